//! Issue 14, defect 17: a transient provider failure no longer ends a run for good. The
//! retry budget of a model is set in keel.toml (`[models.<alias>] retry`) and reaches the
//! provider — the mock sees exactly that many attempts — and a run that still fails on a
//! retryable error says `"resumable": true`; `keel resume THREAD` finishes it `done`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::Output;

use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn};
use serde_json::Value;

/// Two server errors, then an answer: whoever makes three attempts gets through.
fn outage() -> MockScript {
    MockScript::new(vec![
        MockTurn::http_error(503),
        MockTurn::http_error(503),
        MockTurn::text("Back online: all good."),
    ])
}

fn keel_toml(attempts: u32) -> String {
    format!(
        "[models.flaky]\nmodel = \"openai:gpt-4o-mini\"\n\
         retry = {{ max_attempts = {attempts}, initial_delay_ms = 1, max_delay_ms = 5 }}\n"
    )
}

async fn keel(dir: &Path, args: &[&str]) -> (Value, Output) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (json, output)
}

fn run_args<'a>(base_url: &'a str, store: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        "flaky",
        "--base-url",
        base_url,
        "--store",
        store,
        "--output",
        "json",
        "is the service up?",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_model_retry_budget_sets_the_attempts_and_a_failed_run_resumes_to_done() {
    // Three attempts allowed: the outage is ridden out inside the run.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), keel_toml(3)).unwrap();
    let mock = MockLlmServer::start(outage()).await.unwrap();
    let store = format!("sqlite://{}", dir.path().join("keel.db").display());
    let base_url = mock.base_url();
    let (json, output) = keel(dir.path(), &run_args(&base_url, &store)).await;
    assert_eq!(json["end_state"], "done", "{json}");
    assert_eq!(json["resumable"], false, "{json}");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(mock.request_count(), 3, "keel.toml's max_attempts = 3");
    mock.shutdown().await;

    // Two attempts allowed: the run fails, says it is resumable, and resume finishes it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), keel_toml(2)).unwrap();
    let mock = MockLlmServer::start(outage()).await.unwrap();
    let store = format!("sqlite://{}", dir.path().join("keel.db").display());
    let base_url = mock.base_url();
    let (failed, output) = keel(dir.path(), &run_args(&base_url, &store)).await;
    assert_eq!(failed["end_state"], "failed", "{failed}");
    assert_eq!(failed["resumable"], true, "{failed}");
    assert!(
        failed["reason"].as_str().unwrap().contains("503"),
        "{failed}"
    );
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(mock.request_count(), 2, "keel.toml's max_attempts = 2");

    let thread = failed["thread_id"].as_str().unwrap();
    let (done, output) = keel(
        dir.path(),
        &["resume", thread, "--store", &store, "--output", "json"],
    )
    .await;
    assert_eq!(done["end_state"], "done", "{done}");
    assert_eq!(done["final_text"], "Back online: all good.");
    assert_eq!(done["thread_id"], thread);
    assert_ne!(done["run_id"], failed["run_id"]);
    assert_eq!(done["resumable"], false);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(mock.request_count(), 3);
    // The continued request is the failed one again: the same conversation.
    let requests = mock.requests();
    assert_eq!(requests[2].body["messages"], requests[0].body["messages"]);

    // The thread is finished: resuming again only reports the outcome.
    let (again, output) = keel(
        dir.path(),
        &["resume", thread, "--store", &store, "--output", "json"],
    )
    .await;
    assert_eq!(again["end_state"], "done");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(mock.request_count(), 3, "nothing was asked again");
    mock.shutdown().await;
}
