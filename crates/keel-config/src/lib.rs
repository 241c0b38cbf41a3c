//! Keel's configuration layer: the typed schema of `keel.toml` ([`KeelConfig`]: defaults,
//! providers, models, agents, tools, MCP servers, store, telemetry, policies, approvals,
//! server, outbound), loading it ([`KeelConfig::load`]: `.env` first without overriding set
//! variables, then `./keel.toml` or `--config FILE`, `${VAR}` / `${VAR:-default}`
//! expanded), and the
//! diagnostics of `keel config check` ([`check`]: every problem with its key path, line and
//! column — unknown keys with the nearest valid key, invalid values with the valid ones,
//! unset environment variables, missing files).
//!
//! Agents have one schema ([`AgentDefinition`]): keel.toml `[agents.<name>]` tables and
//! standalone agent files (e.g. the Detective's `agents/detective/agent.toml`) alike.
//!
//! This crate only reads and validates configuration. It must not build models, tools,
//! stores or exporters, open network connections, or write files; the CLI turns the
//! configuration into those (keel-app does), applying flags on top (flags always win).

pub mod a2a;
pub mod agent;
mod analyze;
pub mod check;
pub mod diagnostic;
pub mod env;
pub mod load;
pub mod located;
pub mod outbound;
pub mod schema;
pub mod server;
pub mod source;
pub mod workflow;

pub use a2a::{A2aAgentConfig, A2aAuthConfig, A2aConfig};
pub use agent::{
    A2A_UNSUPPORTED_KEYS, AgentDefinition, AgentFile, AgentKind, CriticConfig, RequiredCall,
    RequiredText, ToolEntry,
};
pub use check::{check, check_in, check_str, load_blocking, store_url_problem};
pub use diagnostic::{Diagnostic, DiagnosticCode, Severity, render_json, render_text};
pub use load::{ConfigError, DEFAULT_FILE, LoadedConfig};
pub use located::parse_toml_as;
pub use outbound::OutboundConfig;
pub use schema::{
    AgentConfig, ApprovalsConfig, BUILTIN_PROVIDERS, BudgetConfig, ContextSection,
    ContextStrategyName, DEFAULT_STORE_URL, Defaults, KeelConfig, McpConfig, ModelConfig,
    OutputFormat, PricingOverride, ProviderConfig, ResolvedModel, RetrySettings, StoreConfig,
    ToolsConfig, split_spec,
};
pub use server::{
    CredentialRef, Limits, ServerConfig, TenantConfig, TenantLimits, credential_problems,
    server_secret_vars,
};
pub use source::Source;
pub use workflow::{WorkflowConfig, WorkflowKind};

/// Re-exported so callers need not depend on the owning crates for these sections.
pub use keel_mcp::McpServerConfig;
/// The `[telemetry]` section type.
pub use keel_telemetry::TelemetryConfig;
