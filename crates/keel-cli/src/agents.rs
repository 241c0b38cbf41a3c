//! Shared by every command that drives runs (`run`, `resume`, `approve`, `deny`, `reply`,
//! `worker`): the agent flags (model, tools, budget, approvals), the store flag, building
//! the agent — including a scripted model positioned where a resumed run left off — and
//! the run context (observers, approval prompt).

use std::io::IsTerminal;
use std::sync::Arc;

use keel_core::{CancellationToken, EventStore};
use keel_runtime::{RunApprovalMode, RunContext, RunError, Thread};
use keel_testkit::ScriptedModel;
use serde::{Deserialize, Serialize};

use crate::CliError;
use crate::config::{app, app_error};
use crate::models::ModelArgs;
use crate::output::{OutputFormat, TextPrinter};

/// `--store`.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The event store: sqlite://PATH, postgres://..., or memory: (default: KEEL_STORE, else
    /// keel.toml [store] url, else sqlite://.keel/keel.db).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

impl StoreArgs {
    /// Opens the store (event log and run queue): `--store` > `KEEL_STORE` > keel.toml.
    pub async fn open(&self) -> Result<keel_store::OpenedStore, CliError> {
        app()
            .open_store(self.store.as_deref())
            .await
            .map_err(app_error)
    }

    /// Opens the event log only.
    pub async fn events(&self) -> Result<Arc<dyn EventStore>, CliError> {
        Ok(self.open().await?.events)
    }

    /// Opens the store and takes the lease of `thread_id` for `command` (the same lease a
    /// worker takes: `keel_app::claim`), so no other driver drives the thread meanwhile;
    /// fails naming the holder when one does. Drive the thread through the claim's store
    /// and release it at the end.
    pub async fn claim(
        &self,
        thread_id: &str,
        command: &str,
    ) -> Result<keel_app::claim::ThreadClaim, CliError> {
        let opened = self.open().await?;
        keel_app::claim::ThreadClaim::take(opened.events, opened.queue, thread_id, command)
            .await
            .map_err(|e| CliError::failure(e.to_string()))
    }

    /// [`StoreArgs::claim`] of the thread `--thread ID` names (created with this id if it
    /// does not exist) or of a new one, then that thread as the claimed store holds it —
    /// loaded after the lease was taken, so no other driver's write is missed.
    pub async fn claim_thread(
        &self,
        thread_id: Option<&str>,
        command: &str,
    ) -> Result<(keel_app::claim::ThreadClaim, Thread), CliError> {
        let id = match thread_id {
            Some(id) => id.to_string(),
            None => Thread::new().id().to_string(),
        };
        let claim = self.claim(&id, command).await?;
        match Thread::load(claim.store().as_ref(), &id).await {
            Ok(thread) => Ok((claim, thread)),
            Err(error) => {
                claim.release().await;
                Err(CliError::failure(format!(
                    "cannot load thread {id}: {error}"
                )))
            }
        }
    }
}

/// `--approve` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApproveFlag {
    /// Only tools declared `approval: always` need approval.
    #[default]
    Auto,
    /// Every tool call needs approval.
    Ask,
    /// Calls that need approval are denied.
    Deny,
}

impl ApproveFlag {
    /// The runtime's approval mode.
    pub fn mode(self) -> RunApprovalMode {
        match self {
            Self::Auto => RunApprovalMode::Auto,
            Self::Ask => RunApprovalMode::Ask,
            Self::Deny => RunApprovalMode::Deny,
        }
    }
}

/// The flags that define the agent.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Make a tool available (repeatable). See `keel tools list`.
    #[arg(long = "tool", value_name = "NAME")]
    pub tools: Vec<String>,
    /// Maximum model calls in the run.
    #[arg(long, value_name = "N")]
    pub max_turns: Option<u32>,
    /// System instructions for the agent.
    #[arg(long, value_name = "TEXT")]
    pub instructions: Option<String>,
    /// Which calls need approval: auto (tools declared so; the default), ask (every call),
    /// deny (deny them). Without a terminal on stdin, a call needing approval pauses the
    /// run (exit 10).
    #[arg(long, value_enum, value_name = "MODE")]
    pub approve: Option<ApproveFlag>,
    /// The agent: a keel.toml [agents.<name>] name, or an agent file (e.g.
    /// agents/detective/agent.toml). A name wins over a file of the same name. Default:
    /// keel.toml [defaults] agent. See docs/configuration.md.
    #[arg(long, value_name = "NAME|FILE")]
    pub agent: Option<String>,
    /// How the context is kept within the window: truncate (default), summarize, importance.
    #[arg(long, value_name = "STRATEGY")]
    pub context_strategy: Option<String>,
    /// Override the model's context window, in tokens.
    #[arg(long, value_name = "TOKENS")]
    pub context_window: Option<u32>,
    /// Maximum output tokens per model call (also what the context budget reserves for the
    /// answer; by default the model's limit, at most a quarter of the context window).
    #[arg(long, value_name = "TOKENS")]
    pub max_output_tokens: Option<u32>,
}

/// The agent flags as data: the payload of `keel submit` and — resolved — the recipe
/// every run records, from which `keel resume`, `approve`, `deny`, `reply` and workers
/// rebuild the agent with no flags (see [`keel_app::recipe`] and [`crate::recorded`]).
pub use keel_app::recipe::Recipe as AgentSpec;

