//! OTLP export to `https://` collectors: a loopback TLS receiver with a certificate signed
//! by a CA generated here; the exporter trusts that CA through `ca_file` (or
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`) and the spans arrive. Without the CA the handshake is
//! refused and nothing arrives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use keel_core::EndState;
use keel_telemetry::{OtlpProtocol, TelemetryConfig, TelemetryError, TelemetrySink};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

type Bodies = common::Received;
type Protocols = Arc<Mutex<Vec<String>>>;

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A CA (PEM, written to `dir/ca.pem`) and a server certificate for 127.0.0.1 signed by it.
fn certificates(dir: &Path) -> (std::path::PathBuf, rustls::ServerConfig) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(server_cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .unwrap();
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_path, server)
}

/// A loopback TLS receiver: counts completed handshakes (and the ALPN protocol agreed),
/// and serves OTLP/HTTP on HTTP/1.1 connections.
async fn tls_receiver(server: rustls::ServerConfig) -> (u16, Bodies, Arc<AtomicUsize>, Protocols) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let bodies: Bodies = Arc::default();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let protocols: Protocols = Arc::default();
    let (store, count, alpn) = (
        Arc::clone(&bodies),
        Arc::clone(&handshakes),
        Arc::clone(&protocols),
    );
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, store, count, alpn) = (
                acceptor.clone(),
                Arc::clone(&store),
                Arc::clone(&count),
                Arc::clone(&alpn),
            );
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(sock).await else {
                    return; // the client refused our certificate
                };
                count.fetch_add(1, Ordering::SeqCst);
                let protocol = tls
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_default();
                alpn.lock().unwrap().push(protocol.clone());
                if protocol != "h2" {
                    common::serve_otlp_http(tls, store).await;
                }
            });
        }
    });
    (port, bodies, handshakes, protocols)
}

fn https_config(port: u16, ca_file: Option<std::path::PathBuf>) -> TelemetryConfig {
    TelemetryConfig {
        endpoint: Some(format!("https://127.0.0.1:{port}")),
        ca_file,
        trace_dir: None,
        metrics: false,
        export_timeout_ms: 5_000,
        service_name: "keel-tls-test".into(),
        ..TelemetryConfig::default()
    }
}

async fn export_one_run(config: &TelemetryConfig) -> keel_telemetry::SinkStats {
    let run = common::tool_using_run(7).end(EndState::Done, Some("Risk: low."));
    let sink = TelemetrySink::new(config).unwrap();
    for e in &run {
        sink.record(e);
    }
    sink.shutdown().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_https_collector_that_trusts_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, server) = certificates(dir.path());
    let (port, bodies, handshakes, _) = tls_receiver(server).await;
    let stats = export_one_run(&https_config(port, Some(ca_file))).await;
    assert_eq!(stats.export_errors, 0, "{:?}", stats.last_error);
    assert!(stats.spans_exported >= 4, "{stats:?}");
    assert!(handshakes.load(Ordering::SeqCst) >= 1);
    let traces: Vec<u8> = bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p == "/v1/traces")
        .flat_map(|(_, b)| b.clone())
        .collect();
    for needle in [
        "invoke_agent detective",
        "execute_tool get_release",
        "keel-tls-test",
    ] {
        assert!(contains(&traces, needle), "trace payload lacks {needle:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_certificate_variable_names_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, server) = certificates(dir.path());
    let (port, bodies, _, _) = tls_receiver(server).await;
    let ca = ca_file.to_string_lossy().into_owned();
    let config = https_config(port, None)
        .with_env(|k| (k == "OTEL_EXPORTER_OTLP_CERTIFICATE").then(|| ca.clone()))
        .unwrap();
    assert_eq!(config.ca_file.as_deref(), Some(ca_file.as_path()));
    let stats = export_one_run(&config).await;
    assert_eq!(stats.export_errors, 0, "{:?}", stats.last_error);
    assert!(!bodies.lock().unwrap().is_empty());
}

/// Negative control: the same receiver without the CA trusted is refused, so the test
/// above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, server) = certificates(dir.path());
    let (port, bodies, handshakes, _) = tls_receiver(server).await;
    let stats = export_one_run(&https_config(port, None)).await;
    assert!(stats.export_errors >= 1, "{stats:?}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 0);
    assert!(bodies.lock().unwrap().is_empty());
}

/// gRPC over TLS: the tonic exporter completes a TLS handshake (ALPN `h2`) with the
/// private CA trusted. The loopback receiver does not speak gRPC, so only the handshake
/// is checked here; spans over gRPC+TLS are not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_export_negotiates_tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, server) = certificates(dir.path());
    let (port, _, handshakes, protocols) = tls_receiver(server).await;
    let config = TelemetryConfig {
        protocol: OtlpProtocol::Grpc,
        export_timeout_ms: 2_000,
        ..https_config(port, Some(ca_file))
    };
    let _ = export_one_run(&config).await;
    assert!(handshakes.load(Ordering::SeqCst) >= 1, "no TLS handshake");
    assert!(
        protocols.lock().unwrap().iter().any(|p| p == "h2"),
        "{:?}",
        protocols.lock().unwrap()
    );
}

#[test]
fn a_missing_ca_file_is_a_config_error_naming_the_field() {
    let config = https_config(1, Some("/nonexistent/keel-ca.pem".into()));
    match TelemetrySink::new(&config) {
        Err(TelemetryError::Config { field, message }) => {
            assert_eq!(field, "telemetry.ca_file");
            assert!(message.contains("/nonexistent/keel-ca.pem"), "{message}");
        }
        Err(other) => panic!("expected a config error, got {other:?}"),
        Ok(_) => panic!("a missing CA file was accepted"),
    }
}
