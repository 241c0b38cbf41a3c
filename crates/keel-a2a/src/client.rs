//! The A2A client: fetches an agent's card, picks its JSON-RPC endpoint and protocol
//! version, and sends, streams, gets and cancels tasks.
//!
//! Every await has a deadline ([`ClientOptions::timeout`] per request, and per gap between
//! two events of a stream). Credentials come from environment variables named in
//! [`Auth`], looked up at each request (never stored in configuration), and are sent as
//! sensitive headers that never appear in errors.
//!
//! Outbound calls follow keel-outbound's policy ([`A2aClient::with_outbound`]): only
//! public addresses, plus the host of the agent's own URL (the operator configured it)
//! and what the policy allows; names are checked on the addresses they resolve to.
//! Credentials go only to the origin of the card's URL: redirects are followed hop by hop,
//! same origin only by default ([`A2aClient::with_redirects`]; with `any`, no credential
//! travels on a hop to another origin), and a card naming its interface on another origin
//! is refused unless that origin is trusted ([`A2aClient::trusting_origins`]). Error bodies
//! and remote error messages are capped and redacted ([`keel_outbound::excerpt`]) before
//! they reach an error.

use keel_outbound::excerpt::{error_excerpt, error_text};
use keel_outbound::redirect::{self, RedirectPolicy};
use keel_outbound::{OutboundPolicy, Refused, refusal_of};
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
    /// The outbound policy refused the address (nothing was sent to it).
    #[error("{0}")]
    Refused(Refused),
    /// A redirect or interface URL would take the request (and its credentials) to
    /// another origin; nothing was sent there.
    #[error("{message}")]
    OtherOrigin {
        /// What happened and how to allow it.
        message: String,
    },
}

