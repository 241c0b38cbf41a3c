//! The per-turn telemetry record of seed 000 §8, derived from events:
//! one `planner` record per model call, one `executor` record per tool call and one
//! `critic` record per critique. A record is completed by the event after it (an
//! `user_asked` turns the planner's intent into `ask_user`, a `run_ended` sets the outcome
//! status to the end state), so records are released one event late.

use keel_core::event::CriticNext;
use keel_core::{Budget, Event, EventKind, ToolErrorCode};
use serde::{Deserialize, Serialize};

/// Which part of the agent produced the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnRole {
    /// The model deciding what to do.
    Planner,
    /// A tool call being executed.
    Executor,
    /// A critic's verdict.
    Critic,
}

/// The tool call of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnToolCall {
    /// Tool name.
    pub name: String,
    /// Whether the arguments were valid (JSON, and not rejected as `invalid_input`).
    pub args_valid: bool,
}

/// The tool result of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnToolResult {
    /// Success.
    pub ok: bool,
    /// Error code, or `None`.
    pub err: String,
    /// Whether the output matched the tool's output schema.
    pub schema_ok: bool,
}

/// The run's policy limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnPolicy {
    /// Model-call limit.
    pub max_turns: Option<u32>,
    /// Wall-clock limit in seconds.
    pub time_budget_s: Option<u64>,
}

/// What happened next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnOutcome {
    /// `continue`, or the run's end state when the run ended right after.
    pub status: String,
    /// `call_tool`, `call_model`, `ask_user` or `stop`.
    pub next_action: String,
}

/// Timings of the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTimings {
    /// Wall time of the model call or tool call.
    pub latency_ms: u64,
}

/// Tokens of the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTokens {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
}

/// One per-turn telemetry record, field for field as seed 000 §8.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The run's trace id.
    pub trace_id: String,
    /// 1-based model-call number the record belongs to.
    pub turn: u32,
    /// `planner`, `executor` or `critic`.
    pub role: TurnRole,
    /// `call_tool`, `ask_user` or `stop`.
    pub intent: String,
    /// The tool call (first call, for planner turns), if any.
    pub tool_call: Option<TurnToolCall>,
    /// The tool result (executor turns).
    pub tool_result: Option<TurnToolResult>,
    /// Policy limits.
    pub policy: TurnPolicy,
    /// What happened next.
    pub outcome: TurnOutcome,
    /// Timings.
    pub timings: TurnTimings,
    /// Tokens.
    pub tokens: TurnTokens,
}

/// Builds [`TurnRecord`]s for one run.
#[derive(Debug, Clone, Default)]
pub struct TurnTracker {
    policy: Option<TurnPolicy>,
    turn: u32,
    pending: Vec<TurnRecord>,
}

fn outcome(status: &str, next: &str) -> TurnOutcome {
    TurnOutcome {
        status: status.into(),
        next_action: next.into(),
    }
}

impl TurnTracker {
    /// Records the run's policy.
    pub fn start(&mut self, _event: &Event, budget: &Budget) {
        self.policy = Some(TurnPolicy {
            max_turns: budget.max_turns,
            time_budget_s: budget.max_wall_clock_ms.map(|ms| ms / 1000),
        });
    }

    fn policy(&self) -> TurnPolicy {
        self.policy.unwrap_or(TurnPolicy {
            max_turns: None,
            time_budget_s: None,
        })
    }

    /// Releases records completed by `event` (call before folding it).
    pub fn before(&mut self, event: &Event) -> Vec<TurnRecord> {
        match &event.kind {
            EventKind::RunEnded { .. } => Vec::new(),
            EventKind::UserAsked { .. } => {
                for r in &mut self.pending {
                    if r.role == TurnRole::Planner {
                        r.intent = "ask_user".into();
                        r.outcome.next_action = "ask_user".into();
                    }
                }
                std::mem::take(&mut self.pending)
            }
            _ => std::mem::take(&mut self.pending),
        }
    }

