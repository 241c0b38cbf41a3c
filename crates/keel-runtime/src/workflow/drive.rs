//! Driving a workflow run to its end (or pause): the steps of its [`Plan`] in order —
//! each recorded as started before its run begins and as finished once its run ended —
//! parallel branches concurrently (at most `max_parallel` at once, their results fanned
//! in in branch order), and the route of a router. Steps the log already records as
//! finished are not run again: their output comes from the log.

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use keel_core::event::new_span_id;
use keel_core::{EndState, EventKind, Message};

use super::Workflow;
use super::log::{Finished, WorkflowLog};
use super::plan::{Plan, RouteBy, Step, fan_in, match_route, routing_prompt};
use super::step::{child_thread_id, drive_step};
use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;

/// Where a step left the workflow.
enum Flow {
    /// It ended `done` with this output.
    Output(String),
    /// It ended otherwise: the workflow ends so.
    Ended { end_state: EndState, reason: String },
    /// It paused (awaiting approval) or failed on a retryable model error: the workflow
    /// returns this outcome and its run stays in progress, to be resumed.
    Paused(Box<RunOutcome>),
}

impl Flow {
    fn from_finished(step: &Step, finished: &Finished) -> Self {
        if finished.end_state == EndState::Done {
            Self::Output(finished.output.clone())
        } else {
            Self::Ended {
                end_state: finished.end_state,
                reason: step_reason(step, finished.end_state, finished.reason.as_deref()),
            }
        }
    }
}

fn step_reason(step: &Step, end_state: EndState, reason: Option<&str>) -> String {
    let mut text = format!(
        "step `{}` (agent `{}`) ended {}",
        step.name,
        step.agent.name(),
        end_state.as_str()
    );
    if let Some(reason) = reason.filter(|r| !r.is_empty()) {
        text.push_str(": ");
        text.push_str(reason);
    }
    text
}

/// A step about to run: its child thread (loaded), input and span.
struct Prepared {
    child: Thread,
    input: String,
    from_seq: u64,
    span: String,
}

/// The context a step's run gets: the workflow's, with the step's run nested under the
/// step's span in the workflow's trace.
fn step_context(context: &RunContext, trace_id: &str, step_span: &str) -> RunContext {
    context.clone().with_parent_span(trace_id, step_span)
}

/// Drives the workflow run the journal writes, from where `log` says it stands.
pub(crate) async fn drive(
    workflow: &Workflow,
    journal: &mut Journal<'_>,
    log: &WorkflowLog,
    context: &RunContext,
) -> Result<RunOutcome, RunError> {
    let mut driver = Driver {
        workflow,
        log,
        context,
        trace_id: journal
            .run_events()
            .first()
            .map(|e| e.trace_id.to_string())
            .unwrap_or_default(),
    };
    let input = log.input.clone();
    let flow = match &workflow.plan {
        Plan::Sequential(steps) => driver.sequential(journal, steps, input).await?,
        Plan::Parallel { branches, then } => {
            driver
                .parallel(journal, branches, then.as_ref(), input)
                .await?
        }
        Plan::Router {
            route_by,
            routes,
            default,
        } => {
            driver
                .router(journal, route_by, routes, default.as_deref(), input)
                .await?
        }
    };
    match flow {
        Flow::Output(text) => finish(workflow, journal, EndState::Done, None, text).await,
        Flow::Ended { end_state, reason } => {
            finish(workflow, journal, end_state, Some(reason), String::new()).await
        }
        Flow::Paused(outcome) => Ok(*outcome),
    }
}

/// Ends the workflow run: its answer as an `agent_message` (when done), then `run_ended`.
async fn finish(
    workflow: &Workflow,
    journal: &mut Journal<'_>,
    end_state: EndState,
    reason: Option<String>,
    text: String,
) -> Result<RunOutcome, RunError> {
    let span = journal.run_span().to_string();
    let mut batch = Vec::new();
    if end_state == EndState::Done && !text.is_empty() {
        batch.push((
            EventKind::AgentMessage {
                agent: workflow.name.clone(),
                message: Message::assistant(text.clone()),
            },
            span.clone(),
        ));
    }
    batch.push((
        EventKind::RunEnded {
            end_state,
            reason,
            final_text: (!text.is_empty()).then_some(text),
        },
        span,
    ));
    journal.append_batch(batch).await?;
    Ok(RunOutcome::from_run_events(
        journal.thread_id(),
        journal.run_id(),
        journal.run_events(),
        RunStatus::Ended { end_state },
    ))
}

