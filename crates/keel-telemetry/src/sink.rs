//! [`TelemetrySink`]: the one object the runtime feeds. `record` redacts nothing and does
//! no I/O on the caller's thread: it queues the event (dropping and counting it if the
//! queue is full) for a background worker thread that redacts it, appends it to the
//! trace file, folds it into spans and per-turn records, and exports spans over OTLP in
//! batches from its own single-threaded Tokio runtime.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keel_core::{Event, EventKind};
use serde::Serialize;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::export::OtlpSpanExporter;
use crate::otel_metrics::OtlpMetrics;
use crate::redact::Redactor;
use crate::spans::{Completed, SpanAssembler, SpanOptions, SpanRecord};
use crate::tracefile::{TraceFileWriter, TraceRecord};

/// Counters of a sink, returned by flush and shutdown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// Events processed by the worker.
    pub events: u64,
    /// Events dropped because the queue was full or the worker was gone.
    pub dropped: u64,
    /// Spans completed.
    pub spans: u64,
    /// Spans accepted by the OTLP endpoint.
    pub spans_exported: u64,
    /// Export batches that failed (their spans are dropped; trace files keep them).
    pub export_errors: u64,
    /// Metric exports that failed.
    pub metrics_errors: u64,
    /// Trace-file write failures.
    pub file_errors: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

enum Reply {
    Async(tokio::sync::oneshot::Sender<SinkStats>),
    Sync(mpsc::Sender<SinkStats>),
}

impl Reply {
    fn send(self, stats: SinkStats) {
        match self {
            Self::Async(tx) => {
                let _ = tx.send(stats);
            }
            Self::Sync(tx) => {
                let _ = tx.send(stats);
            }
        }
    }
}

enum Msg {
    Event(Box<Event>),
    Flush(Reply),
    Shutdown(Reply),
}

/// Turns the event stream of runs into trace files and OTLP spans, off the caller's thread.
#[derive(Debug)]
pub struct TelemetrySink {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
    worker: Mutex<Option<JoinHandle<()>>>,
    reply_timeout: Duration,
}

impl TelemetrySink {
    /// Starts the worker. Fails on invalid configuration (regexes, endpoint) or when the
    /// exporter cannot be built.
    pub fn new(config: &TelemetryConfig) -> Result<Self, TelemetryError> {
        config.validate()?;
        let redactor = Redactor::from_config(&config.redaction)?;
        let (tx, rx) = mpsc::sync_channel(config.queue_capacity);
        let dropped = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let worker_config = config.clone();
        let worker_dropped = Arc::clone(&dropped);
        let handle = std::thread::Builder::new()
            .name("keel-telemetry".into())
            .spawn(move || worker_main(worker_config, redactor, rx, worker_dropped, ready_tx))
            .map_err(|e| TelemetryError::Worker(format!("cannot start the worker thread: {e}")))?;
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(TelemetryError::Worker("the worker did not start".into())),
        }
        Ok(Self {
            tx,
            dropped,
            worker: Mutex::new(Some(handle)),
            reply_timeout: Duration::from_millis(config.export_timeout_ms.saturating_mul(2))
                + Duration::from_secs(5),
        })
    }

    /// Queues one event. Never blocks: when the queue is full the event is dropped and
    /// counted in [`SinkStats::dropped`].
    pub fn record(&self, event: &Event) {
        self.record_owned(event.clone());
    }

    /// Queues one event the caller no longer needs (saves a clone).
    pub fn record_owned(&self, event: Event) {
        match self.tx.try_send(Msg::Event(Box::new(event))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn request(&self, make: impl Fn(Reply) -> Msg) -> Result<SinkStats, TelemetryError> {
        let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
        let mut msg = make(Reply::Async(reply_tx));
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) => {
                    if Instant::now() > deadline {
                        return Err(TelemetryError::Worker("the event queue stayed full".into()));
                    }
                    msg = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(TrySendError::Disconnected(_)) => {
                    return Err(TelemetryError::Worker("the worker has stopped".into()));
                }
            }
        }
        match tokio::time::timeout(self.reply_timeout, reply_rx).await {
            Ok(Ok(stats)) => Ok(stats),
            Ok(Err(_)) => Err(TelemetryError::Worker(
                "the worker stopped before answering".into(),
            )),
            Err(_) => Err(TelemetryError::Worker(format!(
                "no answer within {} ms",
                self.reply_timeout.as_millis()
            ))),
        }
    }

    /// Writes out buffered trace-file lines and exports buffered spans. Spans of runs that
    /// are still going stay open.
    pub async fn flush(&self) -> Result<SinkStats, TelemetryError> {
        self.request(Msg::Flush).await
    }

    /// Ends open spans (as incomplete), exports everything and stops the worker.
    pub async fn shutdown(&self) -> Result<SinkStats, TelemetryError> {
        let stats = self.request(Msg::Shutdown).await?;
        let handle = self.worker.lock().ok().and_then(|mut guard| guard.take());
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        Ok(stats)
    }

    /// [`shutdown`](Self::shutdown) for code outside an async runtime (must not be called
    /// from inside one).
    pub fn shutdown_blocking(&self) -> Result<SinkStats, TelemetryError> {
        let (reply_tx, reply_rx) = mpsc::channel();
        self.tx
            .send(Msg::Shutdown(Reply::Sync(reply_tx)))
            .map_err(|_| TelemetryError::Worker("the worker has stopped".into()))?;
        let stats = reply_rx
            .recv_timeout(self.reply_timeout)
            .map_err(|_| TelemetryError::Worker("no answer from the worker".into()))?;
        if let Ok(mut guard) = self.worker.lock()
            && let Some(handle) = guard.take()
        {
            let _ = handle.join();
        }
        Ok(stats)
    }
}

