//! [`AgentTool`]: an agent offered to another agent as a tool. The calling model gives it
//! a `task`; the agent runs on a child thread of its own, in the caller's store, with its
//! own budget, and its final answer is the tool's result.
//!
//! Durable and exactly-once: the child thread's id is derived from the calling thread and
//! the call id ([`AgentTool::child_thread_id`]), so when the calling run is resumed after a
//! crash and the call runs again, the tool finds the child thread — an ended run returns
//! its answer without running again, a run in progress is resumed (its mutating calls are
//! never repeated), and only a thread with no run starts one. That is why the tool
//! declares itself `idempotent`.
//!
//! Observable: the child run joins the caller's trace, nested under the call's span
//! (`keel trace show` prints it inside the `execute_tool` span). Bounded: the tool has a
//! timeout (default 300 s) after which the child run is cancelled, and it follows the
//! calling run's cancellation. Whatever happens is a tool result — an answer, or a typed
//! error the calling model and policy see — never a crash of the caller.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use keel_core::definition::sha256_hex;
use keel_core::{
    Effect, EndState, Message, RetryPolicy, ToolContext, ToolError, ToolErrorCode, ToolSpec,
};
use serde_json::{Value, json};

use crate::agent::Agent;
use crate::context::RunContext;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;

/// How long the tool waits by default for the agent's run to end.
pub const DEFAULT_AGENT_TOOL_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a cancelled child run may take to record its end before the tool gives up on it.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// An agent offered as a tool (see the [module documentation](self)).
pub struct AgentTool {
    agent: Arc<dyn Agent>,
    spec: ToolSpec,
    timeout: Duration,
}

impl std::fmt::Debug for AgentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTool")
            .field("agent", &self.agent.name())
            .field("tool", &self.spec.name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl AgentTool {
    /// Offers `agent` as a tool named after it (lowercased, other characters than letters,
    /// digits and `_` replaced by `_`), described by [`Agent::description`].
    pub fn new(agent: Arc<dyn Agent>) -> Self {
        let name = tool_name(agent.name());
        let description = match agent.description().trim() {
            "" => format!("Delegates a task to the `{}` agent.", agent.name()),
            text => text.to_string(),
        };
        let usage = format!(
            "Delegate a self-contained task to the `{}` agent and get its final answer back. \
             It does not see this conversation: put everything it needs in `task`. It may \
             take a while and uses its own budget; call it once per task.",
            agent.name()
        );
        let spec = ToolSpec::new(name, description, usage)
            .with_input_schema(json!({
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string",
                        "description": "The task, with everything the agent needs to do it."
                    }
                },
                "required": ["task"],
                "additionalProperties": false
            }))
            .with_output_schema(None);
        let mut tool = Self {
            agent,
            spec,
            timeout: DEFAULT_AGENT_TOOL_TIMEOUT,
        };
        tool.apply_timeout();
        tool
    }

    /// Names the tool (default: the agent's name).
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.spec.name = name.into();
        self
    }

    /// The longest the agent's run may take (default 300 s): then it is cancelled and the
    /// call fails with `timeout`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.apply_timeout();
        self
    }

    /// The agent.
    pub fn agent(&self) -> &Arc<dyn Agent> {
        &self.agent
    }

    /// The child thread a call runs on: derived from the calling thread and the call id,
    /// so a repeated call (after a crash) finds the run it started.
    pub fn child_thread_id(parent_thread: &str, call_id: &str) -> String {
        let digest = sha256_hex(&format!("{parent_thread}\n{call_id}"));
        format!(
            "{parent_thread}.sub.{}",
            digest.get(..16).unwrap_or(&digest)
        )
    }

    fn apply_timeout(&mut self) {
        // The executor's own deadline leaves the tool time to cancel the child run and
        // let it record its end.
        let total = self.timeout.saturating_add(CANCEL_GRACE.saturating_mul(2));
        self.spec.timeout_ms = u64::try_from(total.as_millis()).unwrap_or(u64::MAX);
        self.spec.effect = Effect::Idempotent;
        self.spec.retry = RetryPolicy::none();
    }

    async fn call_agent(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let task = args
            .get("task")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|task| !task.is_empty())
            .ok_or_else(|| {
                ToolError::invalid_input(format!(
                    "`{}` needs {{\"task\": string}} with the task to delegate",
                    self.spec.name
                ))
            })?;
        let Some(parent) = ctx
            .runtime
            .as_ref()
            .and_then(|runtime| runtime.downcast_ref::<RunContext>())
        else {
            return Err(ToolError::new(
                ToolErrorCode::ToolBug,
                format!(
                    "`{}` runs an agent and needs the calling run's context; call it from a \
                     keel run (the executor lends it)",
                    self.spec.name
                ),
            ));
        };
        let cancel = ctx.cancel.child();
        let mut context = parent.clone().with_cancel(cancel.clone());
        context.parent = None;
        if !ctx.trace_id.is_empty() && !ctx.span_id.is_empty() {
            context = context.with_parent_span(ctx.trace_id.clone(), ctx.span_id.clone());
        }
        let thread_id = Self::child_thread_id(&ctx.thread_id, &ctx.call_id);
        let mut thread = Thread::load(context.store.as_ref(), &thread_id)
            .await
            .map_err(|e| store_error(&self.spec.name, &e.to_string()))?;
        let name = self.agent.name().to_string();
        let finished = (!thread.is_empty() && !thread.state().run_in_progress())
            .then(|| ended_outcome(&thread));
        let outcome = match finished {
            Some(outcome) => Ok(outcome),
            None => {
                let resume = !thread.is_empty();
                let run = async {
                    if resume {
                        self.agent.resume(&mut thread, &context).await
                    } else {
                        let message = Message::user(task.to_string());
                        self.agent.run(vec![message], &mut thread, &context).await
                    }
                };
                let mut run = std::pin::pin!(run);
                tokio::select! {
                    result = &mut run => result,
                    () = tokio::time::sleep(self.timeout) => {
                        // Let the child run record its cancellation before answering.
                        cancel.cancel();
                        let _ = tokio::time::timeout(CANCEL_GRACE, &mut run).await;
                        return Err(ToolError::new(
                            ToolErrorCode::Timeout,
                            format!(
                                "the `{name}` agent did not finish within {} ms and was \
                                 cancelled (thread {thread_id})",
                                self.timeout.as_millis()
                            ),
                        ));
                    }
                }
            }
        };
        match outcome {
            Ok(outcome) => answer(&name, &thread_id, outcome),
            Err(RunError::Store(e)) => Err(store_error(&self.spec.name, &e.to_string())),
            Err(e) => Err(ToolError::new(
                ToolErrorCode::ToolBug,
                format!("the `{name}` agent could not run on thread {thread_id}: {e}"),
            )),
        }
    }
}

