//! Agent files: an agent declared in TOML — name, instructions, model, declarative HTTP
//! tools, built-in tools, budget and critic rules — and [`build_agent`], which turns one
//! into a `keel_runtime::Agent`. Any user's agent file works the same way as the
//! Detective's (`agents/detective/agent.toml`); the format is documented in
//! `docs/detective.md`. Unknown keys are refused, naming the key and the valid ones.

use std::path::Path;
use std::sync::Arc;

use keel_core::{Budget, Model, RegistryError, RuleCritic, ToolRegistry};
use keel_runtime::{Agent, AgentBuilder};
use keel_tools::http::{HttpTool, HttpToolConfig, HttpToolError};
use serde::{Deserialize, Serialize};

/// An agent declared in a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// The agent's name.
    pub name: String,
    /// What the agent is for (for people; not sent to the model).
    #[serde(default)]
    pub description: String,
    /// The instructions: the top of the system prompt.
    pub instructions: String,
    /// The default model spec (`provider:model`), used when none is given on the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Maximum output tokens per model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Built-in tools by name (`calculator`, `delay`, `failure_injection`, `ping_pong`).
    #[serde(default)]
    pub builtin_tools: Vec<String>,
    /// Declarative HTTP tools (`[[tools]]` tables).
    #[serde(default)]
    pub tools: Vec<HttpToolConfig>,
    /// Limits of each run.
    #[serde(default)]
    pub budget: BudgetConfig,
    /// Rules the final answer must meet.
    #[serde(default)]
    pub critic: CriticConfig,
    /// Environment variables the file may read in `${VAR}` references (tool URLs and
    /// headers). Any other reference is an error: a file must not be able to send, say,
    /// `${AWS_SECRET_ACCESS_KEY}` to a host of its choosing without saying so.
    #[serde(default)]
    pub env: Vec<String>,
}

/// `[budget]`: limits of each run. Missing keys take the defaults (16 turns, 10 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Maximum model calls per run.
    pub max_turns: Option<u32>,
    /// Maximum wall-clock time per run, in milliseconds.
    pub max_wall_clock_ms: Option<u64>,
    /// Maximum input plus output tokens per run.
    pub max_tokens: Option<u64>,
    /// Maximum cost per run in US dollars.
    pub max_cost_usd: Option<f64>,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        let budget = Budget::default();
        Self {
            max_turns: budget.max_turns,
            max_wall_clock_ms: budget.max_wall_clock_ms,
            max_tokens: budget.max_tokens,
            max_cost_usd: budget.max_cost_usd,
        }
    }
}

impl From<BudgetConfig> for Budget {
    fn from(config: BudgetConfig) -> Self {
        Budget {
            max_turns: config.max_turns,
            max_wall_clock_ms: config.max_wall_clock_ms,
            max_tokens: config.max_tokens,
            max_cost_usd: config.max_cost_usd,
        }
    }
}

/// `[critic]`: deterministic rules checked on the final answer. An answer that breaks one
/// goes back to the model with the gap, at most `max_rejections` times; then the run fails.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticConfig {
    /// Tools that must have been called successfully, with non-empty arguments.
    pub require_calls: Vec<RequiredCall>,
    /// Text the final answer must contain.
    pub require_in_answer: Vec<RequiredText>,
    /// How many rejections before the run fails (default 2).
    pub max_rejections: Option<u32>,
}

/// `[[critic.require_calls]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredCall {
    /// The tool.
    pub tool: String,
    /// Arguments that must be present and non-empty.
    #[serde(default)]
    pub args: Vec<String>,
}

/// `[[critic.require_in_answer]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredText {
    /// Text the answer must contain (case-insensitive).
    pub text: String,
    /// The gap reported to the model when it does not.
    pub gap: String,
}

/// Why an agent file could not be loaded or built.
#[derive(Debug, thiserror::Error)]
pub enum AgentFileError {
    /// The file could not be read.
    #[error("cannot read agent file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TOML is invalid or has unknown or mistyped keys.
    #[error("agent file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (names the key, line and column).
        message: String,
    },
    /// An HTTP tool declaration is invalid or references a missing environment variable.
    #[error(transparent)]
    Tool(#[from] HttpToolError),
    /// A tool breaks the tool contract or its name is taken.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Something else in the file is wrong; the message names the key and the fix.
    #[error("agent file: {0}")]
    Invalid(String),
}

impl AgentFile {
    /// Reads and parses an agent file.
    pub fn load(path: &Path) -> Result<Self, AgentFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses agent-file TOML; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, AgentFileError> {
        toml::from_str(text).map_err(|error| AgentFileError::Parse {
            path: origin.to_string(),
            message: error.to_string().trim_end().to_string(),
        })
    }

    /// Environment variables the file's tools need that are unset, as
    /// `(tool, variable, field)` (for `keel config check`).
    pub fn missing_env_vars(&self) -> Vec<(String, String, String)> {
        self.tools
            .iter()
            .flat_map(|tool| {
                tool.missing_env_vars()
                    .into_iter()
                    .map(|(variable, field)| (tool.name.clone(), variable, field))
            })
            .collect()
    }

