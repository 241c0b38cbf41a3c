//! OpenTelemetry metric instruments of the GenAI semantic conventions, fed from events:
//! `gen_ai.client.token.usage` (histogram, `{token}`, by `gen_ai.token.type`) and
//! `gen_ai.client.operation.duration` (histogram, seconds), plus `keel.tool.duration`.
//! Create them on any `Meter` (for instance from a `SdkMeterProvider` with an OTLP
//! exporter) and call [`GenAiMetrics::record`] for each event.

use std::collections::HashMap;
use std::sync::Mutex;

use keel_core::{Event, EventKind};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter};

use crate::spans::split_model;

type Requested = HashMap<(String, u32), (String, Option<String>)>;

/// The GenAI client instruments.
#[derive(Debug)]
pub struct GenAiMetrics {
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
    tool_duration: Histogram<f64>,
    requested: Mutex<Requested>,
}

impl GenAiMetrics {
    /// Creates the instruments on `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self {
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Number of input and output tokens used")
                .with_boundaries(vec![
                    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0,
                    1048576.0, 4194304.0, 16777216.0, 67108864.0,
                ])
                .build(),
            operation_duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("GenAI operation duration")
                .with_boundaries(vec![
                    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92,
                ])
                .build(),
            tool_duration: meter
                .f64_histogram("keel.tool.duration")
                .with_unit("s")
                .with_description("Tool call duration including retries")
                .build(),
            requested: Mutex::new(HashMap::new()),
        }
    }

    /// Records what `event` measures (model responses and failures, tool results).
    pub fn record(&self, event: &Event) {
        match &event.kind {
            EventKind::ModelRequested {
                turn,
                model,
                provider,
                ..
            } => {
                if let Ok(mut map) = self.requested.lock() {
                    map.insert(
                        (event.run_id.to_string(), *turn),
                        (model.clone(), provider.clone()),
                    );
                }
            }
            EventKind::ModelResponded {
                turn,
                usage,
                latency_ms,
                ..
            } => {
                let attrs = self.attrs(event, *turn, None);
                let mut input = attrs.clone();
                input.push(KeyValue::new("gen_ai.token.type", "input"));
                self.token_usage.record(usage.input_tokens, &input);
                let mut output = attrs.clone();
                output.push(KeyValue::new("gen_ai.token.type", "output"));
                self.token_usage.record(usage.output_tokens, &output);
                self.operation_duration
                    .record(*latency_ms as f64 / 1000.0, &attrs);
            }
            EventKind::ModelFailed { turn, error } => {
                let kind = serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let attrs = self.attrs(event, *turn, Some(kind));
                self.operation_duration.record(0.0, &attrs);
            }
            EventKind::ToolCallFinished { result } => {
                let mut attrs = vec![
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("gen_ai.tool.name", result.name.clone()),
                ];
                if let Some(code) = result.outcome.error_code() {
                    attrs.push(KeyValue::new("error.type", code.as_str()));
                }
                self.tool_duration
                    .record(result.outcome.latency_ms as f64 / 1000.0, &attrs);
            }
            EventKind::RunEnded { .. } => {
                if let Ok(mut map) = self.requested.lock() {
                    map.retain(|(run, _), _| **run != *event.run_id);
                }
            }
            _ => {}
        }
    }

    fn attrs(&self, event: &Event, turn: u32, error: Option<String>) -> Vec<KeyValue> {
        let (model, provider) = self
            .requested
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&(event.run_id.to_string(), turn)))
            .unwrap_or_default();
        let (p, name) = split_model(&model);
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.request.model", name.to_string()),
        ];
        if let Some(p) = provider.or_else(|| p.map(str::to_string)) {
            attrs.push(KeyValue::new("gen_ai.provider.name", p));
        }
        if let Some(e) = error {
            attrs.push(KeyValue::new("error.type", e));
        }
        attrs
    }
}

/// A `PushMetricExporter` that runs the async OTLP exporter on its own small Tokio runtime,
/// so the SDK's periodic reader thread can export over HTTP or gRPC without an ambient
/// runtime.
struct BlockingOtlpMetricExporter {
    inner: opentelemetry_otlp::MetricExporter,
    runtime: tokio::runtime::Runtime,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for BlockingOtlpMetricExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingOtlpMetricExporter")
            .finish_non_exhaustive()
    }
}

