//! `keel run` scenarios for the policy engine (issue 4): retries, stop with an action item,
//! a hanging tool, and asking the user.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn run(script: &str, tool: &str) -> (Value, i32) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "run", "--script", script, "--tool", tool, "--output", "json", "go",
        ])
        .current_dir(root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (json, output.status.code().unwrap())
}

#[test]
fn rate_limited_twice_then_done_with_three_attempts() {
    let (json, code) = run("examples/scripts/rate_limited.json", "failure_injection");
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["end_state"], "done");
    assert_eq!(json["tool_calls"][0]["ok"], true);
    assert_eq!(json["tool_calls"][0]["attempts"], 3);
}

#[test]
fn forbidden_stops_the_run_with_an_action_item() {
    let (json, code) = run("examples/scripts/forbidden.json", "failure_injection");
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["end_state"], "failed");
    assert_eq!(json["tool_calls"][0]["error_code"], "forbidden");
    assert_eq!(
        json["tool_calls"][0]["attempts"], 1,
        "forbidden is never retried"
    );
    let item = json["action_item"].as_str().unwrap();
    assert!(
        item.contains("permission") && item.contains("failure_injection"),
        "{item}"
    );
    assert_eq!(json["alert"], false);
}

#[test]
fn a_hanging_tool_times_out_and_the_run_continues() {
    let (json, code) = run("examples/scripts/hang.json", "failure_injection");
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["end_state"], "done");
    assert_eq!(json["tool_calls"][0]["error_code"], "timeout");
    assert_eq!(
        json["tool_calls"][0]["attempts"], 3,
        "timeouts are retried up to the tool's policy"
    );
    assert_eq!(
        json["final_text"],
        "The tool timed out, so I continued without it."
    );
}

#[test]
fn ask_user_ends_clarify_needed_with_the_question() {
    let (json, code) = run("examples/scripts/ask_user.json", "calculator");
    assert_eq!(code, 3, "{json}");
    assert_eq!(json["end_state"], "clarify_needed");
    assert_eq!(
        json["clarification"]["question"],
        "Which account should I bill?"
    );
    assert_eq!(
        json["clarification"]["missing_fields"],
        serde_json::json!(["account_id"])
    );
}