    /// `${VAR}` references of the file's tools to variables its `env` list does not
    /// declare, as `(tool, variable, field)`.
    pub fn undeclared_env_vars(&self) -> Vec<(String, String, String)> {
        self.tools
            .iter()
            .flat_map(|tool| {
                tool.env_references()
                    .into_iter()
                    .filter(|(variable, _)| !self.env.contains(variable))
                    .map(|(variable, field)| (tool.name.clone(), variable, field))
            })
            .collect()
    }

    /// The tool registry the file declares, with `${ENV}` resolved by `env` — only for the
    /// variables the file declares in its `env` list.
    pub fn tool_registry_with_env(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ToolRegistry, AgentFileError> {
        if let Some((tool, variable, field)) = self.undeclared_env_vars().into_iter().next() {
            return Err(AgentFileError::Invalid(format!(
                "tools `{tool}` {field}: `${{{variable}}}` is not declared; an agent file may \
                 only read the environment variables it lists: add `env = [\"{variable}\"]` at \
                 the top of the file (declared: {})",
                if self.env.is_empty() {
                    "none".to_string()
                } else {
                    self.env.join(", ")
                }
            )));
        }
        let declared = |name: &str| {
            if self.env.iter().any(|allowed| allowed == name) {
                env(name)
            } else {
                None
            }
        };
        let env: &dyn Fn(&str) -> Option<String> = &declared;
        let builtins = keel_tools::builtin_registry()?;
        let mut registry = builtins
            .subset(self.builtin_tools.iter().map(String::as_str))
            .map_err(|unknown| {
                AgentFileError::Invalid(format!(
                    "builtin_tools: unknown tool(s) {}; valid built-in tools are {}",
                    unknown.join(", "),
                    keel_tools::BUILTIN_TOOLS.join(", ")
                ))
            })?;
        for config in &self.tools {
            registry.register(Arc::new(HttpTool::with_env(config.clone(), env)?))?;
        }
        Ok(registry)
    }

    /// The critic the file declares, if it declares any rule. Rules naming a tool the agent
    /// does not have are an error.
    pub fn critic(&self, tools: &ToolRegistry) -> Result<Option<RuleCritic>, AgentFileError> {
        let config = &self.critic;
        if config.require_calls.is_empty() && config.require_in_answer.is_empty() {
            return Ok(None);
        }
        let mut critic = RuleCritic::new();
        for rule in &config.require_calls {
            if tools.get(&rule.tool).is_none() {
                return Err(AgentFileError::Invalid(format!(
                    "critic.require_calls: tool `{}` is not one of the agent's tools ({}); declare it \
                     under [[tools]] or builtin_tools, or fix the name",
                    rule.tool,
                    tools.names().collect::<Vec<_>>().join(", ")
                )));
            }
            let args: Vec<&str> = rule.args.iter().map(String::as_str).collect();
            critic = critic.require_successful_call(&rule.tool, &args);
        }
        for rule in &config.require_in_answer {
            critic = critic.require_in_answer(&rule.text, &rule.gap);
        }
        Ok(Some(critic))
    }
}

/// Builds the agent a file declares, on `model`, resolving `${ENV}` from the process
/// environment.
pub fn build_agent(file: &AgentFile, model: Arc<dyn Model>) -> Result<Agent, AgentFileError> {
    build_agent_with_env(file, model, &|name| std::env::var(name).ok())
}

/// [`build_agent`] with an explicit environment lookup.
pub fn build_agent_with_env(
    file: &AgentFile,
    model: Arc<dyn Model>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Agent, AgentFileError> {
    Ok(agent_builder(file, model, env)?.build())
}

/// The builder of the agent a file declares, for callers that add settings the file does
/// not have (observers, policy, context strategy) before `build()`.
pub fn agent_builder(
    file: &AgentFile,
    model: Arc<dyn Model>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AgentBuilder, AgentFileError> {
    if file.name.trim().is_empty() {
        return Err(AgentFileError::Invalid("name: must not be empty".into()));
    }
    if file.instructions.trim().is_empty() {
        return Err(AgentFileError::Invalid(
            "instructions: must not be empty; say what the agent is for and how it works".into(),
        ));
    }
    if let Some(t) = file.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(AgentFileError::Invalid(format!(
            "temperature: must be between 0 and 2, got {t}"
        )));
    }
    let tools = file.tool_registry_with_env(env)?;
    let critic = file.critic(&tools)?;
    let mut builder = Agent::builder(file.name.clone(), model)
        .instructions(file.instructions.clone())
        .tools(tools)
        .budget(file.budget.into())
        .temperature(file.temperature)
        .max_output_tokens(file.max_output_tokens);
    if let Some(critic) = critic {
        builder = builder.critic(Arc::new(critic));
    }
    if let Some(rejections) = file.critic.max_rejections {
        builder = builder.max_critic_rejections(rejections);
    }
    Ok(builder)
}