/// The HTTP client of `policy` (shared by clients with an equal policy). Redirects are
/// not followed by it: [`A2aClient`] follows them itself.
fn http_client(policy: &OutboundPolicy) -> Result<reqwest::Client, ClientError> {
    keel_outbound::resolve::shared_client(policy, Duration::from_secs(10))
        .map_err(ClientError::Transport)
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
    /// Which non-public addresses the client may reach.
    policy: OutboundPolicy,
    /// Which redirects are followed.
    redirects: RedirectPolicy,
    /// Origins besides the card's that its interface may be on.
    trusted: Vec<url::Origin>,
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
        let policy = OutboundPolicy::default().allowing_destination(agent_url);
        Ok(Self {
            card_url: card_url(agent_url),
            options,
            http: http_client(&policy)?,
            policy,
            redirects: RedirectPolicy::SameOrigin,
            trusted: Vec::new(),
            resolved: Arc::new(tokio::sync::OnceCell::new()),
        })
    }

    /// Calls under `policy` instead of the default (public addresses and the host of the
    /// agent's URL). The policy is used as given: to keep the agent's own host reachable
    /// when it is not public, include it ([`OutboundPolicy::allowing_destination`]).
    pub fn with_outbound(mut self, policy: OutboundPolicy) -> Result<Self, ClientError> {
        self.http = http_client(&policy)?;
        self.policy = policy;
        self.resolved = Arc::new(tokio::sync::OnceCell::new());
        Ok(self)
    }

    /// Follows redirects by `redirects` (default: same origin only). With
    /// [`RedirectPolicy::Any`], the credentials stay behind from the first hop to another
    /// origin on.
    #[must_use]
    pub fn with_redirects(mut self, redirects: RedirectPolicy) -> Self {
        self.redirects = redirects;
        self
    }

    /// Trusts `origins` (`https://rpc.example`) as places the card may name for its
    /// interface, besides the card's own origin; the credentials are sent there. An entry
    /// that is not an http(s) origin is refused, naming it.
    pub fn trusting_origins(
        mut self,
        origins: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<Self, ClientError> {
        for origin in origins {
            let text = origin.as_ref();
            let parsed = url::Url::parse(text)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
                .ok_or_else(|| {
                    ClientError::Config(format!(
                        "`{text}` is not an origin; write it as https://host[:port]"
                    ))
                })?;
            self.trusted.push(parsed.origin());
        }
        self.resolved = Arc::new(tokio::sync::OnceCell::new());
        Ok(self)
    }

    /// The same client with credentials looked up through `env` (the card is fetched
    /// again, with them).
    #[must_use]
    pub fn with_env(&self, env: EnvLookup) -> Self {
        let mut client = self.clone();
        client.options.env = env;
        client.resolved = Arc::new(tokio::sync::OnceCell::new());
        client
    }

    /// The outbound policy the client calls under.
    pub fn outbound(&self) -> &OutboundPolicy {
        &self.policy
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

    /// The credential values the client sends (to redact from anything shown).
    fn secrets(&self) -> Vec<String> {
        let env = &self.options.env;
        self.options
            .auth
            .bearer_env
            .iter()
            .chain(self.options.auth.headers.values())
            .filter_map(|var| env(var))
            .filter(|value| !value.is_empty())
            .collect()
    }

    /// Sends one request, following redirects as [`with_redirects`](Self::with_redirects)
    /// allows: every hop's URL is checked against the outbound policy before it is sent,
    /// and the credentials go only to the first URL's origin.
    async fn send_hops(
        &self,
        method: reqwest::Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
    ) -> Result<reqwest::Response, ClientError> {
        let credentials = self.auth_headers()?;
        let original = url::Url::parse(url)
            .map_err(|e| ClientError::Config(format!("`{url}` is not a URL: {e}")))?;
        let mut url = original.clone();
        let mut method = method;
        let mut body = body;
        let mut own_origin = true;
        for _ in 0..=redirect::MAX_REDIRECTS {
            self.policy
                .check_url(&url)
                .await
                .map_err(ClientError::Refused)?;
            let mut builder = self
                .http
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            if own_origin {
                builder = builder.headers(credentials.clone());
            }
            if let Some(body) = &body {
                builder = builder.body(body.clone());
            }
            let response = builder.send().await.map_err(|e| transport(&e))?;
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok());
            let hop = match redirect::next_hop(
                self.redirects,
                &original,
                &url,
                response.status(),
                location,
            ) {
                None => return Ok(response),
                Some(Ok(hop)) => hop,
                Some(Err(refusal)) => {
                    let from = shown_url(&url);
                    let status = response.status().as_u16();
                    let message = match refusal {
                        redirect::Refusal::OtherOrigin(to) => format!(
                            "{from} redirected (HTTP {status}) to {}, another origin; redirects \
                             to other origins are not followed, so the agent's credentials \
                             cannot leak: configure the agent's final URL",
                            shown_url(&to)
                        ),
                        redirect::Refusal::NotAllowed => {
                            format!("{from} redirected (HTTP {status}); redirects are not followed")
                        }
                        redirect::Refusal::BadLocation(_) => format!(
                            "{from} redirected (HTTP {status}) to a location that is not an \
                             http(s) URL"
                        ),
                    };
                    return Err(ClientError::OtherOrigin { message });
                }
            };
            if hop.becomes_get && method != reqwest::Method::GET {
                method = reqwest::Method::GET;
                body = None;
            }
            own_origin &= !hop.cross_origin;
            url = hop.url;
        }
        Err(ClientError::Protocol(format!(
            "more than {} redirects starting at {}",
            redirect::MAX_REDIRECTS,
            shown_url(&original)
        )))
    }

    /// Refuses an interface URL on another origin than the card's, unless trusted.
    fn check_interface(&self, endpoint: &Endpoint) -> Result<(), ClientError> {
        let card = url::Url::parse(&self.card_url)
            .map_err(|e| ClientError::Config(format!("A2A agent URL is not a URL: {e}")))?;
        let interface = url::Url::parse(&endpoint.url).map_err(|e| {
            ClientError::Protocol(format!("the card's interface URL is not a URL: {e}"))
        })?;
        if !matches!(interface.scheme(), "http" | "https") {
            return Err(ClientError::Protocol(format!(
                "the card's interface URL must be http:// or https://, not {}://",
                interface.scheme()
            )));
        }
        let origin = interface.origin();
        if origin == card.origin() || self.trusted.contains(&origin) {
            return Ok(());
        }
        Err(ClientError::OtherOrigin {
            message: format!(
                "the agent card at {} names its JSON-RPC interface at {}, another origin; \
                 the agent's credentials are sent only to the card's origin, so nothing was \
                 sent there: add \"{}\" to the agent's `interface_origins` in keel.toml if \
                 that origin belongs to the agent",
                shown_url(&card),
                shown_url(&interface),
                origin.ascii_serialization()
            ),
        })
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
                self.check_interface(&endpoint)?;
                Ok((card, endpoint))
            })
            .await
            .cloned()
    }

    async fn fetch_card(&self) -> Result<AgentCard, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let secrets = self.secrets();
        self.timed("the agent card request", async {
            let response = self
                .send_hops(reqwest::Method::GET, &self.card_url, headers, None)
                .await?;
            let value = read_json(response, &secrets).await?;
            serde_json::from_value::<AgentCard>(value)
                .map_err(|e| ClientError::Protocol(format!("agent card: {e}")))
        })
        .await
    }

    /// Sends one JSON-RPC request to `endpoint` (following redirects as allowed).
    async fn request(
        &self,
        endpoint: &Endpoint,
        method: Method,
        params: Value,
        stream: bool,
    ) -> Result<reqwest::Response, ClientError> {
        let body = RpcRequest::new(method.name(endpoint.version), params);
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        if endpoint.version == ProtocolVersion::V1_0
            && let Ok(version) = HeaderValue::from_str(endpoint.version.as_str())
        {
            headers.insert(VERSION_HEADER, version);
        }
        self.send_hops(
            reqwest::Method::POST,
            &endpoint.url,
            headers,
            Some(serde_json::to_vec(&body).unwrap_or_default()),
        )
        .await
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
        let what = format!("`{}`", method.name(endpoint.version));
        let secrets = self.secrets();
        self.timed(&what, async {
            let response = self.request(&endpoint, method, params, false).await?;
            let value = read_json(response, &secrets).await?;
            let response: RpcResponse = serde_json::from_value(value)
                .map_err(|e| ClientError::Protocol(format!("JSON-RPC response: {e}")))?;
            response
                .into_result()
                .map_err(|error| ClientError::Rpc(shown_rpc(error, &secrets)))
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
        let secrets = self.secrets();
        let response = self
            .timed(
                "the stream request",
                self.request(endpoint, method, params, true),
            )
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
                .timed("the stream request", read_json(response, &secrets))
                .await?;
            let response: RpcResponse = serde_json::from_value(value)
                .map_err(|e| ClientError::Protocol(format!("JSON-RPC response: {e}")))?;
            return Err(match response.into_result() {
                Err(error) => ClientError::Rpc(shown_rpc(error, &secrets)),
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
            secrets,
        };
        let stream = futures::stream::unfold(state, move |mut state| async move {
            loop {
                if let Some(data) = state.pending.pop_front() {
                    return Some((decode_event(&data, &state.secrets), state));
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
    /// Credential values to redact from remote error messages.
    secrets: Vec<String>,
}

/// A URL as errors show it: without query, fragment and userinfo.
fn shown_url(url: &url::Url) -> String {
    keel_outbound::excerpt::display_url(url)
}

/// A remote JSON-RPC error as it may be shown: its message capped and redacted.
fn shown_rpc(mut error: RpcError, secrets: &[String]) -> RpcError {
    error.message = error_text(&error.message, secrets);
    error
}

fn decode_event(data: &str, secrets: &[String]) -> Result<StreamEvent, ClientError> {
    let response: RpcResponse = serde_json::from_str(data)
        .map_err(|e| ClientError::Protocol(format!("stream event: {e}")))?;
    let result = response
        .into_result()
        .map_err(|error| ClientError::Rpc(shown_rpc(error, secrets)))?;
    StreamEvent::from_value(result).map_err(ClientError::Protocol)
}

fn transport(error: &reqwest::Error) -> ClientError {
    if let Some(refused) = refusal_of(error) {
        return ClientError::Refused(refused);
    }
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

async fn read_json(response: reqwest::Response, secrets: &[String]) -> Result<Value, ClientError> {
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
            return Err(ClientError::Rpc(shown_rpc(error, secrets)));
        }
        return Err(ClientError::Http {
            status: status.as_u16(),
            body: error_excerpt(&body, secrets),
            retry_after_ms,
        });
    }
    serde_json::from_slice(&body).map_err(|e| {
        let head = body.get(..200).unwrap_or(&body);
        ClientError::Protocol(format!("not JSON ({e}): {}", error_excerpt(head, secrets)))
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
