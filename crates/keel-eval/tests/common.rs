//! Builders for event logs shaped like the journal writes them.

use chrono::{TimeZone, Utc};
use keel_core::{
    Budget, EVENT_SCHEMA_VERSION, EndState, Event, EventKind, Message, Part, StopReason, ToolCall,
    ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind, Usage,
};
use serde_json::Value;

/// Appends events of one thread and run, numbered like the journal does.
pub struct Log {
    pub events: Vec<Event>,
    run: u32,
    turn: u32,
}

impl Log {
    pub fn new() -> Self {
        Self {
            events: Vec::new(),
            run: 0,
            turn: 0,
        }
    }

    pub fn push(&mut self, kind: EventKind) -> &mut Self {
        let seq = self.events.len() as u64;
        self.events.push(Event {
            v: EVENT_SCHEMA_VERSION,
            seq,
            ts: Utc.timestamp_opt(1_700_000_000 + seq as i64, 0).unwrap(),
            thread_id: "thread-1".into(),
            run_id: format!("run-{}", self.run).into(),
            trace_id: format!("{:032x}", self.run).into(),
            span_id: format!("{:016x}", seq + 1),
            kind,
        });
        self
    }

    pub fn start(&mut self, goal: &str) -> &mut Self {
        self.run += 1;
        self.push(EventKind::RunStarted {
            agent: "detective".into(),
            model: "mock:model".into(),
            goal: goal.into(),
            constraints: vec![],
            budget: Budget::default(),
            definition: None,
            parent_span_id: None,
        });
        self.push(EventKind::UserMessage {
            message: Message::user(goal),
        })
    }

    /// A model answer with text and tool calls `(id, name, arguments)`.
    pub fn answer(&mut self, text: &str, calls: &[(&str, &str, Value)]) -> &mut Self {
        self.turn += 1;
        let mut parts = Vec::new();
        if !text.is_empty() {
            parts.push(Part::Text { text: text.into() });
        }
        for (id, name, args) in calls {
            parts.push(Part::ToolCall(ToolCall {
                id: (*id).into(),
                name: (*name).into(),
                arguments: args.to_string(),
            }));
        }
        self.push(EventKind::ModelRequested {
            turn: self.turn,
            model: "mock:model".into(),
            message_count: 1,
            tool_count: 4,
            estimated_input_tokens: 100,
            provider: None,
            temperature: None,
            max_tokens: None,
            context_window: None,
        });
        self.push(EventKind::ModelResponded {
            turn: self.turn,
            message: Message {
                role: keel_core::Role::Assistant,
                parts,
            },
            usage: Usage {
                input_tokens: 100,
                output_tokens: 20,
                ..Usage::default()
            },
            latency_ms: 5,
            stop_reason: if calls.is_empty() {
                StopReason::EndTurn
            } else {
                StopReason::ToolUse
            },
            response_id: None,
            cost_usd: Some(0.001),
            first_token_ms: None,
        });
        for (id, name, args) in calls {
            self.push(EventKind::ToolCallRequested {
                call: ToolCall {
                    id: (*id).into(),
                    name: (*name).into(),
                    arguments: args.to_string(),
                },
                effect: None,
                requires_approval: false,
            });
        }
        self
    }

    fn outcome(&self, id: &str, name: &str, result: ToolResultKind) -> ToolOutcome {
        ToolOutcome {
            tool: name.into(),
            call_id: id.into(),
            thread_id: "thread-1".into(),
            run_id: format!("run-{}", self.run),
            attempts: 1,
            latency_ms: 3,
            repairs: vec![],
            result,
        }
    }

    pub fn ok(&mut self, id: &str, name: &str, data: Value) -> &mut Self {
        let outcome = self.outcome(
            id,
            name,
            ToolResultKind::Ok {
                data,
                schema_validated: true,
                truncated: false,
            },
        );
        self.finish_call(id, name, outcome)
    }

    pub fn fail(&mut self, id: &str, name: &str, code: ToolErrorCode, message: &str) -> &mut Self {
        let outcome = self.outcome(
            id,
            name,
            ToolResultKind::Error {
                code,
                message: message.into(),
                details: None,
            },
        );
        self.finish_call(id, name, outcome)
    }

    fn finish_call(&mut self, id: &str, name: &str, outcome: ToolOutcome) -> &mut Self {
        self.push(EventKind::tool_call_started(id, name));
        let content = outcome.render_for_model();
        self.push(EventKind::ToolCallFinished {
            result: std::sync::Arc::new(ToolResult {
                call_id: id.into(),
                name: name.into(),
                outcome,
                content,
            }),
        })
    }

    pub fn end(&mut self, end_state: EndState, final_text: Option<&str>) -> &mut Self {
        self.push(EventKind::RunEnded {
            end_state,
            reason: None,
            final_text: final_text.map(str::to_string),
        })
    }
}

/// A Detective-like run: the release, failing test results (500), a retry that succeeds,
/// the report filed, a final answer.
pub fn detective_run() -> Vec<Event> {
    let answer = "Release v2.1.0 is HIGH risk: coverage dropped from 84% to 71% and \
                  `test_checkout` is flaky. The test service was unavailable at first.";
    let mut log = Log::new();
    log.start("Assess release v2.1.0")
        .answer(
            "",
            &[(
                "c1",
                "get_release",
                serde_json::json!({"version": "v2.1.0"}),
            )],
        )
        .ok(
            "c1",
            "get_release",
            serde_json::json!({"version": "v2.1.0", "coverage": 71, "previous_coverage": 84}),
        )
        .answer(
            "",
            &[(
                "c2",
                "get_test_results",
                serde_json::json!({"version": "v2.1.0"}),
            )],
        )
        .fail(
            "c2",
            "get_test_results",
            ToolErrorCode::RetryableServer,
            "HTTP 500",
        )
        .answer(
            "",
            &[(
                "c3",
                "get_test_results",
                serde_json::json!({"version": "v2.1.0"}),
            )],
        )
        .ok(
            "c3",
            "get_test_results",
            serde_json::json!({"failed": ["test_checkout"], "flaky": ["test_checkout"]}),
        )
        .answer(
            "",
            &[(
                "c4",
                "file_risk_report",
                serde_json::json!({"severity": "high", "findings": ["coverage dropped"]}),
            )],
        )
        .ok("c4", "file_risk_report", serde_json::json!({"id": "r-1"}))
        .answer(answer, &[])
        .end(EndState::Done, Some(answer));
    log.events
}
