//! Shared by every command that drives runs (`run`, `resume`, `approve`, `deny`, `reply`,
//! `worker`): the agent flags (model, tools, budget, approvals), the store flag, building
//! the agent — including a scripted model positioned where a resumed run left off — and
//! the run context (observers, approval prompt).

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use keel_core::{
    Budget, CancellationToken, Event, EventKind, EventStore, Model, ModelCapabilities, ModelError,
    ModelRequest, StreamEvent, ToolCall, ToolRegistry,
};
use keel_runtime::{
    Agent, ApprovalDecision, ApprovalHandler, RunApprovalMode, RunContext, RunError,
};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde::{Deserialize, Serialize};

use crate::CliError;
use crate::models::{self, ModelArgs};
use crate::output::{OutputFormat, TextPrinter};
use crate::test_tools;

/// The default store: a SQLite file under the working directory.
pub const DEFAULT_STORE: &str = "sqlite://.keel/keel.db";

/// `--store`.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The event store: sqlite://PATH (default .keel/keel.db), postgres://..., or memory:.
    #[arg(long, value_name = "URL", env = "KEEL_STORE", default_value = DEFAULT_STORE)]
    pub store: String,
}

impl StoreArgs {
    /// Opens the store (event log and run queue).
    ///
    /// Several processes opening a new SQLite file at once race to create its schema; a
    /// failed open is retried a few times before it is reported.
    pub async fn open(&self) -> Result<keel_store::OpenedStore, CliError> {
        let mut attempt = 0u64;
        loop {
            match keel_store::open(&self.store).await {
                Ok(opened) => return Ok(opened),
                Err(e) if attempt < 4 && !self.store.starts_with("postgres") => {
                    attempt += 1;
                    tracing::debug!(
                        "opening store {} failed ({e}); retrying",
                        crate::redaction::display_url(&self.store)
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                }
                Err(e) => {
                    return Err(CliError::failure(format!(
                        "cannot open store {}: {e}",
                        crate::redaction::display_url(&self.store)
                    )));
                }
            }
        }
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
    /// An agent file (instructions, declared HTTP tools, budget, critic), e.g.
    /// agents/detective/agent.toml. See docs/detective.md.
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `--approve`.
    #[serde(default)]
    pub approve: ApproveFlag,
    /// `--agent`, made absolute.
    #[serde(default)]
    pub agent: Option<PathBuf>,
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
    /// The flags as data (script path made absolute so another process can find it).
    pub fn spec(&self) -> Result<AgentSpec, CliError> {
        let script = match &self.model.script {
            Some(path) => Some(
                std::path::absolute(path)
                    .map_err(|e| CliError::usage(format!("--script {}: {e}", path.display())))?,
            ),
            None => None,
        };
        Ok(AgentSpec {
            model: self.model.model.clone(),
            base_url: self.model.base_url.clone(),
            script,
            tools: self.tools.clone(),
            max_turns: self.max_turns,
            instructions: self.instructions.clone(),
            approve: self.approve.unwrap_or_default(),
            agent: match &self.agent {
                Some(path) => Some(
                    std::path::absolute(path)
                        .map_err(|e| CliError::usage(format!("--agent {}: {e}", path.display())))?,
                ),
                None => None,
            },
            agent_sha256: None,
            context_strategy: self.context_strategy.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            submission: None,
        })
    }
}

/// A built agent, and the scripted model behind it when there is one.
pub struct Built {
    /// The agent.
    pub agent: Agent,
    /// The scripted model (to record its requests).
    pub scripted: Option<Arc<ScriptedModel>>,
}

impl AgentSpec {
    /// Builds the agent. `consumed_steps` is how many model answers the run being resumed
    /// already has: a script continues at that step (0 for a new run).
    pub fn build(&self, consumed_steps: usize) -> Result<Built, CliError> {
        let config = crate::config::get();
        let mut resolved = self.clone();
        let agent_file = match &self.agent {
            Some(path) => {
                let mut file = keel_detective::AgentFile::load(path)
                    .map_err(|e| CliError::usage(format!("--agent {}: {e}", path.display())))?;
                resolved.agent_sha256 = Some(crate::recorded::file_sha256(path)?);
                if let Some(turns) = self.max_turns {
                    file.budget.max_turns = Some(turns);
                }
                if let Some(instructions) = &self.instructions {
                    file.instructions.clone_from(instructions);
                }
                Some(file)
            }
            None => None,
        };
        let (model, scripted): (Arc<dyn Model>, Option<Arc<ScriptedModel>>) = match &self.script {
            Some(path) => {
                let (model, scripted) = scripted_from(path, consumed_steps)?;
                (model, Some(scripted))
            }
            None => {
                let spec = self
                    .model
                    .clone()
                    .or_else(|| agent_file.as_ref().and_then(|f| f.model.clone()))
                    .or_else(|| config.defaults.model.clone())
                    .unwrap_or_else(models::default_model_spec);
                resolved.model = Some(spec.clone());
                let selected = models::select(&ModelArgs {
                    model: Some(spec),
                    base_url: self.base_url.clone(),
                    script: None,
                })?;
                (selected.model, selected.scripted)
            }
        };
        if self.max_turns == Some(0) {
            return Err(CliError::usage("--max-turns must be at least 1"));
        }
        let mut builder = match &agent_file {
            Some(file) => {
                let env = |name: &str| std::env::var(name).ok();
                let builder = keel_detective::agent_file::agent_builder(file, model, &env)
                    .map_err(|e| CliError::usage(format!("agent file: {e}")))?;
                if self.tools.is_empty() {
                    builder
                } else {
                    // `--tool` adds tools from the whole catalog (built-in, keel.toml, MCP)
                    // to the file's own.
                    let mut tools = file
                        .tool_registry_with_env(&env)
                        .map_err(|e| CliError::usage(format!("agent file: {e}")))?;
                    let extra = select_tools(&self.tools)?;
                    for name in extra.names() {
                        if let Some(tool) = extra.get(name).filter(|_| tools.get(name).is_none()) {
                            tools
                                .register(tool.clone())
                                .map_err(|e| CliError::usage(format!("--tool {name}: {e}")))?;
                        }
                    }
                    builder.tools(tools)
                }
            }
            None => {
                let tools = select_tools(&self.tools)?;
                // Record the tools actually chosen (keel.toml's declared tools when no
                // `--tool` was given), so a resumed run gets the same set.
                resolved.tools = tools.names().map(str::to_string).collect();
                let mut budget = Budget::default();
                if let Some(turns) = self.max_turns {
                    budget.max_turns = Some(turns);
                }
                Agent::builder("keel", model)
                    .instructions(self.instructions.clone().unwrap_or_else(|| {
                        "You are a helpful assistant. Use the tools when they help; answer concisely."
                            .into()
                    }))
                    .tools(tools)
                    .budget(budget)
            }
        };
        builder = builder.policy(config.policies.clone());
        if let Some(strategy) = &self.context_strategy {
            let kind = strategy
                .parse::<keel_core::context::StrategyKind>()
                .map_err(|e| CliError::usage(format!("--context-strategy: {e}")))?;
            builder = builder.context_strategy(kind);
        }
        if let Some(window) = self.context_window {
            if window < 256 {
                return Err(CliError::usage(
                    "--context-window must be at least 256 tokens",
                ));
            }
            builder = builder.context_window(window);
        }
        if let Some(tokens) = self.max_output_tokens {
            if tokens == 0 {
                return Err(CliError::usage("--max-output-tokens must be at least 1"));
            }
            builder = builder.max_output_tokens(Some(tokens));
        }
        let recipe = serde_json::to_value(&resolved)
            .map_err(|e| CliError::failure(format!("cannot record the agent definition: {e}")))?;
        builder = builder.recipe(recipe);
        Ok(Built {
            agent: builder.build(),
            scripted,
        })
    }

    /// The run context: the store, a live printer in text mode, the approval mode, an
    /// interactive approval prompt when stdin is a terminal (otherwise approvals defer and
    /// the run pauses), and the cancellation token.
    pub fn context(
        &self,
        store: Arc<dyn EventStore>,
        output: OutputFormat,
        interactive: bool,
        cancel: CancellationToken,
    ) -> RunContext {
        let mut context = RunContext::new(store)
            .with_cancel(cancel)
            .with_approval_mode(self.approve.mode());
        if output == OutputFormat::Text {
            context = context.with_observer(Arc::new(TextPrinter));
        }
        if let Some(telemetry) = crate::config::telemetry_observer() {
            context = context.with_observer(telemetry);
        }
        if interactive && std::io::stdin().is_terminal() {
            context = context.with_approvals(Arc::new(TerminalPrompt));
        }
        context
    }
}

/// The tools named, from the built-in catalog (plus the test tools when
/// `KEEL_TEST_TOOLS=1`).
pub fn select_tools(names: &[String]) -> Result<ToolRegistry, CliError> {
    let mut catalog =
        keel_tools::builtin_registry().map_err(|e| CliError::failure(e.to_string()))?;
    if test_tools::enabled() {
        test_tools::register(&mut catalog).map_err(|e| CliError::failure(e.to_string()))?;
    }
    let declared = crate::tools::register_configured(&mut catalog)?;
    // Tools declared in keel.toml (HTTP tools, MCP servers) are available without flags;
    // `--tool` selects among everything.
    let names: Vec<String> = if names.is_empty() {
        declared
    } else {
        names.to_vec()
    };
    catalog
        .subset(names.iter().map(String::as_str))
        .map_err(|unknown| {
            CliError::usage(format!(
                "unknown tool{} {}; available: {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                catalog.names().collect::<Vec<_>>().join(", ")
            ))
        })
}

/// How many model answers (responses or failures) the run `run_id` has in `events`: the
/// script step a resumed run continues at.
pub fn consumed_steps(events: &[Event], run_id: &str) -> usize {
    events
        .iter()
        .filter(|e| e.run_id == run_id)
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::ModelResponded { .. } | EventKind::ModelFailed { .. }
            )
        })
        .count()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Steps(Vec<ScriptStep>),
    Object { steps: Vec<ScriptStep> },
}

