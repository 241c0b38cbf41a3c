//! Reading a workflow run back from its log: the input, which steps started (with their
//! child thread, input and span) and which finished (with their output) — everything a
//! resumed workflow needs to skip finished steps and continue the others.

use std::collections::HashMap;

use keel_core::{EndState, Event, EventKind};

/// A step recorded as started.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Started {
    pub(crate) child_thread: String,
    pub(crate) input: String,
    pub(crate) from_seq: u64,
    /// The span of the step (parent of the step's run).
    pub(crate) span_id: String,
}

/// A step recorded as finished.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finished {
    pub(crate) end_state: EndState,
    pub(crate) output: String,
    pub(crate) reason: Option<String>,
}

/// A workflow run as its log tells it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkflowLog {
    /// The run's input (its goal).
    pub(crate) input: String,
    /// The workflow name the run was started for.
    pub(crate) agent: String,
    /// The recorded fingerprint of the plan (hash of its shape).
    pub(crate) shape_sha256: Option<String>,
    pub(crate) started: HashMap<String, Started>,
    pub(crate) finished: HashMap<String, Finished>,
}

impl WorkflowLog {
    /// Reads the events of one run (the thread's latest).
    pub(crate) fn read(run_events: &[std::sync::Arc<Event>]) -> Self {
        let mut log = Self::default();
        for event in run_events.iter().map(|event| &**event) {
            match &event.kind {
                EventKind::RunStarted {
                    agent,
                    goal,
                    definition,
                    ..
                } => {
                    log.agent.clone_from(agent);
                    log.input.clone_from(goal);
                    log.shape_sha256 = definition
                        .as_ref()
                        .map(|d| d.fingerprint.system_prompt_sha256.clone());
                }
                EventKind::WorkflowStepStarted {
                    step,
                    child_thread,
                    input,
                    from_seq,
                    ..
                } => {
                    log.started.insert(
                        step.clone(),
                        Started {
                            child_thread: child_thread.clone(),
                            input: input.clone(),
                            from_seq: *from_seq,
                            span_id: event.span_id.clone(),
                        },
                    );
                }
                EventKind::WorkflowStepFinished {
                    step,
                    end_state,
                    output,
                    reason,
                    ..
                } => {
                    log.finished.insert(
                        step.clone(),
                        Finished {
                            end_state: *end_state,
                            output: output.clone().unwrap_or_default(),
                            reason: reason.clone(),
                        },
                    );
                }
                _ => {}
            }
        }
        log
    }
}
