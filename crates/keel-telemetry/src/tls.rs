//! TLS for OTLP export to `https://` collectors: the OS trust store (which honours
//! `SSL_CERT_FILE` / `SSL_CERT_DIR`) plus, when configured, the CA certificates of
//! `[telemetry] ca_file` (or the standard `OTEL_EXPORTER_OTLP_CERTIFICATE`), for both
//! OTLP/HTTP (reqwest 0.12 under the exporter) and OTLP/gRPC (tonic).

use std::time::Duration;

use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;

/// Makes aws-lc-rs the process's default rustls crypto provider unless one is already
/// installed. The exporter's reqwest 0.12 is built without a provider of its own (so the
/// workspace compiles a single crypto library, the aws-lc-rs that reqwest 0.13 and tonic
/// use); it panics when it builds a client and no default is installed. Idempotent and
/// cheap; called before any exporter is built. Call it yourself before building a
/// reqwest 0.12 client of your own in a process that links this crate.
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing the race to another thread that installed a provider is fine.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

/// The configured CA file's contents (PEM), or `None` when there is none.
fn ca_pem(config: &TelemetryConfig) -> Result<Option<Vec<u8>>, TelemetryError> {
    let Some(path) = config
        .ca_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| TelemetryError::Config {
        field: "telemetry.ca_file".into(),
        message: format!(
            "cannot read the CA certificate file `{}`: {e}; point it at a PEM file of CA \
             certificates (or unset it to trust only the system's)",
            path.display()
        ),
    })?;
    Ok(Some(pem))
}

fn bad_ca(config: &TelemetryConfig, reason: impl std::fmt::Display) -> TelemetryError {
    TelemetryError::Config {
        field: "telemetry.ca_file".into(),
        message: format!(
            "`{}` holds no usable PEM certificate: {reason}",
            config
                .ca_file
                .as_deref()
                .unwrap_or_else(|| std::path::Path::new(""))
                .display()
        ),
    }
}

/// The HTTP client for the OTLP/HTTP exporters: rustls on aws-lc-rs, OS roots plus the
/// configured CA, and the export timeout per request.
pub(crate) fn http_client(
    config: &TelemetryConfig,
    timeout: Duration,
) -> Result<reqwest::Client, TelemetryError> {
    ensure_crypto_provider();
    let mut builder = reqwest::Client::builder().timeout(timeout);
    if let Some(pem) = ca_pem(config)? {
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad_ca(config, e))?;
        if certs.is_empty() {
            return Err(bad_ca(config, "no `BEGIN CERTIFICATE` block found"));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder
        .build()
        .map_err(|e| TelemetryError::Export(format!("cannot build the OTLP/HTTP client: {e}")))
}

/// The TLS settings of the OTLP/gRPC exporters, or `None` for a plain `http://` endpoint.
pub(crate) fn grpc_tls(
    config: &TelemetryConfig,
) -> Result<Option<ClientTlsConfig>, TelemetryError> {
    let https = config.endpoint.as_deref().is_some_and(|url| {
        url.trim_start()
            .to_ascii_lowercase()
            .starts_with("https://")
    });
    if !https {
        return Ok(None);
    }
    ensure_crypto_provider();
    let mut tls = ClientTlsConfig::new().with_native_roots();
    if let Some(pem) = ca_pem(config)? {
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(bad_ca(config, "no `BEGIN CERTIFICATE` block found"));
        }
        tls = tls.ca_certificate(Certificate::from_pem(pem));
    }
    Ok(Some(tls))
}
