//! One MCP server connection: start-up and handshake, the tool catalog, calls with
//! timeout and cancellation, progress and list-changed notifications, and reconnecting
//! (restarting a crashed stdio server) with backoff.
//!
//! The handshake uses rmcp's automatic lifecycle: it probes with the discovery-based
//! protocol (`server/discover`, 2026-07-28) and falls back to the `initialize` handshake
//! (offering 2025-11-25; the server may answer with an older version such as 2025-06-18
//! or 2025-03-26, which rmcp accepts). When the probe itself breaks the connection (some
//! HTTP servers answer an unknown session-less request with an uncorrelated error), the
//! connection is retried once with a plain `initialize` handshake.
//!
//! A stdio server runs with a cleared environment ([`child_environment`]) as the leader of
//! its own process group; the group is stopped with the connection ([`ProcessGroup`]).
//!
//! An HTTP server is reached through a reqwest client of the connection's outbound policy
//! (keel-outbound): its URL is checked before each handshake, names resolve only to
//! addresses the policy allows, and only same-origin 307/308 redirects are followed
//! ([`keel_outbound::redirect::same_origin_policy`]), so the configured headers never
//! reach another origin.

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_core::{Effect, ToolContext, ToolError, ToolErrorCode};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientRequest, PingRequest,
    ProtocolVersion, ServerResult,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceError};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::child::{Admission, LogBudget, MAX_STDERR_LINE_BYTES, ProcessGroup, read_bounded_lines};
use crate::config::{McpServerConfig, McpTransport, child_environment, expand_env};
use crate::convert::{cap_tool_error, classify_jsonrpc_error, map_call_result};
use crate::handler::{
    Catalog, Handler, RemoteTool, Shared, fetch_catalog, lock, progress_key, read, write,
};
use crate::notice::{McpNotice, McpServerState, McpServerStatus};

/// Upper bound of the reconnect backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a liveness ping after a timed-out call may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// First non-zero reconnect delay.
const BASE_BACKOFF: Duration = Duration::from_millis(250);
/// How long a stopped stdio server's process group may take to exit after SIGTERM.
const GROUP_GRACE: Duration = Duration::from_secs(2);
/// How long a server that failed its handshake may take to finish writing stderr.
const STDERR_DRAIN: Duration = Duration::from_secs(2);

struct Live {
    service: RunningService<RoleClient, Handler>,
    generation: u64,
    pid: Option<u32>,
    /// The stdio server's process group (empty for HTTP servers).
    group: ProcessGroup,
}

impl Live {
    fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }
}

impl Drop for Live {
    /// A connection that is dropped (lost, replaced by a restart, shut down) takes the
    /// server's whole process group with it: a crashed `npx` wrapper leaves its real
    /// server (a grandchild) running otherwise.
    fn drop(&mut self) {
        self.group.kill();
    }
}

#[derive(Default)]
struct StatusFields {
    state: Option<McpServerState>,
    error: Option<String>,
    protocol_version: Option<String>,
    server_info: Option<String>,
    restarts: u64,
}

#[derive(Default)]
struct Backoff {
    consecutive_failures: u32,
    last_attempt: Option<Instant>,
}

impl Backoff {
    /// No wait for the first reconnect; then 250 ms doubling to 30 s while attempts keep
    /// failing or come in quick succession (a crash loop).
    fn delay(&self) -> Duration {
        let recent = self
            .last_attempt
            .is_some_and(|at| at.elapsed() < Duration::from_secs(10));
        let exponent = self.consecutive_failures + u32::from(recent);
        if exponent == 0 {
            return Duration::ZERO;
        }
        BASE_BACKOFF
            .saturating_mul(1u32 << exponent.saturating_sub(1).min(16))
            .min(MAX_BACKOFF)
    }
}

