//! Shared helpers for the provider tests: a mock server, a model pointed at it with a
//! virtual clock, and a standard request.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keel_core::{
    Message, Model, ModelError, ModelRequest, Part, Role, StreamEvent, ToolCall, ToolChoice,
    ToolDefinition, ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind,
};
use keel_providers::{Jitter, ProviderOptions, RecordingSleeper, RetryConfig};
use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn};
use serde_json::json;

/// The five providers with a model name each.
pub const PROVIDERS: [(&str, &str); 5] = [
    ("anthropic", "claude-sonnet-4-5"),
    ("openai", "gpt-4o-mini"),
    ("openai-responses", "gpt-4o-mini"),
    ("openrouter", "openai/gpt-4o-mini"),
    ("ollama", "llama3.1"),
];

/// A mock server, a model pointed at it, and the virtual clock of its retries.
pub struct Harness {
    pub server: MockLlmServer,
    pub model: Arc<dyn Model>,
    pub clock: RecordingSleeper,
}

pub fn retry_config() -> RetryConfig {
    RetryConfig {
        max_attempts: 3,
        initial_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(5),
        factor: 2.0,
        jitter: Jitter::None,
        max_retry_after: Duration::from_secs(60),
    }
}

pub async fn harness(provider: &str, model: &str, turns: Vec<MockTurn>) -> Harness {
    harness_with(provider, model, MockScript::new(turns), retry_config()).await
}

pub async fn harness_with(
    provider: &str,
    model: &str,
    script: MockScript,
    retry: RetryConfig,
) -> Harness {
    let server = MockLlmServer::start(script)
        .await
        .expect("mock server starts");
    let clock = RecordingSleeper::new();
    let options = ProviderOptions {
        base_url: Some(server.base_url()),
        api_key: Some("test-key".into()),
        retry,
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(10),
        loopback_only: true,
        sleeper: Some(Arc::new(clock.clone())),
        ..ProviderOptions::default()
    };
    let spec = format!("{provider}:{model}");
    let model =
        keel_providers::model_from_spec_with_env(&spec, &options, &|_| None).expect("model builds");
    Harness {
        server,
        model,
        clock,
    }
}

pub fn calculator() -> ToolDefinition {
    ToolDefinition {
        name: "calculator".into(),
        description: "Evaluates an arithmetic expression.".into(),
        input_schema: json!({"type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}},
            "required": ["expression"]}),
    }
}

pub fn clock_tool() -> ToolDefinition {
    ToolDefinition {
        name: "clock".into(),
        description: "Tells the time.".into(),
        input_schema: json!({"type": "object", "properties": {}}),
    }
}

pub fn user(text: &str) -> Vec<Message> {
    vec![Message::user(text)]
}

/// Runs a request and collects every event, stopping at the first error.
pub async fn collect(
    model: &dyn Model,
    request: ModelRequest<'_>,
) -> (Vec<StreamEvent>, Option<ModelError>) {
    let mut stream = model.stream(request);
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => events.push(event),
            Err(error) => return (events, Some(error)),
        }
    }
    (events, None)
}

pub fn text_of(events: &[StreamEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

pub fn calls_of(events: &[StreamEvent]) -> Vec<ToolCall> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn outcome(call_id: &str, result: ToolResultKind) -> ToolOutcome {
    ToolOutcome {
        tool: "calculator".into(),
        call_id: call_id.into(),
        thread_id: "thr_test".into(),
        run_id: "run_test".into(),
        attempts: 1,
        latency_ms: 3,
        repairs: vec![],
        result,
    }
}

/// A conversation that exercises every part type: user text, an assistant turn with text
/// and two tool calls, and two tool results (one success, one error).
pub fn conversation() -> Vec<Message> {
    let ok = outcome(
        "call_a",
        ToolResultKind::Ok {
            data: json!(14),
            schema_validated: true,
            truncated: false,
        },
    );
    let err = outcome(
        "call_b",
        ToolResultKind::Error {
            code: ToolErrorCode::InvalidInput,
            message: "division by zero".into(),
            details: None,
        },
    );
    vec![
        Message::user("what is 2*(3+4) and 1/0?"),
        Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text {
                    text: "Let me compute both.".into(),
                },
                Part::ToolCall(ToolCall {
                    id: "call_a".into(),
                    name: "calculator".into(),
                    arguments: r#"{"expression":"2*(3+4)"}"#.into(),
                }),
                Part::ToolCall(ToolCall {
                    id: "call_b".into(),
                    name: "calculator".into(),
                    arguments: r#"{"expression":"1/0"}"#.into(),
                }),
            ],
        },
        Message {
            role: Role::Tool,
            parts: vec![
                Part::ToolResult(std::sync::Arc::new(ToolResult {
                    call_id: "call_a".into(),
                    name: "calculator".into(),
                    content: ok.render_for_model(),
                    outcome: ok,
                })),
                Part::ToolResult(std::sync::Arc::new(ToolResult {
                    call_id: "call_b".into(),
                    name: "calculator".into(),
                    content: err.render_for_model(),
                    outcome: err,
                })),
            ],
        },
    ]
}

pub static FORCE_CALCULATOR: std::sync::LazyLock<ToolChoice> =
    std::sync::LazyLock::new(|| ToolChoice::Tool("calculator".into()));
