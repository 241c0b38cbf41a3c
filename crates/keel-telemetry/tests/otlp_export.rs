//! OTLP/HTTP export to a loopback receiver: spans go to /v1/traces and the GenAI metric
//! instruments to /v1/metrics, both as protobuf.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel_core::EndState;
use keel_telemetry::{TelemetryConfig, TelemetrySink};

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_genai_metrics_are_posted_as_otlp_protobuf() {
    let (port, bodies) = common::otlp_receiver().await;
    let mut config = TelemetryConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        trace_dir: None,
        service_name: "keel-test".into(),
        ..TelemetryConfig::default()
    };
    config.headers.insert("x-tenant".into(), "t1".into());
    let run = common::tool_using_run(5).end(EndState::Done, Some("Risk: low."));
    let sink = TelemetrySink::new(&config).unwrap();
    for e in &run {
        sink.record(e);
    }
    let flushed = sink.flush().await.unwrap();
    assert_eq!(flushed.spans_exported, 4, "{flushed:?}");
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(
        (stats.export_errors, stats.metrics_errors),
        (0, 0),
        "{stats:?}"
    );

    let bodies = bodies.lock().unwrap().clone();
    let traces: Vec<u8> = bodies
        .iter()
        .filter(|(p, _)| p == "/v1/traces")
        .flat_map(|(_, b)| b.clone())
        .collect();
    let metrics: Vec<u8> = bodies
        .iter()
        .filter(|(p, _)| p == "/v1/metrics")
        .flat_map(|(_, b)| b.clone())
        .collect();
    for needle in [
        "invoke_agent detective",
        "chat claude-sonnet-4",
        "execute_tool get_release",
        "gen_ai.usage.input_tokens",
        "keel-test",
    ] {
        assert!(contains(&traces, needle), "trace payload lacks {needle:?}");
    }
    // Content is off by default: the tool arguments never leave the process.
    assert!(!contains(&traces, r#"{"version":"v2.3.1"}"#));
    for needle in [
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "keel.tool.duration",
        "gen_ai.token.type",
        "claude-sonnet-4",
    ] {
        assert!(
            contains(&metrics, needle),
            "metrics payload lacks {needle:?}"
        );
    }
}
