//! The typed schema of `keel.toml`: one struct per section, all `deny_unknown_fields`, all
//! with defaults so an empty (or absent) file is a valid configuration. Sections owned by
//! other crates are reused as they are: `[telemetry]` is [`keel_telemetry::TelemetryConfig`],
//! `[[mcp.servers]]` entries are [`keel_mcp::McpServerConfig`], `[policies]` is
//! [`keel_core::PolicyTable`].

use keel_core::context::StrategyKind;
use keel_core::{Budget, PolicyTable};
use keel_mcp::McpServerConfig;
use keel_runtime::RunApprovalMode as ApprovalMode;
use keel_telemetry::TelemetryConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The default store URL.
pub const DEFAULT_STORE_URL: &str = "sqlite://.keel/keel.db";

/// The whole `keel.toml`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeelConfig {
    /// `[defaults]`: what `keel run` / `keel chat` use when no flag says otherwise.
    pub defaults: Defaults,
    /// `[providers.<name>]`: how to reach each model provider.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// `[models.<alias>]`: named model settings usable wherever a model spec is expected.
    pub models: BTreeMap<String, ModelConfig>,
    /// `[agents.<name>]`: agents declared inline or by reference to an agent file.
    pub agents: BTreeMap<String, crate::agent::AgentDefinition>,
    /// `[tools]`: which built-in tools are offered and declarative HTTP tools.
    pub tools: ToolsConfig,
    /// `[mcp]`: MCP servers connected at start-up.
    pub mcp: McpConfig,
    /// `[store]`: where threads and events are kept.
    pub store: StoreConfig,
    /// `[telemetry]`: export, trace files, redaction, logs (owned by keel-telemetry).
    pub telemetry: TelemetryConfig,
    /// `[policies]`: what happens after a tool call fails (keel-core's policy table).
    pub policies: PolicyTable,
    /// `[approvals]`: which tool calls need a human decision.
    pub approvals: ApprovalsConfig,
    /// `[workflows.<name>]`: durable compositions of agents (sequential, parallel, router).
    pub workflows: BTreeMap<String, crate::workflow::WorkflowConfig>,
    /// `[server]`: `keel serve` and its per-tenant limits.
    pub server: crate::server::ServerConfig,
    /// `[a2a]`: remote agents over the Agent2Agent protocol, offered as tools.
    pub a2a: crate::a2a::A2aConfig,
    /// `[local]`: the embedded `local:` models.
    pub local: LocalConfig,
    /// `[outbound]`: the non-public destinations outbound calls may reach.
    pub outbound: crate::outbound::OutboundConfig,
}

/// `[local]`: what the embedded `local:` models may load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// SHA-256 digests (hex) a model file must have to be loaded. Empty (the default):
    /// the pinned models (`keel models list`) are verified against their pins and any
    /// other GGUF file loads once its header passes the bounds checks. Set it when agent
    /// files from others may name `local:/path/file.gguf`.
    pub allowed_sha256: Vec<String>,
}

/// Output format of `keel run`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON object describing the outcome.
    Json,
}

/// `[defaults]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Defaults {
    /// Default model: `provider:model` or a `[models.<alias>]` name (`--model`).
    pub model: Option<String>,
    /// Default agent: an `[agents.<name>]` name or a path to an agent file (`--agent`).
    pub agent: Option<String>,
    /// Default approval mode (`--approve`); `[approvals] mode` wins when both are set.
    pub approve: Option<ApprovalMode>,
    /// Output format of `keel run` (`--output`).
    pub output: OutputFormat,
}

