//! The repository's examples run as real processes against a loopback mock LLM (see
//! tests/common/mod.rs for how): hello, typed tool, custom agent and typed output — each
//! checked on what it prints and on what the model was sent.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel::core::store::{ThreadFilter, ThreadStatus};
use keel::core::{EndState, EventKind};

/// Every request body the mock received, as JSON text.
fn bodies(mock: &keel_testkit::mock_llm::MockLlmServer) -> Vec<String> {
    mock.requests().iter().map(|r| r.body.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_prompts_the_configured_agent_and_stores_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(r#"{"turns": [{"text": "Release v2.1.0: low risk."}]}"#).await;
    let store_url = common::write_config(dir.path(), &mock);
    let env = common::provider_env(&mock);
    // keel.toml names the endpoint: only the key comes from the environment.
    let run = common::run_example("hello", dir.path(), &common::as_pairs(&env[..1])).await;
    assert!(run.success, "{run:?}");
    assert!(run.stdout.contains("Release v2.1.0: low risk."), "{run:?}");
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("Assess release v2.1.0"), "{}", bodies[0]);
    assert!(
        bodies[0].contains("You assess software releases"),
        "{}",
        bodies[0]
    );

    // The run is in keel.toml's store, recorded by agent name (so `keel resume` can
    // rebuild the agent).
    let store = keel::store::open_store(&store_url).await.unwrap();
    let threads = store.list_threads(&ThreadFilter::default()).await.unwrap();
    assert_eq!(threads.len(), 1, "{threads:?}");
    assert_eq!(threads[0].status, ThreadStatus::Ended(EndState::Done));
    assert_eq!(threads[0].agent.as_deref(), Some("detective"));
    let events = store.load(&threads[0].thread_id).await.unwrap();
    let recipe = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { definition, .. } => definition.clone(),
            _ => None,
        })
        .expect("the run records its definition")
        .recipe;
    assert_eq!(recipe["agent_name"], "detective", "{recipe}");
    assert_eq!(recipe["model"], "openai:gpt-4.1-mini", "{recipe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_reports_a_bad_configuration_with_file_and_line_before_any_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(r#"{"turns": [{"text": "unused"}]}"#).await;
    common::write_config(dir.path(), &mock);
    let toml = std::fs::read_to_string(dir.path().join("keel.toml")).unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        toml.replace("instructions =", "instructons ="),
    )
    .unwrap();
    let env = common::provider_env(&mock);
    let run = common::run_example("hello", dir.path(), &common::as_pairs(&env)).await;
    assert!(!run.success, "{run:?}");
    assert!(run.stderr.contains("keel.toml:"), "{}", run.stderr);
    assert!(run.stderr.contains("instructons"), "{}", run.stderr);
    assert_eq!(mock.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_tool_gets_checked_arguments_and_its_result_reaches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(
        r#"{"turns": [
            {"tool_calls": [{"name": "convert_temperature", "arguments": {"value": "hot", "from": "kelvin"}}]},
            {"tool_calls": [{"name": "convert_temperature", "arguments": {"value": 100, "from": "celsius"}}]},
            {"text": "100 °C is 212 °F."}
        ]}"#,
    )
    .await;
    let env = common::provider_env(&mock);
    let run = common::run_example("typed_tool", dir.path(), &common::as_pairs(&env)).await;
    assert!(run.success, "{run:?}");
    assert!(run.stdout.contains("100 °C is 212 °F."), "{run:?}");
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 3);
    // The schema derived from the Rust types is what the model was offered.
    assert!(bodies[0].contains("convert_temperature"), "{}", bodies[0]);
    assert!(bodies[0].contains("fahrenheit"), "{}", bodies[0]);
    // Arguments that do not match it never reach the tool: the model is told why.
    assert!(bodies[1].contains("invalid_input"), "{}", bodies[1]);
    assert!(bodies[2].contains("212"), "{}", bodies[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_agent_answers_through_its_model_and_fails_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let mock = common::mock(r#"{"turns": [{"text": "Bonjour, comment allez-vous ?"}]}"#).await;
    let env = common::provider_env(&mock);
    let run = common::run_example("custom_agent", dir.path(), &common::as_pairs(&env)).await;
    assert!(run.success, "{run:?}");
    assert!(
        run.stdout.contains("Bonjour, comment allez-vous ?"),
        "{run:?}"
    );
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("into French"), "{}", bodies[0]);
    assert!(
        bodies[0].contains("Good morning, how are you?"),
        "{}",
        bodies[0]
    );

    // A model that refuses the request: the run ends `failed`, and `prompt` says so.
    let failing = common::mock(
        r#"{"turns": [{"error": {"status": 400, "message": "unsupported language"}}]}"#,
    )
    .await;
    let env = common::provider_env(&failing);
    let run = common::run_example("custom_agent", dir.path(), &common::as_pairs(&env)).await;
    assert!(!run.success, "{run:?}");
    assert!(
        run.stderr.contains("the run ended failed on thread thr_"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("unsupported language"),
        "{}",
        run.stderr
    );
}

const BAD_REPORT: &str = r#"{"release": "v2.1.0", "risk": "extreme", "findings": []}"#;
const GOOD_REPORT: &str =
    r#"{"release": "v2.1.0", "risk": "medium", "findings": ["error rate up 3% in canary"]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_output_repairs_an_invalid_answer_on_the_same_thread() {
    let dir = tempfile::tempdir().unwrap();
    let script = serde_json::json!({"turns": [{"text": BAD_REPORT}, {"text": GOOD_REPORT}]});
    let mock = common::mock(&script.to_string()).await;
    common::write_config(dir.path(), &mock);
    let env = common::provider_env(&mock);
    let run = common::run_example("typed_output", dir.path(), &common::as_pairs(&env)).await;
    assert!(run.success, "{run:?}");
    assert!(run.stdout.contains("v2.1.0 risk: Medium"), "{run:?}");
    assert!(
        run.stdout.contains("- error rate up 3% in canary"),
        "{run:?}"
    );
    let bodies = bodies(&mock);
    assert_eq!(bodies.len(), 2);
    // The first request carries the type's schema; the second, on the same thread (the
    // first answer is in it), the violation.
    assert!(bodies[0].contains("JSON Schema"), "{}", bodies[0]);
    assert!(bodies[0].contains("medium"), "{}", bodies[0]);
    assert!(bodies[1].contains("extreme"), "{}", bodies[1]);
    assert!(bodies[1].contains("/risk"), "{}", bodies[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_output_gives_up_after_the_repair_bound_listing_the_violations() {
    let dir = tempfile::tempdir().unwrap();
    let script = serde_json::json!({"turns": [{"text": BAD_REPORT}, {"text": BAD_REPORT}, {"text": BAD_REPORT}, {"text": GOOD_REPORT}]});
    let mock = common::mock(&script.to_string()).await;
    common::write_config(dir.path(), &mock);
    let env = common::provider_env(&mock);
    let run = common::run_example("typed_output", dir.path(), &common::as_pairs(&env)).await;
    assert!(!run.success, "{run:?}");
    assert!(
        run.stderr
            .contains("does not match the schema of `Report` after 3 attempt(s)"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("/risk"), "{}", run.stderr);
    // The first answer and two repairs: the default bound.
    assert_eq!(mock.request_count(), 3);
}

#[test]
fn the_readme_opens_with_the_hello_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let first_block = readme
        .split("```")
        .nth(1)
        .expect("the README has a code block");
    let (tag, code) = first_block.split_once('\n').unwrap();
    assert_eq!(
        tag, "rust,no_run",
        "the first block is the Rust hello world"
    );
    let hello = std::fs::read_to_string(format!("{root}/examples/hello.rs")).unwrap();
    let hello: String = hello
        .lines()
        .filter(|line| !line.starts_with("//"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(code, hello);
    // The issue's size limits: a hello world of at most 10 lines, a custom agent under 60.
    assert!(hello.lines().count() <= 10);
    let custom = std::fs::read_to_string(format!("{root}/examples/custom_agent.rs")).unwrap();
    assert!(custom.lines().count() < 60, "{}", custom.lines().count());
}