impl keel_core::DynTool for AgentTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(self.call_agent(args, ctx))
    }
}

/// `name` as a tool name: lowercase letters, digits and `_`, at most 64 characters.
pub fn tool_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "agent_");
        out.truncate(64);
    }
    out
}

/// The outcome of the child thread's latest run, which has ended.
fn ended_outcome(thread: &Thread) -> RunOutcome {
    let events = thread.run_events();
    let run_id = events
        .first()
        .map(|e| e.run_id.to_string())
        .unwrap_or_default();
    let end_state = thread
        .state()
        .run()
        .and_then(|run| run.ended)
        .unwrap_or(EndState::Failed);
    RunOutcome::from_run_events(thread.id(), &run_id, events, RunStatus::Ended { end_state })
}

/// The tool's result for the child run's outcome: its answer when it ended `done`, else a
/// typed error saying how it ended.
fn answer(agent: &str, thread_id: &str, outcome: RunOutcome) -> Result<Value, ToolError> {
    let details = json!({
        "agent": agent,
        "thread_id": thread_id,
        "run_id": outcome.run_id,
    });
    let with_details = |error: ToolError| error.with_details(details.clone());
    match outcome.status {
        RunStatus::Ended {
            end_state: EndState::Done,
        } => Ok(json!({
            "agent": agent,
            "answer": outcome.final_text.unwrap_or_default(),
            "thread_id": thread_id,
            "run_id": outcome.run_id,
        })),
        RunStatus::Ended { end_state } => {
            let code = match end_state {
                EndState::Cancelled => ToolErrorCode::Cancelled,
                EndState::ClarifyNeeded => ToolErrorCode::InvalidInput,
                _ => ToolErrorCode::RetryableServer,
            };
            let why = match (&outcome.clarification, &outcome.reason) {
                (Some(question), _) => format!("it needs more information: {}", question.question),
                (None, Some(reason)) => reason.clone(),
                (None, None) => end_state.to_string(),
            };
            Err(with_details(ToolError::new(
                code,
                format!("the `{agent}` agent ended `{end_state}`: {why}"),
            )))
        }
        RunStatus::AwaitingApproval { tool, call_id } => Err(with_details(ToolError::new(
            ToolErrorCode::Denied,
            format!(
                "the `{agent}` agent waits for approval of its `{tool}` call ({call_id}) on \
                 thread {thread_id}; approve it there, then call this tool again with the same task"
            ),
        ))),
    }
}

fn store_error(tool: &str, message: &str) -> ToolError {
    ToolError::new(
        ToolErrorCode::RetryableServer,
        format!("`{tool}`: the event store failed: {message}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_valid_and_child_threads_are_stable() {
        assert_eq!(tool_name("Billing Agent"), "billing_agent");
        assert_eq!(tool_name("2nd"), "agent_2nd");
        let a = AgentTool::child_thread_id("thr_1", "call_1");
        assert_eq!(a, AgentTool::child_thread_id("thr_1", "call_1"));
        assert_ne!(a, AgentTool::child_thread_id("thr_1", "call_2"));
        assert!(a.starts_with("thr_1.sub."));
    }
}
