//! The error type of this crate: typed, with a stable code and a message that names the
//! field or file involved and how to fix it.

use std::path::PathBuf;

/// Everything that can go wrong in keel-telemetry.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A configuration value is invalid.
    #[error("invalid telemetry config `{field}`: {message}")]
    Config {
        /// The offending key (e.g. `telemetry.redaction.patterns[2]`).
        field: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A trace file line could not be parsed.
    #[error("{path}:{line}: not a trace record: {message}")]
    TraceFile {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parse error.
        message: String,
    },
    /// The OTLP exporter could not be built or failed.
    #[error("OTLP export: {0}")]
    Export(String),
    /// Logging could not be initialised (e.g. a global subscriber is already set).
    #[error("logging: {0}")]
    Logging(String),
    /// The background telemetry worker is gone or did not answer in time.
    #[error("telemetry worker: {0}")]
    Worker(String),
}

impl TelemetryError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Config { .. } => "telemetry_config",
            Self::Io { .. } => "telemetry_io",
            Self::TraceFile { .. } => "trace_file",
            Self::Export(_) => "otlp_export",
            Self::Logging(_) => "logging_init",
            Self::Worker(_) => "telemetry_worker",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
