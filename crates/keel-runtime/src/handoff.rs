//! Handoffs: control of a conversation passes from one agent to another on the same
//! thread.
//!
//! A [`crate::ToolAgent`] built with [`crate::ToolAgentBuilder::handoff`] offers its model
//! one `transfer_to_<agent>` tool per target. When the model calls one, the runner records
//! the call's result and a [`EventKind::Handoff`] event (same span), and ends the run
//! (`done`, reason "handed off to `<agent>`"). The target then takes the conversation over
//! in a run of its own, started with no new message (the conversation so far is its input)
//! and nested in the trace under the handoff's span.
//!
//! [`HandoffGroup`] is the [`Agent`] that drives this: it holds the agents by name, runs
//! the one that owns the thread, follows every handoff, and returns the outcome of the
//! last agent — the final answer is the target's. Which agent owns the thread is read from
//! the log (a pending handoff's target, else the agent of the latest run), so a resume
//! after a crash continues with the right agent, and a follow-up message goes to the agent
//! the conversation was handed to.
//!
//! Bounded: one user request may go through at most `max_handoffs` handoffs (default
//! [`DEFAULT_MAX_HANDOFFS`]): past that, a transfer call gets an error result telling the
//! model to answer itself, so a ping-pong between agents cannot loop forever.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::event::new_span_id;
use keel_core::{EventKind, Message, ToolCall, ToolDefinition, ToolErrorCode};
use serde_json::json;

use crate::agent::Agent;
use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome};
use crate::runner::{error_outcome, ok_outcome, tool_finished};
use crate::thread::Thread;
use crate::tool_agent::ToolAgent;

/// Handoffs one user request may go through by default.
pub const DEFAULT_MAX_HANDOFFS: u32 = 5;

/// Prefix of the transfer tools' names.
pub const TRANSFER_PREFIX: &str = "transfer_to_";

/// An agent another agent may hand the conversation to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffTarget {
    /// The target's name ([`Agent::name`]).
    pub agent: String,
    /// What it does, shown to the model in the transfer tool's description.
    pub description: String,
    /// The transfer tool's name: `transfer_to_<agent>`.
    pub tool: String,
}

impl HandoffTarget {
    /// A target, with its transfer tool's name derived from the agent's.
    pub fn new(agent: impl Into<String>, description: impl Into<String>) -> Self {
        let agent = agent.into();
        let mut tool = format!(
            "{TRANSFER_PREFIX}{}",
            crate::agent_tool::tool_name(&agent).trim_start_matches("agent_")
        );
        tool.truncate(64);
        Self {
            tool,
            description: description.into(),
            agent,
        }
    }

    /// The transfer tool's definition.
    pub fn definition(&self) -> ToolDefinition {
        let what = match self.description.trim() {
            "" => String::new(),
            text => format!(" It: {text}"),
        };
        ToolDefinition {
            name: self.tool.clone(),
            description: format!(
                "Hand the conversation over to the `{}` agent, which continues it with the \
                 user.{what}",
                self.agent
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "reason": {
                        "type": "string",
                        "description": "Why this agent should take over, in one sentence."
                    }
                },
                "additionalProperties": false
            }),
        }
    }
}

/// The prompt section explaining the transfer tools.
pub(crate) fn guidance(targets: &[HandoffTarget]) -> String {
    let mut text = String::from(
        "## Handoffs (built in)\nWhen another agent is better placed to handle the request, \
         hand the conversation over by calling its transfer tool (alone, with a one-sentence \
         reason); it sees the whole conversation and answers the user in your place. Do not \
         answer yourself after transferring.",
    );
    for target in targets {
        let what = match target.description.trim() {
            "" => String::new(),
            text => format!(": {text}"),
        };
        text.push_str(&format!("\n- {} → `{}`{what}", target.tool, target.agent));
    }
    text
}

/// Whether a run of `agent` with no new message may start on `thread`: its latest run
/// handed the conversation to `agent`, and no run is in progress.
pub(crate) fn takes_over(thread: &Thread, agent: &str) -> bool {
    !thread.state().run_in_progress() && thread.state().pending_handoff() == Some(agent)
}

