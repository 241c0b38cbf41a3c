//! Shared helpers: a builder of realistic synthetic runs made of keel-core events.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use chrono::{DateTime, Duration, TimeZone, Utc};
use keel_core::{
    Budget, EVENT_SCHEMA_VERSION, EndState, Event, EventKind, Message, Part, Role, StopReason,
    ToolCall, ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind, Usage,
};
use serde_json::json;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct RunBuilder {
    pub trace_id: String,
    pub run_id: String,
    pub thread_id: String,
    pub root_span: String,
    pub now: DateTime<Utc>,
    pub events: Vec<Event>,
    pub model: String,
    pub window: Option<u64>,
    turn: u32,
    span_counter: u64,
    n: u64,
}

impl RunBuilder {
    pub fn new(n: u64, agent: &str, model: &str, goal: &str) -> Self {
        let trace_id = format!(
            "{:032x}",
            0x4bf9_2f35_77b3_4da6_a3ce_0000_0000_0000u128 + u128::from(n)
        );
        let root_span = format!("{:016x}", 0x00f0_67aa_0ba9_0000u64 + n);
        let mut b = Self {
            trace_id,
            run_id: format!("run_{n:04}"),
            thread_id: format!("thr_{n:04}"),
            root_span,
            now: Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).unwrap() + Duration::seconds(n as i64),
            events: Vec::new(),
            model: model.to_string(),
            window: Some(200_000),
            turn: 0,
            span_counter: 0,
            n,
        };
        let root = b.root_span.clone();
        b.push_with_span(
            0,
            root,
            EventKind::RunStarted {
                agent: agent.into(),
                model: model.into(),
                goal: goal.into(),
                constraints: vec![],
                budget: Budget::default(),
                definition: None,
                parent_span_id: None,
            },
        );
        b
    }

    fn push_with_span(&mut self, advance_ms: i64, span_id: String, kind: EventKind) {
        self.now += Duration::milliseconds(advance_ms);
        self.events.push(Event {
            v: EVENT_SCHEMA_VERSION,
            seq: self.events.len() as u64,
            ts: self.now,
            thread_id: self.thread_id.to_string().into(),
            run_id: self.run_id.to_string().into(),
            trace_id: self.trace_id.to_string().into(),
            span_id,
            kind,
        });
    }

    pub fn push(&mut self, advance_ms: i64, kind: EventKind) {
        self.span_counter += 1;
        let span = format!(
            "{:016x}",
            0x0a00_0000_0000_0000u64 + (self.n << 24) + self.span_counter
        );
        self.push_with_span(advance_ms, span, kind);
    }

    pub fn user(&mut self, text: &str) -> &mut Self {
        self.push(
            1,
            EventKind::UserMessage {
                message: Message::user(text),
            },
        );
        self
    }

    pub fn request(&mut self, advance_ms: i64) -> u32 {
        self.turn += 1;
        let model = self.model.clone();
        self.push(
            advance_ms,
            EventKind::ModelRequested {
                turn: self.turn,
                model,
                message_count: 2,
                tool_count: 3,
                estimated_input_tokens: 1200,
                provider: None,
                temperature: Some(0.2),
                max_tokens: Some(1024),
                context_window: self.window,
            },
        );
        self.turn
    }

    /// A model answer; `calls` are (id, name, arguments).
    pub fn respond(
        &mut self,
        latency_ms: u64,
        text: &str,
        calls: &[(&str, &str, &str)],
        usage: (u64, u64),
        cost: f64,
    ) -> &mut Self {
        let mut parts = Vec::new();
        if !text.is_empty() {
            parts.push(Part::Text { text: text.into() });
        }
        for (id, name, args) in calls {
            parts.push(Part::ToolCall(ToolCall {
                id: (*id).into(),
                name: (*name).into(),
                arguments: (*args).into(),
            }));
        }
        let turn = self.turn;
        self.push(
            latency_ms as i64,
            EventKind::ModelResponded {
                turn,
                message: Message {
                    role: Role::Assistant,
                    parts,
                },
                usage: Usage {
                    input_tokens: usage.0,
                    output_tokens: usage.1,
                    cache_read_tokens: 0,
                    cache_write_tokens: 0,
                },
                latency_ms,
                stop_reason: if calls.is_empty() {
                    StopReason::EndTurn
                } else {
                    StopReason::ToolUse
                },
                response_id: Some(format!("msg_{}_{turn}", self.run_id)),
                cost_usd: Some(cost),
                first_token_ms: None,
            },
        );
        for (id, name, args) in calls {
            self.push(
                1,
                EventKind::ToolCallRequested {
                    call: ToolCall {
                        id: (*id).into(),
                        name: (*name).into(),
                        arguments: (*args).into(),
                    },
                    effect: Some(keel_core::Effect::ReadOnly),
                    requires_approval: false,
                },
            );
        }
        self
    }

    /// Runs a tool call: started, optional retries, finished.
    pub fn tool(
        &mut self,
        id: &str,
        name: &str,
        latency_ms: u64,
        attempts: u32,
        error: Option<ToolErrorCode>,
        content: &str,
    ) -> &mut Self {
        self.push(1, EventKind::tool_call_started(id, name));
        for attempt in 1..attempts {
            self.push(
                0,
                EventKind::Retry {
                    scope: "tool".into(),
                    attempt,
                    class: "timeout".into(),
                    wait_ms: 10,
                    call_id: Some(id.into()),
                },
            );
        }
        let result = match error {
            None => ToolResultKind::Ok {
                data: json!({ "text": content }),
                schema_validated: true,
                truncated: false,
            },
            Some(code) => ToolResultKind::Error {
                code,
                message: format!("{name} failed: {content}"),
                details: None,
            },
        };
        let outcome = ToolOutcome {
            tool: name.into(),
            call_id: id.into(),
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            attempts,
            latency_ms,
            repairs: Vec::new(),
            result,
        };
        let content = outcome.render_for_model();
        self.push(
            latency_ms as i64,
            EventKind::ToolCallFinished {
                result: std::sync::Arc::new(ToolResult {
                    call_id: id.into(),
                    name: name.into(),
                    outcome,
                    content,
                }),
            },
        );
        self
    }

    pub fn end(&mut self, state: EndState, final_text: Option<&str>) -> Vec<Event> {
        self.push(
            2,
            EventKind::RunEnded {
                end_state: state,
                reason: (state != EndState::Done).then(|| format!("ended {state}")),
                final_text: final_text.map(str::to_string),
            },
        );
        self.events.clone()
    }
}

