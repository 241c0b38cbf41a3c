//! The Detective's declared tools (from `agent.toml`) called directly against the release
//! service: data, 404, 500, slow answers and validation errors reach the model as typed errors.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_config::AgentDefinition;
use keel_core::{CancellationToken, ToolContext, ToolErrorCode, ToolRegistry};
use keel_detective::{DETECTIVE_AGENT_TOML, RunningService, ServiceConfig, serve};
use keel_tools::HttpTool;
use serde_json::json;

async fn setup(
    dir: &std::path::Path,
    slow_timeout_ms: Option<u64>,
) -> (RunningService, ToolRegistry) {
    let service = serve(ServiceConfig {
        port: 0,
        reports_dir: dir.to_path_buf(),
        fixtures_dir: None,
    })
    .await
    .unwrap();
    let file = AgentDefinition::parse(DETECTIVE_AGENT_TOML, "agent.toml").unwrap();
    let base = service.base_url();
    let env = move |n: &str| (n == "RELEASE_SERVICE_URL").then(|| base.clone());
    let mut tools = ToolRegistry::new();
    for (_, config) in file.http_tools() {
        let mut config = config.clone();
        if let Some(ms) = slow_timeout_ms {
            config.timeout_ms = ms;
        }
        tools
            .register(Arc::new(HttpTool::with_env(config, &env).unwrap()))
            .unwrap();
    }
    (service, tools)
}

fn ctx() -> ToolContext {
    ToolContext::new("thread", "run", "call-1", CancellationToken::new())
}

#[tokio::test]
async fn the_tools_read_releases_and_file_reports() {
    let dir = tempfile::tempdir().unwrap();
    let (service, tools) = setup(dir.path(), None).await;
    let summary = tools
        .get("get_release_summary")
        .unwrap()
        .call(json!({"release_id": "v2.1.0"}), &ctx())
        .await
        .unwrap();
    assert_eq!(summary["changes"][0], "Added payment processing");
    let details = tools
        .get("get_test_details")
        .unwrap()
        .call(json!({"release_id": "v3.0.0"}), &ctx())
        .await
        .unwrap();
    assert_eq!(details["failing_tests"].as_array().unwrap().len(), 7);
    let report = tools
        .get("file_risk_report")
        .unwrap()
        .call(json!({"release_id": "v2.1.0", "severity": "high", "findings": ["2 payment tests fail"]}), &ctx())
        .await
        .unwrap();
    assert!(report["report_id"].as_str().unwrap().starts_with("rr-"));
    // A retried call (same idempotency key) does not file a second report.
    let again = tools
        .get("file_risk_report")
        .unwrap()
        .call(json!({"release_id": "v2.1.0", "severity": "high", "findings": ["2 payment tests fail"]}), &ctx())
        .await
        .unwrap();
    assert_eq!(again["report_id"], report["report_id"]);
    service.shutdown().await;
}

#[tokio::test]
async fn failures_are_typed_errors_the_model_can_act_on() {
    let dir = tempfile::tempdir().unwrap();
    let (service, tools) = setup(dir.path(), Some(1_000)).await;
    let summary = tools.get("get_release_summary").unwrap();
    let error = summary
        .call(json!({"release_id": "v0.0.1"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::NotFound);
    assert!(
        error.message.contains("v0.0.1") && error.message.contains("v2.1.0"),
        "{}",
        error.message
    );
    let error = summary
        .call(json!({"release_id": "v2.7.0-broken"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::RetryableServer);
    assert_eq!(error.details.unwrap()["status"], 500);
    let error = summary
        .call(json!({"release_id": "v2.8.0-slow"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout);
    let error = tools
        .get("file_risk_report")
        .unwrap()
        .call(
            json!({"release_id": "v2.1.0", "severity": "critical", "findings": ["x"]}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput);
    assert!(
        error.message.contains("severity") && error.message.contains("Fix:"),
        "{}",
        error.message
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_reused_call_id_with_other_arguments_is_a_conflict_the_model_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let (service, tools) = setup(dir.path(), None).await;
    let file = tools.get("file_risk_report").unwrap();
    file.call(
        json!({"release_id": "v2.1.0", "severity": "high", "findings": ["2 payment tests fail"]}),
        &ctx(),
    )
    .await
    .unwrap();
    // Same thread and call id (so the same Idempotency-Key), different report.
    let error = file
        .call(
            json!({"release_id": "v2.1.0", "severity": "low", "findings": ["all fine"]}),
            &ctx(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput);
    assert_eq!(error.details.as_ref().unwrap()["status"], 409);
    assert!(
        error.message.contains("Idempotency-Key") && error.message.contains("Fix:"),
        "{}",
        error.message
    );
    service.shutdown().await;
}
