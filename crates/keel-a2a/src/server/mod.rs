//! The A2A server as a library: an axum [`Router`] over an [`A2aBackend`].
//!
//! The router serves, for every agent the backend names:
//!
//! | path | what |
//! | --- | --- |
//! | `GET /.well-known/agent-card.json` | the default agent's card |
//! | `GET /a2a/{agent}/.well-known/agent-card.json` | that agent's card |
//! | `POST /a2a/{agent}` | JSON-RPC: `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask` (1.0, with `A2A-Version: 1.0`) and `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`, `tasks/resubscribe` (0.3) |
//!
//! Cards advertise both versions (1.0 `supportedInterfaces`, 0.3 `url` /
//! `preferredTransport` / `protocolVersion`) on the same URL; each request is answered in
//! the version its method names, in that version's shapes. Streams are Server-Sent
//! Events, one JSON-RPC response per event, closed after a terminal or interrupted state.
//!
//! A backend maps A2A onto its own notion of work. For Keel (keel-server): an agent is an
//! `[agents.<name>]` entry, a task is a run (task id = run id), its context is the thread
//! (context id = thread id), `input-required` is a run paused on an approval or on
//! `ask_user` — the question in the status message, the next message (same task id) its
//! answer — and cancel cancels the run.

mod rpc;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use crate::card::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, JSONRPC_BINDING, WELL_KNOWN_PATH,
};
use crate::jsonrpc::RpcError;
use crate::types::{Message, Task, TaskEvent};
use crate::version::ProtocolVersion;

/// What the card of a served agent says.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDescriptor {
    /// The agent's name (the `{agent}` of its paths).
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its version.
    pub version: String,
    /// What it can do (one skill named after the agent when empty).
    pub skills: Vec<AgentSkill>,
    /// Whether it streams.
    pub streaming: bool,
}

impl AgentDescriptor {
    /// A streaming agent with no declared skills, version `1.0.0`.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            version: "1.0.0".into(),
            skills: Vec::new(),
            streaming: true,
        }
    }
}

/// Who asks, and how: what a backend gets with every call.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The agent addressed.
    pub agent: String,
    /// The protocol version of the request.
    pub version: ProtocolVersion,
    /// The request's headers (authentication, tenant).
    pub headers: HeaderMap,
    /// The request's extensions: what middleware in front of the router put there (e.g.
    /// the caller an authentication layer resolved).
    pub extensions: axum::http::Extensions,
}

/// A task as it started, and its updates from then on.
pub struct TaskRun {
    /// The task's snapshot when the call returned.
    pub task: Task,
    /// Its later updates, in order; ends when the task ends or pauses. Dropping it must
    /// not stop the task.
    pub events: BoxStream<'static, TaskEvent>,
}

impl std::fmt::Debug for TaskRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRun")
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

/// What serves the agents: Keel threads and runs in keel-server, [`EchoBackend`] in tests.
///
/// Errors are A2A errors ([`RpcError`]: `task_not_found`, `not_cancelable`,
/// `unsupported`, `invalid_params`, `internal`), answered to the client as they are.
///
/// [`EchoBackend`]: crate::testing::EchoBackend
pub trait A2aBackend: Send + Sync + 'static {
    /// The agents served, the first being the default.
    fn agents(&self) -> Vec<AgentDescriptor>;

    /// Starts a task from `message`, or — when `message.task_id` is set — continues that
    /// task (it must be waiting for input: `input-required`), the message being the
    /// answer.
    fn send_message<'a>(
        &'a self,
        ctx: &'a CallContext,
        message: Message,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>>;

    /// A task's current snapshot (status, artifacts, history).
    fn get_task<'a>(
        &'a self,
        ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>>;

    /// Cancels a task; answers its snapshot after the cancellation.
    fn cancel_task<'a>(
        &'a self,
        ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>>;

    /// Follows a running task: its snapshot now and its later updates. Default:
    /// unsupported.
    fn subscribe<'a>(
        &'a self,
        _ctx: &'a CallContext,
        _task_id: &'a str,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>> {
        Box::pin(async {
            Err(RpcError::unsupported(
                "this agent does not support resubscribing",
            ))
        })
    }
}

/// Builds the A2A [`Router`] over a backend.
pub struct A2aRouterBuilder {
    backend: Arc<dyn A2aBackend>,
    public_url: String,
    default_agent: Option<String>,
    blocking_timeout: Duration,
    keep_alive: Duration,
    security_schemes: Option<Value>,
}

impl std::fmt::Debug for A2aRouterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aRouterBuilder")
            .field("public_url", &self.public_url)
            .field("default_agent", &self.default_agent)
            .field("blocking_timeout", &self.blocking_timeout)
            .finish_non_exhaustive()
    }
}

/// The router's shared state.
pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn A2aBackend>,
    public_url: String,
    default_agent: Option<String>,
    pub(crate) blocking_timeout: Duration,
    pub(crate) keep_alive: Duration,
    security_schemes: Option<Value>,
}

/// A builder of the A2A router over `backend`, reached by clients at `public_url`
/// (`https://agents.example`, or `http://127.0.0.1:PORT` for a loopback server): the
/// cards' URLs are `<public_url>/a2a/<agent>`. They never come from a request's `Host` or
/// `X-Forwarded-*` headers, which the client chooses: a card built from them would send
/// the next caller (and the key it presents) wherever a request said.
pub fn router(backend: Arc<dyn A2aBackend>, public_url: impl Into<String>) -> A2aRouterBuilder {
    A2aRouterBuilder {
        backend,
        public_url: public_url.into().trim_end_matches('/').to_string(),
        default_agent: None,
        blocking_timeout: Duration::from_secs(120),
        keep_alive: Duration::from_secs(15),
        security_schemes: None,
    }
}

