//! `keel-mcp` connects Keel to the Model Context Protocol, on the official `rmcp` SDK.
//!
//! As a client it starts or reaches the MCP servers declared in `keel.toml`
//! (`[[mcp.servers]]`, see [`McpServerConfig`]) in parallel, negotiates the protocol
//! version each speaks (the discovery-based 2026-07-28 protocol, or the `initialize`
//! handshake of 2025-11-25 and older), and wraps every server tool as an ordinary Keel
//! [`DynTool`](keel_core::DynTool) named `<server>__<tool>` ([`McpManager`], [`McpTool`]).
//! Calls have timeouts and cancellation (sending `notifications/cancelled`), results and
//! errors become Keel outputs and typed `ToolError`s, a crashed stdio server is restarted
//! with backoff, an expired HTTP session is re-initialized, and progress, list-changed and
//! log notifications are published as [`McpNotice`]s. A stdio server gets a cleared
//! environment ([`child_environment`]: no API keys), runs in its own process group (stopped
//! as a whole), and has its stderr read in bounded lines; errors a server sends are capped
//! before they reach the log or a prompt ([`convert::cap_tool_error`]). As a server it
//! exposes a [`ToolRegistry`](keel_core::ToolRegistry) over MCP stdio ([`serve_stdio`]),
//! refusing calls its [`ApprovalGate`] denies or that need human approval, and containing
//! panics.
//!
//! It must not decide anything about runs: no retries beyond reconnecting, no approval
//! prompts, no event log. Those belong to `keel-runtime`, which treats MCP tools exactly
//! like built-in ones. It must not panic on anything a server sends.

mod child;
mod config;
mod connection;
pub mod convert;
mod handler;
mod manager;
mod notice;
mod server;

pub use config::{
    BASE_ENV_PASSTHROUGH, DEFAULT_CALL_TIMEOUT, DEFAULT_STARTUP_TIMEOUT, McpServerConfig,
    McpTransport, child_environment,
};
pub use manager::{McpManager, McpTool};
pub use notice::{McpNotice, McpServerState, McpServerStatus};
pub use server::{
    ApprovalGate, KeelMcpServer, ServeError, ServedApproval, mcp_tool_for_spec, serve, serve_stdio,
    serve_stdio_with,
};
