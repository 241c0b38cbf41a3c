//! Tools declared in keel.toml: `[[tools.http]]` (declarative HTTP tools), the MCP servers
//! of `[[mcp.servers]]` (connected once per process, in parallel, failures reported and
//! skipped), and the `[tools] builtin` list.

use std::sync::{Arc, OnceLock};

use keel_core::ToolRegistry;
use keel_mcp::McpManager;

use crate::CliError;

static MCP: OnceLock<McpManager> = OnceLock::new();

/// The MCP servers of keel.toml, connected on first use.
pub fn mcp_manager() -> Option<&'static McpManager> {
    let servers = &crate::config::get().mcp.servers;
    if servers.is_empty() {
        return None;
    }
    if let Some(manager) = MCP.get() {
        return Some(manager);
    }
    let servers = servers.clone();
    // Connecting is async; commands build agents synchronously inside the runtime.
    let manager = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(McpManager::connect_all(servers))
    });
    for status in manager.statuses() {
        if let Some(error) = &status.error
            && status.tools.is_empty()
        {
            eprintln!(
                "{}",
                crate::redaction::for_stderr(&format!(
                    "keel: MCP server `{}` is unavailable and was skipped: {error}",
                    status.name
                ))
            );
        }
    }
    Some(MCP.get_or_init(|| manager))
}

/// Registers the configured tools into `catalog` and returns the names available by default
/// (declared HTTP tools, MCP tools and the `[tools] builtin` list).
pub fn register_configured(catalog: &mut ToolRegistry) -> Result<Vec<String>, CliError> {
    let config = crate::config::get();
    let mut names: Vec<String> = config.tools.builtin.clone().unwrap_or_default();
    for (index, table) in config.tools.http.iter().enumerate() {
        let declared: keel_tools::HttpToolConfig = toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e| CliError::usage(format!("keel.toml tools.http[{index}]: {e}")))?;
        let tool = keel_tools::HttpTool::new(declared)
            .map_err(|e| CliError::usage(format!("keel.toml tools.http[{index}]: {e}")))?;
        let name = keel_core::DynTool::spec(&tool).name.clone();
        catalog
            .register(Arc::new(tool))
            .map_err(|e| CliError::usage(format!("keel.toml tools.http[{index}]: {e}")))?;
        names.push(name);
    }
    if let Some(manager) = mcp_manager() {
        for error in manager.register_tools(catalog) {
            eprintln!(
                "{}",
                crate::redaction::for_stderr(&format!("keel: MCP tool skipped: {error}"))
            );
        }
        for tool in manager.tools() {
            names.push(tool.spec().name.clone());
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Disconnects MCP servers before exit.
pub async fn shutdown() {
    if let Some(manager) = MCP.get() {
        manager.shutdown().await;
    }
}
