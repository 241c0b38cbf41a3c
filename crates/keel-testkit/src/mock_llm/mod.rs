//! A wire-protocol mock LLM server: one axum server on 127.0.0.1 that answers Anthropic
//! Messages (`POST /v1/messages`), OpenAI Chat Completions streamed and not
//! (`POST /v1/chat/completions`, also OpenRouter's `/api/v1/chat/completions`), OpenAI
//! Responses (`POST /v1/responses`) and Ollama (`POST /api/chat`) from one [`MockScript`].
//!
//! Each request consumes the next scripted turn, rendered in the protocol of the endpoint
//! called, so the same script drives any provider. Turns can inject faults: HTTP errors
//! with each provider's real error body and `retry-after` / `retry-after-ms` headers,
//! latency, slow chunks, a dropped connection, a malformed chunk, keep-alive comments,
//! pings, unknown event types and mid-stream errors. Every request (path, headers, parsed
//! body) is recorded for tests to inspect — or, for long runs, handed to a callback and
//! not kept ([`MockServerOptions`]). A script's `chaos` section ([`MockChaos`]) injects
//! seeded random faults on top of the turns. The script format is in `docs/mock-llm.md`.

mod anthropic;
mod chaos;
mod ollama;
mod openai;
mod render;
mod responses;
mod script;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

pub use chaos::{ChaosFault, MockChaos};
pub use render::Protocol;
pub use script::{
    MockError, MockFaults, MockScript, MockScriptError, MockStop, MockStreamError, MockToolCall,
    MockTurn, TurnBy, WhenExhausted, assistant_answers,
};

use render::Ctx;

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockRequest {
    /// 1-based arrival order.
    pub seq: usize,
    /// The protocol of the endpoint (`None` for unknown paths).
    pub protocol: Option<Protocol>,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Headers, names lower-cased.
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body (a string holding the raw text when it was not JSON).
    pub body: Value,
    /// The script turn (0-based) that answered it, if any.
    pub turn: Option<usize>,
    /// Milliseconds since the server started.
    pub received_ms: u64,
}

impl MockRequest {
    /// A header value by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum MockLlmError {
    /// The port could not be bound.
    #[error(
        "mock-llm cannot listen on 127.0.0.1:{port}: {source} (choose another --port, or 0 for any free port)"
    )]
    Bind {
        /// The port asked for.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("mock-llm server failed: {0}")]
    Serve(std::io::Error),
}

struct Inner {
    script: MockScript,
    options: MockServerOptions,
    next_turn: AtomicUsize,
    /// Requests received (the log may not keep them).
    received: AtomicUsize,
    log: Mutex<Vec<MockRequest>>,
    chaos: chaos::ChaosState,
    started: Instant,
}

/// A callback given every request as it arrives.
pub type RequestHook = Arc<dyn Fn(&MockRequest) + Send + Sync>;

/// How a server treats the requests it receives.
#[derive(Clone, Default)]
pub struct MockServerOptions {
    /// Keep no request log ([`MockLlmServer::requests`] stays empty), so a long run's
    /// memory stays flat. [`MockLlmServer::request_count`] still counts.
    pub no_log: bool,
    /// Called with every request as it arrives, before it is answered (e.g. to check each
    /// request without keeping it).
    pub on_request: Option<RequestHook>,
}

impl std::fmt::Debug for MockServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockServerOptions")
            .field("no_log", &self.no_log)
            .field("on_request", &self.on_request.as_ref().map(|_| "…"))
            .finish()
    }
}

/// A running mock LLM server. Dropping it stops the server.
#[derive(Debug)]
pub struct MockLlmServer {
    addr: SocketAddr,
    inner: Arc<Inner>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("turns", &self.script.turns.len())
            .finish_non_exhaustive()
    }
}

async fn bind(port: u16) -> Result<tokio::net::TcpListener, MockLlmError> {
    tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|source| MockLlmError::Bind { port, source })
}

fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .fallback(handle)
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(inner)
}

fn new_inner(script: MockScript, options: MockServerOptions) -> Arc<Inner> {
    Arc::new(Inner {
        script,
        options,
        next_turn: AtomicUsize::new(0),
        received: AtomicUsize::new(0),
        log: Mutex::new(Vec::new()),
        chaos: chaos::ChaosState::default(),
        started: Instant::now(),
    })
}

impl MockLlmServer {
    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start(script: MockScript) -> Result<Self, MockLlmError> {
        Self::start_on(script, 0).await
    }

    /// Starts a server on `port` of 127.0.0.1 (0 = any free port).
    pub async fn start_on(script: MockScript, port: u16) -> Result<Self, MockLlmError> {
        Self::start_with(script, port, MockServerOptions::default()).await
    }