struct Driver<'a> {
    workflow: &'a Workflow,
    log: &'a WorkflowLog,
    context: &'a RunContext,
    trace_id: String,
}

impl<'a> Driver<'a> {
    async fn sequential(
        &mut self,
        journal: &mut Journal<'_>,
        steps: &'a [Step],
        input: String,
    ) -> Result<Flow, RunError> {
        let mut input = input;
        for step in steps {
            match self.one(journal, step, input.clone()).await? {
                // A step with nothing to say hands its own input on.
                Flow::Output(output) if !output.trim().is_empty() => input = output,
                Flow::Output(_) => {}
                stop => return Ok(stop),
            }
        }
        Ok(Flow::Output(input))
    }

    async fn parallel(
        &mut self,
        journal: &mut Journal<'_>,
        branches: &'a [Step],
        then: Option<&'a Step>,
        input: String,
    ) -> Result<Flow, RunError> {
        let mut results: Vec<Option<Flow>> = branches
            .iter()
            .map(|b| {
                self.log
                    .finished
                    .get(&b.name)
                    .map(|f| Flow::from_finished(b, f))
            })
            .collect();
        let pending: Vec<(usize, &'a Step)> = branches
            .iter()
            .enumerate()
            .filter(|(i, _)| results.get(*i).is_some_and(Option::is_none))
            .collect();
        let mut queue = pending.into_iter();
        let mut running = FuturesUnordered::new();
        let mut stopping = false;
        loop {
            while !stopping && running.len() < self.workflow.max_parallel {
                let Some((index, step)) = queue.next() else {
                    break;
                };
                let mut prepared = self.prepare(journal, step, input.clone()).await?;
                let context = step_context(self.context, &self.trace_id, &prepared.span);
                running.push(async move {
                    let outcome = drive_step(
                        step.agent.as_ref(),
                        &mut prepared.child,
                        &prepared.input,
                        prepared.from_seq,
                        &context,
                    )
                    .await;
                    (index, step, prepared, outcome)
                });
            }
            let Some((index, step, prepared, outcome)) = running.next().await else {
                break;
            };
            let flow = self.settle(journal, step, &prepared, outcome?).await?;
            stopping |= !matches!(flow, Flow::Output(_));
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(flow);
            }
        }
        // A branch that ended the workflow wins over one that paused; else the first pause.
        let mut outputs = Vec::new();
        let mut paused = None;
        for (step, result) in branches.iter().zip(results) {
            match result {
                Some(Flow::Output(output)) => outputs.push((step, output)),
                Some(ended @ Flow::Ended { .. }) => return Ok(ended),
                Some(pause @ Flow::Paused(_)) => {
                    paused.get_or_insert(pause);
                }
                // Not started because another branch stopped the workflow.
                None => {}
            }
        }
        if let Some(pause) = paused {
            return Ok(pause);
        }
        let combined = fan_in(&input, &outputs);
        match then {
            Some(step) => self.one(journal, step, combined).await,
            None => Ok(Flow::Output(combined)),
        }
    }

