//! The process's application: keel.toml (or `--config FILE`) with `.env` loaded, as a
//! [`keel_app::App`] (which owns the MCP servers it connects), plus the telemetry this
//! process starts. Commands read it through [`app`] / [`get`]; flags override it.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use keel_app::{App, AppError};
use keel_config::{KeelConfig, LoadedConfig};

use crate::CliError;
use crate::telemetry::Telemetry;

static APP: OnceLock<App> = OnceLock::new();
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);

/// Loads the configuration once. An invalid file is a usage error listing every problem.
pub fn init(path: Option<&Path>) -> Result<(), CliError> {
    let app = App::load(path).map_err(app_error)?;
    let _ = APP.set(app.with_tools(&test_tools()));
    Ok(())
}

/// The test tools, when `KEEL_TEST_TOOLS=1` (they join the catalog).
fn test_tools() -> keel_core::ToolRegistry {
    let mut tools = keel_core::ToolRegistry::new();
    if crate::test_tools::enabled()
        && let Err(e) = crate::test_tools::register(&mut tools)
    {
        eprintln!("keel: test tools unavailable: {e}");
    }
    tools
}

/// The application (defaults when no configuration was loaded).
pub fn app() -> &'static App {
    APP.get_or_init(|| {
        let dir = std::env::current_dir().unwrap_or_else(|_| ".".into());
        App::new(LoadedConfig::defaults(&dir)).with_tools(&test_tools())
    })
}

/// The application with `env` as its environment (the process's, plus what an eval setup
/// hook points the agent at), same configuration and tools.
pub fn app_with_env(env: keel_app::Env) -> App {
    App::new(app().loaded().clone())
        .with_tools(&test_tools())
        .with_env(env)
}

/// The configuration.
pub fn get() -> &'static KeelConfig {
    app().config()
}

/// An application error as a CLI error: a store that cannot be opened, a tool that cannot
/// be built or a thread that cannot be resumed is a failure (exit 1); everything else is a
/// usage error (exit 2).
pub fn app_error(error: AppError) -> CliError {
    match error {
        AppError::Store { .. } | AppError::Tool { .. } | AppError::Resume(_) => {
            CliError::failure(error.to_string())
        }
        other => CliError::usage(other.to_string()),
    }
}

/// Starts telemetry for this process on first use (trace files under `.keel/traces`, OTLP
/// export when configured) and returns its run observer.
pub fn telemetry_observer() -> Option<std::sync::Arc<dyn keel_runtime::RunObserver>> {
    let mut guard = match TELEMETRY.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    if guard.is_none() {
        match Telemetry::start(&get().telemetry) {
            Ok(telemetry) => *guard = Some(telemetry),
            Err(error) => {
                eprintln!(
                    "keel: telemetry disabled: {}",
                    crate::redaction::for_stderr(&error.message)
                );
                return None;
            }
        }
    }
    guard.as_ref().map(Telemetry::observer)
}

/// Flushes telemetry before the process exits.
pub async fn shutdown() {
    let telemetry = match TELEMETRY.lock() {
        Ok(mut guard) => guard.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
}
