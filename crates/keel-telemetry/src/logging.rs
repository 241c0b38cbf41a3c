//! Process logging: `tracing` to stderr (human-readable) and to a rolling JSON file, with
//! the filter from `RUST_LOG` or `[telemetry.log] level`. Every line written to the file
//! goes through the [`Redactor`] first.

use std::io::Write;
use std::sync::Arc;

use tracing_appender::non_blocking::WorkerGuard;
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::redact::Redactor;

/// Keeps the file writer alive; dropping it flushes the log file.
#[derive(Debug)]
pub struct LogGuard {
    _file: Option<WorkerGuard>,
}

/// A `MakeWriter` that redacts every formatted line before passing it on.
#[derive(Debug, Clone)]
pub struct RedactingMakeWriter<M> {
    inner: M,
    redactor: Arc<Redactor>,
}

impl<M> RedactingMakeWriter<M> {
    /// Wraps `inner`.
    pub fn new(inner: M, redactor: Arc<Redactor>) -> Self {
        Self { inner, redactor }
    }
}

/// The writer made by [`RedactingMakeWriter`]: buffers one formatted event and writes it
/// redacted when dropped or flushed.
pub struct RedactingWriter<W: Write> {
    inner: W,
    redactor: Arc<Redactor>,
    buf: Vec<u8>,
}

impl<W: Write> RedactingWriter<W> {
    fn emit(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        let red = self.redactor.redact_str(&text);
        self.inner.write_all(red.as_bytes())
    }
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.emit()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        let _ = self.emit();
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for RedactingMakeWriter<M> {
    type Writer = RedactingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter {
            inner: self.inner.make_writer(),
            redactor: Arc::clone(&self.redactor),
            buf: Vec::new(),
        }
    }
}

fn filter(config: &TelemetryConfig) -> Result<EnvFilter, TelemetryError> {
    match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| TelemetryError::Config {
                field: "RUST_LOG".into(),
                message: e.to_string(),
            })
        }
        _ => EnvFilter::try_new(&config.log.level).map_err(|e| TelemetryError::Config {
            field: "telemetry.log.level".into(),
            message: e.to_string(),
        }),
    }
}

/// Builds the subscriber without installing it (tests use it with
/// `tracing::subscriber::with_default`).
pub fn build_subscriber(
    config: &TelemetryConfig,
) -> Result<(impl tracing::Subscriber + Send + Sync + 'static, LogGuard), TelemetryError> {
    let redactor = Arc::new(Redactor::from_config(&config.redaction)?);
    let console = config.log.console.then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(RedactingMakeWriter::new(
                std::io::stderr,
                Arc::clone(&redactor),
            ))
            .with_target(true)
    });
    let (file_layer, guard) = match config
        .log
        .file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or_else(|| std::path::Path::new("."));
            std::fs::create_dir_all(dir).map_err(|e| TelemetryError::io(dir, e))?;
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("keel.log");
            let rotation = match config.log.rotation.as_str() {
                "hourly" => Rotation::HOURLY,
                "minutely" => Rotation::MINUTELY,
                "never" => Rotation::NEVER,
                _ => Rotation::DAILY,
            };
            let appender = RollingFileAppender::builder()
                .rotation(rotation)
                .filename_prefix(name)
                .build(dir)
                .map_err(|e| TelemetryError::Logging(format!("{}: {e}", path.display())))?;
            let (writer, guard) = tracing_appender::non_blocking(appender);
            let layer = tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_writer(RedactingMakeWriter::new(writer, Arc::clone(&redactor)));
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    let subscriber = tracing_subscriber::registry()
        .with(filter(config)?)
        .with(console)
        .with(file_layer);
    Ok((subscriber, LogGuard { _file: guard }))
}

/// Installs the global logger. Keep the guard until exit so the file is flushed.
pub fn init_logging(config: &TelemetryConfig) -> Result<LogGuard, TelemetryError> {
    let (subscriber, guard) = build_subscriber(config)?;
    subscriber.try_init().map_err(|e| {
        TelemetryError::Logging(format!("a global logger is already installed: {e}"))
    })?;
    Ok(guard)
}
