//! Keel observability: tracing setup, OpenTelemetry GenAI spans and OTLP export, per-run trace files, metrics and redaction.
