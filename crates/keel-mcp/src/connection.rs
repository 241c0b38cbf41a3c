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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keel_core::{ToolContext, ToolError, ToolErrorCode, ToolSpec};
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, Implementation, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, ServerResult,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer, PeerRequestOptions,
    RunningService,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError};
use serde_json::{Map, Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::broadcast;

use crate::config::{McpServerConfig, McpTransport, expand_env};
use crate::convert::{
    classify_jsonrpc_error, map_call_result, proxied_tool_name, spec_from_mcp_tool,
};
use crate::notice::{McpNotice, McpServerState, McpServerStatus};

/// Most pages of `tools/list` followed before giving up (a server looping on cursors).
const MAX_LIST_PAGES: usize = 100;
/// Lines of a stdio server's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 20;
/// Upper bound of the reconnect backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First non-zero reconnect delay.
const BASE_BACKOFF: Duration = Duration::from_millis(250);

/// A tool offered by a server, with its Keel spec.
#[derive(Debug)]
pub(crate) struct RemoteTool {
    pub remote_name: String,
    pub spec: ToolSpec,
}

#[derive(Default)]
struct Catalog {
    tools: Vec<Arc<RemoteTool>>,
    skipped: Vec<String>,
}

/// State shared between the connection and rmcp's notification handler.
pub(crate) struct Shared {
    pub server: String,
    notices: broadcast::Sender<McpNotice>,
    progress: Mutex<HashMap<String, (String, String)>>,
    catalog: RwLock<Catalog>,
    stderr_tail: Mutex<VecDeque<String>>,
    call_timeout: Duration,
}

impl Shared {
    fn notify(&self, notice: McpNotice) {
        // No subscriber is fine: notices are best-effort.
        let _ = self.notices.send(notice);
    }

    fn set_catalog(&self, catalog: Catalog) -> bool {
        let mut guard = write(&self.catalog);
        let before: Vec<&str> = guard.tools.iter().map(|t| t.spec.name.as_str()).collect();
        let after: Vec<&str> = catalog.tools.iter().map(|t| t.spec.name.as_str()).collect();
        let changed = before != after
            || guard
                .tools
                .iter()
                .zip(&catalog.tools)
                .any(|(a, b)| a.spec != b.spec);
        *guard = catalog;
        changed
    }

    pub(crate) fn tools(&self) -> Vec<Arc<RemoteTool>> {
        read(&self.catalog).tools.clone()
    }

    fn tool_names(&self) -> Vec<String> {
        read(&self.catalog)
            .tools
            .iter()
            .map(|t| t.spec.name.clone())
            .collect()
    }

    fn stderr_tail(&self) -> String {
        let tail = lock(&self.stderr_tail);
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "; stderr: {}",
                tail.iter().cloned().collect::<Vec<_>>().join(" | ")
            )
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn progress_key(token: &ProgressToken) -> String {
    serde_json::to_string(&token.0).unwrap_or_default()
}

/// rmcp's client handler: forwards progress and logs, refreshes the catalog on
/// `notifications/tools/list_changed`.
#[derive(Clone)]
pub(crate) struct Handler {
    shared: Arc<Shared>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("keel", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let target = lock(&self.shared.progress)
            .get(&progress_key(&params.progress_token))
            .cloned();
        if let Some((tool, call_id)) = target {
            self.shared.notify(McpNotice::Progress {
                server: self.shared.server.clone(),
                tool,
                call_id,
                progress: params.progress,
                total: params.total,
                message: params.message,
            });
        }
    }

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let shared = Arc::clone(&self.shared);
        let peer = context.peer;
        tokio::spawn(async move {
            let timeout = shared.call_timeout;
            match tokio::time::timeout(timeout, fetch_catalog(&peer, &shared)).await {
                Ok(Ok(catalog)) => {
                    shared.set_catalog(catalog);
                    shared.notify(McpNotice::ToolsChanged {
                        server: shared.server.clone(),
                        tools: shared.tool_names(),
                    });
                }
                Ok(Err(error)) => {
                    tracing::warn!(server = %shared.server, %error, "refreshing MCP tool list failed");
                }
                Err(_) => {
                    tracing::warn!(server = %shared.server, "refreshing MCP tool list timed out");
                }
            }
        });
    }

    // Logging is deprecated by SEP-2577 (2026-07-28) but still sent by 2025-11-25 servers.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let level = serde_json::to_value(params.level)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "info".into());
        self.shared.notify(McpNotice::Log {
            server: self.shared.server.clone(),
            level,
            logger: params.logger,
            data: params.data,
        });
    }
}

