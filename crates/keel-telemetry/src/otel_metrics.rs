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

/// The GenAI client instruments.
#[derive(Debug)]
pub struct GenAiMetrics {
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
    tool_duration: Histogram<f64>,
    requested: Mutex<HashMap<(String, u32), (String, Option<String>)>>,
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
                        (event.run_id.clone(), *turn),
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
                    map.retain(|(run, _), _| run != &event.run_id);
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
            .and_then(|mut m| m.remove(&(event.run_id.clone(), turn)))
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