impl AgentArgs {
    /// The flags given, as data (script path made absolute so another process can find
    /// it; `--agent` resolved to a keel.toml name or an absolute file path).
    pub fn spec(&self) -> Result<AgentSpec, CliError> {
        let script = match &self.model.script {
            Some(path) => Some(
                std::path::absolute(path)
                    .map_err(|e| CliError::usage(format!("--script {}: {e}", path.display())))?,
            ),
            None => None,
        };
        let mut spec = AgentSpec {
            model: self.model.model.clone(),
            base_url: self.model.base_url.clone(),
            script,
            tools: self.tools.clone(),
            max_turns: self.max_turns,
            instructions: self.instructions.clone(),
            approve: self.approve.map(ApproveFlag::mode),
            context_strategy: self.context_strategy.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            ..AgentSpec::default()
        };
        if let Some(reference) = &self.agent {
            spec.set_agent(app().find_agent(reference).map_err(app_error)?);
        }
        Ok(spec)
    }

    /// [`spec`](Self::spec) for a new run: without `--agent`, keel.toml's
    /// `[defaults] agent`.
    pub fn new_run_spec(&self) -> Result<AgentSpec, CliError> {
        let mut spec = self.spec()?;
        if self.agent.is_none()
            && let Some(agent) = app().default_agent().map_err(app_error)?
        {
            spec.set_agent(agent);
        }
        Ok(spec)
    }
}

/// A built agent, the scripted model behind it when there is one, and the agent's own
/// approval mode.
pub struct Built {
    /// The agent, with the agents it hands off to (runs follow handoffs).
    pub agent: keel_app::ComposedAgent,
    /// The scripted model (to record its requests).
    pub scripted: Option<Arc<ScriptedModel>>,
    /// The definition's `approve`.
    pub approve: Option<RunApprovalMode>,
}

/// What the CLI does with a recipe: build its agent through keel-app (with the scripted
/// model of `--script`, notices on stderr) and make the run context of a terminal.
pub trait RecipeExt {
    /// Builds the agent (keel-app checks every reference first). `consumed_steps` is how
    /// many model answers the run being resumed already has: a script continues at that
    /// step (0 for a new run).
    fn build(&self, consumed_steps: usize) -> impl Future<Output = Result<Built, CliError>> + Send;

    /// The run context: the store, the approval modes (`--approve` > the agent's >
    /// keel.toml), a live printer in text mode, an interactive approval prompt when stdin
    /// is a terminal (otherwise approvals defer and the run pauses), and the cancellation
    /// token.
    fn context(
        &self,
        built: &Built,
        store: Arc<dyn EventStore>,
        output: OutputFormat,
        interactive: bool,
        cancel: CancellationToken,
    ) -> RunContext;

    /// The store and approval modes only (no observers, approvals defer).
    fn base_context(&self, built: &Built, store: Arc<dyn EventStore>) -> RunContext;
}

impl RecipeExt for AgentSpec {
    async fn build(&self, consumed_steps: usize) -> Result<Built, CliError> {
        self.validate().map_err(app_error)?;
        let (model_override, scripted) = match &self.script {
            Some(path) => {
                let (model, scripted) = crate::scripted::scripted_from(path, consumed_steps)?;
                (Some(model), Some(scripted))
            }
            None => (None, None),
        };
        let built = self
            .build_agent(app(), model_override)
            .await
            .map_err(app_error)?;
        for notice in &built.notices {
            eprintln!("keel: {}", crate::redaction::for_stderr(notice));
        }
        Ok(Built {
            agent: built.agent,
            scripted,
            approve: built.approve,
        })
    }

    fn context(
        &self,
        built: &Built,
        store: Arc<dyn EventStore>,
        output: OutputFormat,
        interactive: bool,
        cancel: CancellationToken,
    ) -> RunContext {
        let mut context = self.base_context(built, store).with_cancel(cancel);
        if output == OutputFormat::Text {
            context = context.with_observer(Arc::new(TextPrinter));
        }
        if let Some(telemetry) = crate::config::telemetry_observer() {
            context = context.with_observer(telemetry);
        }
        if interactive && std::io::stdin().is_terminal() {
            context = context.with_approvals(Arc::new(crate::terminal_prompt::TerminalPrompt));
        }
        context
    }

    /// A run of a `keel serve` tenant (a server job leased by `keel worker`, a server
    /// thread resumed here) resolves its tools' credentials from that tenant's
    /// `[server.tenants.<tenant>.credentials]` only, never from this process's environment.
    fn base_context(&self, built: &Built, store: Arc<dyn EventStore>) -> RunContext {
        let context = app().run_context(store, self.approve, built.approve);
        match &self.tenant {
            Some(tenant) => context.with_credentials(Arc::new(
                keel_server::credentials::Credentials::of_app(app()).for_tenant(tenant),
            )),
            None => context,
        }
    }
}

pub use keel_app::resume::consumed_steps;

/// A run error as a CLI error (a store conflict means another process drives the
/// thread; see [`keel_app::worker::run_error`]).
pub fn run_error(error: RunError) -> CliError {
    CliError::failure(keel_app::worker::run_error(&error))
}