    /// Starts records for `event` (call after folding it).
    pub fn after(&mut self, event: &Event) -> Vec<TurnRecord> {
        let trace_id = event.trace_id.to_string();
        let policy = self.policy();
        match &event.kind {
            EventKind::ModelRequested { turn, .. } => self.turn = *turn,
            EventKind::ModelResponded {
                turn,
                message,
                usage,
                latency_ms,
                ..
            } => {
                self.turn = *turn;
                let first = message.tool_calls().next();
                let (intent, next) = if first.is_some() {
                    ("call_tool", "call_tool")
                } else {
                    ("stop", "stop")
                };
                self.pending.push(TurnRecord {
                    trace_id,
                    turn: *turn,
                    role: TurnRole::Planner,
                    intent: intent.into(),
                    tool_call: first.map(|c| TurnToolCall {
                        name: c.name.clone(),
                        args_valid: c.parse_arguments().is_ok(),
                    }),
                    tool_result: None,
                    policy,
                    outcome: outcome("continue", next),
                    timings: TurnTimings {
                        latency_ms: *latency_ms,
                    },
                    tokens: TurnTokens {
                        input: usage.input_tokens,
                        output: usage.output_tokens,
                    },
                });
            }
            EventKind::ModelFailed { turn, .. } => {
                self.pending.push(TurnRecord {
                    trace_id,
                    turn: *turn,
                    role: TurnRole::Planner,
                    intent: "stop".into(),
                    tool_call: None,
                    tool_result: None,
                    policy,
                    outcome: outcome("failed", "stop"),
                    timings: TurnTimings { latency_ms: 0 },
                    tokens: TurnTokens {
                        input: 0,
                        output: 0,
                    },
                });
            }
            EventKind::ToolCallFinished { result } => {
                let code = result.outcome.error_code();
                self.pending.push(TurnRecord {
                    trace_id,
                    turn: self.turn,
                    role: TurnRole::Executor,
                    intent: "call_tool".into(),
                    tool_call: Some(TurnToolCall {
                        name: result.name.clone(),
                        args_valid: code != Some(ToolErrorCode::InvalidInput),
                    }),
                    tool_result: Some(TurnToolResult {
                        ok: code.is_none(),
                        err: code
                            .map(|c| c.as_str().to_string())
                            .unwrap_or_else(|| "None".into()),
                        schema_ok: code != Some(ToolErrorCode::OutputSchemaMismatch),
                    }),
                    policy,
                    outcome: outcome("continue", "call_model"),
                    timings: TurnTimings {
                        latency_ms: result.outcome.latency_ms,
                    },
                    tokens: TurnTokens {
                        input: 0,
                        output: 0,
                    },
                });
            }
            EventKind::Critique {
                satisfied, next, ..
            } => {
                let (intent, next_action) = match next {
                    CriticNext::Stop => ("stop", "stop"),
                    CriticNext::Clarify => ("ask_user", "ask_user"),
                    CriticNext::Continue => ("call_tool", "call_model"),
                    CriticNext::Replan => ("call_tool", "replan"),
                };
                self.pending.push(TurnRecord {
                    trace_id,
                    turn: self.turn,
                    role: TurnRole::Critic,
                    intent: intent.into(),
                    tool_call: None,
                    tool_result: None,
                    policy,
                    outcome: outcome(
                        if *satisfied { "satisfied" } else { "continue" },
                        next_action,
                    ),
                    timings: TurnTimings { latency_ms: 0 },
                    tokens: TurnTokens {
                        input: 0,
                        output: 0,
                    },
                });
            }
            _ => {}
        }
        Vec::new()
    }

    /// Releases the pending records with the run's end state.
    pub fn end(&mut self, event: &Event) -> Vec<TurnRecord> {
        let status = match &event.kind {
            EventKind::RunEnded { end_state, .. } => end_state.as_str(),
            _ => "continue",
        };
        let mut out = std::mem::take(&mut self.pending);
        for r in &mut out {
            r.outcome.status = status.into();
            r.outcome.next_action = "stop".into();
        }
        out
    }

    /// Releases pending records as they are.
    pub fn flush(&mut self) -> Vec<TurnRecord> {
        std::mem::take(&mut self.pending)
    }
}
