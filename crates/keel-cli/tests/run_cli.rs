//! End-to-end tests of `keel run` and `keel tools` with scripted models: the real binary,
//! real tools, the JSON output contract and exit codes.
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

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn keel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(workspace_root())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENROUTER_API_KEY")
        .output()
        .unwrap()
}

fn run_json(script: &str, tools: &[&str], message: &str) -> (Value, i32) {
    let mut args = vec!["run", "--script", script, "--output", "json"];
    for tool in tools {
        args.push("--tool");
        args.push(tool);
    }
    args.push(message);
    let output = keel(&args);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (json, output.status.code().unwrap())
}

#[test]
fn calculator_script_runs_the_real_tool() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = dir.path().join("requests.json");
    let output = keel(&[
        "run",
        "--script",
        "examples/scripts/calculator.json",
        "--tool",
        "calculator",
        "--output",
        "json",
        "--record-requests",
        recorded.to_str().unwrap(),
        "what is 2*(3+4)?",
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["end_state"], "done");
    assert_eq!(json["turns"], 2);
    assert_eq!(json["final_text"], "2*(3+4) = 14.");
    let calls = json["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "calculator");
    assert_eq!(calls[0]["arguments"]["expression"], "2*(3+4)");
    assert_eq!(calls[0]["ok"], true);
    assert_eq!(calls[0]["attempts"], 1);
    assert!(calls[0]["latency_ms"].is_u64());
    assert!(json["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(json["usage"]["output_tokens"].as_u64().unwrap() > 0);

    // The second model request carried the real tool result.
    let requests: Value =
        serde_json::from_str(&std::fs::read_to_string(&recorded).unwrap()).unwrap();
    let second = &requests.as_array().unwrap()[1];
    let tool_message = second["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(tool_message["role"], "tool");
    let content = tool_message["parts"][0]["content"].as_str().unwrap();
    assert!(content.contains("14"), "tool result content: {content}");
    assert!(
        second["system"]
            .as_str()
            .unwrap()
            .contains("calculator — Usage Guide")
    );
}

#[test]
fn unknown_tool_is_fed_back_as_data() {
    let (json, code) = run_json(
        "examples/scripts/unknown_tool.json",
        &["calculator"],
        "weather in Oslo?",
    );
    assert_eq!(code, 0);
    assert_eq!(json["end_state"], "done");
    let call = &json["tool_calls"][0];
    assert_eq!(call["name"], "weather_lookup");
    assert_eq!(call["ok"], false);
    assert_eq!(call["error_code"], "not_found");
    assert!(
        call["error_message"]
            .as_str()
            .unwrap()
            .contains("available tools: calculator")
    );
}

#[test]
fn invalid_json_arguments_are_fed_back_as_data() {
    let (json, code) = run_json(
        "examples/scripts/invalid_json.json",
        &["calculator"],
        "1+1?",
    );
    assert_eq!(code, 0, "{json}");
    let calls = json["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["ok"], false);
    assert_eq!(calls[0]["error_code"], "invalid_input");
    assert_eq!(calls[0]["arguments"], "{\"expression\": \"1+1\"");
    assert_eq!(calls[1]["ok"], true);
    assert_eq!(json["end_state"], "done");
}

#[test]
fn a_panicking_tool_is_contained() {
    let (json, code) = run_json(
        "examples/scripts/panic.json",
        &["failure_injection"],
        "crash please",
    );
    // The panic becomes a tool_bug outcome fed back to the model (the script's second step
    // checks the model saw the error); seed 000's policy then stops the run with an alert
    // after the model's summary.
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["end_state"], "failed");
    assert_eq!(json["alert"], true);
    assert_eq!(json["final_text"], "The tool crashed; I reported it.");
    assert_eq!(json["tool_calls"][0]["error_code"], "tool_bug");
    assert!(
        json["tool_calls"][0]["error_message"]
            .as_str()
            .unwrap()
            .contains("injected panic")
    );
}

#[test]
fn max_turns_ends_with_budget_exceeded_and_its_exit_code() {
    let output = keel(&[
        "run",
        "--script",
        "examples/scripts/calculator.json",
        "--tool",
        "calculator",
        "--max-turns",
        "1",
        "--output",
        "json",
        "what is 2*(3+4)?",
    ]);
    assert_eq!(output.status.code(), Some(4));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["end_state"], "budget_exceeded");
    assert!(json["reason"].as_str().unwrap().contains("max_turns"));
}

#[test]
fn usage_errors_exit_2_with_a_clear_message() {
    let output = keel(&[
        "run",
        "--script",
        "examples/scripts/calculator.json",
        "--tool",
        "nope",
        "hi",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown tool nope") && stderr.contains("calculator"),
        "{stderr}"
    );

    let output = keel(&["run", "--script", "does/not/exist.json", "hi"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("does/not/exist.json"));

    let output = keel(&["run"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn tools_check_passes_builtins_and_fails_a_bad_catalog() {
    let output = keel(&["tools", "check"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );

    let output = keel(&[
        "tools",
        "check",
        "--catalog",
        "examples/scripts/bad_catalog.json",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("tool `BadName`: name must be lowercase_snake_case"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tool `no_guidance`: usage guidance must not be empty"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tool `bad_schema`: input schema is not a valid JSON Schema"),
        "{stdout}"
    );

    let output = keel(&["tools", "list"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for name in ["calculator", "delay", "failure_injection", "ping_pong"] {
        assert!(stdout.contains(name));
    }
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_a_slow_run_with_a_consistent_log() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "run",
            "--script",
            "examples/scripts/slow.json",
            "--tool",
            "delay",
            "--output",
            "json",
            "wait",
        ])
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = child.wait().unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(status.code(), Some(130), "stdout: {stdout}");
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["end_state"], "cancelled");
    // The delay tool answers cancellation with a successful outcome describing it.
    assert_eq!(json["tool_calls"][0]["name"], "delay");
    assert_eq!(json["tool_calls"][0]["ok"], true, "{json}");
}
