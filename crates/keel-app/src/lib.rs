//! Keel's application layer: configuration turned into the things a run needs — the
//! store, models, the tool catalog (built-in, HTTP, MCP), agents and run contexts. The
//! `keel` CLI, servers and library users all go through it, so an agent declared once
//! (keel.toml `[agents.<name>]` or an agent file) behaves the same everywhere.
//!
//! An [`App`] owns the loaded keel.toml, the environment lookup and the MCP servers it
//! connected (no process-global state):
//!
//! ```no_run
//! # async fn demo() -> Result<(), keel_app::AppError> {
//! let app = keel_app::App::load(None)?; // ./keel.toml (and .env)
//! let agent = app.find_agent("detective")?; // [agents.detective] or a file path
//! let built = app
//!     .agent(&keel_app::AgentRequest { agent: Some(agent), ..Default::default() })
//!     .await?;
//! let store = app.open_store(None).await?;
//! let context = app.run_context(store.events, None, built.resolution.approve);
//! # let _ = (built.agent, context);
//! # Ok(()) }
//! ```
//!
//! Precedence everywhere: the caller's explicit value (a CLI flag) > the environment
//! variable named in `docs/configuration.md` > keel.toml > the built-in default.

pub mod a2a_agent;
mod build;
mod catalog;
pub mod claim;
pub mod compose;
pub mod crash_point;
pub mod definition;
mod error;
pub mod model;
pub mod recipe;
pub mod responses;
pub mod resume;
pub mod store;
pub mod threads;
pub mod worker;
pub mod workflow;

use std::path::Path;
use std::sync::Arc;

use keel_config::{KeelConfig, LoadedConfig, OutputFormat};
use keel_core::{EventStore, ToolRegistry};
use keel_mcp::McpManager;
use keel_runtime::{RunApprovalMode, RunContext, ToolAgent, ToolAgentBuilder};
use keel_store::OpenedStore;

pub use a2a_agent::A2aAgent;
pub use build::{AgentRequest, DEFAULT_INSTRUCTIONS, Resolution};
pub use catalog::Catalog;
pub use compose::ComposedAgent;
pub use definition::AgentRef;
pub use error::AppError;
pub use model::ModelSettings;
pub use responses::ResponsesAgent;
pub use store::{STORE_ENV, StoreOrigin};

/// An environment lookup (the process environment by default).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A built agent and what building chose.
pub struct BuiltAgent {
    /// The agent.
    pub agent: ToolAgent,
    /// The choices made (model spec, tools, agent name or file, approval mode, notices).
    pub resolution: Resolution,
}

impl std::fmt::Debug for BuiltAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltAgent")
            .field("resolution", &self.resolution)
            .finish_non_exhaustive()
    }
}

