//! The pure decision function: given the folded state of a thread, what happens next.
//!
//! `decide` performs no I/O and reads no clock (the caller passes `now`). The runner in
//! `keel-runtime` performs the action and appends what happened; the same events folded
//! again give the same decision, which is what makes resume and replay exact.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::message::Role;
use crate::state::{PendingCall, RunState};

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndState {
    /// The agent produced its final answer.
    Done,
    /// The agent needs information only the user has.
    ClarifyNeeded,
    /// A turn, time, token or cost limit was reached.
    BudgetExceeded,
    /// A tool kept breaking its contract (e.g. output schema) after repair.
    UnrecoverableToolContract,
    /// The run was cancelled.
    Cancelled,
    /// The run failed (model error, policy stop).
    Failed,
}

impl EndState {
    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::ClarifyNeeded => "clarify_needed",
            Self::BudgetExceeded => "budget_exceeded",
            Self::UnrecoverableToolContract => "unrecoverable_tool_contract",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }

    /// The process exit code the `keel` CLI uses for this end state.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Done => 0,
            Self::Failed => 1,
            Self::ClarifyNeeded => 3,
            Self::BudgetExceeded => 4,
            Self::UnrecoverableToolContract => 5,
            Self::Cancelled => 130,
        }
    }
}

impl std::fmt::Display for EndState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The next thing the runner must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action<'s> {
    /// Call the model with the state's messages (the runner adds the agent's system prompt
    /// and tool definitions). `turn` is the 1-based model call number in the run; a
    /// repeated turn number means the previous call never got its answer (e.g. a crash).
    CallModel {
        /// Model call number.
        turn: u32,
        /// A policy stopped the run: this call only summarizes for the user (tools
        /// disabled); the run ends after it with the policy's end state.
        final_summary: bool,
    },
    /// Settle these calls, in this order: run the approved or approval-free ones, report
    /// denied ones to the model as `denied`. Results must be appended in this order.
    ExecuteTools(Vec<&'s PendingCall>),
    /// Wait for a human decision on this call.
    AwaitApproval(&'s PendingCall),
    /// Wait for the user's answer.
    AwaitUser {
        /// The question.
        question: &'s str,
        /// Fields the agent cannot know.
        missing_fields: &'s [String],
    },
    /// End the run. Calls still unanswered must be answered (as cancelled) first so the
    /// thread never holds an orphan tool call.
    Finish {
        /// How it ends.
        end_state: EndState,
        /// Why, in words.
        reason: Option<String>,
        /// The final answer, if any.
        final_text: Option<String>,
    },
}

/// Decides the next action from the folded state.
pub fn decide(state: &RunState, now: DateTime<Utc>) -> Action<'_> {
    let Some(run) = state.run() else {
        return finish(
            EndState::Failed,
            Some("no run has been started on this thread".into()),
        );
    };
    if let Some(end_state) = run.ended {
        return Action::Finish {
            end_state,
            reason: None,
            final_text: run.final_text.clone(),
        };
    }
    if let Some(error) = &run.model_failed {
        return finish(
            EndState::Failed,
            Some(format!("model error: {}: {}", error.kind, error.message)),
        );
    }
    if let Some(waiting) = run
        .pending
        .iter()
        .find(|p| !p.finished && p.requires_approval && p.approval.is_none())
    {
        return Action::AwaitApproval(waiting);
    }
    if let Some((question, missing_fields)) = &run.awaiting_user {
        return Action::AwaitUser {
            question,
            missing_fields,
        };
    }
    let runnable: Vec<&PendingCall> = run.pending.iter().filter(|p| p.is_runnable()).collect();
    if !runnable.is_empty() {
        return Action::ExecuteTools(runnable);
    }
    if let Some((end_state, reason, _)) = &run.policy_stop {
        let stop = Action::Finish {
            end_state: *end_state,
            reason: Some(reason.clone()),
            final_text: run.final_text.clone(),
        };
        return match (run.summary_turn, run.model_outstanding) {
            (Some(_), false) => stop,
            (_, true) => Action::CallModel {
                turn: run.turns.max(1),
                final_summary: true,
            },
            (None, false) if run.budget.exceeded(&run.spent(now)).is_some() => stop,
            (None, false) => Action::CallModel {
                turn: run.turns.saturating_add(1),
                final_summary: true,
            },
        };
    }
    if run.model_outstanding {
        return Action::CallModel {
            turn: run.turns.max(1),
            final_summary: false,
        };
    }
    match state.messages().last() {
        None => finish(EndState::Failed, Some("the conversation is empty".into())),
        Some(last) if last.role == Role::Assistant && last.tool_calls().next().is_none() => {
            Action::Finish {
                end_state: EndState::Done,
                reason: None,
                final_text: Some(last.text()),
            }
        }
        Some(_) => match run.budget.exceeded(&run.spent(now)) {
            Some(reason) => Action::Finish {
                end_state: EndState::BudgetExceeded,
                reason: Some(reason),
                final_text: run.final_text.clone(),
            },
            None => Action::CallModel {
                turn: run.turns.saturating_add(1),
                final_summary: false,
            },
        },
    }
}

fn finish(end_state: EndState, reason: Option<String>) -> Action<'static> {
    Action::Finish {
        end_state,
        reason,
        final_text: None,
    }
}