/// A scripted model over the steps of `path` from `skip` on. Tool calls without an id get
/// the id they would have had without skipping (`call_{step}_{n}`), so ids stay unique.
fn scripted_from(
    path: &std::path::Path,
    skip: usize,
) -> Result<(Arc<dyn Model>, Arc<ScriptedModel>), CliError> {
    let full = ScriptedModel::from_file(path).map_err(|e| CliError::usage(e.to_string()))?;
    let id = full.id();
    if skip == 0 {
        let scripted = Arc::new(full);
        return Ok((scripted.clone(), scripted));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read script {}: {e}", path.display())))?;
    let file: ScriptFile = serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("cannot parse script {}: {e}", path.display())))?;
    let (ScriptFile::Steps(steps) | ScriptFile::Object { steps }) = file;
    let rest: Vec<ScriptStep> = steps
        .into_iter()
        .enumerate()
        .skip(skip)
        .map(|(index, mut step)| {
            for (n, call) in step.tool_calls.iter_mut().enumerate() {
                if call.id.is_none() {
                    call.id = Some(format!("call_{index}_{n}"));
                }
            }
            step
        })
        .collect();
    let scripted = Arc::new(ScriptedModel::new(rest));
    let model: Arc<dyn Model> = Arc::new(Renamed {
        id,
        inner: scripted.clone(),
    });
    Ok((model, scripted))
}

