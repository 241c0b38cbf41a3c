//! What a run returns: its status and a summary folded from the run's events (the shape
//! behind `keel run --output json`), and the errors that stop a run from being driven.

use keel_core::event::ModelFailure;
use keel_core::{EndState, Event, EventKind, StoreError, ToolErrorCode, Usage};
use serde::{Deserialize, Serialize};

/// Why a run could not be driven. Model and tool failures are NOT errors: they end the
/// run with an end state, or are fed back to the model. These are infrastructure problems.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The event store failed (or another process appended to the thread first).
    #[error("event store: {0}")]
    Store(#[from] StoreError),
    /// The thread already has a run in progress.
    #[error(
        "thread {thread_id} already has run {run_id} in progress; resume it instead of starting a new one"
    )]
    RunInProgress {
        /// Thread.
        thread_id: String,
        /// The run in progress.
        run_id: String,
    },
    /// There is nothing to resume.
    #[error("thread {0} has no run in progress to resume")]
    NothingToResume(String),
    /// The run was asked to start with no user message.
    #[error("a run needs at least one new message")]
    NoInput,
    /// The agent given to continue a run is not the one the run started with in a way
    /// that makes continuing unsafe (a tool gone or reshaped). Nothing was appended.
    #[error("cannot continue the run on thread {thread_id} with this agent: {}", problems.join("; "))]
    IncompatibleAgent {
        /// Thread.
        thread_id: String,
        /// Every incompatibility found.
        problems: Vec<String>,
    },
    /// The thread's conversation lives where this agent cannot continue it: a local agent
    /// on a thread held by a provider's service, or a provider-backed agent on a thread
    /// with local history (see [`crate::thread::ThreadHome`]). Nothing was appended.
    #[error("thread {thread_id} lives {home}, where agent `{agent}` cannot continue it: {hint}")]
    IncompatibleThread {
        /// Thread.
        thread_id: String,
        /// Where its conversation lives.
        home: crate::thread::ThreadHome,
        /// The agent refused.
        agent: String,
        /// What to do instead.
        hint: String,
    },
}

/// Where a run stands when `run`/`resume` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum RunStatus {
    /// The run ended.
    Ended {
        /// How.
        end_state: EndState,
    },
    /// The run waits for an approval decision on a call.
    AwaitingApproval {
        /// The call.
        call_id: String,
        /// Its tool.
        tool: String,
    },
}

/// One tool call of the run, as reported in `--output json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSummary {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments (parsed JSON, or the raw text when it was not JSON).
    pub arguments: serde_json::Value,
    /// Success?
    pub ok: bool,
    /// Error code, on failure.
    pub error_code: Option<ToolErrorCode>,
    /// Error message, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// Latency in milliseconds.
    pub latency_ms: u64,
}

/// The result of driving a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// Where it stands.
    pub status: RunStatus,
    /// Why it ended (budget reason, model error...).
    pub reason: Option<String>,
    /// The final answer.
    pub final_text: Option<String>,
    /// Model calls made.
    pub turns: u32,
    /// Tool calls in order.
    pub tool_calls: Vec<ToolCallSummary>,
    /// Token usage.
    pub usage: Usage,
    /// Cost when known.
    pub cost_usd: Option<f64>,
    /// The trace id of the run.
    pub trace_id: String,
    /// What the user must do, when a policy stopped the run for a reason only they can fix
    /// (credentials, permissions).
    pub action_item: Option<String>,
    /// Whether the run stopped on an alert-worthy tool bug.
    pub alert: bool,
    /// The open question, when the run ended `clarify_needed`.
    pub clarification: Option<Clarification>,
    /// Whether [`crate::ToolAgent::resume`] (`keel resume THREAD`) can continue the run: it
    /// ended `failed` because a model call failed on a retryable error (rate limit,
    /// overload, 5xx, network, timeout, interrupted stream) after its retries.
    #[serde(default)]
    pub resumable: bool,
}

/// The model failure that ended a run `failed` when waiting and trying again can help:
/// the run's last model call failed with a retryable error, no policy stopped the run, and
/// it ended `failed`. Such a run is continued by [`crate::ToolAgent::resume`].
pub fn retryable_failure<E: std::borrow::Borrow<Event>>(run_events: &[E]) -> Option<&ModelFailure> {
    let mut failure = None;
    let mut ended_failed = false;
    for event in run_events.iter().map(std::borrow::Borrow::borrow) {
        match &event.kind {
            EventKind::ModelFailed { error, .. } => failure = Some(error),
            EventKind::ModelResponded { .. } => failure = None,
            EventKind::PolicyApplied {
                decision: keel_core::PolicyDecision::Stop { .. },
                ..
            } => return None,
            EventKind::RunEnded { end_state, .. } => {
                ended_failed = *end_state == EndState::Failed;
            }
            _ => {}
        }
    }
    failure.filter(|f| ended_failed && f.kind.is_retryable())
}

