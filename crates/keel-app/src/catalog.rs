//! The tool catalog an [`App`](crate::App) offers agents: the built-in tools, tools the
//! caller adds, keel.toml's `[[tools.http]]`, its `[[a2a.agents]]` (remote A2A agents as
//! tools; nothing is fetched until a call) and the tools of its `[[mcp.servers]]` (the
//! servers are connected once per `App`, in parallel; unavailable ones are skipped with a
//! warning). Agents pick tools from it by name.

use std::sync::Arc;

use keel_config::KeelConfig;
use keel_core::{DynTool, ToolRegistry};
use keel_mcp::McpManager;

use crate::error::AppError;

/// The tools available to agents, and which are offered when none are named.
#[derive(Clone)]
pub struct Catalog {
    /// Every tool.
    pub registry: ToolRegistry,
    /// The tools offered by default (no agent, no `--tool`): keel.toml's declared HTTP
    /// tools, MCP tools and the `[tools] builtin` list.
    pub defaults: Vec<String>,
    /// Problems that did not stop the catalog (an MCP server or tool skipped).
    pub warnings: Vec<String>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("tools", &self.registry.names().collect::<Vec<_>>())
            .field("defaults", &self.defaults)
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl Catalog {
    /// The registry of `names`; unknown names come back as the error's list.
    pub fn select<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<ToolRegistry, Vec<String>> {
        self.registry.subset(names)
    }

    /// Every tool name, comma-separated (for messages).
    pub fn names(&self) -> String {
        self.registry.names().collect::<Vec<_>>().join(", ")
    }
}

/// Builds the catalog: built-ins, `extra`, keel.toml's HTTP tools and A2A agents (their
/// `auth` credentials asked of the call's credential source, else read from `env` at
/// each call), then `mcp`'s tools.
pub(crate) fn build(
    config: &KeelConfig,
    extra: &ToolRegistry,
    mcp: Option<&McpManager>,
    env: &crate::Env,
) -> Result<Catalog, AppError> {
    let tool_error = |name: String, message: String| AppError::Tool { name, message };
    let mut registry =
        keel_tools::builtin_registry().map_err(|e| tool_error("built-in".into(), e.to_string()))?;
    for name in extra.names() {
        if let Some(tool) = extra.get(name).filter(|_| registry.get(name).is_none()) {
            registry
                .register(Arc::clone(tool))
                .map_err(|e| tool_error(name.to_string(), e.to_string()))?;
        }
    }
    let mut defaults: Vec<String> = config.tools.builtin.clone().unwrap_or_default();
    let outbound = config
        .outbound
        .policy()
        .map_err(|e| tool_error("keel.toml [outbound]".into(), e.to_string()))?;
    for (index, declared) in config.tools.http.iter().enumerate() {
        let at = format!("keel.toml tools.http[{index}] `{}`", declared.name);
        let tool = keel_tools::HttpTool::new(declared.clone())
            .map_err(|e| tool_error(at.clone(), e.to_string()))?;
        let policy = outbound.allowing_destination(tool.url_template());
        let tool = tool
            .with_outbound(policy)
            .map_err(|e| tool_error(at.clone(), e.to_string()))?
            .with_call_env(Arc::clone(env));
        let name = DynTool::spec(&tool).name.clone();
        registry
            .register(Arc::new(tool))
            .map_err(|e| tool_error(at, e.to_string()))?;
        defaults.push(name);
    }
    for (index, declared) in config.a2a.agents.iter().enumerate() {
        let at = format!("keel.toml a2a.agents[{index}] `{}`", declared.name);
        let auth = declared.auth.clone().unwrap_or_default();
        let agent = keel_a2a::RemoteAgent {
            name: declared.name.clone(),
            url: declared.url.clone(),
            description: declared.description.clone(),
            auth: keel_a2a::Auth {
                bearer_env: auth.bearer_env,
                headers: auth.headers,
            },
            timeout: std::time::Duration::from_millis(declared.timeout_ms()),
            env: Arc::clone(env),
            outbound: Some(crate::a2a_agent::policy_of(&outbound, declared)),
            interface_origins: declared.interface_origins.clone(),
        };
        let tool =
            keel_a2a::A2aTool::new(agent).map_err(|e| tool_error(at.clone(), e.to_string()))?;
        registry
            .register_typed(tool)
            .map_err(|e| tool_error(at, e.to_string()))?;
        defaults.push(declared.name.clone());
    }
    let mut warnings = Vec::new();
    if let Some(manager) = mcp {
        for status in manager.statuses() {
            if let Some(error) = &status.error
                && status.tools.is_empty()
            {
                warnings.push(format!(
                    "MCP server `{}` is unavailable and was skipped: {error}",
                    status.name
                ));
            }
        }
        for error in manager.register_tools(&mut registry) {
            warnings.push(format!("MCP tool skipped: {error}"));
        }
        for tool in manager.tools() {
            defaults.push(tool.spec().name.clone());
        }
    }
    defaults.sort();
    defaults.dedup();
    Ok(Catalog {
        registry,
        defaults,
        warnings,
    })
}
