//! The `[telemetry]` section of `keel.toml`, and how the standard `OTEL_EXPORTER_OTLP_*`
//! environment variables fill in what the file leaves out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::TelemetryError;

/// OTLP transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`POST {endpoint}/v1/traces`). Default port 4318.
    #[default]
    #[serde(alias = "http/protobuf", alias = "http_protobuf")]
    Http,
    /// OTLP/gRPC (tonic). Default port 4317.
    Grpc,
}

/// `[telemetry]` in keel.toml. Unknown keys are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP collector endpoint, e.g. `http://127.0.0.1:4318` (HTTP) or
    /// `http://127.0.0.1:4317` (gRPC). For HTTP, `/v1/traces` is appended unless the URL
    /// already ends with it. `None` (and no `OTEL_EXPORTER_OTLP_*` variable) disables export.
    pub endpoint: Option<String>,
    /// Transport for `endpoint`.
    pub protocol: OtlpProtocol,
    /// Extra headers sent with every export (e.g. an API key for a hosted backend).
    pub headers: BTreeMap<String, String>,
    /// PEM file of CA certificates trusted for an `https://` endpoint, in addition to the
    /// system's trust store (for a collector with a private or self-signed CA). Filled
    /// from `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` or `OTEL_EXPORTER_OTLP_CERTIFICATE`
    /// when unset.
    pub ca_file: Option<PathBuf>,
    /// `service.name` resource attribute.
    pub service_name: String,
    /// Extra resource attributes (e.g. `openinference.project.name` for Phoenix).
    pub resource_attributes: BTreeMap<String, String>,
    /// Per-export timeout in milliseconds.
    pub export_timeout_ms: u64,
    /// Spans per export batch.
    pub max_batch_size: usize,
    /// How often buffered spans are exported, in milliseconds.
    pub export_interval_ms: u64,
    /// Events queued for the background worker before new ones are dropped (counted).
    pub queue_capacity: usize,
    /// Also export the GenAI metrics (`gen_ai.client.token.usage`,
    /// `gen_ai.client.operation.duration`, `keel.tool.duration`) to `endpoint`.
    pub metrics: bool,
    /// How often metrics are exported, in milliseconds.
    pub metrics_interval_ms: u64,
    /// Directory of per-trace JSONL files; `None` or `""` disables trace files.
    pub trace_dir: Option<PathBuf>,
    /// Put message text, tool arguments and results on spans (opt-in; redacted either way).
    pub capture_content: bool,
    /// Redaction settings.
    pub redaction: RedactionConfig,
    /// Log settings.
    pub log: LogConfig,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::Http,
            headers: BTreeMap::new(),
            ca_file: None,
            service_name: "keel".into(),
            resource_attributes: BTreeMap::new(),
            export_timeout_ms: 10_000,
            max_batch_size: 512,
            export_interval_ms: 1_000,
            queue_capacity: 65_536,
            metrics: true,
            metrics_interval_ms: 60_000,
            trace_dir: Some(PathBuf::from(".keel/traces")),
            capture_content: false,
            redaction: RedactionConfig::default(),
            log: LogConfig::default(),
        }
    }
}

/// `[telemetry.redaction]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedactionConfig {
    /// Redaction on or off. On by default; turning it off is for debugging only.
    pub enabled: bool,
    /// Extra regular expressions (Rust `regex` syntax); every match is replaced.
    pub patterns: Vec<String>,
    /// Extra JSON field / `key=value` names whose values are always replaced
    /// (case-insensitive; `-` and `_` are interchangeable). Added to the built-in list.
    pub fields: Vec<String>,
    /// Text put in place of a redacted value.
    pub replacement: String,
}

impl Default for RedactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            patterns: Vec::new(),
            fields: Vec::new(),
            replacement: "[REDACTED]".into(),
        }
    }
}

/// `[telemetry.log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Filter directives (`info`, `keel=debug,hyper=warn`). `RUST_LOG` overrides it.
    pub level: String,
    /// Human-readable log lines to stderr.
    pub console: bool,
    /// JSON log file (rolled by `rotation`); `None` or `""` disables the file.
    pub file: Option<PathBuf>,
    /// `never`, `hourly` or `daily`.
    pub rotation: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            console: true,
            file: Some(PathBuf::from(".keel/logs/keel.log")),
            rotation: "daily".into(),
        }
    }
}