/// A question the agent asked the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clarification {
    /// The question.
    pub question: String,
    /// Fields only the user can provide.
    pub missing_fields: Vec<String>,
}

impl RunOutcome {
    /// The end state, if the run ended.
    pub fn end_state(&self) -> Option<EndState> {
        match self.status {
            RunStatus::Ended { end_state } => Some(end_state),
            _ => None,
        }
    }

    /// Folds a run's events into its summary. `status` is where the run stands now.
    pub fn from_run_events<E: std::borrow::Borrow<Event>>(
        thread_id: &str,
        run_id: &str,
        events: &[E],
        status: RunStatus,
    ) -> Self {
        let events: Vec<&Event> = events.iter().map(std::borrow::Borrow::borrow).collect();
        let mut outcome = RunOutcome {
            thread_id: thread_id.to_string(),
            run_id: run_id.to_string(),
            status,
            reason: None,
            final_text: None,
            turns: 0,
            tool_calls: Vec::new(),
            usage: Usage::default(),
            cost_usd: None,
            trace_id: events
                .first()
                .map(|e| e.trace_id.to_string())
                .unwrap_or_default(),
            action_item: None,
            alert: false,
            clarification: None,
            resumable: false,
        };
        let mut arguments: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for event in events.iter().filter(|e| &*e.run_id == run_id) {
            match &event.kind {
                EventKind::ModelRequested { turn, .. } => outcome.turns = outcome.turns.max(*turn),
                EventKind::ModelResponded {
                    message,
                    usage,
                    cost_usd,
                    ..
                } => {
                    outcome.usage.add(usage);
                    if let Some(cost) = cost_usd {
                        *outcome.cost_usd.get_or_insert(0.0) += cost;
                    }
                    for call in message.tool_calls() {
                        arguments.insert(call.id.as_str(), call.arguments.as_str());
                    }
                    let text = message.text();
                    if !text.is_empty() {
                        outcome.final_text = Some(text);
                    }
                }
                EventKind::ToolCallFinished { result } => {
                    if result.name == keel_core::planner::ASK_USER && result.outcome.is_ok() {
                        outcome.clarification = None;
                    }
                    let raw = arguments
                        .get(result.call_id.as_str())
                        .copied()
                        .unwrap_or("");
                    let parsed = serde_json::from_str(raw)
                        .unwrap_or_else(|_| serde_json::Value::String(raw.to_string()));
                    let (error_code, error_message) = match &result.outcome.result {
                        keel_core::ToolResultKind::Error { code, message, .. } => {
                            (Some(*code), Some(message.clone()))
                        }
                        keel_core::ToolResultKind::Ok { .. } => (None, None),
                    };
                    outcome.tool_calls.push(ToolCallSummary {
                        call_id: result.call_id.clone(),
                        name: result.name.clone(),
                        arguments: parsed,
                        ok: result.outcome.is_ok(),
                        error_code,
                        error_message,
                        attempts: result.outcome.attempts,
                        latency_ms: result.outcome.latency_ms,
                    });
                }
                EventKind::PolicyApplied {
                    decision:
                        keel_core::PolicyDecision::Stop {
                            action_item, alert, ..
                        },
                    ..
                } => {
                    if action_item.is_some() {
                        outcome.action_item.clone_from(action_item);
                    }
                    outcome.alert |= *alert;
                }
                EventKind::UserAsked {
                    question,
                    missing_fields,
                } => {
                    outcome.clarification = Some(Clarification {
                        question: question.clone(),
                        missing_fields: missing_fields.clone(),
                    });
                }
                EventKind::UserAnswered { .. } => outcome.clarification = None,
                EventKind::RunEnded {
                    reason, final_text, ..
                } => {
                    outcome.reason.clone_from(reason);
                    if final_text.is_some() {
                        outcome.final_text.clone_from(final_text);
                    }
                }
                _ => {}
            }
        }
        outcome.resumable = matches!(outcome.status, RunStatus::Ended { end_state } if end_state == EndState::Failed)
            && retryable_failure(
                // Only this run's events (the slice may start earlier).
                events
                    .iter()
                    .position(|e| &*e.run_id == run_id)
                    .and_then(|start| events.get(start..))
                    .unwrap_or_default(),
            )
            .is_some();
        outcome
    }
}
