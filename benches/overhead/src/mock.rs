//! The loopback mock LLM used by the benchmark, run in its own process (`mock`
//! subcommand) so its CPU and memory are not counted against the client under test.
//!
//! Why not `keel_testkit::mock_llm`: its script is one global sequence of turns — every
//! request takes the next turn from a single shared counter (`next_turn.fetch_add` in
//! `crates/keel-testkit/src/mock_llm/mod.rs`, `handle`), whatever conversation it belongs
//! to. With 500 conversations in flight, requests of different conversations interleave,
//! so a conversation at its first request can be handed another's final text turn (or a
//! sixth tool call): no script makes each conversation see "5 tool calls, then text". It
//! also keeps every request (headers and parsed body) in an unbounded log. This mock is
//! stateless instead: it decides each answer from the request itself — the number of
//! `role: tool` messages already in the conversation — so any number of concurrent
//! conversations each get exactly their own sequence.
//!
//! Protocol: OpenAI Chat Completions streamed over SSE (what Keel's `openai:` provider
//! sends and reads). The first user message carries the plan: `tools=N` (tool turns before
//! the final answer, default 1) and `latency_ms=M` (wait before answering, default 0).

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// The tool every tool turn asks for, and its arguments.
pub const TOOL_NAME: &str = "calculator";
/// The calculator expression of every tool call.
pub const EXPRESSION: &str = "6*7";
/// The final answer text.
pub const FINAL_TEXT: &str = "6*7 = 42.";

/// The user message of a conversation with `tools` tool turns and `latency_ms` per request.
pub fn user_prompt(tools: u32, latency_ms: u64) -> String {
    format!("bench tools={tools} latency_ms={latency_ms}: what is {EXPRESSION}?")
}

/// Serves on 127.0.0.1:`port` (0 = any), prints `mock listening on PORT` on stdout, and
/// stops when stdin closes (the parent exited or dropped the pipe).
pub async fn serve(port: u16) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| anyhow::anyhow!("mock cannot listen on 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr()?;
    println!("mock listening on {}", addr.port());
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat));
    // A blocking thread watches stdin (tokio's async stdin needs a feature the workspace
    // does not enable).
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = [0_u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed.send(());
    });
    let stdin_closed = async {
        let _ = stdin_closed.await;
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(stdin_closed)
        .await
        .map_err(|e| anyhow::anyhow!("mock server failed: {e}"))
}

/// `key=value` from the first user message, parsed.
fn plan_value(body: &Value, key: &str) -> Option<u64> {
    let first_user = body
        .get("messages")?
        .as_array()?
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?
        .get("content")?
        .as_str()?;
    first_user
        .split(|c: char| c.is_whitespace() || c == ':')
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
}

async fn chat(raw: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        return (StatusCode::BAD_REQUEST, "request body is not JSON").into_response();
    };
    let tools = plan_value(&body, "tools").unwrap_or(1);
    let latency = plan_value(&body, "latency_ms").unwrap_or(0);
    let answered = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
                .count() as u64
        });
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock")
        .to_owned();
    let prompt_tokens = raw.len() / 4;
    let sse = if answered < tools {
        let call = json!({"index": 0, "id": format!("call_{answered}"), "type": "function",
            "function": {"name": TOOL_NAME,
                         "arguments": json!({"expression": EXPRESSION}).to_string()}});
        frames(
            &model,
            json!({"role": "assistant", "content": null, "tool_calls": [call]}),
            "tool_calls",
            prompt_tokens,
        )
    } else {
        frames(
            &model,
            json!({"role": "assistant", "content": FINAL_TEXT}),
            "stop",
            prompt_tokens,
        )
    };
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from(sse),
    )
        .into_response()
}

/// One answer as SSE frames: the delta, the finish reason, the usage chunk, `[DONE]`.
fn frames(model: &str, delta: Value, finish: &str, prompt_tokens: usize) -> String {
    let chunk = |choices: Value, usage: Value| {
        json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
               "model": model, "choices": choices, "usage": usage})
    };
    let parts = [
        chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
            Value::Null,
        ),
        chunk(
            json!([]),
            json!({"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                   "total_tokens": prompt_tokens + 12}),
        ),
    ];
    let mut out = String::new();
    for part in parts {
        out.push_str("data: ");
        out.push_str(&part.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}
