//! Shared by every command that drives runs (`run`, `resume`, `approve`, `deny`, `reply`,
//! `worker`): the agent flags (model, tools, budget, approvals), the store flag, building
//! the agent — including a scripted model positioned where a resumed run left off — and
//! the run context (observers, approval prompt).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use keel_app::{AgentRef, AgentRequest};
use keel_core::{CancellationToken, EventStore};
use keel_runtime::{Agent, RunApprovalMode, RunContext, RunError};
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

/// The agent flags as data: the payload of `keel submit`, and — resolved (model chosen,
/// agent file hashed) — the recipe every run records in its `RunStarted` event, from
/// which `keel resume`, `approve`, `deny`, `reply` and workers rebuild the agent with no
/// flags (see [`crate::recorded`]). It never holds secrets: API keys are read from the
/// environment again when the agent is rebuilt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// `--model`.
    #[serde(default)]
    pub model: Option<String>,
    /// `--base-url`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// `--script`, made absolute.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// `--tool`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// `--max-turns`.
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// `--instructions`.
    #[serde(default)]
    pub instructions: Option<String>,
    /// `--approve` (`None`: keel.toml's approvals decide).
    #[serde(default)]
    pub approve: Option<ApproveFlag>,
    /// `--agent FILE`, made absolute.
    #[serde(default)]
    pub agent: Option<PathBuf>,
    /// `--agent NAME`: an `[agents.<name>]` table of keel.toml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// SHA-256 of the agent file when the run started (set when resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_sha256: Option<String>,
    /// `--context-strategy`.
    #[serde(default)]
    pub context_strategy: Option<String>,
    /// `--context-window`.
    #[serde(default)]
    pub context_window: Option<u32>,
    /// `--max-output-tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// The `keel submit` message a worker started this run for (not part of the agent: a
    /// worker that takes the job over finds the job's own run by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
}

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
            approve: self.approve,
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
    /// The agent.
    pub agent: Agent,
    /// The scripted model (to record its requests).
    pub scripted: Option<Arc<ScriptedModel>>,
    /// The definition's `approve`.
    pub approve: Option<RunApprovalMode>,
}

impl AgentSpec {
    fn set_agent(&mut self, agent: AgentRef) {
        match agent {
            AgentRef::Named(name) => {
                self.agent_name = Some(name);
                self.agent = None;
            }
            AgentRef::File(path) => {
                self.agent = Some(path);
                self.agent_name = None;
            }
            _ => {}
        }
        self.agent_sha256 = None;
    }

    /// Builds the agent (keel-app checks every reference first). `consumed_steps` is how
    /// many model answers the run being resumed already has: a script continues at that
    /// step (0 for a new run).
    pub async fn build(&self, consumed_steps: usize) -> Result<Built, CliError> {
        if self.max_turns == Some(0) {
            return Err(CliError::usage("--max-turns must be at least 1"));
        }
        if self.context_window.is_some_and(|w| w < 256) {
            return Err(CliError::usage(
                "--context-window must be at least 256 tokens",
            ));
        }
        if self.max_output_tokens == Some(0) {
            return Err(CliError::usage("--max-output-tokens must be at least 1"));
        }
        let (model_override, scripted) = match &self.script {
            Some(path) => {
                let (model, scripted) = crate::scripted::scripted_from(path, consumed_steps)?;
                (Some(model), Some(scripted))
            }
            None => (None, None),
        };
        let agent = match (&self.agent_name, &self.agent) {
            (Some(name), _) => Some(AgentRef::Named(name.clone())),
            (None, Some(path)) => Some(AgentRef::File(path.clone())),
            (None, None) => None,
        };
        let request = AgentRequest {
            agent,
            model: self.model.clone(),
            model_override,
            base_url: self.base_url.clone(),
            tools: self.tools.clone(),
            instructions: self.instructions.clone(),
            max_turns: self.max_turns,
            context_strategy: self.context_strategy.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
        };
        let (builder, resolution) = app().agent_builder(&request).await.map_err(app_error)?;
        for notice in &resolution.notices {
            eprintln!("keel: {}", crate::redaction::for_stderr(notice));
        }
        let mut resolved = self.clone();
        if self.script.is_none() {
            resolved.model.clone_from(&resolution.model_spec);
        }
        if let Some(path) = &self.agent {
            resolved.agent_sha256 = Some(crate::recorded::file_sha256(path)?);
        }
        if resolution.definition.is_none() {
            // The tools actually chosen (keel.toml's declared tools when no `--tool` was
            // given), so a resumed run gets the same set.
            resolved.tools.clone_from(&resolution.tools);
        }
        let recipe = serde_json::to_value(&resolved)
            .map_err(|e| CliError::failure(format!("cannot record the agent definition: {e}")))?;
        Ok(Built {
            agent: builder.recipe(recipe).build(),
            scripted,
            approve: resolution.approve,
        })
    }

    /// The run context: the store, the approval modes (`--approve` > the agent's >
    /// keel.toml), a live printer in text mode, an interactive approval prompt when stdin
    /// is a terminal (otherwise approvals defer and the run pauses), and the cancellation
    /// token.
    pub fn context(
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

    /// The store and approval modes only (no observers, approvals defer).
    pub fn base_context(&self, built: &Built, store: Arc<dyn EventStore>) -> RunContext {
        app().run_context(store, self.approve.map(ApproveFlag::mode), built.approve)
    }
}

pub use crate::scripted::consumed_steps;

/// A run error as a CLI error; a store conflict means another process drives the thread.
pub fn run_error(error: RunError) -> CliError {
    match &error {
        RunError::Store(keel_core::StoreError::Conflict { thread_id, .. }) => {
            CliError::failure(format!(
                "another process is driving thread {thread_id} (append conflict: {error}); \
                 nothing of this step was written — try again when it is done"
            ))
        }
        _ => CliError::failure(error.to_string()),
    }
}