/// A configured server and, while it is up, its live rmcp client.
pub(crate) struct Connection {
    pub config: McpServerConfig,
    /// Which non-public addresses an HTTP server may be reached at.
    outbound: keel_outbound::OutboundPolicy,
    pub shared: Arc<Shared>,
    live: RwLock<Option<Arc<Live>>>,
    status: Mutex<StatusFields>,
    reconnect: tokio::sync::Mutex<Backoff>,
    generation: AtomicU64,
    /// Set by [`shutdown`](Self::shutdown): no reconnecting afterwards (a call still in
    /// flight when the server is stopped must not start it again).
    shut_down: AtomicBool,
}

impl Connection {
    /// Connects (bounded by the start-up timeout). Never fails: a failure is recorded in
    /// the status.
    pub(crate) async fn start(
        config: McpServerConfig,
        notices: broadcast::Sender<McpNotice>,
        outbound: keel_outbound::OutboundPolicy,
    ) -> Arc<Self> {
        let conn = Arc::new(Self {
            shared: Arc::new(Shared {
                server: config.name.clone(),
                notices,
                progress: Mutex::new(HashMap::new()),
                catalog: RwLock::new(Catalog::default()),
                stderr_tail: Mutex::new(VecDeque::new()),
                call_timeout: config.call_timeout,
            }),
            config,
            outbound,
            live: RwLock::new(None),
            status: Mutex::new(StatusFields::default()),
            reconnect: tokio::sync::Mutex::new(Backoff::default()),
            generation: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
        });
        if let Err(error) = conn.connect_once().await {
            let mut status = lock(&conn.status);
            status.state = Some(McpServerState::Failed);
            status.error = Some(error);
        }
        conn
    }

