//! Issue 15: a handoff and an agent-as-tool conversation, run through `keel run` against
//! the loopback mock LLM, appear in `keel trace show` as nested spans; a handoff cycle or
//! an unknown agent is refused before any model call, naming the file, key and line.
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
use serde_json::{Value, json};

const KEEL_TOML: &str = r#"
[defaults]
model = "openai:gpt-4o-mini"

[agents.triage]
description = "Routes customer requests."
instructions = "Route the request to the right desk."
handoffs = ["billing"]

[agents.billing]
description = "Answers invoice and refund questions."
instructions = "Answer billing questions."

[agents.lead]
instructions = "Delegate research, then answer."
agents_as_tools = ["research"]

[agents.research]
description = "Looks facts up."
instructions = "Find the fact asked for."
"#;

async fn keel(dir: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap()
}

fn json_of(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Runs `agent` on `message` against a mock playing `turns`; returns the run's JSON and
/// `keel trace show THREAD`'s text.
async fn run_and_trace(agent: &str, turns: Vec<MockTurn>, message: &str) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), KEEL_TOML).unwrap();
    let mock = MockLlmServer::start(MockScript::new(turns)).await.unwrap();
    let store = format!("sqlite://{}", dir.path().join("keel.db").display());
    let base_url = mock.base_url();
    let args = [
        "run",
        "--agent",
        agent,
        "--base-url",
        &base_url,
        "--store",
        &store,
        "--output",
        "json",
        message,
    ];
    let output = keel(dir.path(), &args).await;
    let run = json_of(&output);
    assert_eq!(run["end_state"], "done", "{run}");
    let thread = run["thread_id"].as_str().unwrap().to_string();
    let shown = keel(dir.path(), &["trace", "show", &thread]).await;
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    mock.shutdown().await;
    (run, text)
}

/// The indentation (depth) of the span line that starts with `name`.
fn depth(trace: &str, name: &str) -> usize {
    let spans = trace
        .split("\nspans\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no span tree:\n{trace}"));
    let line = spans
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no span `{name}`:\n{trace}"));
    line.len() - line.trim_start().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_shows_the_target_run_nested_under_the_transfer_call() {
    let (run, trace) = run_and_trace(
        "triage",
        vec![
            MockTurn::tool_call("transfer_to_billing", json!({"reason": "invoice question"})),
            MockTurn::text("Your invoice INV-7 is paid."),
        ],
        "Is invoice INV-7 paid?",
    )
    .await;
    assert_eq!(run["final_text"], "Your invoice INV-7 is paid.", "{run}");
    let triage = depth(&trace, "invoke_agent triage");
    let transfer = depth(&trace, "execute_tool transfer_to_billing");
    let billing = depth(&trace, "invoke_agent billing");
    assert!(triage < transfer && transfer < billing, "{trace}");
    assert!(
        trace.contains("handoff triage -> billing: invoice question"),
        "{trace}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_called_as_a_tool_shows_its_run_nested_under_the_call() {
    let (run, trace) = run_and_trace(
        "lead",
        vec![
            MockTurn::tool_call(
                "research",
                json!({"task": "What is the capital of France?"}),
            ),
            MockTurn::text("Paris."),
            MockTurn::text("The capital is Paris."),
        ],
        "Capital of France?",
    )
    .await;
    assert_eq!(run["final_text"], "The capital is Paris.", "{run}");
    let lead = depth(&trace, "invoke_agent lead");
    let call = depth(&trace, "execute_tool research");
    let research = depth(&trace, "invoke_agent research");
    assert!(lead < call && call < research, "{trace}");
}

async fn refused(toml: &str) -> (String, usize) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), toml).unwrap();
    let mock = MockLlmServer::start(MockScript::new(vec![MockTurn::text("never")]))
        .await
        .unwrap();
    let store = format!("sqlite://{}", dir.path().join("keel.db").display());
    let base_url = mock.base_url();
    let output = keel(
        dir.path(),
        &[
            "run",
            "--agent",
            "a",
            "--base-url",
            &base_url,
            "--store",
            &store,
            "hello",
        ],
    )
    .await;
    assert!(!output.status.success());
    let requests = mock.request_count();
    mock.shutdown().await;
    (
        String::from_utf8_lossy(&output.stderr).into_owned(),
        requests,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_and_unknown_agents_are_refused_before_any_model_call() {
    let base = "[defaults]\nmodel = \"openai:gpt-4o-mini\"\n";
    let (stderr, requests) = refused(&format!(
        "{base}[agents.a]\nhandoffs = [\"b\"]\n\n[agents.b]\nhandoffs = [\"a\"]\n"
    ))
    .await;
    assert_eq!(requests, 0);
    assert!(stderr.contains("keel.toml"), "{stderr}");
    assert!(stderr.contains("agents.b.handoffs[0]"), "{stderr}");
    assert!(
        stderr.contains("keel.toml:7:"),
        "line of the closing key: {stderr}"
    );
    assert!(stderr.contains("handoff cycle a → b → a"), "{stderr}");

    let (stderr, requests) =
        refused(&format!("{base}[agents.a]\nagents_as_tools = [\"a\"]\n")).await;
    assert_eq!(requests, 0);
    assert!(stderr.contains("agents.a.agents_as_tools[0]"), "{stderr}");
    assert!(stderr.contains("would run itself as a tool"), "{stderr}");

    let (stderr, requests) = refused(&format!(
        "{base}[agents.a]\nhandoffs = [\"biling\"]\n\n[agents.billing]\n"
    ))
    .await;
    assert_eq!(requests, 0);
    assert!(stderr.contains("agents.a.handoffs[0]"), "{stderr}");
    assert!(stderr.contains("unknown agent `biling`"), "{stderr}");
    assert!(stderr.contains("did you mean `billing`?"), "{stderr}");
}