    /// Starts a server on `port` of 127.0.0.1 (0 = any free port) with `options`.
    pub async fn start_with(
        script: MockScript,
        port: u16,
        options: MockServerOptions,
    ) -> Result<Self, MockLlmError> {
        let listener = bind(port).await?;
        let addr = listener.local_addr().map_err(MockLlmError::Serve)?;
        let inner = new_inner(script, options);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = router(inner.clone());
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                eprintln!("mock-llm server error: {error}");
            }
        });
        Ok(Self {
            addr,
            inner,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT` — pass it as a provider's base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<MockRequest> {
        self.inner
            .log
            .lock()
            .map(|log| log.clone())
            .unwrap_or_default()
    }

    /// How many script turns have been consumed.
    pub fn turns_used(&self) -> usize {
        self.inner.next_turn.load(Ordering::SeqCst)
    }

    /// How many requests arrived (counted even when the log keeps none).
    pub fn request_count(&self) -> usize {
        self.inner.received.load(Ordering::SeqCst)
    }

    /// The faults the script's `chaos` section injected so far, by kind.
    pub fn faults_injected(&self) -> BTreeMap<ChaosFault, u64> {
        self.inner.chaos.injected()
    }

    /// Stops the server and waits (at most two seconds) for it to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for MockLlmServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Runs a mock server on 127.0.0.1:`port` until Ctrl-C, printing
/// `mock-llm listening on http://127.0.0.1:PORT` on stdout once it accepts connections.
pub async fn serve(script: MockScript, port: u16) -> Result<(), MockLlmError> {
    serve_until(script, port, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

/// Like [`serve`], stopping when `shutdown` completes.
pub async fn serve_until(
    script: MockScript,
    port: u16,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MockLlmError> {
    let listener = bind(port).await?;
    let addr = listener.local_addr().map_err(MockLlmError::Serve)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "mock-llm listening on http://{addr}");
        let _ = out.flush();
    }
    axum::serve(
        listener,
        router(new_inner(script, MockServerOptions::default())),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .map_err(MockLlmError::Serve)
}

fn protocol_for(path: &str, headers: &HeaderMap) -> Option<Protocol> {
    let openrouter_headers =
        headers.contains_key("x-title") || headers.contains_key("http-referer");
    match path.trim_end_matches('/') {
        "/v1/messages" => Some(Protocol::Anthropic),
        "/api/v1/chat/completions" => Some(Protocol::OpenRouter),
        "/v1/chat/completions" | "/chat/completions" if openrouter_headers => {
            Some(Protocol::OpenRouter)
        }
        "/v1/chat/completions" | "/chat/completions" => Some(Protocol::OpenAi),
        "/v1/responses" | "/responses" | "/api/v1/responses" => Some(Protocol::OpenAiResponses),
        "/api/chat" => Some(Protocol::Ollama),
        _ => None,
    }
}

fn wants_stream(protocol: Protocol, body: &Value) -> bool {
    let flag = body.get("stream").and_then(Value::as_bool);
    match protocol {
        Protocol::Ollama => flag != Some(false),
        _ => flag == Some(true),
    }
}

fn json_response(
    status: StatusCode,
    value: &Value,
    extra: Vec<(&'static str, String)>,
) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response();
    for (name, value) in extra {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, v);
        }
    }
    response
}

fn request_id_header(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Anthropic => "request-id",
        _ => "x-request-id",
    }
}

fn error_response(protocol: Protocol, seq: usize, error: &MockError) -> Response {
    let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = render::render_error_body(protocol, seq, error);
    let mut extra = vec![(request_id_header(protocol), format!("req_mock_{seq}"))];
    if let Some(seconds) = error.retry_after {
        extra.push(("retry-after", seconds.to_string()));
    }
    if let Some(ms) = error.retry_after_ms {
        extra.push(("retry-after-ms", ms.to_string()));
    }
    if protocol == Protocol::Anthropic && status == StatusCode::TOO_MANY_REQUESTS {
        extra.push(("anthropic-ratelimit-requests-remaining", "0".to_owned()));
    }
    json_response(status, &body, extra)
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let protocol = protocol_for(&path, &headers);
    let parsed: Option<Value> = serde_json::from_slice(&raw).ok();
    let body = parsed
        .clone()
        .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&raw).into()));
    let header_map: BTreeMap<String, String> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let consumes_turn = method == Method::POST && protocol.is_some() && parsed.is_some();
    let turn_index = if consumes_turn {
        let sequence_index = inner.next_turn.fetch_add(1, Ordering::SeqCst);
        let index = match (inner.script.turn_by, &parsed) {
            (script::TurnBy::Conversation, Some(body)) => script::assistant_answers(body),
            _ => sequence_index,
        };
        let len = inner.script.turns.len();
        match inner.script.when_exhausted {
            _ if index < len => Some(index),
            WhenExhausted::RepeatLast if len > 0 => Some(len - 1),
            WhenExhausted::Cycle if len > 0 => Some(index % len),
            _ => None,
        }
    } else {
        None
    };
    let (seq, hooked) = {
        // Numbered under the log's lock so that, when logged, `seq` is the log position.
        let mut log = match inner.log.lock() {
            Ok(log) => log,
            Err(poisoned) => poisoned.into_inner(),
        };
        let seq = inner.received.fetch_add(1, Ordering::SeqCst) + 1;
        let request = MockRequest {
            seq,
            protocol,
            method: method.to_string(),
            path: path.clone(),
            headers: header_map,
            body: body.clone(),
            turn: turn_index,
            received_ms: u64::try_from(inner.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        let hooked = inner.options.on_request.is_some();
        let hooked = if inner.options.no_log {
            hooked.then_some(request)
        } else {
            let copy = hooked.then(|| request.clone());
            log.push(request);
            copy
        };
        (seq, hooked)
    };
    // The callback runs outside the lock: it may read the log itself.
    if let (Some(hook), Some(request)) = (&inner.options.on_request, &hooked) {
        hook(request);
    }
    if method == Method::GET && matches!(path.as_str(), "/" | "/health") {
        return json_response(
            StatusCode::OK,
            &json!({"status": "ok", "server": "keel mock-llm"}),
            vec![],
        );
    }
    let Some(protocol) = protocol.filter(|_| method == Method::POST) else {
        let message = format!(
            "mock-llm has no endpoint {method} {path}; use POST /v1/messages, /v1/chat/completions, /v1/responses or /api/chat"
        );
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": {"message": message, "type": "not_found_error"}}),
            vec![],
        );
    };
    let Some(parsed) = parsed else {
        let error = MockError {
            status: Some(400),
            message: Some("request body is not valid JSON".into()),
            ..MockError::default()
        };
        return error_response(protocol, seq, &error);
    };
    let Some(turn_index) = turn_index else {
        let used = inner.next_turn.load(Ordering::SeqCst);
        let message = format!(
            "mock-llm script exhausted: {} turn(s) were scripted and this is model request #{used}; add turns or set \"when_exhausted\": \"repeat_last\"",
            inner.script.turns.len()
        );
        let error = MockError {
            status: Some(500),
            message: Some(message),
            ..MockError::default()
        };
        return error_response(protocol, seq, &error);
    };
    let Some(scripted) = inner.script.turns.get(turn_index) else {
        return json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": "no such turn"}),
            vec![],
        );
    };
    let faulty = inner.script.chaos.as_ref().and_then(|chaos| {
        let streamed = wants_stream(protocol, &parsed);
        inner.chaos.inject(chaos, &parsed, streamed, scripted)
    });
    let turn = faulty.as_ref().map_or(scripted, |(_, turn)| turn);
    let latency = turn.delay_ms.unwrap_or(turn.faults.latency_ms);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    if let Some(error) = &turn.error {
        return error_response(protocol, seq, error);
    }
    let ctx = Ctx {
        seq,
        turn,
        model: parsed
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock-model")
            .to_owned(),
        usage: render::usage_for(turn, raw.len()),
        body: &parsed,
    };
    let request_id = vec![(request_id_header(protocol), format!("req_mock_{seq}"))];
    if !wants_stream(protocol, &parsed) {
        let value = match protocol {
            Protocol::Anthropic => anthropic::message(&ctx),
            Protocol::OpenAi | Protocol::OpenRouter => openai::completion(&ctx, protocol),
            Protocol::Ollama => ollama::message(&ctx),
            Protocol::OpenAiResponses => responses_object(&ctx),
        };
        return json_response(StatusCode::OK, &value, request_id);
    }
    let (frames, drop) = render::frames_with_faults(protocol, &ctx);
    let delay = Duration::from_millis(turn.faults.chunk_delay_ms);
    let stream = async_stream::stream! {
        for frame in frames {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            yield Ok::<Bytes, std::io::Error>(Bytes::from(frame));
        }
        if drop {
            // Let the frames reach the client before the connection is cut.
            tokio::time::sleep(Duration::from_millis(30)).await;
            yield Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "mock-llm dropped the connection (scripted fault)",
            ));
        }
    };
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(protocol.stream_content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    for (name, value) in request_id {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    response
}

/// The non-streamed Responses object: the `response` of the final streamed event.
fn responses_object(ctx: &Ctx<'_>) -> Value {
    let rendered = responses::stream(ctx);
    rendered
        .tail
        .first()
        .and_then(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .and_then(|data| serde_json::from_str::<Value>(data).ok())
        .and_then(|v| v.get("response").cloned())
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests;
