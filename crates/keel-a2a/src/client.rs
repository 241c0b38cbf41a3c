//! The A2A client: fetches an agent's card, picks its JSON-RPC endpoint and protocol
//! version, and sends, streams, gets and cancels tasks.
//!
//! Every await has a deadline ([`ClientOptions::timeout`] per request, and per gap between
//! two events of a stream). Credentials come from environment variables named in
//! [`Auth`], looked up at each request (never stored in configuration), and are sent as
//! sensitive headers that never appear in errors.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};

use crate::card::{AgentCard, Endpoint, WELL_KNOWN_PATH};
use crate::jsonrpc::{RpcError, RpcRequest, RpcResponse};
use crate::sse::SseDecoder;
use crate::types::{Message, SendResult, StreamEvent, Task};
use crate::version::{Method, ProtocolVersion, VERSION_HEADER};

/// Longest error body kept in an error, in characters.
const ERROR_BODY_CHARS: usize = 2_000;
/// Longest response body read, in bytes.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// An environment lookup (the process environment by default).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The process environment.
pub fn process_env() -> EnvLookup {
    Arc::new(|name: &str| std::env::var(name).ok())
}

/// Credentials of a remote agent, by the environment variables that hold them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Sends `Authorization: Bearer $VAR`.
    pub bearer_env: Option<String>,
    /// Sends `Header: $VAR` for each header → variable.
    pub headers: BTreeMap<String, String>,
}

/// How a client talks to an agent.
#[derive(Clone)]
pub struct ClientOptions {
    /// Deadline of one request, and of the gap between two events of a stream.
    pub timeout: Duration,
    /// Credentials.
    pub auth: Auth,
    /// Where credentials are looked up.
    pub env: EnvLookup,
    /// Use this protocol version even when the card offers a newer one.
    pub force_version: Option<ProtocolVersion>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("timeout", &self.timeout)
            .field("auth", &self.auth)
            .field("force_version", &self.force_version)
            .finish_non_exhaustive()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            auth: Auth::default(),
            env: process_env(),
            force_version: None,
        }
    }
}

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The agent answered with an HTTP error status.
    #[error("the A2A agent answered HTTP {status}: {body}")]
    Http {
        /// The status.
        status: u16,
        /// A bounded excerpt of the body.
        body: String,
        /// `Retry-After`, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// The agent answered with a JSON-RPC error.
    #[error("the A2A agent answered {0}")]
    Rpc(RpcError),
    /// No answer in time.
    #[error("the A2A agent did not answer {what} within {ms} ms")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        ms: u64,
    },
    /// The agent could not be reached.
    #[error("cannot reach the A2A agent: {0}")]
    Transport(String),
    /// The answer is not A2A.
    #[error("the A2A agent's answer is not valid A2A: {0}")]
    Protocol(String),
    /// Missing credentials or an unusable URL.
    #[error("{0}")]
    Config(String),
    /// Cancelled by the caller.
    #[error("cancelled")]
    Cancelled,
}

fn shared_http() -> Result<reqwest::Client, ClientError> {
    static CLIENT: std::sync::LazyLock<Result<reqwest::Client, String>> =
        std::sync::LazyLock::new(|| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::limited(5))
                .build()
                .map_err(|e| e.to_string())
        });
    CLIENT.clone().map_err(ClientError::Transport)
}

/// The card URL for an agent URL: the URL itself when it names a `.json` file, else
/// `<url>/.well-known/agent-card.json`.
pub fn card_url(agent_url: &str) -> String {
    let trimmed = agent_url.trim_end_matches('/');
    let path_is_json = url::Url::parse(trimmed)
        .map(|u| u.path().ends_with(".json"))
        .unwrap_or(false);
    if path_is_json {
        trimmed.to_string()
    } else {
        format!("{trimmed}{WELL_KNOWN_PATH}")
    }
}

/// A client of one remote agent.
#[derive(Debug, Clone)]
pub struct A2aClient {
    card_url: String,
    options: ClientOptions,
    http: reqwest::Client,
    resolved: Arc<tokio::sync::OnceCell<(AgentCard, Endpoint)>>,
}

