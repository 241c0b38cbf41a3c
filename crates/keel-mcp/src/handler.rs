//! The shared per-server state ([`Shared`]): the tool catalog, progress routing and the
//! stderr tail; and rmcp's client handler ([`Handler`]) that forwards progress and log
//! notifications and refreshes the catalog on `notifications/tools/list_changed`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use keel_core::ToolSpec;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{NotificationContext, Peer};
use rmcp::{ClientHandler, RoleClient};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::convert::{
    MAX_ERROR_DETAILS_CHARS, cap_text, cap_value, proxied_tool_name, spec_from_mcp_tool,
};
use crate::notice::McpNotice;

/// Most pages of `tools/list` followed before giving up (a server looping on cursors).
const MAX_LIST_PAGES: usize = 100;
/// Lines of a stdio server's stderr kept for error messages.
pub(crate) const STDERR_TAIL_LINES: usize = 20;
/// Most bytes of stderr lines kept for error messages (the oldest lines go first).
pub(crate) const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// Most characters of a progress message forwarded.
const MAX_PROGRESS_MESSAGE_CHARS: usize = 1024;

/// A tool offered by a server, with its Keel spec.
#[derive(Debug)]
pub(crate) struct RemoteTool {
    pub remote_name: String,
    pub spec: ToolSpec,
}

#[derive(Default)]
pub(crate) struct Catalog {
    pub(crate) tools: Vec<Arc<RemoteTool>>,
    pub(crate) skipped: Vec<String>,
}

/// How long a finished call's progress token still routes notifications: rmcp hands
/// each notification to its own task, so one the server sent before its answer may be
/// handled after the call returned.
pub(crate) const LATE_PROGRESS: Duration = Duration::from_secs(30);

/// The call a progress token reports on.
pub(crate) struct ProgressTarget {
    /// Keel's name of the tool.
    pub(crate) tool: String,
    /// The call's id.
    pub(crate) call_id: String,
    /// When the call returned (`None`: still running); the entry goes once this is older
    /// than [`LATE_PROGRESS`].
    pub(crate) ended: Option<std::time::Instant>,
}

/// State shared between the connection and rmcp's notification handler.
pub(crate) struct Shared {
    pub(crate) server: String,
    pub(crate) notices: broadcast::Sender<McpNotice>,
    /// Progress token → the call it reports on ([`ProgressTarget`]).
    pub(crate) progress: Mutex<HashMap<String, ProgressTarget>>,
    pub(crate) catalog: RwLock<Catalog>,
    pub(crate) stderr_tail: Mutex<VecDeque<String>>,
    pub(crate) call_timeout: Duration,
}

impl Shared {
    pub(crate) fn notify(&self, notice: McpNotice) {
        // No subscriber is fine: notices are best-effort.
        let _ = self.notices.send(notice);
    }

    pub(crate) fn set_catalog(&self, catalog: Catalog) -> bool {
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

    pub(crate) fn tool_names(&self) -> Vec<String> {
        read(&self.catalog)
            .tools
            .iter()
            .map(|t| t.spec.name.clone())
            .collect()
    }

    /// Keeps `line` (already bounded by the reader) as the newest line of the stderr tail,
    /// dropping the oldest lines beyond [`STDERR_TAIL_LINES`] or [`STDERR_TAIL_BYTES`].
    pub(crate) fn push_stderr(&self, line: String) {
        let mut tail = lock(&self.stderr_tail);
        tail.push_back(line);
        let mut bytes: usize = tail.iter().map(String::len).sum();
        while tail.len() > STDERR_TAIL_LINES || (bytes > STDERR_TAIL_BYTES && tail.len() > 1) {
            if let Some(oldest) = tail.pop_front() {
                bytes = bytes.saturating_sub(oldest.len());
            }
        }
    }

    pub(crate) fn stderr_tail(&self) -> String {
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

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub(crate) fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub(crate) fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn progress_key(token: &ProgressToken) -> String {
    serde_json::to_string(&token.0).unwrap_or_default()
}

/// rmcp's client handler: forwards progress and logs, refreshes the catalog on
/// `notifications/tools/list_changed`.
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) shared: Arc<Shared>,
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
            .map(|target| (target.tool.clone(), target.call_id.clone()));
        if let Some((tool, call_id)) = target {
            self.shared.notify(McpNotice::Progress {
                server: self.shared.server.clone(),
                tool,
                call_id,
                progress: params.progress,
                total: params.total,
                message: params
                    .message
                    .map(|m| cap_text(m, MAX_PROGRESS_MESSAGE_CHARS, "MCP progress message")),
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
        let source = format!("MCP server `{}` log", self.shared.server);
        self.shared.notify(McpNotice::Log {
            server: self.shared.server.clone(),
            level,
            logger: params.logger,
            data: cap_value(params.data, MAX_ERROR_DETAILS_CHARS, &source),
        });
    }
}

/// Lists every tool (following `nextCursor`) and wraps each one.
pub(crate) async fn fetch_catalog(
    peer: &Peer<RoleClient>,
    shared: &Shared,
) -> Result<Catalog, String> {
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