    /// A connection that failed before it was started (e.g. a duplicate name).
    pub(crate) fn failed(
        config: McpServerConfig,
        notices: broadcast::Sender<McpNotice>,
        error: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::new(Shared {
                server: config.name.clone(),
                notices,
                progress: Mutex::new(HashMap::new()),
                catalog: RwLock::new(Catalog::default()),
                stderr_tail: Mutex::new(VecDeque::new()),
                call_timeout: config.call_timeout,
            }),
            config,
            outbound: keel_outbound::OutboundPolicy::default(),
            live: RwLock::new(None),
            status: Mutex::new(StatusFields {
                state: Some(McpServerState::Failed),
                error: Some(error),
                ..StatusFields::default()
            }),
            reconnect: tokio::sync::Mutex::new(Backoff::default()),
            generation: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
        })
    }

    pub(crate) fn status(&self) -> McpServerStatus {
        let fields = lock(&self.status);
        let catalog = read(&self.shared.catalog);
        let pid = read(&self.live)
            .as_ref()
            .filter(|l| !l.is_closed())
            .and_then(|l| l.pid);
        McpServerStatus {
            name: self.config.name.clone(),
            transport: self.config.transport_kind().into(),
            state: fields.state.unwrap_or(McpServerState::Failed),
            error: fields.error.clone(),
            protocol_version: fields.protocol_version.clone(),
            server_info: fields.server_info.clone(),
            tools: catalog.tools.iter().map(|t| t.spec.name.clone()).collect(),
            skipped_tools: catalog.skipped.clone(),
            restarts: fields.restarts,
            pid,
        }
    }

    fn current(&self) -> Option<Arc<Live>> {
        read(&self.live)
            .as_ref()
            .filter(|live| !live.is_closed())
            .cloned()
    }

    /// Starts the transport and completes the handshake and the first `tools/list`.
    async fn connect_once(&self) -> Result<Arc<Live>, String> {
        let timeout = self.config.startup_timeout;
        let auto = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        };
        let first = tokio::time::timeout(timeout, self.handshake(auto)).await;
        let (service, pid) = match first {
            Ok(Ok(ok)) => ok,
            Ok(Err(first_error)) => {
                // The discovery probe can break a legacy HTTP server's session handling;
                // retry once with the plain `initialize` handshake.
                tracing::debug!(server = %self.config.name, error = %first_error, "auto lifecycle failed; retrying with initialize");
                match tokio::time::timeout(timeout, self.handshake(ClientLifecycleMode::Initialize))
                    .await
                {
                    Ok(Ok(ok)) => ok,
                    Ok(Err(error)) => return Err(format!("{error}{}", self.shared.stderr_tail())),
                    Err(_) => return Err(self.timeout_error()),
                }
            }
            Err(_) => return Err(self.timeout_error()),
        };
        let catalog = tokio::time::timeout(timeout, fetch_catalog(service.peer(), &self.shared))
            .await
            .map_err(|_| self.timeout_error())??;
        let info = service.peer().peer_info();
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let live = Arc::new(Live {
            service,
            generation,
            pid,
            group: match self.config.transport {
                McpTransport::Stdio { .. } => ProcessGroup::led_by(pid),
                McpTransport::Http { .. } => ProcessGroup::led_by(None),
            },
        });
        *write(&self.live) = Some(Arc::clone(&live));
        let changed = self.shared.set_catalog(catalog);
        {
            let mut status = lock(&self.status);
            status.state = Some(McpServerState::Connected);
            status.protocol_version = info.as_ref().map(|i| i.protocol_version.to_string());
            status.server_info = info
                .as_ref()
                .and_then(|i| i.server_info.as_ref())
                .map(|s| format!("{} {}", s.name, s.version));
        }
        if changed && generation > 1 {
            self.shared.notify(McpNotice::ToolsChanged {
                server: self.config.name.clone(),
                tools: self.shared.tool_names(),
            });
        }
        Ok(live)
    }

    fn timeout_error(&self) -> String {
        format!(
            "did not complete start-up within {} ms (startup_timeout_ms){}",
            self.config.startup_timeout.as_millis(),
            self.shared.stderr_tail()
        )
    }

    async fn handshake(
        &self,
        lifecycle: ClientLifecycleMode,
    ) -> Result<(RunningService<RoleClient, Handler>, Option<u32>), String> {
        let handler = Handler {
            shared: Arc::clone(&self.shared),
        };
        match &self.config.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                env_passthrough,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args);
                // Only the allowlist, the named pass-through variables and the `env` table:
                // Keel's environment holds provider API keys and `.env` values.
                cmd.env_clear();
                cmd.envs(child_environment(
                    std::env::vars_os(),
                    env_passthrough,
                    env,
                )?);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
                #[cfg(unix)]
                wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
                let (transport, stderr) = TokioChildProcess::builder(wrapped)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| {
                        format!("cannot start `{command}`: {e} (check `command` and PATH)")
                    })?;
                let pid = transport.id();
                lock(&self.shared.stderr_tail).clear();
                let mut reader = None;
                if let Some(stderr) = stderr {
                    let shared = Arc::clone(&self.shared);
                    reader = Some(tokio::spawn(drain_stderr(stderr, shared)));
                }
                match handler.serve_with_lifecycle(transport, lifecycle).await {
                    Ok(service) => Ok((service, pid)),
                    Err(error) => {
                        // Stop whatever the server left behind, so its stderr reaches end
                        // of file, and let the reader collect what it printed.
                        ProcessGroup::led_by(pid).kill();
                        if let Some(reader) = reader {
                            let _ = tokio::time::timeout(STDERR_DRAIN, reader).await;
                        }
                        Err(format!("MCP handshake failed: {error}"))
                    }
                }
            }
            McpTransport::Http { url, headers } => {
                let mut custom = std::collections::HashMap::new();
                for (key, value) in headers {
                    let name = http::HeaderName::try_from(key.as_str())
                        .map_err(|e| format!("headers: `{key}` is not a valid header name: {e}"))?;
                    let value = expand_env(value, &format!("headers.{key}"))?;
                    let value = http::HeaderValue::try_from(value)
                        .map_err(|e| format!("headers.{key}: not a valid header value: {e}"))?;
                    custom.insert(name, value);
                }
                let parsed =
                    url::Url::parse(url).map_err(|e| format!("url: `{url}` is not a URL: {e}"))?;
                // Checked here first for an error that names the refusal (rmcp's errors
                // drop their cause); the client's resolver checks each connection.
                self.outbound
                    .check_resolved(&parsed)
                    .await
                    .map_err(|refused| format!("MCP server at {url} not contacted: {refused}"))?;
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom)
                    .reinit_on_expired_session(true);
                let transport = StreamableHttpClientTransport::with_client(
                    http_client(&self.outbound)?,
                    config,
                );
                let service = handler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .map_err(|e| match keel_outbound::refusal_of(&e) {
                        Some(refused) => format!("MCP server at {url} not contacted: {refused}"),
                        None => format!("MCP handshake with {url} failed: {e}"),
                    })?;
                Ok((service, None))
            }
        }
    }

    /// The live client, reconnecting (with backoff) when the connection was lost.
    async fn ensure_live(&self) -> Result<Arc<Live>, String> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        let mut backoff = self.reconnect.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.shut_down.load(Ordering::SeqCst) {
            return Err("the connection was shut down".into());
        }
        let delay = backoff.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        backoff.last_attempt = Some(Instant::now());
        if let Some(old) = write(&self.live).take() {
            drop(old);
        }
        lock(&self.status).state = Some(McpServerState::Reconnecting);
        match self.connect_once().await {
            Ok(live) => {
                backoff.consecutive_failures = 0;
                let restarts = {
                    let mut status = lock(&self.status);
                    status.restarts += 1;
                    status.restarts
                };
                tracing::info!(server = %self.config.name, restarts, "MCP server reconnected");
                self.shared.notify(McpNotice::Reconnected {
                    server: self.config.name.clone(),
                    restarts,
                });
                Ok(live)
            }
            Err(error) => {
                backoff.consecutive_failures = backoff.consecutive_failures.saturating_add(1);
                let retry_in = backoff.delay();
                lock(&self.status).error = Some(error.clone());
                self.shared.notify(McpNotice::ReconnectFailed {
                    server: self.config.name.clone(),
                    error: error.clone(),
                    retry_in_ms: u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX),
                });
                Err(error)
            }
        }
    }

    /// Forgets a lost connection and reconnects in the background, so the next call finds
    /// the server up again.
    fn mark_lost(self: &Arc<Self>, generation: u64, reason: &str) {
        {
            let mut live = write(&self.live);
            if live.as_ref().is_some_and(|l| l.generation == generation) {
                *live = None;
            } else {
                return;
            }
        }
        {
            let mut status = lock(&self.status);
            status.state = Some(McpServerState::Reconnecting);
            status.error = Some(reason.to_string());
        }
        tracing::warn!(server = %self.config.name, %reason, "MCP server connection lost; reconnecting");
        self.shared.notify(McpNotice::Disconnected {
            server: self.config.name.clone(),
            reason: reason.into(),
        });
        if self.shut_down.load(Ordering::SeqCst) {
            return;
        }
        let conn = Arc::clone(self);
        tokio::spawn(async move {
            let _ = conn.ensure_live().await;
        });
    }

    /// Calls `tool` with `args`, bounded by the call timeout and `ctx.cancel`. Error
    /// messages and details taken from the server are capped
    /// ([`cap_tool_error`]).
    pub(crate) async fn call(
        self: &Arc<Self>,
        tool: &RemoteTool,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<Value, ToolError> {
        self.call_uncapped(tool, args, ctx)
            .await
            .map_err(|error| cap_tool_error(error, &tool.spec.name))
    }

    async fn call_uncapped(
        self: &Arc<Self>,
        tool: &RemoteTool,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<Value, ToolError> {
        let server = self.config.name.clone();
        let keel_name = tool.spec.name.clone();
        let deadline = tokio::time::Instant::now() + self.config.call_timeout;
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Err(ToolError::invalid_input(format!(
                    "arguments for `{keel_name}` must be a JSON object, got {other}"
                )));
            }
        };
        let timeout_error = || {
            ToolError::new(
                ToolErrorCode::Timeout,
                format!(
                    "MCP tool `{}` of server `{server}` did not answer within {} ms",
                    tool.remote_name,
                    self.config.call_timeout.as_millis()
                ),
            )
        };
        let cancelled_error = || {
            ToolError::new(
                ToolErrorCode::Cancelled,
                format!("call to `{keel_name}` was cancelled"),
            )
        };

        let live = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return Err(cancelled_error()),
            _ = tokio::time::sleep_until(deadline) => return Err(timeout_error()),
            live = self.ensure_live() => live.map_err(|error| {
                ToolError::new(
                    ToolErrorCode::RetryableServer,
                    format!("MCP server `{server}` is unavailable: {error}"),
                )
            })?,
        };

        let mut params = CallToolRequestParams::new(tool.remote_name.clone());
        params.arguments = Some(arguments);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let peer = live.service.peer().clone();
        // The call's durable key travels with it: a server that deduplicates can take it.
        let mut options = PeerRequestOptions::no_options();
        options.meta = Some(crate::convert::idempotency_meta(&ctx.idempotency_key));
        let handle = match peer.send_request_with_option(request, options).await {
            Ok(handle) => handle,
            Err(error) => {
                self.mark_lost(live.generation, &error.to_string());
                return Err(lost_error(&server, &error, tool.spec.effect));
            }
        };
        let request_id = handle.id.clone();
        let token = progress_key(&handle.progress_token);
        {
            let mut progress = lock(&self.shared.progress);
            // Calls that returned long enough ago no longer route late notifications.
            progress.retain(|_, target| {
                target
                    .ended
                    .is_none_or(|ended| ended.elapsed() < crate::handler::LATE_PROGRESS)
            });
            progress.insert(
                token.clone(),
                crate::handler::ProgressTarget {
                    tool: keel_name.clone(),
                    call_id: ctx.call_id.clone(),
                    ended: None,
                },
            );
        }
        let _progress = ProgressGuard {
            shared: &self.shared,
            token,
        };

        let response = tokio::select! {
            biased;
            response = handle.await_response() => Some(response),
            _ = ctx.cancel.cancelled() => None,
            _ = tokio::time::sleep_until(deadline) => None,
        };
        let Some(response) = response else {
            let cancelled = ctx.cancel.is_cancelled();
            let reason = if cancelled {
                "cancelled by the caller"
            } else {
                "call timed out"
            };
            let notice = CancelledNotificationParam::new(Some(request_id), Some(reason.into()));
            let _ =
                tokio::time::timeout(Duration::from_secs(2), peer.notify_cancelled(notice)).await;
            if cancelled {
                return Err(cancelled_error());
            }
            // A slow tool or a dead connection? Probe in the background; if the server does
            // not answer a ping, reconnect so the next call does not hang as well.
            let conn = Arc::clone(self);
            let generation = live.generation;
            tokio::spawn(async move {
                let ping = ClientRequest::PingRequest(PingRequest::default());
                let probe = tokio::time::timeout(PROBE_TIMEOUT, peer.send_request(ping)).await;
                // An error *answer* (e.g. a revision without ping) still proves liveness.
                let alive = matches!(probe, Ok(Ok(_) | Err(ServiceError::McpError(_))));
                if !alive {
                    conn.mark_lost(generation, "no answer to ping after a call timed out");
                }
            });
            return Err(timeout_error());
        };
        match response {
            Ok(ServerResult::CallToolResult(result)) => {
                let value = serde_json::to_value(&result).unwrap_or(Value::Null);
                map_call_result(
                    &value,
                    tool.spec.output_schema.is_some(),
                    &server,
                    &tool.remote_name,
                )
            }
            Ok(_) => Err(ToolError::new(
                ToolErrorCode::ToolBug,
                format!(
                    "MCP server `{server}` answered tools/call for `{}` with something other \
                     than a tool result (tasks and input requests are not supported)",
                    tool.remote_name
                ),
            )),
            Err(ServiceError::McpError(error)) => {
                let code = classify_jsonrpc_error(error.code.0, &error.message);
                Err(ToolError::new(
                    code,
                    format!("MCP error {}: {}", error.code.0, error.message),
                )
                .with_details(json!({
                    "server": server,
                    "tool": tool.remote_name,
                    "jsonrpc_code": error.code.0,
                    "data": error.data,
                })))
            }
            Err(ServiceError::Timeout { .. }) => Err(timeout_error()),
            Err(ServiceError::Cancelled { .. }) => Err(cancelled_error()),
            Err(error @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                if let Some(status) = http_status(&error)
                    && let Some(code) = ToolErrorCode::from_http_status(status)
                {
                    return Err(ToolError::new(
                        code,
                        format!("MCP server `{server}`: HTTP {status}"),
                    ));
                }
                self.mark_lost(live.generation, &error.to_string());
                Err(lost_error(&server, &error, tool.spec.effect))
            }
            Err(error) => Err(ToolError::new(
                ToolErrorCode::ToolBug,
                format!(
                    "MCP call to `{}` of server `{server}` failed: {error}",
                    tool.remote_name
                ),
            )),
        }
    }

    /// Closes the connection. A stdio server is asked to exit (its stdin is closed, as the
    /// MCP spec says), then whatever is left of its process group gets SIGTERM and, after
    /// a grace period, SIGKILL — also while calls still hold the connection.
    pub(crate) async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        let Some(live) = write(&self.live).take() else {
            return;
        };
        let group = live.group;
        let closed = match Arc::try_unwrap(live) {
            Ok(mut live) => {
                let _ = live
                    .service
                    .close_with_timeout(Duration::from_secs(5))
                    .await;
                Some(live)
            }
            Err(_in_use) => None,
        };
        group.terminate(GROUP_GRACE).await;
        drop(closed);
    }
}