impl A2aClient {
    /// A client of the agent at `agent_url` (its base URL or its card's URL). Nothing is
    /// fetched until the first call.
    pub fn new(agent_url: &str, options: ClientOptions) -> Result<Self, ClientError> {
        let parsed = url::Url::parse(agent_url)
            .map_err(|e| ClientError::Config(format!("A2A agent URL is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ClientError::Config(format!(
                "A2A agent URL must be http:// or https://, not {}://",
                parsed.scheme()
            )));
        }
        Ok(Self {
            card_url: card_url(agent_url),
            options,
            http: shared_http()?,
            resolved: Arc::new(tokio::sync::OnceCell::new()),
        })
    }

    /// Where the card is fetched from.
    pub fn card_url(&self) -> &str {
        &self.card_url
    }

    /// The options.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    fn timeout_ms(&self) -> u64 {
        u64::try_from(self.options.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    fn auth_headers(&self) -> Result<HeaderMap, ClientError> {
        let env = &self.options.env;
        let lookup = |var: &str, what: &str| {
            env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                ClientError::Config(format!(
                    "environment variable `{var}` ({what} of the A2A agent) is not set; export it or add it to .env"
                ))
            })
        };
        let mut headers = HeaderMap::new();
        let mut add = |name: &str, value: String| -> Result<(), ClientError> {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ClientError::Config(format!("`{name}` is not a header name")))?;
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                ClientError::Config(format!(
                    "the value of header `{name}` has characters a header cannot carry"
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
            Ok(())
        };
        if let Some(var) = &self.options.auth.bearer_env {
            add(
                "authorization",
                format!("Bearer {}", lookup(var, "bearer token")?),
            )?;
        }
        for (header, var) in &self.options.auth.headers {
            add(header, lookup(var, &format!("header `{header}`"))?)?;
        }
        Ok(headers)
    }

    async fn timed<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.options.timeout, future)
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Timeout {
                    what: what.into(),
                    ms: self.timeout_ms(),
                })
            })
    }

    /// The agent's card (fetched once, then cached).
    pub async fn card(&self) -> Result<AgentCard, ClientError> {
        Ok(self.resolve().await?.0)
    }

    /// The endpoint and version the client uses (from the card).
    pub async fn endpoint(&self) -> Result<Endpoint, ClientError> {
        Ok(self.resolve().await?.1)
    }

    async fn resolve(&self) -> Result<(AgentCard, Endpoint), ClientError> {
        self.resolved
            .get_or_try_init(|| async {
                let card = self.fetch_card().await?;
                let mut endpoint = card.select_endpoint(&self.card_url).ok_or_else(|| {
                    ClientError::Protocol(format!(
                        "the agent card at {} offers no JSON-RPC interface of protocol 0.3 or 1.0",
                        self.card_url
                    ))
                })?;
                if let Some(version) = self.options.force_version {
                    endpoint.version = version;
                }
                Ok((card, endpoint))
            })
            .await
            .cloned()
    }

    async fn fetch_card(&self) -> Result<AgentCard, ClientError> {
        let headers = self.auth_headers()?;
        self.timed("the agent card request", async {
            let response = self
                .http
                .get(&self.card_url)
                .headers(headers)
                .header(ACCEPT, "application/json")
                .send()
                .await
                .map_err(|e| transport(&e))?;
            let value = read_json(response).await?;
            serde_json::from_value::<AgentCard>(value)
                .map_err(|e| ClientError::Protocol(format!("agent card: {e}")))
        })
        .await
    }

    fn request(
        &self,
        endpoint: &Endpoint,
        method: Method,
        params: Value,
        stream: bool,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let body = RpcRequest::new(method.name(endpoint.version), params);
        let mut builder = self
            .http
            .post(&endpoint.url)
            .headers(self.auth_headers()?)
            .header(CONTENT_TYPE, "application/json")
            .header(
                ACCEPT,
                if stream {
                    "text/event-stream"
                } else {
                    "application/json"
                },
            )
            .body(serde_json::to_vec(&body).unwrap_or_default());
        if endpoint.version == ProtocolVersion::V1_0 {
            builder = builder.header(VERSION_HEADER, endpoint.version.as_str());
        }
        Ok(builder)
    }

    fn add_tenant(endpoint: &Endpoint, mut params: Value) -> Value {
        if let (Some(tenant), ProtocolVersion::V1_0, Value::Object(map)) =
            (&endpoint.tenant, endpoint.version, &mut params)
        {
            map.insert("tenant".into(), Value::String(tenant.clone()));
        }
        params
    }

    async fn call(&self, method: Method, params: Value) -> Result<Value, ClientError> {
        let endpoint = self.endpoint().await?;
        let params = Self::add_tenant(&endpoint, params);
        let request = self.request(&endpoint, method, params, false)?;
        let what = format!("`{}`", method.name(endpoint.version));
        self.timed(&what, async {
            let response = request.send().await.map_err(|e| transport(&e))?;
            let value = read_json(response).await?;
            let response: RpcResponse = serde_json::from_value(value)
                .map_err(|e| ClientError::Protocol(format!("JSON-RPC response: {e}")))?;
            response.into_result().map_err(ClientError::Rpc)
        })
        .await
    }

    fn send_params(endpoint: &Endpoint, message: &Message, blocking: bool) -> Value {
        let configuration = match endpoint.version {
            ProtocolVersion::V1_0 => json!({ "returnImmediately": !blocking }),
            ProtocolVersion::V0_3 => json!({ "blocking": blocking }),
        };
        json!({
            "message": endpoint.version.encode_message(message),
            "configuration": configuration,
        })
    }

    /// Sends a message. `blocking`: wait until the task ends or needs input (within the
    /// request deadline); else answer at once with the task as it started.
    pub async fn send(&self, message: &Message, blocking: bool) -> Result<SendResult, ClientError> {
        let endpoint = self.endpoint().await?;
        let value = self
            .call(
                Method::Send,
                Self::send_params(&endpoint, message, blocking),
            )
            .await?;
        SendResult::from_value(value).map_err(ClientError::Protocol)
    }

    /// Sends a message and streams the task's events. The stream ends when the agent closes
    /// it (after a terminal or interrupted state); a gap between two events longer than the
    /// timeout ends it with [`ClientError::Timeout`].
    pub async fn stream(
        &self,
        message: &Message,
    ) -> Result<BoxStream<'static, Result<StreamEvent, ClientError>>, ClientError> {
        let endpoint = self.endpoint().await?;
        let params = Self::add_tenant(&endpoint, Self::send_params(&endpoint, message, true));
        self.open_stream(&endpoint, Method::Stream, params).await
    }

    /// Follows a running task's events (`SubscribeToTask` / `tasks/resubscribe`).
    pub async fn subscribe(
        &self,
        task_id: &str,
    ) -> Result<BoxStream<'static, Result<StreamEvent, ClientError>>, ClientError> {
        let endpoint = self.endpoint().await?;
        let params = Self::add_tenant(&endpoint, json!({ "id": task_id }));
        self.open_stream(&endpoint, Method::Subscribe, params).await
    }

    async fn open_stream(
        &self,
        endpoint: &Endpoint,
        method: Method,
        params: Value,
    ) -> Result<BoxStream<'static, Result<StreamEvent, ClientError>>, ClientError> {
        let request = self.request(endpoint, method, params, true)?;
        let response = self
            .timed("the stream request", async {
                request.send().await.map_err(|e| transport(&e))
            })
            .await?;
        let status = response.status();
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() || !is_sse {
            // An error answered as plain JSON-RPC (or HTTP).
            let value = self
                .timed("the stream request", read_json(response))
                .await?;
            let response: RpcResponse = serde_json::from_value(value)
                .map_err(|e| ClientError::Protocol(format!("JSON-RPC response: {e}")))?;
            return Err(match response.into_result() {
                Err(error) => ClientError::Rpc(error),
                Ok(_) => ClientError::Protocol(
                    "asked for an event stream, the agent answered plain JSON".into(),
                ),
            });
        }
        let idle = self.options.timeout;
        let idle_ms = self.timeout_ms();
        let state = StreamState {
            body: response.bytes_stream().boxed(),
            decoder: SseDecoder::new(),
            pending: VecDeque::new(),
            done: false,
        };
        let stream = futures::stream::unfold(state, move |mut state| async move {
            loop {
                if let Some(data) = state.pending.pop_front() {
                    return Some((decode_event(&data), state));
                }
                if state.done {
                    return None;
                }
                match tokio::time::timeout(idle, state.body.next()).await {
                    Err(_) => {
                        state.done = true;
                        let error = ClientError::Timeout {
                            what: "the next event of the stream".into(),
                            ms: idle_ms,
                        };
                        return Some((Err(error), state));
                    }
                    Ok(None) => {
                        state.done = true;
                        if let Some(data) = state.decoder.finish() {
                            state.pending.push_back(data);
                        }
                    }
                    Ok(Some(Err(error))) => {
                        state.done = true;
                        return Some((Err(transport(&error)), state));
                    }
                    Ok(Some(Ok(chunk))) => match state.decoder.feed(&chunk) {
                        Ok(events) => state.pending.extend(events),
                        Err(message) => {
                            state.done = true;
                            return Some((Err(ClientError::Protocol(message)), state));
                        }
                    },
                }
            }
        });
        Ok(stream.boxed())
    }

    /// A task's current state.
    pub async fn get_task(
        &self,
        task_id: &str,
        history_length: Option<u32>,
    ) -> Result<Task, ClientError> {
        let params = match history_length {
            Some(n) => json!({ "id": task_id, "historyLength": n }),
            None => json!({ "id": task_id }),
        };
        let value = self.call(Method::GetTask, params).await?;
        serde_json::from_value(value).map_err(|e| ClientError::Protocol(format!("task: {e}")))
    }

    /// Asks the agent to cancel a task; answers the task as it then stands.
    pub async fn cancel_task(&self, task_id: &str) -> Result<Task, ClientError> {
        let value = self
            .call(Method::CancelTask, json!({ "id": task_id }))
            .await?;
        serde_json::from_value(value).map_err(|e| ClientError::Protocol(format!("task: {e}")))
    }
}

