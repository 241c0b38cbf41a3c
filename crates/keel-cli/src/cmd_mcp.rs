//! `keel mcp list|serve`: the MCP servers declared in keel.toml, and Keel's own tools served
//! over MCP stdio — under keel.toml's `[approvals]`, resolved as keel-app resolves them
//! for a run ([`approval_gate`]): denied calls and calls that would need a human are
//! refused.

use std::sync::Arc;

use keel_core::{ApprovalMode as ToolApproval, MemoryStore, ToolSpec};
use keel_mcp::{ApprovalGate, KeelMcpServer, McpManager, McpServerConfig, ServedApproval};
use keel_runtime::RunApprovalMode;

use crate::CliError;

/// `keel mcp` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Connect to every `[[mcp.servers]]` of keel.toml and show status and tools.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve Keel's built-in tools (and declared HTTP tools) as an MCP server over stdio.
    Serve {
        /// Only these tools (repeatable; default: all built-in tools).
        #[arg(long = "tool", value_name = "NAME")]
        tools: Vec<String>,
    },
}

/// Runs `keel mcp list`.
pub async fn list(servers: Vec<McpServerConfig>, json: bool) -> Result<u8, CliError> {
    if servers.is_empty() {
        eprintln!("keel: no [[mcp.servers]] declared in keel.toml (see docs/mcp.md)");
    }
    let manager = McpManager::connect_all(servers).await;
    let statuses = manager.statuses();
    manager.shutdown().await;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&statuses).unwrap_or_default()
        );
    } else {
        for status in &statuses {
            println!(
                "{} ({}) {:?}{}{}",
                status.name,
                status.transport,
                status.state,
                status
                    .protocol_version
                    .as_deref()
                    .map(|v| format!(" protocol {v}"))
                    .unwrap_or_default(),
                status
                    .error
                    .as_deref()
                    .map(|e| format!(" — {e}"))
                    .unwrap_or_default()
            );
            for tool in &status.tools {
                println!("  {tool}");
            }
            for skipped in &status.skipped_tools {
                println!("  skipped: {skipped}");
            }
        }
    }
    let failed = statuses
        .iter()
        .filter(|s| s.error.is_some() && s.tools.is_empty())
        .count();
    Ok(if failed > 0 { 1 } else { 0 })
}

/// Runs `keel mcp serve` over stdio until the client disconnects.
pub async fn serve(registry: keel_core::ToolRegistry, tools: &[String]) -> Result<u8, CliError> {
    let registry = if tools.is_empty() {
        registry
    } else {
        registry
            .subset(tools.iter().map(String::as_str))
            .map_err(|unknown| {
                CliError::usage(format!(
                    "unknown tool(s) {}; see `keel tools list`",
                    unknown.join(", ")
                ))
            })?
    };
    let server = KeelMcpServer::new(registry).with_approvals(approval_gate(crate::config::app()));
    keel_mcp::serve_stdio_with(server)
        .await
        .map_err(|e| CliError::failure(format!("mcp serve: {e}")))?;
    Ok(0)
}

/// keel.toml's `[approvals]` for tools served over MCP: the run context keel-app builds
/// for a run with no `--approve` flag and no agent says whether a call needs a decision
/// and whether that decision is `deny` — the same resolution a run's calls get.
pub fn approval_gate(app: &keel_app::App) -> ApprovalGate {
    let context = app.run_context(Arc::new(MemoryStore::new()), None, None);
    Arc::new(move |spec: &ToolSpec| {
        let declared_always = spec.approval == ToolApproval::Always;
        if !context.requires_approval(&spec.name, declared_always) {
            ServedApproval::Run
        } else if context.approval_mode_for(&spec.name) == RunApprovalMode::Deny {
            ServedApproval::Deny
        } else {
            ServedApproval::Ask
        }
    })
}