/// A model under another id (a resumed script keeps its file's id).
struct Renamed {
    id: String,
    inner: Arc<ScriptedModel>,
}

impl Model for Renamed {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn capabilities(&self) -> ModelCapabilities {
        self.inner.capabilities()
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        self.inner.stream(request)
    }

    fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        self.inner.estimate_tokens(request)
    }
}

/// Asks on the terminal: `y` approves, `n` (optionally followed by a reason) denies, an
/// empty line or end of input defers (the run pauses, exit 10).
struct TerminalPrompt;

#[async_trait]
impl ApprovalHandler for TerminalPrompt {
    async fn decide(&self, _thread_id: &str, call: &ToolCall) -> ApprovalDecision {
        let prompt = format!(
            "approve {} {} (call {})? [y]es / [n]o [reason] / Enter to decide later: ",
            call.name, call.arguments, call.id
        );
        let line = tokio::task::spawn_blocking(move || {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(prompt.as_bytes());
            let _ = stderr.flush();
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line),
            }
        })
        .await
        .ok()
        .flatten();
        let Some(line) = line else {
            return ApprovalDecision::Defer;
        };
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word.to_ascii_lowercase().as_str() {
            "y" | "yes" => ApprovalDecision::Approve,
            "n" | "no" => ApprovalDecision::Deny {
                reason: Some(rest.trim().to_string()).filter(|r| !r.is_empty()),
            },
            _ => ApprovalDecision::Defer,
        }
    }
}

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