impl Drop for TelemetrySink {
    fn drop(&mut self) {
        // Best effort and non-blocking: ask the worker to finish on its own.
        if let Ok(guard) = self.worker.lock()
            && guard.is_some()
        {
            let (reply_tx, _reply_rx) = mpsc::channel();
            let _ = self.tx.try_send(Msg::Shutdown(Reply::Sync(reply_tx)));
        }
    }
}

struct Worker {
    redactor: Redactor,
    assembler: SpanAssembler,
    files: Option<TraceFileWriter>,
    exporter: Option<OtlpSpanExporter>,
    buffer: Vec<SpanRecord>,
    max_batch: usize,
    stats: SinkStats,
    dropped: Arc<AtomicU64>,
    metrics: Option<OtlpMetrics>,
}

fn worker_main(
    config: TelemetryConfig,
    redactor: Redactor,
    rx: Receiver<Msg>,
    dropped: Arc<AtomicU64>,
    ready: mpsc::Sender<Result<(), TelemetryError>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(TelemetryError::Worker(format!(
                "cannot start a Tokio runtime: {e}"
            ))));
            return;
        }
    };
    let exporter = match runtime.block_on(async { OtlpSpanExporter::from_config(&config) }) {
        Ok(exporter) => exporter,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // Built outside the runtime: the metrics pipeline runs on the SDK's reader thread.
    let metrics = match OtlpMetrics::from_config(&config) {
        Ok(metrics) => metrics,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut worker = Worker {
        redactor,
        assembler: SpanAssembler::new(SpanOptions {
            capture_content: config.capture_content,
        }),
        files: config
            .trace_dir
            .clone()
            .filter(|d| !d.as_os_str().is_empty())
            .map(TraceFileWriter::new),
        exporter,
        buffer: Vec::new(),
        max_batch: config.max_batch_size,
        stats: SinkStats::default(),
        dropped,
        metrics,
    };
    let interval = Duration::from_millis(config.export_interval_ms.max(10));
    let mut last_export = Instant::now();
    loop {
        match rx.recv_timeout(interval) {
            Ok(Msg::Event(event)) => {
                worker.handle(&event);
                if worker.buffer.len() >= worker.max_batch {
                    runtime.block_on(worker.export());
                    last_export = Instant::now();
                }
            }
            Ok(Msg::Flush(reply)) => {
                runtime.block_on(worker.export());
                worker.flush_files();
                worker.flush_metrics();
                last_export = Instant::now();
                reply.send(worker.snapshot());
            }
            Ok(Msg::Shutdown(reply)) => {
                worker.finish(&runtime);
                reply.send(worker.snapshot());
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                worker.finish(&runtime);
                return;
            }
        }
        if last_export.elapsed() >= interval && !worker.buffer.is_empty() {
            runtime.block_on(worker.export());
            worker.flush_files();
            last_export = Instant::now();
        }
    }
}

/// Redacts an event through its JSON form. Returns the redacted JSON and, when it still
/// reads as an event, the redacted event.
pub fn redact_event(redactor: &Redactor, event: &Event) -> (serde_json::Value, Option<Event>) {
    let mut value = match serde_json::to_value(event) {
        Ok(v) => v,
        Err(_) => return (serde_json::Value::Null, None),
    };
    if !redactor.is_enabled() {
        return (value, Some(event.clone()));
    }
    redactor.redact_value(&mut value);
    let back = serde_json::from_value(value.clone()).ok();
    (value, back)
}

impl Worker {
    fn snapshot(&self) -> SinkStats {
        let mut stats = self.stats.clone();
        stats.dropped = self.dropped.load(Ordering::Relaxed);
        stats
    }

    fn note_file_error(&mut self, e: &TelemetryError) {
        self.stats.file_errors += 1;
        self.stats.last_error = Some(e.to_string());
    }

    fn handle(&mut self, event: &Event) {
        self.stats.events += 1;
        let (value, redacted) = redact_event(&self.redactor, event);
        if let Some(files) = self.files.as_mut() {
            let mut line = serde_json::json!({ "record": "event", "event": value });
            if redacted.is_none()
                && let Some(obj) = line.as_object_mut()
            {
                obj.insert(
                    "record".into(),
                    serde_json::Value::String("raw_event".into()),
                );
            }
            let result = files.append_line(&event.trace_id, &line.to_string());
            if let Err(e) = result {
                self.note_file_error(&e);
            }
        }
        let Some(redacted) = redacted else { return };
        if let Some(metrics) = &self.metrics {
            metrics.instruments.record(&redacted);
        }
        for done in self.assembler.apply(&redacted) {
            let record = match done {
                Completed::Span(span) => {
                    self.stats.spans += 1;
                    let record = TraceRecord::Span { span: span.clone() };
                    if self.exporter.is_some() {
                        self.buffer.push(span);
                    }
                    record
                }
                Completed::Turn(turn) => TraceRecord::Turn { turn },
            };
            if let Some(files) = self.files.as_mut()
                && let Err(e) = files.append(&event.trace_id, &record)
            {
                self.note_file_error(&e);
            }
        }
        if matches!(event.kind, EventKind::RunEnded { .. })
            && let Some(files) = self.files.as_mut()
            && let Err(e) = files.close(&event.trace_id)
        {
            self.note_file_error(&e);
        }
    }

    async fn export(&mut self) {
        let Some(exporter) = self.exporter.as_ref() else {
            self.buffer.clear();
            return;
        };
        while !self.buffer.is_empty() {
            let take = self.buffer.len().min(self.max_batch);
            let batch: Vec<SpanRecord> = self.buffer.drain(..take).collect();
            match exporter.export(&batch).await {
                Ok(()) => self.stats.spans_exported += batch.len() as u64,
                Err(e) => {
                    self.stats.export_errors += 1;
                    self.stats.last_error = Some(e.to_string());
                    tracing::warn!(target: "keel_telemetry", error = %e, spans = batch.len(), "OTLP export failed; spans kept only in trace files");
                }
            }
        }
    }

    fn flush_files(&mut self) {
        if let Some(files) = self.files.as_mut()
            && let Err(e) = files.flush()
        {
            self.note_file_error(&e);
        }
    }

    fn finish(&mut self, runtime: &tokio::runtime::Runtime) {
        for done in self.assembler.finish_all() {
            let (trace_id, record) = match done {
                Completed::Span(span) => {
                    self.stats.spans += 1;
                    if self.exporter.is_some() {
                        self.buffer.push(span.clone());
                    }
                    (span.trace_id.clone(), TraceRecord::Span { span })
                }
                Completed::Turn(turn) => (turn.trace_id.clone(), TraceRecord::Turn { turn }),
            };
            if let Some(files) = self.files.as_mut()
                && let Err(e) = files.append(&trace_id, &record)
            {
                self.note_file_error(&e);
            }
        }
        runtime.block_on(self.export());
        self.flush_files();
        if let Some(metrics) = self.metrics.take()
            && let Err(e) = metrics.shutdown()
        {
            self.stats.metrics_errors += 1;
            self.stats.last_error = Some(e.to_string());
        }
    }

    fn flush_metrics(&mut self) {
        if let Some(metrics) = &self.metrics
            && let Err(e) = metrics.flush()
        {
            self.stats.metrics_errors += 1;
            self.stats.last_error = Some(e.to_string());
        }
    }
}

/// The trace directory a config writes to, if any.
pub fn trace_dir(config: &TelemetryConfig) -> Option<PathBuf> {
    config.trace_dir.clone()
}
