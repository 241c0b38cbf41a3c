//! Keel's configuration layer: the typed schema of `keel.toml` ([`KeelConfig`]: defaults,
//! providers, models, agents, tools, MCP servers, store, telemetry, policies, approvals),
//! loading it ([`KeelConfig::load`]: `.env` first without overriding set variables, then
//! `./keel.toml` or `--config FILE`, `${VAR}` / `${VAR:-default}` expanded), and the
//! diagnostics of `keel config check` ([`check`]: every problem with its key path, line and
//! column — unknown keys with the nearest valid key, invalid values with the valid ones,
//! unset environment variables, missing files).
//!
//! This crate only reads and validates configuration. It must not build models, tools,
//! stores or exporters, open network connections, or write files; the CLI turns the
//! configuration into those, applying its flags on top (flags always win).

mod analyze;
pub mod check;
pub mod diagnostic;
pub mod env;
pub mod load;
pub mod schema;

pub use check::{check, check_in, check_str, store_url_problem};
pub use diagnostic::{Diagnostic, DiagnosticCode, Severity, render_json, render_text};
pub use load::{ConfigError, DEFAULT_FILE, LoadedConfig};
pub use schema::{
    AgentConfig, ApprovalsConfig, BudgetConfig, ContextSection, ContextStrategyName, CriticConfig,
    CriticRule, DEFAULT_STORE_URL, Defaults, KeelConfig, McpConfig, ModelConfig, OutputFormat,
    PricingOverride, ProviderConfig, ResolvedModel, RetrySettings, StoreConfig, ToolsConfig,
};

/// Re-exported so callers need not depend on the owning crates for these sections.
pub use keel_mcp::McpServerConfig;
/// The `[telemetry]` section type.
pub use keel_telemetry::TelemetryConfig;