impl TelemetryConfig {
    /// Fills unset values from the standard OpenTelemetry variables, read with `env`:
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, `http/protobuf`), `OTEL_EXPORTER_OTLP_HEADERS`
    /// (`k=v,k2=v2`), `OTEL_EXPORTER_OTLP_TIMEOUT` (ms), `OTEL_EXPORTER_OTLP_CERTIFICATE`
    /// (or `…_TRACES_CERTIFICATE`: a PEM CA file, as `ca_file`) and `OTEL_SERVICE_NAME`.
    /// Values in keel.toml win over the environment.
    pub fn with_env(
        mut self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let protocol_from_env = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if self.endpoint.is_none() {
            if let Some(p) = &protocol_from_env {
                self.protocol = match p.trim() {
                    "grpc" => OtlpProtocol::Grpc,
                    "http/protobuf" | "http" => OtlpProtocol::Http,
                    other => {
                        return Err(TelemetryError::Config {
                            field: "OTEL_EXPORTER_OTLP_PROTOCOL".into(),
                            message: format!(
                                "`{other}` is not supported; use `grpc` or `http/protobuf`"
                            ),
                        });
                    }
                };
            }
            if let Some(url) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
                self.endpoint = Some(url);
            } else if let Some(url) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
                self.endpoint = Some(url);
            }
        }
        if let Some(headers) = get("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in headers.split(',').filter(|p| !p.trim().is_empty()) {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err(TelemetryError::Config {
                        field: "OTEL_EXPORTER_OTLP_HEADERS".into(),
                        message: format!("`{pair}` is not `key=value`"),
                    });
                };
                self.headers
                    .entry(k.trim().to_string())
                    .or_insert_with(|| v.trim().to_string());
            }
        }
        if self.ca_file.is_none()
            && let Some(path) = get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
                .or_else(|| get("OTEL_EXPORTER_OTLP_CERTIFICATE"))
        {
            self.ca_file = Some(PathBuf::from(path.trim()));
        }
        if let Some(ms) = get("OTEL_EXPORTER_OTLP_TIMEOUT") {
            self.export_timeout_ms = ms.trim().parse().map_err(|_| TelemetryError::Config {
                field: "OTEL_EXPORTER_OTLP_TIMEOUT".into(),
                message: format!("`{ms}` is not a number of milliseconds"),
            })?;
        }
        if self.service_name == "keel"
            && let Some(name) = get("OTEL_SERVICE_NAME")
        {
            self.service_name = name;
        }
        Ok(self)
    }

    /// [`with_env`](Self::with_env) over the process environment.
    pub fn with_process_env(self) -> Result<Self, TelemetryError> {
        self.with_env(|k| std::env::var(k).ok())
    }

    /// Checks values that serde cannot: URLs, regexes, sizes.
    pub fn validate(&self) -> Result<(), TelemetryError> {
        if let Some(url) = &self.endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(TelemetryError::Config {
                field: "telemetry.endpoint".into(),
                message: format!("`{url}` must start with http:// or https://"),
            });
        }
        if self.max_batch_size == 0 {
            return Err(TelemetryError::Config {
                field: "telemetry.max_batch_size".into(),
                message: "must be at least 1".into(),
            });
        }
        if self.queue_capacity == 0 {
            return Err(TelemetryError::Config {
                field: "telemetry.queue_capacity".into(),
                message: "must be at least 1".into(),
            });
        }
        if !matches!(
            self.log.rotation.as_str(),
            "never" | "hourly" | "daily" | "minutely"
        ) {
            return Err(TelemetryError::Config {
                field: "telemetry.log.rotation".into(),
                message: format!("`{}` is not one of never, hourly, daily", self.log.rotation),
            });
        }
        crate::redact::check_config(&self.redaction)
    }

    /// The full URL the HTTP exporter posts to, or the gRPC endpoint as configured.
    pub fn traces_endpoint(&self) -> Option<String> {
        let url = self.endpoint.as_ref()?;
        Some(match self.protocol {
            OtlpProtocol::Grpc => url.clone(),
            OtlpProtocol::Http => {
                let trimmed = url.trim_end_matches('/');
                if trimmed.ends_with("/v1/traces") {
                    trimmed.to_string()
                } else {
                    format!("{trimmed}/v1/traces")
                }
            }
        })
    }
}
