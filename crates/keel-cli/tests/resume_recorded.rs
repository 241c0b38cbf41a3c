//! A resumed run is the same agent: `keel run` with a hosted model spec pointed at a custom
//! base URL (`keel mock-llm`), an agent file and two extra tools is SIGKILLed at seeded,
//! machine-calibrated random points 30 times, and each time `keel resume THREAD` — with no
//! flag at all, on the default store — finishes it `done`: the provider is called at the
//! recorded base URL, every tool is found, and the mutating `test_append` tool never runs
//! twice. Also: an explicit flag overrides the recorded agent with a notice, a tool
//! that disappeared is a clear error before any model call, and an agent chosen by its
//! keel.toml name is rebuilt by name.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MockLlm, Rng, check_appends, run_and_kill};
use serde_json::Value;

/// Runs that must be killed after their first event and then resumed.
const REQUIRED_KILLS: usize = 30;
const MAX_RUNS: usize = 120;
const SEED: u64 = 0x7e5e_ed00_0000_0013;

/// Each conversation follows the script on its own (`turn_by: conversation`), so a model
/// call repeated after a kill gets the same answer.
const MOCK_SCRIPT: &str = r#"{"turn_by": "conversation", "when_exhausted": "error", "turns": [
  {"text": "Working on it.", "delay_ms": 30, "tool_calls": [
     {"id": "call_a1", "name": "calculator", "arguments": {"expression": "6*7"}},
     {"id": "call_a2", "name": "test_append", "arguments": {"text": "first", "delay_before_ms": 40, "delay_after_ms": 40}}]},
  {"delay_ms": 30, "tool_calls": [
     {"id": "call_b1", "name": "delay", "arguments": {"ms": 40}},
     {"id": "call_b2", "name": "test_append", "arguments": {"text": "second", "delay_before_ms": 20, "delay_after_ms": 20}}]},
  {"text": "All done: 42.", "delay_ms": 40}
]}"#;

const AGENT_FILE: &str = r#"
name = "recorder"
description = "Computes and records."
instructions = "Compute with the calculator, record with test_append, then answer."
tools = ["calculator"]
"#;

fn keel(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .stdin(Stdio::null());
    command
}

