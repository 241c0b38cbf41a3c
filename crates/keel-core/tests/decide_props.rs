//! Property tests of the pure run loop: for any sequence of model responses (and noise
//! such as duplicate or orphan tool results), driving `decide` terminates within the
//! budget, never puts a tool result without its call in the context, and answers every
//! tool call exactly once.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::{HashMap, HashSet};

use chrono::{Duration, Utc};
use keel_core::event::{Event, EventKind};
use keel_core::{
    Action, Budget, EVENT_SCHEMA_VERSION, EndState, Message, Part, Role, RunState, StopReason,
    ToolCall, ToolOutcome, ToolResult, ToolResultKind, Usage, decide,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Response {
    text: Option<String>,
    calls: Vec<(String, bool)>, // (tool name, requires approval)
}

#[derive(Debug, Clone)]
struct Noise {
    duplicate_result: bool,
    orphan_result: bool,
    deny_approvals: bool,
}

fn response() -> impl Strategy<Value = Response> {
    (
        proptest::option::of("[a-z ]{0,12}"),
        proptest::collection::vec(
            (prop_oneof!["calc", "search", "write"], any::<bool>()),
            0..4,
        ),
    )
        .prop_map(|(text, calls)| Response { text, calls })
}

struct Sim {
    state: RunState,
    seq: u64,
    now: chrono::DateTime<Utc>,
    log: Vec<Event>,
}

impl Sim {
    fn push(&mut self, kind: EventKind) {
        let event = Event {
            v: EVENT_SCHEMA_VERSION,
            seq: self.seq,
            ts: self.now,
            thread_id: "thr".into(),
            run_id: "run".into(),
            trace_id: "0".repeat(32).into(),
            span_id: "0".repeat(16),
            kind,
        };
        self.seq += 1;
        self.now += Duration::milliseconds(5);
        self.state.apply(&event);
        self.log.push(event);
    }
}

fn result_for(call: &ToolCall, ok: bool) -> EventKind {
    let outcome = ToolOutcome {
        tool: call.name.clone(),
        call_id: call.id.clone(),
        thread_id: "thr".into(),
        run_id: "run".into(),
        attempts: 1,
        latency_ms: 1,
        repairs: Vec::new(),
        result: if ok {
            ToolResultKind::Ok {
                data: serde_json::json!({"v": 1}),
                schema_validated: true,
                truncated: false,
            }
        } else {
            ToolResultKind::Error {
                code: keel_core::ToolErrorCode::Denied,
                message: "denied".into(),
                details: None,
            }
        },
    };
    let content = outcome.render_for_model();
    EventKind::ToolCallFinished {
        result: std::sync::Arc::new(ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            outcome,
            content,
        }),
    }
}

/// Drives a simulated run; returns the end state, the number of model calls and the log.
fn drive(responses: &[Response], max_turns: u32, noise: &Noise) -> (EndState, u32, Sim) {
    let started = Utc::now();
    let mut sim = Sim {
        state: RunState::new("thr"),
        seq: 0,
        now: started,
        log: Vec::new(),
    };
    sim.push(EventKind::RunStarted {
        agent: "a".into(),
        model: "m".into(),
        goal: "g".into(),
        constraints: vec![],
        budget: Budget::unlimited().with_max_turns(max_turns),
        definition: None,
        parent_span_id: None,
    });
    sim.push(EventKind::UserMessage {
        message: Message::user("go"),
    });
    let mut model_calls = 0u32;
    for _ in 0..10_000 {
        let action = decide(&sim.state, sim.now);
        match action {
            Action::CallModel { turn, .. } => {
                model_calls += 1;
                sim.push(EventKind::ModelRequested {
                    turn,
                    model: "m".into(),
                    message_count: 0,
                    tool_count: 0,
                    estimated_input_tokens: 0,
                    provider: None,
                    temperature: None,
                    max_tokens: None,
                    context_window: None,
                });
                let index = (turn as usize).saturating_sub(1);
                let response = responses.get(index).cloned().unwrap_or(Response {
                    text: Some("done".into()),
                    calls: vec![],
                });
                let mut parts = Vec::new();
                if let Some(text) = &response.text {
                    parts.push(Part::Text { text: text.clone() });
                }
                let calls: Vec<(ToolCall, bool)> = response
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, approval))| {
                        (
                            ToolCall {
                                id: format!("c{turn}_{i}"),
                                name: name.clone(),
                                arguments: "{}".into(),
                            },
                            *approval,
                        )
                    })
                    .collect();
                parts.extend(calls.iter().map(|(call, _)| Part::ToolCall(call.clone())));
                if parts.is_empty() {
                    parts.push(Part::Text {
                        text: String::new(),
                    });
                }
                sim.push(EventKind::ModelResponded {
                    turn,
                    message: Message {
                        role: Role::Assistant,
                        parts,
                    },
                    usage: Usage {
                        input_tokens: 10,
                        output_tokens: 5,
                        ..Usage::default()
                    },
                    latency_ms: 1,
                    stop_reason: StopReason::EndTurn,
                    response_id: None,
                    cost_usd: None,
                    first_token_ms: None,
                });
                for (call, approval) in calls {
                    sim.push(EventKind::ToolCallRequested {
                        call,
                        effect: None,
                        requires_approval: approval,
                    });
                }
            }
            Action::ExecuteTools(calls) => {
                let calls: Vec<(ToolCall, Option<bool>)> =
                    calls.iter().map(|p| (p.call.clone(), p.approval)).collect();
                for (call, approval) in &calls {
                    sim.push(EventKind::tool_call_started(
                        call.id.clone(),
                        call.name.clone(),
                    ));
                    sim.push(result_for(call, *approval != Some(false)));
                    if noise.duplicate_result {
                        sim.push(result_for(call, true));
                    }
                }
                if noise.orphan_result {
                    let orphan = ToolCall {
                        id: format!("orphan_{}", sim.seq),
                        name: "calc".into(),
                        arguments: "{}".into(),
                    };
                    sim.push(result_for(&orphan, true));
                }
            }
            Action::AwaitApproval(pending) => {
                let call_id = pending.call.id.clone();
                if noise.deny_approvals {
                    sim.push(EventKind::ApprovalDenied {
                        call_id,
                        reason: Some("no".into()),
                        by: None,
                    });
                } else {
                    sim.push(EventKind::ApprovalGranted { call_id, by: None });
                }
            }
            Action::AwaitUser { .. } => sim.push(EventKind::UserAnswered {
                answer: "ok".into(),
            }),
            Action::Finish {
                end_state,
                reason,
                final_text,
            } => {
                let unanswered: Vec<ToolCall> = sim
                    .state
                    .unanswered_calls()
                    .map(|p| p.call.clone())
                    .collect();
                for call in &unanswered {
                    sim.push(result_for(call, false));
                }
                sim.push(EventKind::RunEnded {
                    end_state,
                    reason,
                    final_text,
                });
                return (end_state, model_calls, sim);
            }
        }
    }
    panic!("the run did not terminate within 10,000 decisions");
}