struct StreamState {
    body: BoxStream<'static, Result<axum::body::Bytes, reqwest::Error>>,
    decoder: SseDecoder,
    pending: VecDeque<String>,
    done: bool,
}

fn decode_event(data: &str) -> Result<StreamEvent, ClientError> {
    let response: RpcResponse = serde_json::from_str(data)
        .map_err(|e| ClientError::Protocol(format!("stream event: {e}")))?;
    let result = response.into_result().map_err(ClientError::Rpc)?;
    StreamEvent::from_value(result).map_err(ClientError::Protocol)
}

fn transport(error: &reqwest::Error) -> ClientError {
    if error.is_timeout() {
        return ClientError::Timeout {
            what: "the request".into(),
            ms: 0,
        };
    }
    // reqwest's Display includes the URL (which may carry a query); keep the kind and
    // the innermost cause only.
    let mut source: &dyn std::error::Error = error;
    while let Some(inner) = source.source() {
        source = inner;
    }
    let kind = if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    };
    ClientError::Transport(format!("{kind}: {source}"))
}

async fn read_json(response: reqwest::Response) -> Result<Value, ClientError> {
    let status = response.status();
    let retry_after_ms = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.saturating_mul(1000));
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| transport(&e))?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ClientError::Protocol(format!(
                "the response is larger than {MAX_BODY_BYTES} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        // A JSON-RPC error carried with an HTTP error status is still the better report.
        if let Ok(RpcResponse {
            error: Some(error), ..
        }) = serde_json::from_slice::<RpcResponse>(&body)
        {
            return Err(ClientError::Rpc(error));
        }
        let text = String::from_utf8_lossy(&body);
        return Err(ClientError::Http {
            status: status.as_u16(),
            body: text.chars().take(ERROR_BODY_CHARS).collect(),
            retry_after_ms,
        });
    }
    serde_json::from_slice(&body).map_err(|e| {
        let text = String::from_utf8_lossy(&body);
        ClientError::Protocol(format!(
            "not JSON ({e}): {}",
            text.chars().take(200).collect::<String>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_url_appends_the_well_known_path_unless_given_a_json_file() {
        assert_eq!(
            card_url("http://h:1/"),
            "http://h:1/.well-known/agent-card.json"
        );
        assert_eq!(
            card_url("http://h:1/a2a/echo"),
            "http://h:1/a2a/echo/.well-known/agent-card.json"
        );
        assert_eq!(card_url("http://h/card.json"), "http://h/card.json");
    }
}