/// `[providers.<name>]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// The wire protocol when `<name>` is not a built-in provider (`openai`,
    /// `openai-responses`, `anthropic`, `openrouter`, `ollama`), e.g. a company proxy
    /// speaking the OpenAI API.
    pub kind: Option<String>,
    /// Base URL of the API (`--base-url`).
    pub base_url: Option<String>,
    /// Environment variable holding the API key (default: the provider's usual one).
    pub api_key_env: Option<String>,
    /// Time allowed to open a connection, in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// Longest silence allowed while waiting for (or streaming) a response, in milliseconds.
    pub idle_timeout_ms: Option<u64>,
    /// Refuse any base URL that is not loopback.
    pub loopback_only: bool,
    /// Retry policy for retryable failures.
    pub retry: Option<RetrySettings>,
}

/// `[providers.<name>.retry]` and `[models.<alias>] retry`: the retry budget of model
/// calls. Unset fields keep the provider's (then the built-in) values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// Total attempts including the first (1 = no retries).
    pub max_attempts: Option<u32>,
    /// First backoff delay, in milliseconds.
    pub initial_delay_ms: Option<u64>,
    /// Upper bound of one backoff delay, in milliseconds.
    pub max_delay_ms: Option<u64>,
    /// Growth factor between attempts.
    pub factor: Option<f64>,
    /// The longest server-requested wait (`retry-after`) honoured, in milliseconds; a
    /// longer one is not waited for.
    pub max_retry_after_ms: Option<u64>,
}

/// `[models.<alias>]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// `provider:model`, e.g. `anthropic:claude-sonnet-4-5`.
    pub model: String,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Maximum output tokens per call.
    pub max_output_tokens: Option<u32>,
    /// Overrides the model's context window, in tokens.
    pub context_window: Option<u32>,
    /// Overrides the built-in price of the model.
    pub pricing: Option<PricingOverride>,
    /// The retry budget of this model's calls (over `[providers.<name>.retry]`), e.g.
    /// `retry = { max_attempts = 8, initial_delay_ms = 200 }`.
    pub retry: Option<RetrySettings>,
    /// Overall deadline of one call of this model, retries and their waits included, in
    /// milliseconds (default 600000).
    pub call_timeout_ms: Option<u64>,
}

/// `[models.<alias>.pricing]`, USD per million tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PricingOverride {
    /// Uncached input.
    pub input: f64,
    /// Output.
    pub output: f64,
    /// Input read from the prompt cache.
    pub cache_read: f64,
    /// Input written to the prompt cache.
    pub cache_write: f64,
}

/// `[agents.<name>]`: the one agent schema, also used by standalone agent files.
pub type AgentConfig = crate::agent::AgentDefinition;

/// An agent's `budget`. Unset fields keep the defaults (16 turns, 10 minutes); `0`
/// means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Maximum model calls in a run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Maximum wall-clock time of a run, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wall_clock_ms: Option<u64>,
    /// Maximum input plus output tokens over a run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Maximum cost over a run, in US dollars.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

impl BudgetConfig {
    /// The budget: the defaults overridden by the set fields (`0` = unlimited).
    pub fn to_budget(&self) -> Budget {
        let mut budget = Budget::default();
        if let Some(v) = self.max_turns {
            budget.max_turns = (v > 0).then_some(v);
        }
        if let Some(v) = self.max_wall_clock_ms {
            budget.max_wall_clock_ms = (v > 0).then_some(v);
        }
        if let Some(v) = self.max_tokens {
            budget.max_tokens = (v > 0).then_some(v);
        }
        if let Some(v) = self.max_cost_usd {
            budget.max_cost_usd = (v > 0.0).then_some(v);
        }
        budget
    }
}

/// A context strategy name (`[agents.<name>.context] strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextStrategyName {
    /// Drop the oldest turns.
    #[default]
    Truncate,
    /// Summarize older turns with a model.
    Summarize,
    /// Keep the most important messages.
    Importance,
    /// No context management.
    None,
}

impl ContextStrategyName {
    /// The keel-core strategy, `None` when management is disabled.
    pub fn kind(self) -> Option<StrategyKind> {
        match self {
            Self::Truncate => Some(StrategyKind::Truncate),
            Self::Summarize => Some(StrategyKind::Summarize),
            Self::Importance => Some(StrategyKind::Importance),
            Self::None => None,
        }
    }
}