    async fn router(
        &mut self,
        journal: &mut Journal<'_>,
        route_by: &'a RouteBy,
        routes: &'a [Step],
        default: Option<&str>,
        input: String,
    ) -> Result<Flow, RunError> {
        // A route already started is the one chosen.
        if let Some(route) = routes
            .iter()
            .find(|r| self.log.started.contains_key(&r.name))
        {
            return self.one(journal, route, input).await;
        }
        let (choice, answer) = match route_by {
            RouteBy::Function(choose) => {
                let choice = choose(&input);
                (
                    choice
                        .as_deref()
                        .and_then(|name| routes.iter().find(|r| r.name == name)),
                    choice.unwrap_or_default(),
                )
            }
            RouteBy::Agent(router) => {
                match self
                    .one(journal, router, routing_prompt(&input, routes))
                    .await?
                {
                    Flow::Output(answer) => (match_route(&answer, routes), answer),
                    stop => return Ok(stop),
                }
            }
        };
        let route = choice.or_else(|| default.and_then(|d| routes.iter().find(|r| r.name == d)));
        match route {
            Some(route) => self.one(journal, route, input).await,
            None => Ok(Flow::Ended {
                end_state: EndState::Failed,
                reason: format!(
                    "workflow `{}`: the router's answer `{}` names none of the routes ({}) and \
                     there is no default route",
                    self.workflow.name,
                    answer.trim(),
                    routes
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// One step, alone: from the log when finished, else prepared, run and settled.
    async fn one(
        &mut self,
        journal: &mut Journal<'_>,
        step: &Step,
        input: String,
    ) -> Result<Flow, RunError> {
        if let Some(finished) = self.log.finished.get(&step.name) {
            return Ok(Flow::from_finished(step, finished));
        }
        let mut prepared = self.prepare(journal, step, input).await?;
        let context = step_context(self.context, &self.trace_id, &prepared.span);
        let outcome = drive_step(
            step.agent.as_ref(),
            &mut prepared.child,
            &prepared.input,
            prepared.from_seq,
            &context,
        )
        .await?;
        self.settle(journal, step, &prepared, outcome).await
    }

    /// Loads the step's child thread; records `workflow_step_started` unless the log
    /// already has it (then its recorded input, position and span are used).
    async fn prepare(
        &self,
        journal: &mut Journal<'_>,
        step: &Step,
        input: String,
    ) -> Result<Prepared, RunError> {
        let store = self.context.store.as_ref();
        if let Some(started) = self.log.started.get(&step.name) {
            return Ok(Prepared {
                child: Thread::load(store, &started.child_thread).await?,
                input: started.input.clone(),
                from_seq: started.from_seq,
                span: started.span_id.clone(),
            });
        }
        let child_id = child_thread_id(journal.thread_id(), &step.name);
        let child = Thread::load(store, &child_id).await?;
        let from_seq = child.state().next_seq();
        let span = new_span_id();
        journal
            .append_batch(vec![(
                EventKind::WorkflowStepStarted {
                    step: step.name.clone(),
                    agent: step.agent.name().to_string(),
                    child_thread: child_id,
                    input: input.clone(),
                    from_seq,
                },
                span.clone(),
            )])
            .await?;
        Ok(Prepared {
            child,
            input,
            from_seq,
            span,
        })
    }

    /// Records how the step's run ended (`workflow_step_finished`), unless it paused.
    async fn settle(
        &self,
        journal: &mut Journal<'_>,
        step: &Step,
        prepared: &Prepared,
        outcome: RunOutcome,
    ) -> Result<Flow, RunError> {
        let end_state = match outcome.status {
            RunStatus::Ended { end_state } if !outcome.resumable => end_state,
            RunStatus::Ended { .. } => {
                // A retryable model failure: the workflow stays in progress; `resume`
                // continues the step's run.
                let mut paused = outcome;
                paused.reason = Some(format!(
                    "{}; the workflow continues where it stopped when resumed",
                    step_reason(step, EndState::Failed, paused.reason.as_deref())
                ));
                paused.thread_id = journal.thread_id().to_string();
                paused.run_id = journal.run_id().to_string();
                paused.trace_id.clone_from(&self.trace_id);
                return Ok(Flow::Paused(Box::new(paused)));
            }
            // Awaiting approval on the step's own thread: decide there, then resume.
            _ => return Ok(Flow::Paused(Box::new(outcome))),
        };
        let output = outcome.final_text.clone().unwrap_or_default();
        journal
            .append_batch(vec![(
                EventKind::WorkflowStepFinished {
                    step: step.name.clone(),
                    child_thread: prepared.child.id().to_string(),
                    child_run_id: outcome.run_id.clone(),
                    end_state,
                    output: (!output.is_empty()).then(|| output.clone()),
                    reason: outcome.reason.clone(),
                },
                prepared.span.clone(),
            )])
            .await?;
        if end_state == EndState::Done {
            Ok(Flow::Output(output))
        } else {
            Ok(Flow::Ended {
                end_state,
                reason: step_reason(step, end_state, outcome.reason.as_deref()),
            })
        }
    }
}