fn run_args(base_url: &str, thread: &str) -> Vec<String> {
    [
        "run",
        "--model",
        "openai:gpt-4.1",
        "--base-url",
        base_url,
        "--agent",
        "agent.toml",
        "--tool",
        "delay",
        "--tool",
        "test_append",
        "--thread",
        thread,
        "--output",
        "json",
        "compute 6*7 and record it",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn output(mut command: Command) -> Output {
    command.output().unwrap()
}

fn events_of(root: &Path, thread: &str) -> Option<Vec<Value>> {
    let out = output(keel(root, &["threads", "show", thread, "--output", "json"]));
    if !out.status.success() {
        return None;
    }
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(shown["events"].as_array().unwrap().clone())
}

#[test]
fn resume_with_no_flags_rebuilds_the_recorded_agent_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    std::fs::write(root.join("agent.toml"), AGENT_FILE).unwrap();
    let mock = MockLlm::start(root, "mock.json");
    let mut rng = Rng(SEED);
    let started = Instant::now();
    // Calibrate kill times to this machine (a loaded CI box starts processes slower).
    let calibration = {
        let args = run_args(&mock.base_url, "calibration");
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let start = Instant::now();
        let out = output(keel(root, &refs));
        assert!(
            out.status.success(),
            "calibration run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        u64::try_from(start.elapsed().as_millis()).unwrap().max(300)
    };
    let mut resumed = 0;
    let mut runs = 0;
    let mut phases: HashMap<&'static str, usize> = HashMap::new();
    for i in 0..MAX_RUNS {
        if resumed >= REQUIRED_KILLS {
            break;
        }
        runs += 1;
        let thread = format!("crash_{i}");
        let args = run_args(&mock.base_url, &thread);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let kill_at = Duration::from_millis(rng.below(calibration));
        if !run_and_kill(keel(root, &refs), kill_at) {
            continue; // finished before the kill: nothing to resume
        }
        let Some(events) = events_of(root, &thread) else {
            continue; // killed before its first event: nothing was recorded
        };
        *phases.entry(phase(&events)).or_insert(0) += 1;
        // A third of the time the first resume is killed too.
        if i % 3 == 0 {
            run_and_kill(
                keel(root, &["resume", &thread]),
                Duration::from_millis(rng.below(calibration / 2)),
            );
        }
        let out = output(keel(root, &["resume", &thread, "--output", "json"]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "keel resume {thread} (killed at {kill_at:?}) failed: {stderr}"
        );
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["end_state"], "done", "{thread}: {json}\n{stderr}");
        assert_eq!(json["final_text"], "All done: 42.", "{thread}: {json}");
        check_thread(root, &thread, &mock.base_url);
        resumed += 1;
    }
    assert_eq!(
        resumed, REQUIRED_KILLS,
        "only {resumed} of {runs} runs were killed after their first event"
    );
    check_appends(root);
    eprintln!(
        "{runs} runs, {resumed} killed and resumed with no flags ({phases:?}), in {:?}",
        started.elapsed()
    );
}

/// What the killed run was doing, judged by its last event.
fn phase(events: &[Value]) -> &'static str {
    match events.last().and_then(|e| e["type"].as_str()) {
        Some("model_requested") => "model call",
        Some("tool_call_started") => "tool call",
        Some("run_ended") => "after the end",
        _ => "between events",
    }
}

/// Every call answered once and found; the run's start recorded the agent.
fn check_thread(root: &Path, thread: &str, base_url: &str) {
    let events = events_of(root, thread).unwrap();
    let definition = &events[0]["definition"];
    assert_eq!(
        definition["recipe"]["base_url"].as_str(),
        Some(base_url),
        "{thread}: the run records the base URL it ran with: {definition}"
    );
    let recorded_tools: Vec<&str> = definition["fingerprint"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(recorded_tools, ["calculator", "delay", "test_append"]);
    let mut answered: HashMap<String, usize> = HashMap::new();
    for event in events.iter().filter(|e| e["type"] == "tool_call_finished") {
        let result = &event["result"];
        *answered
            .entry(result["call_id"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
        let code = result["outcome"]["error"]["code"].as_str().unwrap_or("");
        assert_ne!(code, "not_found", "{thread}: a tool was lost: {result}");
        if result["outcome"]["status"] != "ok" {
            // Only an interrupted mutating call may fail, and it says so.
            assert_eq!(result["name"], "test_append", "{thread}: {result}");
            assert!(
                result["content"]
                    .as_str()
                    .unwrap()
                    .contains("may or may not"),
                "{thread}: {result}"
            );
        }
    }
    assert_eq!(answered.len(), 4, "{thread}: {answered:?}");
    assert!(answered.values().all(|n| *n == 1), "{thread}: {answered:?}");
    let ended = events.iter().filter(|e| e["type"] == "run_ended").count();
    assert_eq!(ended, 1, "{thread}");
}

/// The call id of the first approval request in a thread's events.
fn first_approval_call(events: &[Value]) -> String {
    events
        .iter()
        .find(|e| e["type"] == "approval_requested")
        .unwrap()["call_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A paused run (approval required) on the default store, with the mock as provider.
fn paused_run(root: &Path, base_url: &str, thread: &str) {
    let mut args = run_args(base_url, thread);
    args.insert(1, "--approve".into());
    args.insert(2, "ask".into());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = output(keel(root, &refs));
    assert_eq!(
        out.status.code(),
        Some(10),
        "the run pauses for approval: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn approve_with_no_flags_continues_the_recorded_agent_and_flags_override_with_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    std::fs::write(root.join("agent.toml"), AGENT_FILE).unwrap();
    let mock = MockLlm::start(root, "mock.json");
    paused_run(root, &mock.base_url, "approved");
    // Every call of the run needs approval (`--approve ask` is recorded too): approve each
    // with no agent flags until the run ends.
    let mut approvals = 0;
    loop {
        let events = events_of(root, "approved").unwrap();
        let last_run_ended = events.last().is_some_and(|e| e["type"] == "run_ended");
        if last_run_ended {
            break;
        }
        let pending: Vec<String> = events
            .iter()
            .filter(|e| e["type"] == "approval_requested")
            .map(|e| e["call_id"].as_str().unwrap().to_string())
            .filter(|id| {
                !events.iter().any(|e| {
                    (e["type"] == "approval_granted" || e["type"] == "approval_denied")
                        && e["call_id"] == id.as_str()
                })
            })
            .collect();
        let call = pending.first().expect("a call awaits approval");
        let out = output(keel(root, &["approve", "approved", call]));
        assert!(
            matches!(out.status.code(), Some(0 | 10)),
            "approve: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        approvals += 1;
        assert!(approvals <= 4, "more approvals than calls");
    }
    assert_eq!(approvals, 4);

    // An explicit flag overrides the recorded agent and says so.
    paused_run(root, &mock.base_url, "overridden");
    let events = events_of(root, "overridden").unwrap();
    let call = first_approval_call(&events);
    let out = output(keel(
        root,
        &[
            "deny",
            "overridden",
            &call,
            "--max-turns",
            "5",
            "--approve",
            "deny",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--max-turns 5 overrides the run's recorded"),
        "{stderr}"
    );
    assert!(stderr.contains("--approve deny overrides"), "{stderr}");
}

#[test]
fn a_tool_that_disappeared_is_a_clear_error_before_any_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    std::fs::write(root.join("agent.toml"), AGENT_FILE).unwrap();
    let mock = MockLlm::start(root, "mock.json");
    paused_run(root, &mock.base_url, "gone");
    let before = events_of(root, "gone").unwrap().len();
    // The agent file loses its calculator: the run's tool cannot be rebuilt.
    std::fs::write(
        root.join("agent.toml"),
        AGENT_FILE.replace(r#"tools = ["calculator"]"#, ""),
    )
    .unwrap();
    let events = events_of(root, "gone").unwrap();
    let call = first_approval_call(&events);
    let out = output(keel(root, &["approve", "gone", &call]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("agent file"), "{stderr}");
    assert!(stderr.contains("`calculator`"), "{stderr}");
    let after = events_of(root, "gone").unwrap();
    assert_eq!(
        after.len(),
        before,
        "nothing was written: {:?}",
        after.last()
    );
}

#[test]
fn an_agent_chosen_by_keel_toml_name_is_rebuilt_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    // The same agent, declared inline in keel.toml (no agent file anywhere).
    std::fs::write(
        root.join("keel.toml"),
        "[agents.recorder]\ninstructions = \"Compute with the calculator, record with test_append, then answer.\"\ntools = [\"calculator\", \"delay\", \"test_append\"]\napprove = \"ask\"\n",
    )
    .unwrap();
    let mock = MockLlm::start(root, "mock.json");
    let out = output(keel(
        root,
        &[
            "run",
            "--model",
            "openai:gpt-4.1",
            "--base-url",
            &mock.base_url,
            "--agent",
            "recorder",
            "--thread",
            "named",
            "--output",
            "json",
            "compute 6*7 and record it",
        ],
    ));
    assert_eq!(
        out.status.code(),
        Some(10),
        "the agent's `approve = \"ask\"` pauses the run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events_of(root, "named").unwrap();
    let started = events.iter().find(|e| e["type"] == "run_started").unwrap();
    assert_eq!(
        started["definition"]["recipe"]["agent_name"], "recorder",
        "{started}"
    );
    // `keel approve` with no flags rebuilds [agents.recorder] until the run ends.
    for _ in 0..4 {
        let events = events_of(root, "named").unwrap();
        if events.last().is_some_and(|e| e["type"] == "run_ended") {
            break;
        }
        let pending = events
            .iter()
            .filter(|e| e["type"] == "approval_requested")
            .map(|e| e["call_id"].as_str().unwrap().to_string())
            .find(|id| {
                !events.iter().any(|e| {
                    (e["type"] == "approval_granted" || e["type"] == "approval_denied")
                        && e["call_id"] == id.as_str()
                })
            })
            .expect("a call awaits approval");
        let out = output(keel(root, &["approve", "named", &pending]));
        assert!(
            matches!(out.status.code(), Some(0 | 10)),
            "approve: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let events = events_of(root, "named").unwrap();
    let ended = events.last().unwrap();
    assert_eq!(ended["type"], "run_ended");
    assert_eq!(ended["end_state"], "done", "{ended}");
}
