//! OTLP export: converts [`SpanRecord`]s into OpenTelemetry SDK `SpanData` (keeping their
//! ids, parents and explicit start/end times) and sends them with the `opentelemetry-otlp`
//! exporter over HTTP/protobuf or gRPC, with TLS for `https://` endpoints ([`crate::tls`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};

use crate::config::{OtlpProtocol, TelemetryConfig};
use crate::error::TelemetryError;
use crate::spans::{AttrValue, SpanKind, SpanRecord, SpanStatus};

/// Name and version of the instrumentation scope on exported spans.
pub const SCOPE_NAME: &str = "keel-telemetry";

fn to_value(v: &AttrValue) -> Value {
    match v {
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::Int(i) => Value::I64(*i),
        AttrValue::Float(f) => Value::F64(*f),
        AttrValue::Str(s) => Value::String(StringValue::from(s.clone())),
        AttrValue::StrArray(items) => Value::Array(Array::String(
            items.iter().map(|s| StringValue::from(s.clone())).collect(),
        )),
    }
}

fn system_time(ts: chrono::DateTime<chrono::Utc>) -> SystemTime {
    SystemTime::from(ts)
}

/// Converts a span record into SDK span data. Invalid ids become zero (invalid) ids, which
/// exporters drop; records built by [`crate::SpanAssembler`] always have valid ids.
pub fn to_span_data(span: &SpanRecord) -> SpanData {
    let trace_id = TraceId::from_hex(&span.trace_id).unwrap_or(TraceId::INVALID);
    let span_id = SpanId::from_hex(&span.span_id).unwrap_or(SpanId::INVALID);
    let parent = span
        .parent_span_id
        .as_deref()
        .and_then(|p| SpanId::from_hex(p).ok())
        .unwrap_or(SpanId::INVALID);
    let mut events = SpanEvents::default();
    for e in &span.events {
        events.events.push(opentelemetry::trace::Event::new(
            e.name.clone(),
            system_time(e.ts),
            e.attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), to_value(v)))
                .collect(),
            0,
        ));
    }
    SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: match span.kind {
            SpanKind::Internal => opentelemetry::trace::SpanKind::Internal,
            SpanKind::Client => opentelemetry::trace::SpanKind::Client,
        },
        name: Cow::Owned(span.name.clone()),
        start_time: system_time(span.start),
        end_time: system_time(span.end),
        attributes: span
            .attributes
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), to_value(v)))
            .collect(),
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status: match &span.status {
            SpanStatus::Unset => opentelemetry::trace::Status::Unset,
            SpanStatus::Ok => opentelemetry::trace::Status::Ok,
            SpanStatus::Error { message } => opentelemetry::trace::Status::error(message.clone()),
        },
        instrumentation_scope: InstrumentationScope::builder(SCOPE_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

/// The resource describing this process (service name and configured attributes).
pub fn resource(config: &TelemetryConfig) -> Resource {
    Resource::builder_empty()
        .with_service_name(config.service_name.clone())
        .with_attributes(
            config
                .resource_attributes
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// An OTLP span exporter over the configured transport. Must be created and used inside a
/// Tokio runtime (the sink's worker owns one).
#[derive(Debug)]
pub struct OtlpSpanExporter {
    inner: opentelemetry_otlp::SpanExporter,
    timeout: Duration,
}

impl OtlpSpanExporter {
    /// Builds the exporter, or `None` when no endpoint is configured.
    pub fn from_config(config: &TelemetryConfig) -> Result<Option<Self>, TelemetryError> {
        let Some(endpoint) = config.traces_endpoint() else {
            return Ok(None);
        };
        let timeout = Duration::from_millis(config.export_timeout_ms.max(1));
        let mut inner = match config.protocol {
            OtlpProtocol::Http => {
                let headers: HashMap<String, String> = config.headers.clone().into_iter().collect();
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(crate::tls::http_client(config, timeout)?)
                    .with_endpoint(endpoint)
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(timeout)
                    .with_headers(headers)
                    .build()
            }
            OtlpProtocol::Grpc => {
                let mut map = http::HeaderMap::new();
                for (k, v) in &config.headers {
                    let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|e| TelemetryError::Config {
                            field: format!("telemetry.headers.{k}"),
                            message: format!("not a valid header name: {e}"),
                        })?;
                    let value =
                        http::HeaderValue::from_str(v).map_err(|e| TelemetryError::Config {
                            field: format!("telemetry.headers.{k}"),
                            message: format!("not a valid header value: {e}"),
                        })?;
                    map.insert(name, value);
                }
                let builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint)
                    .with_protocol(Protocol::Grpc)
                    .with_timeout(timeout)
                    .with_metadata(
                        opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(map),
                    );
                match crate::tls::grpc_tls(config)? {
                    Some(tls) => builder.with_tls_config(tls),
                    None => builder,
                }
                .build()
            }
        }
        .map_err(|e| {
            TelemetryError::Export(format!(
                "cannot build the exporter for `{}`: {e}",
                config.endpoint.clone().unwrap_or_default()
            ))
        })?;
        inner.set_resource(&resource(config));
        Ok(Some(Self { inner, timeout }))
    }

    /// Exports one batch, bounded by the configured timeout (plus a second of slack).
    pub async fn export(&self, spans: &[SpanRecord]) -> Result<(), TelemetryError> {
        if spans.is_empty() {
            return Ok(());
        }
        let batch: Vec<SpanData> = spans.iter().map(to_span_data).collect();
        match tokio::time::timeout(
            self.timeout + Duration::from_secs(1),
            self.inner.export(batch),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(TelemetryError::Export(e.to_string())),
            Err(_) => Err(TelemetryError::Export(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}
