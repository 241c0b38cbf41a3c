//! The load client: many concurrent streaming requests from one `reqwest` client (a
//! connection pool as large as the concurrency), each recording when every Server-Sent
//! Event arrived, measured from the moment its request was sent.
//!
//! - [`chat`]: `POST /v1/chat` with `stream: true` against `keel serve`.
//! - [`mock_stream`]: the same answer asked of `keel mock-llm` directly (OpenAI Chat
//!   Completions, streamed), the baseline the server's figures are compared with.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Client;
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};
use sse_stream::SseStream;
use tokio::sync::Semaphore;

/// The agent of the benchmark's keel.toml.
pub const AGENT: &str = "bench";

/// The model name the baseline requests carry (any name: the mock answers every model).
pub const MOCK_MODEL: &str = "gpt-4.1-mini";

/// The HTTP client: a pool as large as the concurrency, no proxy, Nagle off.
pub fn http_client(concurrency: usize) -> anyhow::Result<Client> {
    Ok(Client::builder()
        .pool_max_idle_per_host(concurrency)
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(30))
        .build()?)
}

/// What one SSE event of a chat stream was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A stored event (`id:` = its sequence number), by type.
    Stored {
        /// `event:` (`run_started`, `model_responded`, …).
        name: String,
        /// `id:`.
        seq: u64,
    },
    /// A `text_delta` (not stored, no id): its text.
    Delta {
        /// `text`.
        text: String,
    },
    /// The final `outcome`; whether the run ended `done`.
    Outcome {
        /// `status` is `ended` and `end_state` is `done`.
        done: bool,
    },
}

/// One event and when it arrived (since the request was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// Since the request was sent.
    pub at: Duration,
    /// What it was.
    pub kind: Kind,
}

/// One chat stream.
#[derive(Debug, Clone, Default)]
pub struct ChatTimeline {
    /// The response's status, once received.
    pub status: Option<u16>,
    /// When the response's headers arrived (the run was queued), since the request.
    pub headers: Option<Duration>,
    /// Why the stream failed (transport, timeout, bad status, unparsable event).
    pub error: Option<String>,
    /// Every event, in order.
    pub arrivals: Vec<Arrival>,
    /// When the stream ended (since the request was sent).
    pub end: Duration,
}

/// One answer streamed by the mock directly.
#[derive(Debug, Clone, Default)]
pub struct MockTimeline {
    /// Why it failed.
    pub error: Option<String>,
    /// When each text chunk arrived (since the request was sent), with the answer's length
    /// in bytes up to and including it.
    pub chunks: Vec<(usize, Duration)>,
    /// When `data: [DONE]` arrived.
    pub done: Option<Duration>,
}

/// Runs `count` calls of `each` (given their index), `concurrency` at a time; returns
/// their results in index order and the wall time from the first start to the last end.
pub async fn run_many<T, F, Fut>(count: usize, concurrency: usize, each: F) -> (Vec<T>, Duration)
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for index in 0..count {
        let permits = permits.clone();
        let work = each(index);
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await.ok();
            work.await
        }));
    }
    let mut out = Vec::with_capacity(count);
    for task in tasks {
        if let Ok(value) = task.await {
            out.push(value);
        }
    }
    (out, started.elapsed())
}

/// One streaming chat against `keel serve` at `base` (`http://ADDR`).
pub async fn chat(
    client: Client,
    base: String,
    key: String,
    index: usize,
    timeout: Duration,
) -> ChatTimeline {
    let mut timeline = ChatTimeline::default();
    let sent = Instant::now();
    let body = json!({
        "agent": AGENT,
        "message": format!("Chat {index}: tell me about the weather."),
        "stream": true,
    });
    let request = client
        .post(format!("{base}/v1/chat"))
        .bearer_auth(key)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(timeout);
    let read = async {
        let response = request.send().await.map_err(|e| format!("send: {e}"))?;
        let status = response.status();
        timeline.status = Some(status.as_u16());
        timeline.headers = Some(sent.elapsed());
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {text}"));
        }
        let mut events = SseStream::from_bytes_stream(response.bytes_stream());
        while let Some(item) = events.next().await {
            let at = sent.elapsed();
            let event = item.map_err(|e| format!("stream: {e}"))?;
            let Some(name) = event.event else { continue };
            let kind = match name.as_str() {
                "text_delta" => Kind::Delta {
                    text: event
                        .data
                        .as_deref()
                        .and_then(|d| serde_json::from_str::<Value>(d).ok())
                        .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_string))
                        .ok_or_else(|| "text_delta without a text".to_string())?,
                },
                "outcome" => {
                    let value: Value = event
                        .data
                        .as_deref()
                        .and_then(|d| serde_json::from_str(d).ok())
                        .unwrap_or(Value::Null);
                    Kind::Outcome {
                        done: value.get("status").and_then(Value::as_str) == Some("ended")
                            && value.get("end_state").and_then(Value::as_str) == Some("done"),
                    }
                }
                _ => {
                    let seq = event
                        .id
                        .as_deref()
                        .and_then(|id| id.parse().ok())
                        .ok_or_else(|| format!("event {name} without a numeric id"))?;
                    Kind::Stored { name, seq }
                }
            };
            timeline.arrivals.push(Arrival { at, kind });
        }
        Ok(())
    };
    let result = tokio::time::timeout(timeout + Duration::from_secs(5), read).await;
    timeline.end = sent.elapsed();
    timeline.error = match result {
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(format!("no end after {timeout:?}")),
    };
    timeline
}

/// One streamed answer asked of the mock at `base` directly (the request `keel serve`'s
/// provider would send: system prompt, user message, usage in the stream).
pub async fn mock_stream(
    client: Client,
    base: String,
    instructions: String,
    index: usize,
    timeout: Duration,
) -> MockTimeline {
    let mut timeline = MockTimeline::default();
    let sent = Instant::now();
    let body = json!({
        "model": MOCK_MODEL,
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": instructions},
            {"role": "user", "content": format!("Chat {index}: tell me about the weather.")},
        ],
    });
    let request = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sk-mock")
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(timeout);
    let read = async {
        let response = request.send().await.map_err(|e| format!("send: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        let mut events = SseStream::from_bytes_stream(response.bytes_stream());
        while let Some(item) = events.next().await {
            let at = sent.elapsed();
            let event = item.map_err(|e| format!("stream: {e}"))?;
            let Some(data) = event.data else { continue };
            if data.trim() == "[DONE]" {
                timeline.done = Some(at);
                continue;
            }
            let value: Value =
                serde_json::from_str(&data).map_err(|e| format!("chunk is not JSON: {e}"))?;
            let text = value
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !text.is_empty() {
                let before = timeline.chunks.last().map_or(0, |(len, _)| *len);
                timeline.chunks.push((before + text.len(), at));
            }
        }
        Ok(())
    };
    timeline.error = match tokio::time::timeout(timeout + Duration::from_secs(5), read).await {
        Ok(Ok(())) if timeline.done.is_none() => Some("no [DONE]".to_string()),
        Ok(Ok(())) => None,
        Ok(Err(error)) => Some(error),
        Err(_) => Some(format!("no end after {timeout:?}")),
    };
    timeline
}