/// Lists every tool (following `nextCursor`) and wraps each one.
async fn fetch_catalog(peer: &Peer<RoleClient>, shared: &Shared) -> Result<Catalog, String> {
    let mut raw = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let mut params = PaginatedRequestParams::default();
        params.cursor = cursor;
        let page = peer
            .list_tools(Some(params))
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        raw.extend(page.tools);
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let mut catalog = Catalog::default();
    let mut used = BTreeSet::new();
    for tool in raw {
        let value = serde_json::to_value(&tool).unwrap_or(Value::Null);
        let remote_name = tool.name.to_string();
        let mut name = proxied_tool_name(&shared.server, &remote_name);
        let mut suffix = 2;
        while used.contains(&name) {
            let tail = format!("_{suffix}");
            let base: String = name.chars().take(64 - tail.len()).collect();
            name = format!("{}{tail}", base.trim_end_matches('_'));
            suffix += 1;
        }
        let spec = spec_from_mcp_tool(&name, &shared.server, &value, shared.call_timeout);
        let problems = spec.contract_violations();
        if !problems.is_empty() {
            catalog
                .skipped
                .push(format!("{remote_name}: {}", problems.join("; ")));
            continue;
        }
        used.insert(name);
        catalog
            .tools
            .push(Arc::new(RemoteTool { remote_name, spec }));
    }
    catalog.tools.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    Ok(catalog)
}

struct Live {
    service: RunningService<RoleClient, Handler>,
    generation: u64,
    pid: Option<u32>,
}

impl Live {
    fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
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
    pub shared: Arc<Shared>,
    live: RwLock<Option<Arc<Live>>>,
    status: Mutex<StatusFields>,
    reconnect: tokio::sync::Mutex<Backoff>,
    generation: AtomicU64,
}

impl Connection {
    /// Connects (bounded by the start-up timeout). Never fails: a failure is recorded in
    /// the status.
    pub(crate) async fn start(
        config: McpServerConfig,
        notices: broadcast::Sender<McpNotice>,
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
            live: RwLock::new(None),
            status: Mutex::new(StatusFields::default()),
            reconnect: tokio::sync::Mutex::new(Backoff::default()),
            generation: AtomicU64::new(0),
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
            live: RwLock::new(None),
            status: Mutex::new(StatusFields {
                state: Some(McpServerState::Failed),
                error: Some(error),
                ..StatusFields::default()
            }),
            reconnect: tokio::sync::Mutex::new(Backoff::default()),
            generation: AtomicU64::new(0),
        });
        conn
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
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args);
                for (key, value) in env {
                    cmd.env(key, expand_env(value, &format!("env.{key}"))?);
                }
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
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
                    reader = Some(tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            tracing::debug!(server = %shared.server, "stderr: {line}");
                            let mut tail = lock(&shared.stderr_tail);
                            if tail.len() >= STDERR_TAIL_LINES {
                                tail.pop_front();
                            }
                            tail.push_back(line);
                        }
                    }));
                }
                match handler.serve_with_lifecycle(transport, lifecycle).await {
                    Ok(service) => Ok((service, pid)),
                    Err(error) => {
                        // Let the reader collect what the dying server printed.
                        if let Some(reader) = reader {
                            let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
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
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom)
                    .reinit_on_expired_session(true);
                let transport = StreamableHttpClientTransport::from_config(config);
                let service = handler
                    .serve_with_lifecycle(transport, lifecycle)
                    .await
                    .map_err(|e| format!("MCP handshake with {url} failed: {e}"))?;
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
        let conn = Arc::clone(self);
        tokio::spawn(async move {
            let _ = conn.ensure_live().await;
        });
    }

    /// Calls `tool` with `args`, bounded by the call timeout and `ctx.cancel`.
    pub(crate) async fn call(
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
        let handle = match peer
            .send_request_with_option(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(error) => {
                self.mark_lost(live.generation, &error.to_string());
                return Err(lost_error(&server, &error));
            }
        };
        let request_id = handle.id.clone();
        let token = progress_key(&handle.progress_token);
        lock(&self.shared.progress).insert(token.clone(), (keel_name.clone(), ctx.call_id.clone()));
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
            return Err(if cancelled {
                cancelled_error()
            } else {
                timeout_error()
            });
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
                if let Some(status) = http_status(&error) {
                    if let Some(code) = ToolErrorCode::from_http_status(status) {
                        return Err(ToolError::new(
                            code,
                            format!("MCP server `{server}`: HTTP {status}"),
                        ));
                    }
                }
                self.mark_lost(live.generation, &error.to_string());
                Err(lost_error(&server, &error))
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

    /// Closes the connection (stops a stdio server).
    pub(crate) async fn shutdown(&self) {
        let live = write(&self.live).take();
        if let Some(live) = live
            && let Ok(mut live) = Arc::try_unwrap(live)
        {
            let _ = live
                .service
                .close_with_timeout(Duration::from_secs(5))
                .await;
        }
    }
}

struct ProgressGuard<'a> {
    shared: &'a Shared,
    token: String,
}

impl Drop for ProgressGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.progress).remove(&self.token);
    }
}

fn lost_error(server: &str, error: &ServiceError) -> ToolError {
    ToolError::new(
        ToolErrorCode::RetryableServer,
        format!(
            "MCP server `{server}` disconnected during the call ({error}); it is being \
             restarted, so the call can be retried"
        ),
    )
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
