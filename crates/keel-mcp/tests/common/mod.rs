//! Shared helpers of the keel-mcp integration tests: where the real MCP servers installed
//! by `./scripts/install-mcp-peers` live, and tool contexts.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::time::Duration;

use keel_core::{CancellationToken, ToolContext};
use keel_mcp::McpServerConfig;

/// The install root of the peers: `$KEEL_MCP_PEERS` or `<workspace>/.peers/mcp`.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os("KEEL_MCP_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/mcp"),
    }
}

fn require(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{what} is not installed at {}: run ./scripts/install-mcp-peers",
        path.display()
    );
    path
}

/// `node .../server-everything/dist/index.js`
pub fn everything_js() -> String {
    let path =
        peers_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    require(path, "@modelcontextprotocol/server-everything")
        .display()
        .to_string()
}

/// `node .../server-filesystem/dist/index.js`
pub fn filesystem_js() -> String {
    let path =
        peers_dir().join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    require(path, "@modelcontextprotocol/server-filesystem")
        .display()
        .to_string()
}

/// `.../venv/bin/mcp-server-time`
pub fn time_bin() -> String {
    require(
        peers_dir().join("venv/bin/mcp-server-time"),
        "mcp-server-time (PyPI)",
    )
    .display()
    .to_string()
}

/// server-everything over stdio, named `everything`.
pub fn everything() -> McpServerConfig {
    McpServerConfig::stdio("everything", "node", [everything_js(), "stdio".to_string()])
        .with_startup_timeout(Duration::from_secs(30))
        .with_call_timeout(Duration::from_secs(20))
}

/// A fresh tool context.
pub fn ctx(call_id: &str) -> ToolContext {
    ToolContext::new("thr_test", "run_test", call_id, CancellationToken::new())
}
