//! The Detective end to end through the real binary: `keel detective serve`, `keel mock-llm`
//! and `keel run --agent agents/detective/agent.toml --model openai:mock --base-url …`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::KeelServer;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn assess(script: &str, dir: &std::path::Path) -> (Output, KeelServer, KeelServer) {
    let agent = root().join("agents/detective/agent.toml");
    assess_with(script, dir, agent.to_str().unwrap())
}

/// Runs `keel run --agent AGENT` in `dir` (where a keel.toml may name agents).
fn assess_with(
    script: &str,
    dir: &std::path::Path,
    agent: &str,
) -> (Output, KeelServer, KeelServer) {
    let service = KeelServer::start(
        &[
            "detective",
            "serve",
            "--port",
            "0",
            "--reports-dir",
            dir.join("reports").to_str().unwrap(),
        ],
        dir,
    );
    let script = root().join(script);
    let mock = KeelServer::start(
        &[
            "mock-llm",
            "--script",
            script.to_str().unwrap(),
            "--port",
            "0",
        ],
        dir,
    );
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "run",
            "--agent",
            agent,
            "--model",
            "openai:mock",
            "--base-url",
            &mock.url,
            "--output",
            "json",
            "Assess release v2.1.0",
        ])
        .current_dir(dir)
        .env("RELEASE_SERVICE_URL", &service.url)
        .env("OPENAI_API_KEY", "test-key")
        .env("KEEL_TEST_MODE", "1")
        .output()
        .unwrap();
    (output, service, mock)
}

fn reports(service: &KeelServer) -> Vec<Value> {
    let url = format!("{}/risk-reports?release_id=v2.1.0", service.url);
    let output = Command::new("curl").args(["-sf", &url]).output().unwrap();
    let body: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("GET {url}: {:?}", output));
    body.get("reports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_else(|| body.as_array().cloned().unwrap_or_default())
}

#[test]
fn the_detective_files_a_report_with_the_scripted_severity() {
    let dir = tempfile::tempdir().unwrap();
    let (output, service, _mock) = assess("examples/mock/detective.json", dir.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(json["end_state"], "done", "{json}");
    let names: Vec<&str> = json["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"get_release_summary") && names.contains(&"get_test_details"),
        "{names:?}"
    );
    assert!(names.contains(&"file_risk_report"));
    let filed = reports(&service);
    assert_eq!(filed.len(), 1, "{filed:?}");
    assert_eq!(filed[0]["severity"], "high");
    // The run's trace file was written.
    let trace = dir
        .path()
        .join(".keel/traces")
        .join(format!("{}.jsonl", json["trace_id"].as_str().unwrap()));
    assert!(trace.is_file(), "{}", trace.display());
}

#[test]
fn the_critic_rejects_an_answer_without_a_filed_report() {
    let dir = tempfile::tempdir().unwrap();
    let (output, service, _mock) = assess("examples/mock/detective_no_report.json", dir.path());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_ne!(json["end_state"], "done", "{json}");
    assert!(
        json["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("file_risk_report"),
        "{json}"
    );
    assert!(reports(&service).is_empty());
}

/// The answer and the tool calls (name and arguments) of a `--output json` run.
fn answer_and_calls(output: &Output) -> (Value, Vec<(Value, Value)>) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(json["end_state"], "done", "{json}");
    let calls = json["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].clone(), c["arguments"].clone()))
        .collect();
    (json["final_text"].clone(), calls)
}

#[test]
fn the_detective_by_keel_toml_name_matches_the_agent_file() {
    let by_file_dir = tempfile::tempdir().unwrap();
    let agent = root().join("agents/detective/agent.toml");
    let (by_file, service, _mock) = assess_with(
        "examples/mock/detective.json",
        by_file_dir.path(),
        agent.to_str().unwrap(),
    );
    let by_file_reports = reports(&service);

    let by_name_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        by_name_dir.path().join("keel.toml"),
        format!("[agents.detective]\nfile = \"{}\"\n", agent.display()),
    )
    .unwrap();
    let (by_name, service, _mock) = assess_with(
        "examples/mock/detective.json",
        by_name_dir.path(),
        "detective",
    );
    let (file_answer, file_calls) = answer_and_calls(&by_file);
    let (name_answer, name_calls) = answer_and_calls(&by_name);
    assert_eq!(name_answer, file_answer);
    assert_eq!(name_calls, file_calls);
    assert_eq!(file_calls.len(), 3, "{file_calls:?}");
    let by_name_reports = reports(&service);
    assert_eq!(by_name_reports.len(), 1);
    assert_eq!(
        by_name_reports[0]["severity"],
        by_file_reports[0]["severity"]
    );
    assert_eq!(
        by_name_reports[0]["findings"],
        by_file_reports[0]["findings"]
    );
}

#[test]
fn an_unknown_agent_name_fails_before_any_model_call() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[agents.detective]\ninstructions = \"x\"\ntools = [\"file_risk_reprot\"]\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["run", "--agent", "detectiv", "--model", "openai:m", "hello"])
        .current_dir(dir.path())
        .env("KEEL_TEST_MODE", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("did you mean `detective`?"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "run",
            "--agent",
            "detective",
            "--model",
            "openai:m",
            "hello",
        ])
        .current_dir(dir.path())
        .env("KEEL_TEST_MODE", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("keel.toml:3:10: error:")
            && stderr.contains("unknown tool `file_risk_reprot`"),
        "{stderr}"
    );
}