impl opentelemetry_sdk::metrics::exporter::PushMetricExporter for BlockingOtlpMetricExporter {
    fn export(
        &self,
        metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let result = self.runtime.block_on(async {
            match tokio::time::timeout(self.timeout, self.inner.export(metrics)).await {
                Ok(r) => r,
                Err(_) => Err(opentelemetry_sdk::error::OTelSdkError::Timeout(
                    self.timeout,
                )),
            }
        });
        std::future::ready(result)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
        self.inner.temporality()
    }
}

/// OTLP metrics export of the [`GenAiMetrics`] instruments: a meter provider with a
/// periodic reader. Must be created outside any async runtime (the sink's worker thread).
#[derive(Debug)]
pub struct OtlpMetrics {
    provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    /// The instruments to record into.
    pub instruments: GenAiMetrics,
}

impl OtlpMetrics {
    /// Builds the pipeline, or `None` without an endpoint or with `metrics = false`.
    pub fn from_config(
        config: &crate::TelemetryConfig,
    ) -> Result<Option<Self>, crate::TelemetryError> {
        use opentelemetry::metrics::MeterProvider as _;
        use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};

        let Some(base) = config.endpoint.clone().filter(|_| config.metrics) else {
            return Ok(None);
        };
        let timeout = std::time::Duration::from_millis(config.export_timeout_ms.max(1));
        let (http_client, grpc_tls) = match config.protocol {
            crate::OtlpProtocol::Http => (Some(crate::tls::http_client(config, timeout)?), None),
            crate::OtlpProtocol::Grpc => (None, crate::tls::grpc_tls(config)?),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                crate::TelemetryError::Export(format!("cannot start a Tokio runtime: {e}"))
            })?;
        let inner = runtime
            .block_on(async {
                match config.protocol {
                    crate::OtlpProtocol::Http => {
                        let trimmed = base.trim_end_matches('/');
                        let url = if trimmed.ends_with("/v1/metrics") {
                            trimmed.to_string()
                        } else {
                            format!("{}/v1/metrics", trimmed.trim_end_matches("/v1/traces"))
                        };
                        let builder = opentelemetry_otlp::MetricExporter::builder().with_http();
                        match http_client {
                            Some(client) => builder.with_http_client(client),
                            None => builder,
                        }
                        .with_endpoint(url)
                        .with_protocol(Protocol::HttpBinary)
                        .with_timeout(timeout)
                        .with_headers(config.headers.clone().into_iter().collect())
                        .build()
                    }
                    crate::OtlpProtocol::Grpc => {
                        let builder = opentelemetry_otlp::MetricExporter::builder()
                            .with_tonic()
                            .with_endpoint(base.clone())
                            .with_protocol(Protocol::Grpc)
                            .with_timeout(timeout);
                        match grpc_tls {
                            Some(tls) => builder.with_tls_config(tls),
                            None => builder,
                        }
                        .build()
                    }
                }
            })
            .map_err(|e| {
                crate::TelemetryError::Export(format!(
                    "cannot build the metric exporter for `{base}`: {e}"
                ))
            })?;
        let reader =
            opentelemetry_sdk::metrics::PeriodicReader::builder(BlockingOtlpMetricExporter {
                inner,
                runtime,
                timeout,
            })
            .with_interval(std::time::Duration::from_millis(
                config.metrics_interval_ms.max(100),
            ))
            .build();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_resource(crate::export::resource(config))
            .with_reader(reader)
            .build();
        let meter = provider.meter(crate::export::SCOPE_NAME);
        let instruments = GenAiMetrics::new(&meter);
        Ok(Some(Self {
            provider,
            instruments,
        }))
    }

    /// Exports what has been recorded so far.
    pub fn flush(&self) -> Result<(), crate::TelemetryError> {
        self.provider
            .force_flush()
            .map_err(|e| crate::TelemetryError::Export(format!("metrics: {e}")))
    }

    /// Exports and stops.
    pub fn shutdown(&self) -> Result<(), crate::TelemetryError> {
        self.provider
            .shutdown()
            .map_err(|e| crate::TelemetryError::Export(format!("metrics: {e}")))
    }
}
