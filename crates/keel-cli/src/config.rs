//! The process-wide configuration: keel.toml (or `--config FILE`) with `.env` loaded, and
//! the telemetry it starts. Commands read it through [`get`]; flags override it.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use keel_config::KeelConfig;

use crate::CliError;
use crate::telemetry::Telemetry;

static CONFIG: OnceLock<KeelConfig> = OnceLock::new();
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);

/// Loads the configuration once. An invalid file is a usage error listing every problem.
pub fn init(path: Option<&Path>) -> Result<(), CliError> {
    let loaded = KeelConfig::load(path).map_err(|e| CliError::usage(e.to_string()))?;
    let _ = CONFIG.set(loaded.config);
    Ok(())
}

/// The configuration (defaults when none was loaded).
pub fn get() -> &'static KeelConfig {
    CONFIG.get_or_init(KeelConfig::default)
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
