//! What MCP servers tell Keel outside of call results ([`McpNotice`]), and what `keel mcp
//! list` shows about each server ([`McpServerStatus`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Something an MCP server reported, fanned out on a `tokio::sync::broadcast` channel
/// (see [`McpManager::subscribe`](crate::McpManager::subscribe)) for the runtime to turn
/// into events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum McpNotice {
    /// `notifications/progress` for a running tool call.
    Progress {
        /// Server name.
        server: String,
        /// Keel tool name (`server__tool`).
        tool: String,
        /// The tool call id from the `ToolContext`.
        call_id: String,
        /// Progress so far.
        progress: f64,
        /// Total, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        /// Human-readable progress message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The server's tool catalog changed (`notifications/tools/list_changed` or a
    /// reconnect); the list holds the Keel names now available.
    ToolsChanged {
        /// Server name.
        server: String,
        /// Keel tool names, sorted.
        tools: Vec<String>,
    },
    /// The connection was lost (a stdio server exited, an HTTP server went away).
    Disconnected {
        /// Server name.
        server: String,
        /// Why, as far as known.
        reason: String,
    },
    /// The server was restarted or reconnected after a loss.
    Reconnected {
        /// Server name.
        server: String,
        /// How many times this server has been reconnected so far.
        restarts: u64,
    },
    /// A reconnect attempt failed; the next call retries after a backoff.
    ReconnectFailed {
        /// Server name.
        server: String,
        /// The error.
        error: String,
        /// Wait before the next attempt, in milliseconds.
        retry_in_ms: u64,
    },
    /// `notifications/message` (server log).
    Log {
        /// Server name.
        server: String,
        /// Log level (`debug` ... `emergency`).
        level: String,
        /// Logger name, when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logger: Option<String>,
        /// The log payload.
        data: Value,
    },
}

/// Connection state of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpServerState {
    /// Connected; its tools are available.
    Connected,
    /// The connection was lost; it is re-established on the next call.
    Reconnecting,
    /// Could not be started or reached; skipped (see `error`).
    Failed,
}

/// What `keel mcp list` shows for one configured server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpServerStatus {
    /// Configured name.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// Current state.
    pub state: McpServerState,
    /// The last error, when the state is not `connected` (or the last recovered error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Negotiated protocol version, e.g. `2025-11-25`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The server's self-reported `name version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_info: Option<String>,
    /// Keel tool names offered by this server, sorted.
    pub tools: Vec<String>,
    /// Tools the server offers that could not be wrapped, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_tools: Vec<String>,
    /// How many times the server was restarted or reconnected.
    pub restarts: u64,
    /// Process id of a stdio server, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}
