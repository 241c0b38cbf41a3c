//! The Detective end to end: the release service and the mock LLM on loopback ports, the
//! agent built from `agent.toml`, an OpenAI-protocol model pointed at the mock. Also the
//! guards of its `[[call_rules]]` (docs/detective.md, "Guards"): a report filed before its
//! reads, with a finding citing nothing the tools returned, or a second time is refused
//! with a message for the model, and the release service never sees it.
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
use keel_core::{
    EndState, EventKind, EventStore, MemoryStore, Message, ToolErrorCode, ToolResultKind,
};
use keel_detective::{ServiceConfig, serve};
use keel_providers::{ProviderOptions, model_from_spec};
use keel_runtime::{RunContext, RunOutcome, Thread};
use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn};
use serde_json::{Value, json};

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
    let script = MockScript::from_file(repo().join("examples/mock").join(script)).unwrap();
    run_script(script, "v2.1.0").await
}

/// Runs the Detective on "Assess release RELEASE" with the model answering `script`;
/// `reports` are the release service's reports of that release afterwards.
async fn run_script(script: MockScript, release: &str) -> Run {
    let reports_dir = tempfile::tempdir().unwrap();
    let service = serve(ServiceConfig {
        port: 0,
        reports_dir: reports_dir.path().to_path_buf(),
        fixtures_dir: None,
    })
    .await
    .unwrap();
    let mock = MockLlmServer::start(script).await.unwrap();
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
            vec![Message::user(format!("Assess release {release}"))],
            &mut thread,
            &RunContext::new(store.clone()),
        )
        .await
        .unwrap();
    let events = store.load(thread.id()).await.unwrap();
    let reports: Value = reqwest::get(format!(
        "{}/risk-reports?release_id={release}",
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

/// The outcome of every `file_risk_report` call of the run, in order: `Ok` when it ran and
/// succeeded, else the error message the model got.
fn filings(events: &[keel_core::Event]) -> Vec<Result<(), String>> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } if result.name == "file_risk_report" => {
                Some(match &result.outcome.result {
                    ToolResultKind::Ok { .. } => Ok(()),
                    ToolResultKind::Error { code, message, .. } => {
                        assert_eq!(*code, ToolErrorCode::InvalidInput, "{message}");
                        Err(message.clone())
                    }
                })
            }
            _ => None,
        })
        .collect()
}

/// How many `file_risk_report` calls started, i.e. reached the release service: a refused
/// call never starts.
fn filings_started(events: &[keel_core::Event]) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(&e.kind, EventKind::ToolCallStarted { name, .. } if name == "file_risk_report")
        })
        .count()
}

fn reads(release: &str) -> MockTurn {
    MockTurn::tool_call("get_release_summary", json!({"release_id": release}))
        .with_tool_call("get_test_details", json!({"release_id": release}))
}

fn filing(release: &str, severity: &str, findings: &[&str]) -> MockTurn {
    MockTurn::tool_call(
        "file_risk_report",
        json!({"release_id": release, "severity": severity, "findings": findings}),
    )
}

