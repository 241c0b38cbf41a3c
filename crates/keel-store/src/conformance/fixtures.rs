//! Events used by the conformance cases: every field populated, awkward text included.

use chrono::{DateTime, Duration, TimeZone, Utc};
use keel_core::event::{Event, EventKind, ModelFailure};
use keel_core::model::{ModelErrorKind, StopReason};
use keel_core::tool::Effect;
use keel_core::{Budget, EndState, Message, ToolCall, Usage};

/// A fixed base time with nanosecond digits (so precision loss is detected).
pub fn base_time() -> DateTime<Utc> {
    Utc.timestamp_opt(1_735_689_600, 123_456_789)
        .single()
        .unwrap_or_default()
}

/// `base_time() + ms` milliseconds (+ `ms` nanoseconds, to keep odd digits).
pub fn at(ms: i64) -> DateTime<Utc> {
    base_time() + Duration::milliseconds(ms) + Duration::nanoseconds(ms % 997)
}

/// An event on `thread` at `seq`, recorded at `at(ms)`.
pub fn event(thread: &str, seq: u64, ms: i64, kind: EventKind) -> Event {
    Event {
        v: keel_core::EVENT_SCHEMA_VERSION,
        seq,
        ts: at(ms),
        thread_id: thread.into(),
        run_id: format!("run-{thread}").into(),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        span_id: "b7ad6b7169203331".into(),
        kind,
    }
}

/// A notice (status-neutral).
pub fn notice(code: &str, message: &str) -> EventKind {
    EventKind::Notice {
        code: code.into(),
        message: message.into(),
        data: None,
    }
}

/// A `run_started` for `agent`.
pub fn run_started(agent: &str) -> EventKind {
    EventKind::RunStarted {
        agent: agent.into(),
        model: "mock:model".into(),
        goal: "assess release 1.2".into(),
        constraints: vec!["no network".into()],
        budget: Budget::unlimited().with_max_turns(7),
        definition: None,
        parent_span_id: None,
    }
}

/// A `run_ended`.
pub fn run_ended(end_state: EndState) -> EventKind {
    EventKind::RunEnded {
        end_state,
        reason: Some("finished".into()),
        final_text: Some("done".into()),
    }
}

/// An event kind from its JSON form (a notice saying what failed when it does not parse,
/// which then fails the round-trip comparison loudly).
fn json_kind(value: serde_json::Value) -> EventKind {
    serde_json::from_value(value.clone()).unwrap_or_else(|e| {
        notice(
            "fixture_invalid",
            &format!("fixture {value} does not parse: {e}"),
        )
    })
}

/// A log touching many event kinds and awkward values (unicode, NUL, quotes, big numbers).
pub fn rich_log(thread: &str) -> Vec<Event> {
    let call = ToolCall {
        id: "call_1".into(),
        name: "deploy".into(),
        arguments: "{\"env\":\"prod\"".into(),
    };
    let kinds = vec![
        run_started("detective"),
        EventKind::UserMessage {
            message: Message::user("héllo ✓ \"quoted\" \\ back\u{0}nul \u{1F600}"),
        },
        // Built from JSON so fields added later (with serde defaults) do not break the suite.
        json_kind(serde_json::json!({
            "type": "model_requested", "turn": 1, "model": "mock:model", "message_count": 2,
            "tool_count": 3, "estimated_input_tokens": u64::from(u32::MAX) + 17,
            "provider": "mock", "temperature": 0.25, "max_tokens": 512, "context_window": 200_000
        })),
        json_kind(serde_json::json!({
            "type": "model_responded", "turn": 1,
            "message": serde_json::to_value(Message::assistant("I will deploy.")).unwrap_or_default(),
            "usage": serde_json::to_value(Usage { input_tokens: 120, output_tokens: 33, cache_read_tokens: 5, cache_write_tokens: 1 }).unwrap_or_default(),
            "latency_ms": 42, "stop_reason": serde_json::to_value(StopReason::ToolUse).unwrap_or_default(),
            "response_id": "resp_1", "cost_usd": 0.000_123_456_789_012_3
        })),
        EventKind::ToolCallRequested {
            call: call.clone(),
            effect: Some(Effect::Mutating),
            requires_approval: true,
        },
        EventKind::ApprovalRequested {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        },
        EventKind::ApprovalDenied {
            call_id: call.id.clone(),
            reason: Some("not today".into()),
            by: Some("key:k1".into()),
        },
        EventKind::ModelFailed {
            turn: 2,
            error: ModelFailure {
                kind: ModelErrorKind::RateLimited,
                message: "slow down".into(),
                status: Some(429),
            },
        },
        EventKind::UserAsked {
            question: "Which env?".into(),
            missing_fields: vec!["env".into()],
        },
        EventKind::UserAnswered {
            answer: "staging".into(),
        },
        EventKind::Notice {
            code: "history_trimmed".into(),
            message: "tab\there".into(),
            data: Some(
                serde_json::json!({"dropped": 3, "nested": {"f": 1.5, "neg": -2, "list": [null, true]}}),
            ),
        },
        run_ended(EndState::Done),
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| event(thread, i as u64, i as i64, kind))
        .collect()
}
