//! Keel observability: turns the event stream of runs into telemetry so the runtime needs
//! no tracing code of its own.
//!
//! Feed every event of a run to a [`TelemetrySink`]; it redacts them ([`Redactor`]), writes
//! one JSONL file per trace (`.keel/traces/<trace_id>.jsonl`, read back with
//! [`read_trace_file`]), folds them into OpenTelemetry GenAI spans ([`SpanAssembler`]:
//! `invoke_agent`, `chat`, `execute_tool`, `retry`, `compact`, `critique`) with per-turn
//! records ([`TurnRecord`], seed 000 §8), and exports the spans over OTLP (HTTP/protobuf or
//! gRPC) in batches. [`compute_metrics`] and the renderers back `keel stats` and
//! `keel trace show/list`; [`init_logging`] sets up console and JSON-file logs.
//!
//! This crate must not block or slow the agent loop (all I/O happens on its worker
//! thread), must not let a secret or personal datum reach a log, trace file or exporter
//! unredacted, and must not depend on anything above `keel-core`.

mod assembler;
pub mod config;
pub mod error;
pub mod export;
pub mod ids;
pub mod logging;
pub mod metrics;
pub mod otel_metrics;
pub mod redact;
mod run_spans;
pub mod sink;
pub mod spans;
pub mod timeline;
pub mod tls;
pub mod tracefile;
pub mod turns;

pub use config::{LogConfig, OtlpProtocol, RedactionConfig, TelemetryConfig};
pub use error::TelemetryError;
pub use export::{OtlpSpanExporter, to_span_data};
pub use logging::{LogGuard, build_subscriber, init_logging};
pub use metrics::{
    MetricsOptions, MetricsReport, compute_metrics, metrics_from_facts, render_prometheus,
    render_summary,
};
pub use otel_metrics::GenAiMetrics;
pub use redact::Redactor;
pub use sink::{SinkStats, TelemetrySink, redact_event};
pub use spans::{
    AttrValue, Completed, SpanAssembler, SpanOptions, SpanRecord, SpanStatus, spans_for_events,
};
pub use timeline::{
    TraceSummary, list_traces, render_timeline, render_trace_list, summarize_trace,
};
pub use tls::ensure_crypto_provider;
pub use tracefile::{
    TraceFileWriter, TraceRecord, list_trace_files, read_thread_traces, read_trace,
    read_trace_file, trace_file_path,
};
pub use turns::{TurnRecord, TurnRole};
