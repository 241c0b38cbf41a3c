//! The `[telemetry]` section: TOML parsing with unknown keys rejected, defaults, and the
//! standard OTEL_EXPORTER_OTLP_* variables.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;

use keel_telemetry::{OtlpProtocol, TelemetryConfig, TelemetrySink};

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeelToml {
    telemetry: TelemetryConfig,
}

#[test]
fn parses_the_telemetry_section() {
    let toml = r#"
        [telemetry]
        endpoint = "http://127.0.0.1:4317"
        protocol = "grpc"
        capture_content = true
        trace_dir = "/tmp/traces"
        headers = { "x-api-key" = "abc" }

        [telemetry.redaction]
        patterns = ["ACME-[0-9]{6}"]
        fields = ["license_key"]

        [telemetry.log]
        level = "keel=debug,info"
        file = "/tmp/keel.log"
        rotation = "hourly"
    "#;
    let cfg: KeelToml = toml::from_str(toml).unwrap();
    let t = cfg.telemetry;
    assert_eq!(t.protocol, OtlpProtocol::Grpc);
    assert_eq!(
        t.traces_endpoint().as_deref(),
        Some("http://127.0.0.1:4317")
    );
    assert!(t.capture_content);
    assert!(t.redaction.enabled, "redaction stays on by default");
    assert_eq!(t.redaction.fields, ["license_key"]);
    assert_eq!(t.log.rotation, "hourly");
    t.validate().unwrap();
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let err = toml::from_str::<KeelToml>("[telemetry]\nendpoit = \"http://x\"\n").unwrap_err();
    assert!(err.to_string().contains("endpoit"), "{err}");
    let err = toml::from_str::<KeelToml>("[telemetry.redaction]\npattern = []\n").unwrap_err();
    assert!(err.to_string().contains("pattern"), "{err}");
}

#[test]
fn defaults() {
    let t = TelemetryConfig::default();
    assert_eq!(t.endpoint, None);
    assert!(!t.capture_content);
    assert!(t.redaction.enabled);
    assert_eq!(
        t.trace_dir.as_deref(),
        Some(std::path::Path::new(".keel/traces"))
    );
}

#[test]
fn http_endpoint_gets_the_traces_path() {
    let t = TelemetryConfig {
        endpoint: Some("http://127.0.0.1:6006/".into()),
        ..TelemetryConfig::default()
    };
    assert_eq!(
        t.traces_endpoint().as_deref(),
        Some("http://127.0.0.1:6006/v1/traces")
    );
}

#[test]
fn otel_environment_fills_what_the_file_leaves_out() {
    let env: HashMap<&str, &str> = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=k1, tenant=t2"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_SERVICE_NAME", "detective"),
    ]
    .into_iter()
    .collect();
    let t = TelemetryConfig::default()
        .with_env(|k| env.get(k).map(|v| v.to_string()))
        .unwrap();
    assert_eq!(t.endpoint.as_deref(), Some("http://collector:4317"));
    assert_eq!(t.protocol, OtlpProtocol::Grpc);
    assert_eq!(t.headers["api-key"], "k1");
    assert_eq!(t.headers["tenant"], "t2");
    assert_eq!(t.export_timeout_ms, 2500);
    assert_eq!(t.service_name, "detective");

    // The file wins over the environment.
    let file = TelemetryConfig {
        endpoint: Some("http://file:4318".into()),
        ..TelemetryConfig::default()
    };
    let t = file
        .with_env(|k| env.get(k).map(|v| v.to_string()))
        .unwrap();
    assert_eq!(t.endpoint.as_deref(), Some("http://file:4318"));
    assert_eq!(t.protocol, OtlpProtocol::Http);

    let err = TelemetryConfig::default()
        .with_env(|k| (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| "http/json".to_string()))
        .unwrap_err();
    assert!(
        err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
        "{err}"
    );
}

#[test]
fn invalid_values_are_rejected_with_the_field_name() {
    let t = TelemetryConfig {
        endpoint: Some("localhost:4317".into()),
        ..TelemetryConfig::default()
    };
    let err = TelemetrySink::new(&t).unwrap_err();
    assert!(err.to_string().contains("telemetry.endpoint"), "{err}");
    let mut t = TelemetryConfig::default();
    t.log.rotation = "weekly".into();
    assert!(
        t.validate()
            .unwrap_err()
            .to_string()
            .contains("telemetry.log.rotation")
    );
}

#[tokio::test]
async fn an_unreachable_collector_never_blocks_and_is_reported() {
    // A port nobody listens on: export fails fast, recording never blocks. The bounds are
    // hang detectors, generous for a machine whose cores are busy: export_timeout_ms sets
    // how long shutdown waits for the worker (2× + 5 s), and a refused connection fails
    // at once whatever the timeout, so a large one costs nothing.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = TelemetryConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        trace_dir: None,
        export_timeout_ms: 20_000,
        ..TelemetryConfig::default()
    };
    let sink = TelemetrySink::new(&t).unwrap();
    let start = std::time::Instant::now();
    let event = |i: u64, kind: keel_core::EventKind| keel_core::Event {
        v: 1,
        seq: i % 2,
        ts: chrono::Utc::now(),
        thread_id: "t".into(),
        run_id: format!("r{}", i / 2).into(),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        span_id: "b7ad6b7169203331".into(),
        kind,
    };
    for i in 0..10_000u64 {
        let kind = if i % 2 == 0 {
            keel_core::EventKind::RunStarted {
                agent: "a".into(),
                model: "m".into(),
                goal: "g".into(),
                constraints: vec![],
                budget: keel_core::Budget::default(),
                definition: None,
                parent_span_id: None,
            }
        } else {
            keel_core::EventKind::RunEnded {
                end_state: keel_core::EndState::Done,
                reason: None,
                final_text: None,
            }
        };
        sink.record(&event(i, kind));
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "record must not block"
    );
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(stats.events + stats.dropped, 10_000);
    assert!(stats.export_errors >= 1, "{stats:?}");
    assert!(stats.last_error.is_some());
}