/// The goal recorded by a run that takes a conversation over: the goal of the run that
/// handed it off.
pub(crate) fn handed_off_goal(thread: &Thread) -> String {
    thread
        .run_events()
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { goal, .. } => Some(goal.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// Settles a call of a transfer tool: refused (an error result the model sees) when the
/// turn already handed off or the chain is at its limit; otherwise its result and the
/// `handoff` event are recorded in one span and `handed_off` names the target, whose
/// caller then ends the run.
pub(crate) async fn transfer(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    call: ToolCall,
    target: &HandoffTarget,
    handed_off: &mut Option<String>,
) -> Result<(), RunError> {
    let span = new_span_id();
    let chain = journal.state().handoff_chain();
    let refusal = match handed_off {
        Some(already) => Some(format!(
            "the conversation is already handed off to `{already}` in this turn; one handoff \
             per turn"
        )),
        None if chain >= agent.max_handoffs => Some(format!(
            "this request was already handed off {chain} time(s), the limit; do not transfer \
             again: answer the user yourself"
        )),
        None => None,
    };
    if let Some(message) = refusal {
        let outcome = error_outcome(journal, &call, ToolErrorCode::Denied, message);
        return journal
            .append_batch(vec![(tool_finished(call, outcome, None), span)])
            .await;
    }
    let reason = call
        .parse_arguments()
        .ok()
        .and_then(|args| {
            args.get("reason")
                .and_then(|r| r.as_str())
                .map(str::to_string)
        })
        .filter(|reason| !reason.trim().is_empty());
    let outcome = ok_outcome(journal, &call, json!({ "transferred_to": target.agent }));
    let content = format!(
        "Transferred to `{}`, which continues the conversation.",
        target.agent
    );
    let handoff = EventKind::Handoff {
        from: agent.name.clone(),
        to: target.agent.clone(),
        reason,
        call_id: call.id.clone(),
    };
    journal
        .append_batch(vec![
            (tool_finished(call, outcome, Some(content)), span.clone()),
            (handoff, span),
        ])
        .await?;
    *handed_off = Some(target.agent.clone());
    Ok(())
}

/// Agents that hand a conversation to each other (see the [module documentation](self)).
pub struct HandoffGroup {
    entry: Arc<dyn Agent>,
    agents: BTreeMap<String, Arc<dyn Agent>>,
    max_handoffs: u32,
}

impl std::fmt::Debug for HandoffGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandoffGroup")
            .field("entry", &self.entry.name())
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .field("max_handoffs", &self.max_handoffs)
            .finish()
    }
}

impl HandoffGroup {
    /// A group whose new conversations start with `entry`.
    pub fn new(entry: Arc<dyn Agent>) -> Self {
        let mut agents = BTreeMap::new();
        agents.insert(entry.name().to_string(), Arc::clone(&entry));
        Self {
            entry,
            agents,
            max_handoffs: DEFAULT_MAX_HANDOFFS,
        }
    }

    /// Adds an agent conversations may be handed to (by its [`Agent::name`]; an agent of
    /// the same name is replaced).
    #[must_use]
    pub fn with_agent(mut self, agent: Arc<dyn Agent>) -> Self {
        self.agents.insert(agent.name().to_string(), agent);
        self
    }

    /// How many handoffs the group follows for one request before it returns the latest
    /// outcome (default [`DEFAULT_MAX_HANDOFFS`]; tool agents also refuse transfers past
    /// their own limit).
    #[must_use]
    pub fn max_handoffs(mut self, handoffs: u32) -> Self {
        self.max_handoffs = handoffs;
        self
    }

    /// The agent by name.
    pub fn agent(&self, name: &str) -> Option<&Arc<dyn Agent>> {
        self.agents.get(name)
    }

    /// The agent that owns `thread`: the target of a handoff not yet taken over, else the
    /// agent of the latest run when it is one of the group's, else the entry agent.
    pub fn active_agent(&self, thread: &Thread) -> &Arc<dyn Agent> {
        let state = thread.state();
        state
            .pending_handoff()
            .or_else(|| state.run().map(|run| run.agent.as_str()))
            .and_then(|name| self.agents.get(name))
            .unwrap_or(&self.entry)
    }

    /// Follows the handoffs recorded on `thread` after `outcome`: each target takes the
    /// conversation over in a run nested under the handoff's span, until a run ends
    /// without handing off (or pauses), or the limit is reached.
    async fn follow(
        &self,
        mut outcome: RunOutcome,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        let mut hops = 0u32;
        while let Some(target) = thread.state().pending_handoff().map(str::to_string) {
            if thread.state().run_in_progress() || hops >= self.max_handoffs {
                break;
            }
            let Some(agent) = self.agents.get(&target) else {
                break;
            };
            hops = hops.saturating_add(1);
            let mut nested = context.clone();
            if let Some(event) = thread
                .run_events()
                .iter()
                .rev()
                .find(|e| matches!(&e.kind, EventKind::Handoff { to, .. } if *to == target))
            {
                nested = nested.with_parent_span(event.trace_id.to_string(), event.span_id.clone());
            }
            outcome = agent.run(Vec::new(), thread, &nested).await?;
        }
        Ok(outcome)
    }
}

#[async_trait]
impl Agent for HandoffGroup {
    fn name(&self) -> &str {
        self.entry.name()
    }

    fn description(&self) -> &str {
        self.entry.description()
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        let agent = Arc::clone(self.active_agent(thread));
        let outcome = agent.run(new_messages, thread, context).await?;
        self.follow(outcome, thread, context).await
    }

    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        if thread.state().pending_handoff().is_some() && !thread.state().run_in_progress() {
            // Stopped between the handoff and the target's first event.
            let events = thread.run_events();
            let run_id = events
                .first()
                .map(|e| e.run_id.to_string())
                .unwrap_or_default();
            let end_state = thread
                .state()
                .run()
                .and_then(|run| run.ended)
                .unwrap_or(keel_core::EndState::Done);
            let outcome = RunOutcome::from_run_events(
                thread.id(),
                &run_id,
                events,
                crate::RunStatus::Ended { end_state },
            );
            return self.follow(outcome, thread, context).await;
        }
        let agent = Arc::clone(self.active_agent(thread));
        let outcome = agent.resume(thread, context).await?;
        self.follow(outcome, thread, context).await
    }
}
