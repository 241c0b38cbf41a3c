//! A run as JSON: the object `keel run --output json` prints ([`outcome_json`], the same
//! keys and values), and [`run_json`], which also covers runs still going
//! (`status: "running"` or `"awaiting_user"`).

use keel_core::store::ThreadStatus;
use keel_core::{Event, EventKind};
use keel_runtime::{RunOutcome, RunStatus};
use serde_json::{Value, json};

/// The `keel run --output json` object of `outcome`.
pub fn outcome_json(outcome: &RunOutcome) -> Value {
    let (end_state, status) = match &outcome.status {
        RunStatus::Ended { end_state } => (json!(end_state), json!("ended")),
        RunStatus::AwaitingApproval { .. } => (Value::Null, json!("awaiting_approval")),
    };
    let mut usage = json!({
        "input_tokens": outcome.usage.input_tokens,
        "output_tokens": outcome.usage.output_tokens,
        "cache_read_tokens": outcome.usage.cache_read_tokens,
        "cache_write_tokens": outcome.usage.cache_write_tokens,
    });
    if let (Some(cost), Some(map)) = (outcome.cost_usd, usage.as_object_mut()) {
        map.insert("cost_usd".into(), json!(cost));
    }
    let mut object = json!({
        "thread_id": outcome.thread_id,
        "run_id": outcome.run_id,
        "trace_id": outcome.trace_id,
        "status": status,
        "end_state": end_state,
        "reason": outcome.reason,
        "final_text": outcome.final_text,
        "turns": outcome.turns,
        "tool_calls": outcome.tool_calls,
        "usage": usage,
        "action_item": outcome.action_item,
        "alert": outcome.alert,
        "clarification": outcome.clarification,
        "resumable": outcome.resumable,
    });
    if let (RunStatus::AwaitingApproval { call_id, tool }, Some(map)) =
        (&outcome.status, object.as_object_mut())
    {
        map.insert("awaiting".into(), json!({"call_id": call_id, "tool": tool}));
    }
    object
}

/// Where run `run_id` stands in `run_events` (its own events, in order).
#[derive(Debug, Clone, PartialEq)]
pub enum RunPosition {
    /// It ended (or paused for approval): its outcome.
    Settled(RunStatus),
    /// It waits for the user's answer to `question`.
    AwaitingUser(String),
    /// It is being driven, queued to continue, or was interrupted.
    Running,
}

/// Where the run of `run_events` stands.
pub fn position<E: std::borrow::Borrow<Event>>(run_events: &[E]) -> RunPosition {
    let mut status = ThreadStatus::Running;
    let mut pending: Option<(String, String)> = None;
    let mut question = String::new();
    for event in run_events.iter().map(std::borrow::Borrow::borrow) {
        status = ThreadStatus::after(status, &event.kind);
        match &event.kind {
            EventKind::ApprovalRequested { call_id, name, .. } => {
                pending = Some((call_id.clone(), name.clone()));
            }
            EventKind::UserAsked { question: q, .. } => question.clone_from(q),
            _ => {}
        }
    }
    match status {
        ThreadStatus::Ended(end_state) => RunPosition::Settled(RunStatus::Ended { end_state }),
        ThreadStatus::AwaitingApproval => match pending {
            Some((call_id, tool)) => {
                RunPosition::Settled(RunStatus::AwaitingApproval { call_id, tool })
            }
            None => RunPosition::Running,
        },
        ThreadStatus::AwaitingUser => RunPosition::AwaitingUser(question),
        ThreadStatus::Running => RunPosition::Running,
    }
}

/// Run `run_id` of client thread `thread_id` as JSON: [`outcome_json`]'s keys, with
/// `status` `running` or `awaiting_user` (and `awaiting.question`) for runs not settled.
pub fn run_json(thread_id: &str, run_id: &str, run_events: &[Event]) -> Value {
    let position = position(run_events);
    let status = match &position {
        RunPosition::Settled(status) => status.clone(),
        // A placeholder for the fold; the JSON's status is replaced below.
        _ => RunStatus::Ended {
            end_state: keel_core::EndState::Done,
        },
    };
    let outcome = RunOutcome::from_run_events(thread_id, run_id, run_events, status);
    let mut value = outcome_json(&outcome);
    if let Some(map) = value.as_object_mut() {
        match position {
            RunPosition::Settled(_) => {}
            RunPosition::AwaitingUser(question) => {
                map.insert("status".into(), json!("awaiting_user"));
                map.insert("end_state".into(), Value::Null);
                map.insert("awaiting".into(), json!({"question": question}));
            }
            RunPosition::Running => {
                map.insert("status".into(), json!("running"));
                map.insert("end_state".into(), Value::Null);
            }
        }
    }
    value
}

/// The events of run `run_id` in `events`.
pub fn run_events(events: &[Event], run_id: &str) -> Vec<Event> {
    events
        .iter()
        .filter(|e| &*e.run_id == run_id)
        .cloned()
        .collect()
}