/// Every tool result follows its call, and every call is answered exactly once before the
/// next assistant message (or by the end).
fn assert_no_orphans(messages: &[Message]) {
    let mut open: HashSet<String> = HashSet::new();
    let mut answered: HashMap<String, u32> = HashMap::new();
    for message in messages {
        match message.role {
            Role::Assistant => {
                assert!(
                    open.is_empty(),
                    "calls {open:?} unanswered before the next assistant message"
                );
                for call in message.tool_calls() {
                    open.insert(call.id.clone());
                }
            }
            _ => {
                for result in message.tool_results() {
                    assert!(
                        open.remove(&result.call_id),
                        "result for {} has no open call",
                        result.call_id
                    );
                    *answered.entry(result.call_id.clone()).or_default() += 1;
                }
            }
        }
    }
    assert!(open.is_empty(), "calls {open:?} never answered");
    assert!(answered.values().all(|count| *count == 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn terminates_within_budget_and_answers_every_call_once(
        responses in proptest::collection::vec(response(), 0..30),
        max_turns in 1u32..12,
        duplicate_result in any::<bool>(),
        orphan_result in any::<bool>(),
        deny_approvals in any::<bool>(),
    ) {
        let noise = Noise { duplicate_result, orphan_result, deny_approvals };
        let (end_state, model_calls, sim) = drive(&responses, max_turns, &noise);
        prop_assert!(model_calls <= max_turns, "{model_calls} model calls with max_turns {max_turns}");
        prop_assert!(matches!(end_state, EndState::Done | EndState::BudgetExceeded), "unexpected end {end_state:?}");
        if end_state == EndState::BudgetExceeded {
            prop_assert_eq!(model_calls, max_turns);
        }
        assert_no_orphans(sim.state.messages());
        // Rebuilding the state from the log gives the same state (resume is the same fold).
        let rebuilt = RunState::from_events("thr", &sim.log);
        prop_assert_eq!(&rebuilt, &sim.state);
    }
}

#[test]
fn denied_calls_are_answered_as_data_and_the_run_continues() {
    let responses = vec![
        Response {
            text: None,
            calls: vec![("write".into(), true)],
        },
        Response {
            text: Some("ok".into()),
            calls: vec![],
        },
    ];
    let noise = Noise {
        duplicate_result: false,
        orphan_result: false,
        deny_approvals: true,
    };
    let (end_state, calls, sim) = drive(&responses, 5, &noise);
    assert_eq!(end_state, EndState::Done);
    assert_eq!(calls, 2);
    let denied = sim
        .state
        .messages()
        .iter()
        .flat_map(|m| m.tool_results())
        .next()
        .unwrap();
    assert!(denied.is_error());
}

#[test]
fn wall_clock_budget_ends_the_run() {
    let mut state = RunState::new("thr");
    let start = Utc::now();
    let event = |seq, kind| Event {
        v: EVENT_SCHEMA_VERSION,
        seq,
        ts: start,
        thread_id: "thr".into(),
        run_id: "run".into(),
        trace_id: String::new().into(),
        span_id: String::new(),
        kind,
    };
    let budget = Budget {
        max_wall_clock_ms: Some(1_000),
        ..Budget::unlimited()
    };
    state.apply(&event(
        0,
        EventKind::RunStarted {
            agent: "a".into(),
            model: "m".into(),
            goal: "g".into(),
            constraints: vec![],
            budget,
            definition: None,
            parent_span_id: None,
        },
    ));
    state.apply(&event(
        1,
        EventKind::UserMessage {
            message: Message::user("hi"),
        },
    ));
    assert!(matches!(
        decide(&state, start),
        Action::CallModel { turn: 1, .. }
    ));
    match decide(&state, start + Duration::seconds(2)) {
        Action::Finish {
            end_state: EndState::BudgetExceeded,
            reason: Some(reason),
            ..
        } => {
            assert!(reason.contains("max_wall_clock"), "{reason}");
        }
        other => panic!("expected budget_exceeded, got {other:?}"),
    }
}