/// The Must-show run: RunStarted, UserMessage, ModelRequested, ModelResponded with a tool
/// call, ToolCallStarted, ToolCallFinished, second model call, RunEnded.
pub fn tool_using_run(n: u64) -> RunBuilder {
    let mut b = RunBuilder::new(
        n,
        "detective",
        "anthropic:claude-sonnet-4",
        "Assess the risk of release v2.3.1",
    );
    b.user("Is release v2.3.1 safe to ship?");
    b.request(3);
    b.respond(
        1200,
        "Let me look at the release.",
        &[("call_1", "get_release", r#"{"version":"v2.3.1"}"#)],
        (1534, 214),
        0.0078,
    );
    b.tool(
        "call_1",
        "get_release",
        300,
        1,
        None,
        "3 commits, 1 migration, tests green",
    );
    b.request(2);
    b.respond(
        900,
        "Risk: low. One migration, all tests pass.",
        &[],
        (1820, 95),
        0.0069,
    );
    b
}

/// Every request a receiver got: (path, body).
pub type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A loopback OTLP/HTTP receiver that keeps every request's path and body.
pub async fn otlp_receiver() -> (u16, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::clone(&bodies);
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_otlp_http(sock, Arc::clone(&store)));
        }
    });
    (port, bodies)
}

/// Serves OTLP/HTTP requests on one connection (plain or TLS), keeping path and body.
pub async fn serve_otlp_http<S>(mut sock: S, store: Received)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    loop {
        // Read one request: headers, then Content-Length bytes.
        let header_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            let n = sock.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        while buf.len() < header_end + len {
            let mut chunk = [0u8; 8192];
            let n = sock.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        store
            .lock()
            .unwrap()
            .push((path, buf[header_end..header_end + len].to_vec()));
        buf.drain(..header_end + len);
        let reply =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if sock.write_all(reply).await.is_err() {
            return;
        }
        if sock.flush().await.is_err() {
            return;
        }
    }
}