/// `[agents.<name>.context]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextSection {
    /// `truncate` (default), `summarize`, `importance` or `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ContextStrategyName>,
    /// Overrides the model's context window, in tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// Longest tool result the model sees, in characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tool_result_chars: Option<usize>,
    /// Longest a compaction may take, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `[tools]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Built-in tools offered (`None`: all of them).
    pub builtin: Option<Vec<String>>,
    /// Declarative HTTP tools (`[[tools.http]]`), keel-tools' HTTP tool declarations.
    pub http: Vec<keel_tools::HttpToolConfig>,
}

/// `[mcp]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// `[[mcp.servers]]`.
    pub servers: Vec<McpServerConfig>,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH`, a plain path, `postgres://...` or `memory:` (`--store`).
    pub url: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_STORE_URL.into(),
        }
    }
}

/// `[approvals]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// Approval mode for all tools (`auto`, `ask`, `deny`; `--approve`).
    pub mode: Option<ApprovalMode>,
    /// Per-tool overrides: tool name → mode.
    pub tools: BTreeMap<String, ApprovalMode>,
}

/// A model setting resolved from a spec or an alias.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedModel {
    /// The provider (`openai`, or a `[providers.<name>]` name).
    pub provider: String,
    /// The model name at the provider.
    pub model: String,
    /// The alias's settings, when the spec named one.
    pub settings: Option<ModelConfig>,
}

/// Providers Keel knows without a `[providers]` entry.
pub const BUILTIN_PROVIDERS: [&str; 5] = [
    "anthropic",
    "openai",
    "openai-responses",
    "openrouter",
    "ollama",
];

/// The usual API-key variable of a built-in provider (`None`: no key needed).
pub fn default_api_key_env(provider: &str) -> Option<&'static str> {
    match provider {
        "anthropic" => Some("ANTHROPIC_API_KEY"),
        "openai" | "openai-responses" => Some("OPENAI_API_KEY"),
        "openrouter" => Some("OPENROUTER_API_KEY"),
        _ => None,
    }
}

impl KeelConfig {
    /// Resolves `spec` (`provider:model` or a `[models]` alias). `None` when it is neither.
    pub fn resolve_model(&self, spec: &str) -> Option<ResolvedModel> {
        if let Some(alias) = self.models.get(spec) {
            let (provider, model) = split_spec(&alias.model)?;
            return Some(ResolvedModel {
                provider: provider.into(),
                model: model.into(),
                settings: Some(alias.clone()),
            });
        }
        let (provider, model) = split_spec(spec)?;
        Some(ResolvedModel {
            provider: provider.into(),
            model: model.into(),
            settings: None,
        })
    }

    /// The environment variable holding `provider`'s API key (configured, else usual).
    pub fn api_key_env(&self, provider: &str) -> Option<String> {
        let entry = self.providers.get(provider);
        if let Some(var) = entry.and_then(|p| p.api_key_env.clone()) {
            return Some(var);
        }
        let kind = entry.and_then(|p| p.kind.as_deref()).unwrap_or(provider);
        default_api_key_env(kind).map(str::to_string)
    }

    /// The approval mode for `tool`: per-tool override, then `[approvals] mode`, then
    /// `[defaults] approve`, then `auto`.
    pub fn approval_mode(&self, tool: &str) -> ApprovalMode {
        self.approvals
            .tools
            .get(tool)
            .copied()
            .or(self.approvals.mode)
            .or(self.defaults.approve)
            .unwrap_or_default()
    }
}

/// Splits `provider:model`; `None` unless both halves are non-empty.
pub fn split_spec(spec: &str) -> Option<(&str, &str)> {
    spec.split_once(':')
        .filter(|(p, m)| !p.trim().is_empty() && !m.trim().is_empty())
}