/// The findings of the "Good usage" example in `file_risk_report`'s usage guide (the first
/// `- {` line after "Good usage"), which the 0.5B and 1.5B Qwen models copied when it was a
/// concrete report (issue 19); now a shape with `<...>` placeholders.
fn usage_guide_example() -> Vec<String> {
    let line = keel_detective::DETECTIVE_AGENT_TOML
        .lines()
        .skip_while(|l| !l.starts_with("Good usage"))
        .find(|l| l.starts_with("- {"))
        .unwrap();
    let example: Value = serde_json::Deserializer::from_str(line.trim_start_matches("- "))
        .into_iter::<Value>()
        .next()
        .unwrap()
        .unwrap();
    example["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_report_copied_from_the_usage_guide_is_refused_before_the_reads_and_after_them() {
    let copied = usage_guide_example();
    let copied: Vec<&str> = copied.iter().map(String::as_str).collect();
    // What a correct Detective files for v2.1.0: figures of its summary and test details.
    let grounded = [
        "2 payment tests fail: test_capture_partial_refund and test_timeout_retries_once",
        "Error rate 2% against a 0.4% baseline",
    ];
    let script = MockScript::new(vec![
        // The example, filed without reading anything.
        filing("v2.1.0", "high", &copied),
        reads("v2.1.0"),
        // The example again, now that the reads succeeded: it cites none of their data.
        filing("v2.1.0", "high", &copied),
        filing("v2.1.0", "high", &grounded),
        MockTurn::text("Filed the report. Severity: high. Two payment tests fail."),
    ]);
    let run = run_script(script, "v2.1.0").await;
    assert_eq!(
        run.outcome.end_state(),
        Some(EndState::Done),
        "{:#?}",
        run.outcome
    );
    let filings = filings(&run.events);
    assert_eq!(filings.len(), 3, "{filings:#?}");
    let before = filings[0].as_ref().unwrap_err();
    assert!(
        before.contains("`file_risk_report` was not run")
            && before.contains(
                "still missing: `get_release_summary` and `get_test_details`. Call them first"
            )
            && before.contains("with the same `release_id` \"v2.1.0\""),
        "{before}"
    );
    let ungrounded = filings[1].as_ref().unwrap_err();
    for (i, finding) in copied.iter().enumerate() {
        assert!(
            ungrounded.contains(&format!(
                "/findings/{i} {finding:?} cites nothing that this run's tool results contain"
            )),
            "finding {i} named in: {ungrounded}"
        );
    }
    assert_eq!(filings[2], Ok(()));
    assert_eq!(filings_started(&run.events), 1, "refused calls never ran");

    // The service holds the one grounded report.
    let reports = run.reports["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{}", run.reports);
    assert_eq!(reports[0]["findings"], json!(grounded));
    // Each refusal reached the model as the call's result.
    let second = serde_json::to_string(&run.mock_requests[1].body).unwrap();
    assert!(second.contains("still missing"), "{second}");
    let fourth = serde_json::to_string(&run.mock_requests[3].body).unwrap();
    assert!(fourth.contains("/findings/0"), "{fourth}");
}

#[tokio::test]
async fn reads_of_another_release_do_not_open_the_filing() {
    let findings = ["Error rate 2% against a 0.4% baseline"];
    let script = MockScript::new(vec![
        reads("v2.0.4"),
        filing("v2.1.0", "high", &findings),
        reads("v2.1.0"),
        filing("v2.1.0", "high", &findings),
        MockTurn::text("Filed the report. Severity: high."),
    ]);
    let run = run_script(script, "v2.1.0").await;
    assert_eq!(run.outcome.end_state(), Some(EndState::Done));
    let filings = filings(&run.events);
    assert_eq!(filings.len(), 2, "{filings:#?}");
    let refused = filings[0].as_ref().unwrap_err();
    assert!(
        refused.contains("still missing: `get_release_summary` and `get_test_details`"),
        "{refused}"
    );
    assert_eq!(filings[1], Ok(()));
    assert_eq!(run.reports["reports"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_second_filing_is_refused_and_the_service_keeps_one_report() {
    let findings = [
        "Flaky UI test web::settings::test_save_button_position fails",
        "p95 latency 260 ms against a 215 ms baseline",
    ];
    let script = MockScript::new(vec![
        reads("v2.0.4"),
        // Two filings in one turn: the second is refused before either runs.
        filing("v2.0.4", "medium", &findings).with_tool_call(
            "file_risk_report",
            json!({"release_id": "v2.0.4", "severity": "medium", "findings": findings}),
        ),
        // And a later one, with another severity.
        filing("v2.0.4", "high", &findings),
        MockTurn::text("Filed the report. Severity: medium. One flaky settings test fails."),
    ]);
    let run = run_script(script, "v2.0.4").await;
    assert_eq!(run.outcome.end_state(), Some(EndState::Done));
    let filings = filings(&run.events);
    assert_eq!(filings.len(), 3, "{filings:#?}");
    assert_eq!(filings[0], Ok(()));
    let same_turn = filings[1].as_ref().unwrap_err();
    assert!(
        same_turn.contains("it is already being called in this turn")
            && same_turn.contains("at most once per run"),
        "{same_turn}"
    );
    let later = filings[2].as_ref().unwrap_err();
    assert!(
        later.contains("it already succeeded once in this run")
            && later.contains("Do not call it again"),
        "{later}"
    );
    assert_eq!(filings_started(&run.events), 1);
    let reports = run.reports["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{}", run.reports);
    assert_eq!(reports[0]["severity"], "medium");
}

#[tokio::test]
async fn an_ungrounded_finding_is_refused_naming_it_and_the_fixed_report_is_filed() {
    let script = MockScript::new(vec![
        reads("v2.6.0"),
        // The second finding cites nothing v2.6.0's tools returned ("p95" is a key of
        // theirs, not a value; "All", "tests", "pass" and "improved" are no figures).
        filing(
            "v2.6.0",
            "low",
            &["All 341 tests pass", "All tests pass; p95 improved"],
        ),
        filing(
            "v2.6.0",
            "low",
            &[
                "All 341 tests pass",
                "p95 latency improved from 240 to 190 ms",
            ],
        ),
        MockTurn::text("Filed the report. Severity: low. p95 latency improved to 190 ms."),
    ]);
    let run = run_script(script, "v2.6.0").await;
    assert_eq!(run.outcome.end_state(), Some(EndState::Done));
    let filings = filings(&run.events);
    assert_eq!(filings.len(), 2, "{filings:#?}");
    let refused = filings[0].as_ref().unwrap_err();
    assert!(
        refused.contains("/findings/1 \"All tests pass; p95 improved\" cites nothing"),
        "{refused}"
    );
    assert!(!refused.contains("/findings/0"), "{refused}");
    assert_eq!(filings[1], Ok(()));
    let reports = run.reports["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 1, "{}", run.reports);
    assert_eq!(
        reports[0]["findings"][1],
        "p95 latency improved from 240 to 190 ms"
    );
}
