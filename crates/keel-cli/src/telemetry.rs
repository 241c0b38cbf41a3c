//! Wires `keel-telemetry` into a run: every event goes to the telemetry sink (trace file,
//! OTLP spans, metrics), which is flushed before the process exits.

use std::sync::Arc;

use keel_core::Event;
use keel_runtime::RunObserver;
use keel_telemetry::{TelemetryConfig, TelemetrySink};

use crate::CliError;

/// Forwards events to the sink (non-blocking).
pub struct TelemetryObserver(pub Arc<TelemetrySink>);

impl RunObserver for TelemetryObserver {
    fn on_event(&self, event: &Event) {
        self.0.record(event);
    }
}

/// The telemetry of one command.
pub struct Telemetry {
    sink: Arc<TelemetrySink>,
}

impl Telemetry {
    /// Starts telemetry from the `[telemetry]` config (with `OTEL_*` variables applied). The
    /// trace directory defaults to `.keel/traces`.
    pub fn start(config: &TelemetryConfig) -> Result<Self, CliError> {
        let mut config = config
            .clone()
            .with_process_env()
            .map_err(|e| CliError::usage(format!("telemetry configuration: {e}")))?;
        if config.trace_dir.is_none() {
            config.trace_dir = Some(".keel/traces".into());
        }
        let sink =
            TelemetrySink::new(&config).map_err(|e| CliError::usage(format!("telemetry: {e}")))?;
        Ok(Self {
            sink: Arc::new(sink),
        })
    }

    /// The observer to add to the run context.
    pub fn observer(&self) -> Arc<dyn RunObserver> {
        Arc::new(TelemetryObserver(self.sink.clone()))
    }

    /// Flushes everything (trace file, exporter) before exit; failures are reported, not fatal.
    pub async fn shutdown(self) {
        match self.sink.shutdown().await {
            Ok(stats) if stats.export_errors > 0 => {
                eprintln!(
                    "keel: telemetry export failed {} time(s): {}",
                    stats.export_errors,
                    crate::redaction::for_stderr(&stats.last_error.unwrap_or_default())
                );
            }
            Ok(_) => {}
            Err(error) => eprintln!(
                "keel: telemetry shutdown: {}",
                crate::redaction::for_stderr(&error.to_string())
            ),
        }
    }
}
