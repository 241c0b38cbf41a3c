//! [`McpManager`]: every configured MCP server, connected in parallel at start-up, and
//! their tools as ordinary Keel [`DynTool`]s ([`McpTool`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use keel_core::{DynTool, RegistryError, ToolContext, ToolError, ToolRegistry, ToolSpec};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::config::McpServerConfig;
use crate::connection::Connection;
use crate::convert::proxied_tool_name;
use crate::handler::RemoteTool;
use crate::notice::{McpNotice, McpServerStatus};

/// Capacity of the notice channel; slow subscribers lose the oldest notices.
const NOTICE_CAPACITY: usize = 1024;

/// All configured MCP servers. Cheap to clone.
#[derive(Clone)]
pub struct McpManager {
    servers: Vec<Arc<Connection>>,
    notices: broadcast::Sender<McpNotice>,
}

impl std::fmt::Debug for McpManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.servers.iter().map(|s| &s.config.name))
            .finish()
    }
}

impl McpManager {
    /// Connects every server in parallel, each bounded by its `startup_timeout`. A server
    /// that fails (cannot start, handshake error, timeout, duplicate name) is recorded with
    /// its error in [`statuses`](Self::statuses) and skipped; this never fails.
    ///
    /// An HTTP server may be reached at its URL's host whatever its address (the operator
    /// configured it), and otherwise only at public addresses; see
    /// [`connect_all_with`](Self::connect_all_with).
    pub async fn connect_all(configs: impl IntoIterator<Item = McpServerConfig>) -> Self {
        Self::connect_with(configs, None).await
    }

    /// [`connect_all`](Self::connect_all) with HTTP servers reached under `outbound`, used
    /// as given (keel-outbound's policy: to reach a server whose host is not public,
    /// include it with [`OutboundPolicy::allowing_destination`](keel_outbound::OutboundPolicy::allowing_destination)).
    pub async fn connect_all_with(
        configs: impl IntoIterator<Item = McpServerConfig>,
        outbound: &keel_outbound::OutboundPolicy,
    ) -> Self {
        Self::connect_with(configs, Some(outbound)).await
    }

    async fn connect_with(
        configs: impl IntoIterator<Item = McpServerConfig>,
        outbound: Option<&keel_outbound::OutboundPolicy>,
    ) -> Self {
        let (notices, _) = broadcast::channel(NOTICE_CAPACITY);
        let mut seen = BTreeSet::new();
        let mut pending = Vec::new();
        for config in configs {
            let prefix = proxied_tool_name(&config.name, "x");
            if seen.insert(prefix) {
                let policy = match (outbound, &config.transport) {
                    (Some(policy), _) => policy.clone(),
                    (None, crate::config::McpTransport::Http { url, .. }) => {
                        keel_outbound::OutboundPolicy::default().allowing_destination(url)
                    }
                    (None, crate::config::McpTransport::Stdio { .. }) => {
                        keel_outbound::OutboundPolicy::default()
                    }
                };
                pending.push(futures::future::Either::Left(Connection::start(
                    config,
                    notices.clone(),
                    policy,
                )));
            } else {
                let error = format!(
                    "another MCP server already uses the name `{}` (names must be unique after \
                     sanitizing to lowercase_snake_case)",
                    config.name
                );
                let conn = Connection::failed(config, notices.clone(), error);
                pending.push(futures::future::Either::Right(std::future::ready(conn)));
            }
        }
        let servers = futures::future::join_all(pending).await;
        for server in &servers {
            let status = server.status();
            match &status.error {
                Some(error) => tracing::warn!(server = %status.name, %error, "MCP server skipped"),
                None => tracing::info!(
                    server = %status.name,
                    tools = status.tools.len(),
                    protocol = status.protocol_version.as_deref().unwrap_or("?"),
                    "MCP server connected"
                ),
            }
        }
        Self { servers, notices }
    }

    /// One status per configured server, in configuration order (for `keel mcp list`).
    pub fn statuses(&self) -> Vec<McpServerStatus> {
        self.servers.iter().map(|s| s.status()).collect()
    }

    /// Every tool of every connected server, as of now, sorted by name per server.
    pub fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        let mut out: Vec<Arc<dyn DynTool>> = Vec::new();
        for server in &self.servers {
            for tool in server.shared.tools() {
                out.push(Arc::new(McpTool {
                    remote: tool,
                    conn: Arc::clone(server),
                }));
            }
        }
        out
    }

    /// Registers every tool into `registry`. A tool the registry refuses (e.g. a name clash
    /// with a built-in tool) is skipped and its error returned.
    pub fn register_tools(&self, registry: &mut ToolRegistry) -> Vec<RegistryError> {
        self.tools()
            .into_iter()
            .filter_map(|tool| registry.register(tool).err())
            .collect()
    }

    /// Progress, list-changed, reconnect and log notices from all servers.
    pub fn subscribe(&self) -> broadcast::Receiver<McpNotice> {
        self.notices.subscribe()
    }

    /// Closes every connection (stops stdio servers).
    pub async fn shutdown(&self) {
        futures::future::join_all(self.servers.iter().map(|s| s.shutdown())).await;
    }
}

/// A tool of an MCP server, callable like any other Keel tool. Calls go to whatever
/// connection the server has at the time (a restarted server is used transparently).
pub struct McpTool {
    remote: Arc<RemoteTool>,
    conn: Arc<Connection>,
}

impl McpTool {
    /// The server's name.
    pub fn server(&self) -> &str {
        &self.conn.config.name
    }

    /// The tool's name on the server.
    pub fn remote_name(&self) -> &str {
        &self.remote.remote_name
    }
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.remote.spec.name)
            .field("server", &self.conn.config.name)
            .field("remote_name", &self.remote.remote_name)
            .finish()
    }
}

impl DynTool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.remote.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move { self.conn.call(&self.remote, args, ctx).await })
    }
}
