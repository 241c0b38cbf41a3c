//! What scorers read about one trial: a [`RunTrace`] folded from the thread's events (as
//! `EventStore::read` returns them). It only reads the log — the tool calls in order with
//! their arguments and outcomes, the final answer, where the run stands, the tool results'
//! text (for hallucination checks), usage and cost, the trace id — and never re-runs
//! anything.

use std::collections::HashMap;

use keel_core::{EndState, Event, EventKind, ToolErrorCode, ToolResultKind, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The call succeeded.
    Ok,
    /// The call failed with a typed error.
    Error {
        /// The taxonomy code.
        code: ToolErrorCode,
        /// The error message.
        message: String,
    },
    /// No result was recorded (the run paused or stopped first).
    Pending,
}

/// One tool call, in the order the runner accepted it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracedCall {
    /// Call id.
    pub id: String,
    /// Tool name as the model wrote it.
    pub name: String,
    /// The arguments parsed as JSON; the raw text as a JSON string when it is not JSON.
    pub arguments: Value,
    /// How it ended.
    pub outcome: CallOutcome,
    /// The result text the model saw, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_text: Option<String>,
}

impl TracedCall {
    /// Whether the call failed.
    pub fn failed(&self) -> bool {
        matches!(self.outcome, CallOutcome::Error { .. })
    }

    /// Whether the call succeeded.
    pub fn succeeded(&self) -> bool {
        matches!(self.outcome, CallOutcome::Ok)
    }
}

/// Where the (last) run of the thread stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "end_state", rename_all = "snake_case")]
pub enum TraceEnd {
    /// The run ended (`RunEnded`).
    Ended(EndState),
    /// The run waits for an approval.
    AwaitingApproval,
    /// The run waits for the user's answer.
    AwaitingUser,
    /// No `RunEnded` and no pause: the log stops mid-run (a crash) or is empty.
    Incomplete,
}

impl TraceEnd {
    /// `done`, `failed`, …, `awaiting_approval`, `awaiting_user`, `incomplete`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ended(state) => state.as_str(),
            Self::AwaitingApproval => "awaiting_approval",
            Self::AwaitingUser => "awaiting_user",
            Self::Incomplete => "incomplete",
        }
    }
}

/// One trial's run, as scorers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunTrace {
    /// The thread.
    pub thread_id: String,
    /// The trace id of the last run.
    pub trace_id: String,
    /// Every tool call of the thread, in order.
    pub tool_calls: Vec<TracedCall>,
    /// The last run's final answer: `RunEnded.final_text` when recorded, else the last
    /// non-empty assistant text (model answer or agent message) of that run.
    pub final_text: Option<String>,
    /// Where the last run stands.
    pub end: TraceEnd,
    /// Why the last run ended, when it said.
    pub end_reason: Option<String>,
    /// Model calls made (all runs).
    pub model_calls: u32,
    /// Token usage (all runs).
    pub usage: Usage,
    /// Cost in US dollars, when any model call reported one.
    pub cost_usd: Option<f64>,
}

impl RunTrace {
    /// Folds a thread's events, in log order.
    pub fn from_events(events: &[Event]) -> RunTrace {
        let mut trace = RunTrace {
            thread_id: events
                .first()
                .map(|e| e.thread_id.to_string())
                .unwrap_or_default(),
            trace_id: events
                .first()
                .map(|e| e.trace_id.to_string())
                .unwrap_or_default(),
            tool_calls: Vec::new(),
            final_text: None,
            end: TraceEnd::Incomplete,
            end_reason: None,
            model_calls: 0,
            usage: Usage::default(),
            cost_usd: None,
        };
        let mut by_id: HashMap<String, usize> = HashMap::new();
        let mut pending_approvals = 0usize;
        let mut waiting_user = false;
        for event in events {
            match &event.kind {
                EventKind::RunStarted { .. } => {
                    trace.trace_id = event.trace_id.to_string();
                    trace.final_text = None;
                    trace.end = TraceEnd::Incomplete;
                    trace.end_reason = None;
                    pending_approvals = 0;
                    waiting_user = false;
                }
                EventKind::ModelResponded {
                    message,
                    usage,
                    cost_usd,
                    ..
                } => {
                    trace.model_calls = trace.model_calls.saturating_add(1);
                    trace.usage.add(usage);
                    if let Some(cost) = cost_usd {
                        *trace.cost_usd.get_or_insert(0.0) += cost;
                    }
                    let text = message.text();
                    if !text.trim().is_empty() {
                        trace.final_text = Some(text);
                    }
                }
                EventKind::AgentMessage { message, .. } => {
                    let text = message.text();
                    if !text.trim().is_empty() {
                        trace.final_text = Some(text);
                    }
                }
                EventKind::ToolCallRequested { call, .. } => {
                    let arguments = call
                        .parse_arguments()
                        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                    by_id.insert(call.id.clone(), trace.tool_calls.len());
                    trace.tool_calls.push(TracedCall {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        arguments,
                        outcome: CallOutcome::Pending,
                        result_text: None,
                    });
                }
                EventKind::ToolCallFinished { result } => {
                    if let Some(call) = by_id
                        .get(&result.call_id)
                        .and_then(|&i| trace.tool_calls.get_mut(i))
                    {
                        call.outcome = match &result.outcome.result {
                            ToolResultKind::Ok { .. } => CallOutcome::Ok,
                            ToolResultKind::Error { code, message, .. } => CallOutcome::Error {
                                code: *code,
                                message: message.clone(),
                            },
                        };
                        call.result_text = Some(result.content.clone());
                    }
                }
                EventKind::ApprovalRequested { .. } => {
                    pending_approvals = pending_approvals.saturating_add(1);
                }
                EventKind::ApprovalGranted { .. } | EventKind::ApprovalDenied { .. } => {
                    pending_approvals = pending_approvals.saturating_sub(1);
                }
                EventKind::UserAsked { .. } => waiting_user = true,
                EventKind::UserAnswered { .. } => waiting_user = false,
                EventKind::RunEnded {
                    end_state,
                    reason,
                    final_text,
                } => {
                    trace.end = TraceEnd::Ended(*end_state);
                    trace.end_reason.clone_from(reason);
                    if final_text.is_some() {
                        trace.final_text.clone_from(final_text);
                    }
                    pending_approvals = 0;
                    waiting_user = false;
                }
                _ => {}
            }
            if !matches!(trace.end, TraceEnd::Ended(_)) {
                trace.end = if pending_approvals > 0 {
                    TraceEnd::AwaitingApproval
                } else if waiting_user {
                    TraceEnd::AwaitingUser
                } else {
                    TraceEnd::Incomplete
                };
            }
        }
        trace
    }

    /// The final answer, or `""`.
    pub fn answer(&self) -> &str {
        self.final_text.as_deref().unwrap_or_default()
    }

    /// The calls of `tool`, in order.
    pub fn calls_of<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a TracedCall> + 'a {
        self.tool_calls.iter().filter(move |c| c.name == tool)
    }

    /// The result texts of every call (what the model saw), in order.
    pub fn tool_result_texts(&self) -> impl Iterator<Item = &str> {
        self.tool_calls
            .iter()
            .filter_map(|c| c.result_text.as_deref())
    }
}