/// Forwards a stdio server's stderr to the log (rate-limited) and keeps its last lines for
/// error messages, reading bounded lines until end of file.
async fn drain_stderr(stderr: tokio::process::ChildStderr, shared: Arc<Shared>) {
    let mut budget = LogBudget::new(Instant::now());
    read_bounded_lines(stderr, MAX_STDERR_LINE_BYTES, |line| {
        match budget.admit(Instant::now()) {
            Admission::Log { suppressed_before } => {
                if suppressed_before > 0 {
                    tracing::debug!(server = %shared.server, "{suppressed_before} stderr lines not logged (rate limit)");
                }
                tracing::debug!(server = %shared.server, "stderr: {line}");
            }
            Admission::Suppress => {}
        }
        shared.push_stderr(line);
    })
    .await;
    let pending = budget.pending();
    if pending > 0 {
        tracing::debug!(server = %shared.server, "{pending} stderr lines not logged (rate limit)");
    }
}

struct ProgressGuard<'a> {
    shared: &'a Shared,
    token: String,
}

impl Drop for ProgressGuard<'_> {
    /// Marks the call returned; its token keeps routing the notifications still being
    /// handled for [`crate::handler::LATE_PROGRESS`] (the next call removes it).
    fn drop(&mut self) {
        if let Some(target) = lock(&self.shared.progress).get_mut(&self.token) {
            target.ended = Some(std::time::Instant::now());
        }
    }
}