/// The application: keel.toml loaded, plus what it connected.
pub struct App {
    loaded: LoadedConfig,
    env: Env,
    extra_tools: ToolRegistry,
    mcp: tokio::sync::OnceCell<Option<McpManager>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("config", &self.loaded.path)
            .field("extra_tools", &self.extra_tools.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl App {
    /// Loads `path` (`--config FILE`) or `./keel.toml` (after `./.env`).
    pub fn load(path: Option<&Path>) -> Result<Self, AppError> {
        Ok(Self::new(KeelConfig::load(path)?))
    }

    /// An application over an already loaded configuration, reading the process
    /// environment.
    pub fn new(loaded: LoadedConfig) -> Self {
        Self {
            loaded,
            env: Arc::new(|name: &str| std::env::var(name).ok()),
            extra_tools: ToolRegistry::new(),
            mcp: tokio::sync::OnceCell::new(),
        }
    }

    /// keel.toml text as if it were `base_dir/keel.toml`, `${VAR}` expanded from `env`,
    /// which is also the environment the application reads afterwards.
    pub fn from_toml_str(text: &str, base_dir: &Path, env: Env) -> Result<Self, AppError> {
        let loaded = KeelConfig::loaded_from_str(text, base_dir, &*env)?;
        Ok(Self::new(loaded).with_env(env))
    }

    /// Reads the environment through `env` (API keys, `KEEL_STORE`, `${VAR}` of HTTP tools).
    #[must_use]
    pub fn with_env(mut self, env: Env) -> Self {
        self.env = env;
        self
    }

    /// Adds tools to the catalog (before keel.toml's).
    #[must_use]
    pub fn with_tools(mut self, tools: &ToolRegistry) -> Self {
        for name in tools.names() {
            if let Some(tool) = tools.get(name) {
                let _ = self.extra_tools.register(Arc::clone(tool));
            }
        }
        self
    }

    /// The configuration.
    pub fn config(&self) -> &KeelConfig {
        &self.loaded.config
    }

    /// The configuration with where it came from.
    pub fn loaded(&self) -> &LoadedConfig {
        &self.loaded
    }

    /// The environment lookup.
    pub fn env(&self) -> &(dyn Fn(&str) -> Option<String> + Send + Sync) {
        &*self.env
    }

    /// The environment lookup, shared (for what outlives a borrow of the application).
    pub fn shared_env(&self) -> Env {
        Arc::clone(&self.env)
    }

    /// The store URL: `flag` > `KEEL_STORE` > keel.toml `[store] url` > the default.
    pub fn store_url(&self, flag: Option<&str>) -> (String, StoreOrigin) {
        store::store_url(flag, self.env()(STORE_ENV), &self.config().store.url)
    }

    /// Opens the store [`store_url`](Self::store_url) chooses.
    pub async fn open_store(&self, flag: Option<&str>) -> Result<OpenedStore, AppError> {
        store::open_store(&self.store_url(flag).0).await
    }

    /// The MCP servers of keel.toml, connected on first use (`None` without servers),
    /// under the outbound policy with every HTTP server's host allowed.
    pub async fn mcp(&self) -> Option<&McpManager> {
        self.mcp
            .get_or_init(|| async {
                let servers = self.config().mcp.servers.clone();
                if servers.is_empty() {
                    return None;
                }
                let mut policy = self.outbound_policy_or_public();
                for server in &servers {
                    if let keel_mcp::McpTransport::Http { url, .. } = &server.transport {
                        policy = policy.allowing_destination(url);
                    }
                }
                Some(McpManager::connect_all_with(servers, &policy).await)
            })
            .await
            .as_ref()
    }

    /// The outbound policy of `[outbound] allow_private` (keel-outbound): public
    /// addresses and the listed entries. Each client adds the destination keel.toml (or
    /// an agent file) configures for it ([`OutboundPolicy::allowing_destination`]).
    ///
    /// [`OutboundPolicy::allowing_destination`]: keel_outbound::OutboundPolicy::allowing_destination
    pub fn outbound_policy(&self) -> Result<keel_outbound::OutboundPolicy, AppError> {
        self.config()
            .outbound
            .policy()
            .map_err(|error| AppError::Tool {
                name: "keel.toml [outbound]".into(),
                message: error.to_string(),
            })
    }

    /// [`outbound_policy`](Self::outbound_policy), or public addresses only when
    /// `allow_private` is invalid (a loaded keel.toml never has an invalid one: the load
    /// refuses it).
    fn outbound_policy_or_public(&self) -> keel_outbound::OutboundPolicy {
        self.outbound_policy().unwrap_or_default()
    }

    /// The tool catalog.
    pub async fn catalog(&self) -> Result<Catalog, AppError> {
        catalog::build(
            self.config(),
            &self.extra_tools,
            self.mcp().await,
            &self.env,
        )
    }

    /// `reference` as an agent: an `[agents.<name>]` name of keel.toml (a name wins over a
    /// file of the same name), else an agent file relative to the current directory.
    pub fn find_agent(&self, reference: &str) -> Result<AgentRef, AppError> {
        let dir = std::env::current_dir().unwrap_or_else(|_| ".".into());
        definition::find(&self.loaded, reference, &dir)
    }

    /// The agent `[defaults] agent` names (a file path there is relative to keel.toml).
    pub fn default_agent(&self) -> Result<Option<AgentRef>, AppError> {
        match &self.config().defaults.agent {
            Some(reference) => {
                definition::find(&self.loaded, reference, &self.loaded.base_dir).map(Some)
            }
            None => Ok(None),
        }
    }

    /// The builder of the agent `request` describes, every reference checked, and what was
    /// chosen — for callers that set more (a recipe, observers) before `build()`.
    pub async fn agent_builder(
        &self,
        request: &AgentRequest,
    ) -> Result<(ToolAgentBuilder, Resolution), AppError> {
        build::agent_builder(self, request).await
    }

    /// Builds the agent `request` describes.
    pub async fn agent(&self, request: &AgentRequest) -> Result<BuiltAgent, AppError> {
        let (builder, resolution) = self.agent_builder(request).await?;
        Ok(BuiltAgent {
            agent: builder.build(),
            resolution,
        })
    }

    /// Builds workflow `request.workflow` (`[workflows.<name>]`): every agent it names is
    /// checked first (an unknown one is an error naming the file, key and line).
    pub async fn workflow(
        &self,
        request: &workflow::WorkflowRequest,
    ) -> Result<keel_runtime::Workflow, AppError> {
        workflow::build(self, request).await
    }

    /// Builds the agent `request` describes with what it composes: its `agents_as_tools`
    /// (already among its tools) and, when it hands off, every agent its conversations can
    /// be handed to — run through [`ComposedAgent::run`] so handoffs are followed. A remote
    /// A2A agent (`a2a = "…"`) is built alone (it composes nothing). Use it
    /// rather than [`agent`](Self::agent) for agents with `handoffs`.
    pub async fn composed_agent(
        &self,
        request: &AgentRequest,
    ) -> Result<(ComposedAgent, Resolution), AppError> {
        if a2a_agent::refers_to_a2a(self, request.agent.as_ref()) {
            let (agent, resolution) = self.a2a_agent(request, serde_json::Value::Null)?;
            return Ok((ComposedAgent::remote(agent), resolution));
        }
        let (builder, resolution) = self.agent_builder(request).await?;
        let agent = self
            .compose(builder, &resolution, request, serde_json::Value::Null)
            .await?;
        Ok((agent, resolution))
    }

    /// [`composed_agent`](Self::composed_agent) from a builder the caller prepared (e.g.
    /// with a recipe): every agent reachable by handoff is built with the same `recipe`,
    /// so a thread resumed from its log rebuilds the whole group.
    pub async fn compose(
        &self,
        builder: ToolAgentBuilder,
        resolution: &Resolution,
        request: &AgentRequest,
        recipe: serde_json::Value,
    ) -> Result<ComposedAgent, AppError> {
        compose::compose(self, builder, resolution, request, recipe).await
    }

    /// The output format of `keel run`: `flag`, else `[defaults] output`.
    pub fn output_format(&self, flag: Option<OutputFormat>) -> OutputFormat {
        flag.unwrap_or(self.config().defaults.output)
    }

    /// The approval mode of a run: `flag` > the agent's `approve` > `[approvals] mode` >
    /// `[defaults] approve` > `auto`.
    pub fn approval_mode(
        &self,
        flag: Option<RunApprovalMode>,
        agent: Option<RunApprovalMode>,
    ) -> RunApprovalMode {
        let config = self.config();
        flag.or(agent)
            .or(config.approvals.mode)
            .or(config.defaults.approve)
            .unwrap_or_default()
    }

    /// A run context over `store` with the run's approval mode
    /// ([`approval_mode`](Self::approval_mode)) and keel.toml's per-tool modes
    /// (`[approvals] tools.<tool>`, which apply whatever the run's mode).
    pub fn run_context(
        &self,
        store: Arc<dyn EventStore>,
        flag: Option<RunApprovalMode>,
        agent: Option<RunApprovalMode>,
    ) -> RunContext {
        let mut context =
            RunContext::new(store).with_approval_mode(self.approval_mode(flag, agent));
        for (tool, mode) in &self.config().approvals.tools {
            context = context.with_tool_approval_mode(tool.clone(), *mode);
        }
        context
    }

    /// Disconnects the MCP servers.
    pub async fn shutdown(&self) {
        if let Some(Some(manager)) = self.mcp.get() {
            manager.shutdown().await;
        }
    }
}

/// `; did you mean `X`?` when a candidate is close to `given`.
pub(crate) fn hint(given: &str, candidates: &[&str]) -> String {
    keel_config::diagnostic::nearest(given, candidates.iter().copied())
        .map_or_else(String::new, |best| format!("; did you mean `{best}`?"))
}