impl A2aRouterBuilder {
    /// Replaces the URL clients reach the router at (see [`router`]).
    #[must_use]
    pub fn public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = url.into().trim_end_matches('/').to_string();
        self
    }

    /// The agent of `/.well-known/agent-card.json` (default: the backend's first).
    #[must_use]
    pub fn default_agent(mut self, name: impl Into<String>) -> Self {
        self.default_agent = Some(name.into());
        self
    }

    /// Longest a blocking send waits for its task to end or pause before answering the
    /// task as it stands (default 120 s).
    #[must_use]
    pub fn blocking_timeout(mut self, timeout: Duration) -> Self {
        self.blocking_timeout = timeout;
        self
    }

    /// Interval of SSE keep-alive comments on a quiet stream (default 15 s).
    #[must_use]
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// The cards' `securitySchemes` (published as given, e.g.
    /// `{"bearer": {"type": "http", "scheme": "bearer"}}`); authentication itself is the
    /// job of a layer in front of the router.
    #[must_use]
    pub fn security_schemes(mut self, schemes: Value) -> Self {
        self.security_schemes = Some(schemes);
        self
    }

    /// The router.
    pub fn build(self) -> Router {
        self.build_for()
    }

    /// The router, for merging into a router of state `S` (its routes need no state).
    pub fn build_for<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let inner = Arc::new(Inner {
            backend: self.backend,
            public_url: self.public_url,
            default_agent: self.default_agent,
            blocking_timeout: self.blocking_timeout,
            keep_alive: self.keep_alive,
            security_schemes: self.security_schemes,
        });
        Router::new()
            .route(WELL_KNOWN_PATH, get(default_card))
            .route(&format!("/a2a/{{agent}}{WELL_KNOWN_PATH}"), get(agent_card))
            .route("/a2a/{agent}", post(rpc::handle))
            .with_state(inner)
    }
}

impl Inner {
    pub(crate) fn agent(&self, name: &str) -> Option<AgentDescriptor> {
        self.backend.agents().into_iter().find(|a| a.name == name)
    }

    fn card(&self, agent: &AgentDescriptor) -> AgentCard {
        let url = format!("{}/a2a/{}", self.public_url, agent.name);
        let interface = |version: ProtocolVersion| AgentInterface {
            url: url.clone(),
            protocol_binding: JSONRPC_BINDING.into(),
            protocol_version: version.as_str().into(),
            tenant: None,
        };
        let skills = if agent.skills.is_empty() {
            vec![AgentSkill {
                id: agent.name.clone(),
                name: agent.name.clone(),
                description: agent.description.clone(),
                tags: vec!["keel".into()],
                examples: Vec::new(),
                input_modes: Vec::new(),
                output_modes: Vec::new(),
            }]
        } else {
            agent.skills.clone()
        };
        AgentCard {
            name: agent.name.clone(),
            description: agent.description.clone(),
            version: agent.version.clone(),
            supported_interfaces: vec![
                interface(ProtocolVersion::V1_0),
                interface(ProtocolVersion::V0_3),
            ],
            url: Some(url.clone()),
            preferred_transport: Some(JSONRPC_BINDING.into()),
            protocol_version: Some("0.3.0".into()),
            additional_interfaces: Vec::new(),
            provider: None,
            documentation_url: None,
            capabilities: AgentCapabilities {
                streaming: Some(agent.streaming),
                push_notifications: Some(false),
                extended_agent_card: None,
            },
            default_input_modes: vec!["text/plain".into()],
            default_output_modes: vec!["text/plain".into()],
            skills,
            security_schemes: self.security_schemes.clone(),
            security_requirements: requirements(
                self.security_schemes.as_ref(),
                |name| json!({ "schemes": { name: { "list": [] } } }),
            ),
            security: requirements(self.security_schemes.as_ref(), |name| json!({ name: [] })),
        }
    }
}

/// The security requirements of the published schemes, in one version's shape (`entry`
/// of a scheme name): any one scheme satisfies a request. `None` without schemes.
fn requirements(schemes: Option<&Value>, entry: impl Fn(&str) -> Value) -> Option<Value> {
    let names: Vec<Value> = schemes?
        .as_object()?
        .keys()
        .map(|name| entry(name))
        .collect();
    (!names.is_empty()).then_some(Value::Array(names))
}

fn card_response(card: &AgentCard) -> Response {
    (
        [(header::CACHE_CONTROL, "public, max-age=60")],
        axum::Json(card),
    )
        .into_response()
}

fn not_found(message: String) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": { "code": 404, "message": message } })),
    )
        .into_response()
}

fn agent_names(inner: &Inner) -> Value {
    Value::Array(
        inner
            .backend
            .agents()
            .into_iter()
            .map(|a| Value::String(a.name))
            .collect(),
    )
}

async fn default_card(State(inner): State<Arc<Inner>>) -> Response {
    let agents = inner.backend.agents();
    let chosen = match &inner.default_agent {
        Some(name) => agents.into_iter().find(|a| &a.name == name),
        None => agents.into_iter().next(),
    };
    match chosen {
        Some(agent) => card_response(&inner.card(&agent)),
        None => not_found("no agent is served here".into()),
    }
}

async fn agent_card(State(inner): State<Arc<Inner>>, Path(agent): Path<String>) -> Response {
    match inner.agent(&agent) {
        Some(descriptor) => card_response(&inner.card(&descriptor)),
        None => not_found(format!(
            "no agent `{agent}` is served here; agents: {}",
            agent_names(&inner)
        )),
    }
}