fn lost_error(server: &str, error: &ServiceError, effect: Effect) -> ToolError {
    let advice = match effect {
        Effect::ReadOnly | Effect::Idempotent => "so the call can be retried",
        Effect::Mutating => {
            "but the call may already have taken effect: check before calling it again"
        }
    };
    ToolError::new(
        ToolErrorCode::RetryableServer,
        format!(
            "MCP server `{server}` disconnected during the call ({error}); it is being \
             restarted, {advice}"
        ),
    )
}

/// The HTTP client of an MCP server under `policy`: names resolve through the policy,
/// redirects are followed only within the origin (307/308, which keep the JSON-RPC body),
/// and idle connections are not pooled (as rmcp's own client: a pooled connection whose
/// previous body was not read to the end stalls on delayed ACKs).
fn http_client(policy: &keel_outbound::OutboundPolicy) -> Result<reqwest::Client, String> {
    policy
        .client_builder()
        .pool_max_idle_per_host(0)
        .redirect(keel_outbound::redirect::same_origin_policy())
        .build()
        .map_err(|e| format!("cannot create the HTTP client: {e}"))
}

/// The HTTP status behind a transport error, if there is one.
fn http_status(error: &ServiceError) -> Option<u16> {
    use rmcp::transport::streamable_http_client::HttpStatusError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(status) = current.downcast_ref::<HttpStatusError>() {
            return Some(status.status);
        }
        source = current.source();
    }
    None
}
