//! The Detective end to end: the release service and the mock LLM on loopback ports, the
//! agent built from `agent.toml`, an OpenAI-protocol model pointed at the mock.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_app::{AgentRef, AgentRequest, App};
use keel_core::{EndState, EventKind, EventStore, MemoryStore, Message};
use keel_detective::{ServiceConfig, serve};
use keel_providers::{ProviderOptions, model_from_spec};
use keel_runtime::{RunContext, RunOutcome, Thread};
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Run {
    outcome: RunOutcome,
    events: Vec<keel_core::Event>,
    reports: Value,
    mock_requests: Vec<keel_testkit::mock_llm::MockRequest>,
}

async fn run_detective(script: &str) -> Run {
    let reports_dir = tempfile::tempdir().unwrap();
    let service = serve(ServiceConfig {
        port: 0,
        reports_dir: reports_dir.path().to_path_buf(),
        fixtures_dir: None,
    })
    .await
    .unwrap();
    let mock = MockLlmServer::start(
        MockScript::from_file(repo().join("examples/mock").join(script)).unwrap(),
    )
    .await
    .unwrap();
    let model = model_from_spec(
        "openai:mock",
        &ProviderOptions {
            base_url: Some(mock.base_url()),
            api_key: Some("test".into()),
            ..ProviderOptions::default()
        },
    )
    .unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("agent.toml");
    let base = service.base_url();
    let env = Arc::new(move |name: &str| (name == "RELEASE_SERVICE_URL").then(|| base.clone()));
    let app = App::from_toml_str("", &repo(), env).unwrap();
    let agent = app
        .agent(&AgentRequest {
            agent: Some(AgentRef::File(file)),
            model_override: Some(model),
            ..AgentRequest::default()
        })
        .await
        .unwrap()
        .agent;

    let store = Arc::new(MemoryStore::new());
    let mut thread = Thread::new();
    let outcome = agent
        .run(
            vec![Message::user("Assess release v2.1.0")],
            &mut thread,
            &RunContext::new(store.clone()),
        )
        .await
        .unwrap();
    let events = store.load(thread.id()).await.unwrap();
    let reports: Value = reqwest::get(format!(
        "{}/risk-reports?release_id=v2.1.0",
        service.base_url()
    ))
    .await
    .unwrap()
    .json_value()
    .await;
    let mock_requests = mock.requests();
    mock.shutdown().await;
    service.shutdown().await;
    Run {
        outcome,
        events,
        reports,
        mock_requests,
    }
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        serde_json::from_slice(&self.bytes().await.unwrap()).unwrap()
    }
}

#[tokio::test]
async fn the_detective_reads_both_tools_files_a_report_and_ends_done() {
    let run = run_detective("detective.json").await;
    let outcome = &run.outcome;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:#?}");
    let names: Vec<&str> = outcome.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "get_release_summary",
            "get_test_details",
            "file_risk_report"
        ]
    );
    assert!(
        outcome.tool_calls.iter().all(|c| c.ok),
        "{:#?}",
        outcome.tool_calls
    );

    // The report is in the service, with the severity the script chose.
    let reports = run.reports["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{}", run.reports);
    assert_eq!(reports[0]["severity"], "high");
    assert_eq!(reports[0]["findings"].as_array().unwrap().len(), 3);
    assert!(
        reports[0]["idempotency_key"]
            .as_str()
            .is_some_and(|k| !k.is_empty())
    );

    // The model saw the service's real data: the second request carries the failing tests.
    let second = serde_json::to_string(&run.mock_requests[1].body).unwrap();
    assert!(second.contains("test_capture_partial_refund"), "{second}");
    let third = serde_json::to_string(&run.mock_requests[2].body).unwrap();
    assert!(
        third.contains(reports[0]["report_id"].as_str().unwrap()),
        "report id reached the model"
    );

    let verdicts: Vec<bool> = run
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Critique { satisfied, .. } => Some(*satisfied),
            _ => None,
        })
        .collect();
    assert_eq!(
        verdicts.last(),
        Some(&true),
        "the final answer was accepted: {verdicts:?}"
    );
}

#[tokio::test]
async fn the_critic_rejects_an_answer_without_a_filed_report() {
    let run = run_detective("detective_no_report.json").await;
    let outcome = &run.outcome;
    assert_ne!(outcome.end_state(), Some(EndState::Done), "{outcome:#?}");
    assert!(outcome.tool_calls.is_empty());
    let rejections: Vec<Vec<String>> = run
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Critique {
                satisfied: false,
                known_gaps,
                ..
            } => Some(known_gaps.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejections.len(),
        3,
        "rejected, sent back twice, then the run failed: {rejections:?}"
    );
    assert!(
        rejections[0]
            .iter()
            .any(|g| g.contains("file_risk_report") && g.contains("severity")),
        "{rejections:?}"
    );
    assert_eq!(run.reports["reports"], serde_json::json!([]));
    // The gap went back to the model.
    let second = serde_json::to_string(&run.mock_requests[1].body).unwrap();
    assert!(second.contains("file_risk_report"), "{second}");
}
