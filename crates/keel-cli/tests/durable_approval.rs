//! Human in the loop across processes: a run pauses awaiting approval and its process
//! exits (code 10); a new process approves (or denies) and the run finishes. Also threads
//! list/show/fork/delete and `keel reply` on a SQLite store.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const SCRIPT: &str = r#"{"steps": [
  {"text": "Let me compute.", "tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
  {"text": "The answer is 5.", "expect": {"tool_result_contains": ["5"]}}
]}"#;

const DENY_SCRIPT: &str = r#"{"steps": [
  {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
  {"text": "I was not allowed to compute.", "expect": {"tool_result_contains": ["denied", "not today"]}}
]}"#;

const ASK_SCRIPT: &str = r#"{"steps": [
  {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which city?", "missing_fields": ["city"]}}]}
]}"#;

const REPLY_SCRIPT: &str = r#"{"steps": [
  {"text": "Paris it is.", "expect": {"last_user_contains": ["Paris"]}}
]}"#;

fn keel(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(dir)
        .env_remove("KEEL_STORE")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn setup() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("s.json", SCRIPT),
        ("deny.json", DENY_SCRIPT),
        ("ask.json", ASK_SCRIPT),
        ("reply.json", REPLY_SCRIPT),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let store = format!("sqlite://{}", dir.path().join("k.db").display());
    (dir, store)
}

#[test]
fn approval_survives_a_restart() {
    let (dir, store) = setup();
    let root = dir.path();
    let first = keel(
        root,
        &[
            "run",
            "--approve",
            "ask",
            "--script",
            "s.json",
            "--tool",
            "calculator",
            "--store",
            &store,
            "--output",
            "json",
            "what is 2+3",
        ],
    );
    assert_eq!(
        first.status.code(),
        Some(10),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let paused = json(&first);
    assert_eq!(paused["status"], "awaiting_approval");
    assert_eq!(paused["end_state"], Value::Null);
    let thread = paused["thread_id"].as_str().unwrap().to_string();
    let call = paused["awaiting"]["call_id"].as_str().unwrap().to_string();
    assert_eq!(paused["awaiting"]["tool"], "calculator");

    let listed = json(&keel(
        root,
        &[
            "threads",
            "list",
            "--status",
            "awaiting_approval",
            "--store",
            &store,
            "--output",
            "json",
        ],
    ));
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["thread_id"] == thread.as_str()),
        "{listed}"
    );

    // Approving an unknown call is refused and writes nothing.
    let wrong = keel(
        root,
        &[
            "approve",
            &thread,
            "nope",
            "--script",
            "s.json",
            "--tool",
            "calculator",
            "--store",
            &store,
        ],
    );
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("not awaiting approval"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    let approved = keel(
        root,
        &[
            "approve",
            &thread,
            &call,
            "--by",
            "alice",
            "--script",
            "s.json",
            "--tool",
            "calculator",
            "--store",
            &store,
            "--output",
            "json",
        ],
    );
    assert_eq!(
        approved.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let done = json(&approved);
    assert_eq!(done["end_state"], "done");
    assert_eq!(done["thread_id"], thread.as_str());
    assert_eq!(done["run_id"], paused["run_id"]);
    assert_eq!(done["final_text"], "The answer is 5.");
    assert_eq!(done["tool_calls"][0]["ok"], true);
    assert_eq!(done["tool_calls"][0]["call_id"], call.as_str());

    let shown = json(&keel(
        root,
        &[
            "threads", "show", &thread, "--store", &store, "--output", "json",
        ],
    ));
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"approval_requested") && kinds.contains(&"approval_granted"),
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| **k == "run_ended").count(), 1);

    // A second approval is refused: the run is over.
    let again = keel(
        root,
        &[
            "approve",
            &thread,
            &call,
            "--script",
            "s.json",
            "--tool",
            "calculator",
            "--store",
            &store,
        ],
    );
    assert_eq!(again.status.code(), Some(1));

    // Resuming an ended thread reports its last run.
    let resumed = json(&keel(
        root,
        &[
            "resume",
            &thread,
            "--script",
            "s.json",
            "--tool",
            "calculator",
            "--store",
            &store,
            "--output",
            "json",
        ],
    ));
    assert_eq!(resumed["end_state"], "done");

    // Fork at the approval request: the copy is paused too, and can be denied separately.
    let at = kinds
        .iter()
        .position(|k| *k == "approval_requested")
        .unwrap()
        .to_string();
    let forked = json(&keel(
        root,
        &[
            "threads", "fork", &thread, "--at", &at, "--store", &store, "--output", "json",
        ],
    ));
    let fork_id = forked["thread_id"].as_str().unwrap().to_string();
    assert_ne!(fork_id, thread);
    let recorded = json(&keel(
        root,
        &[
            "deny",
            &fork_id,
            &call,
            "--reason",
            "no",
            "--no-resume",
            "--store",
            &store,
            "--output",
            "json",
        ],
    ));
    assert_eq!(recorded["decision"], "denied");
    let deleted = json(&keel(
        root,
        &[
            "threads", "delete", &fork_id, "--store", &store, "--output", "json",
        ],
    ));
    assert_eq!(deleted["deleted"], true);
    let gone = keel(root, &["threads", "show", &fork_id, "--store", &store]);
    assert_eq!(gone.status.code(), Some(1));
}

#[test]
fn denial_is_reported_to_the_model() {
    let (dir, store) = setup();
    let root = dir.path();
    let first = keel(
        root,
        &[
            "run",
            "--approve",
            "ask",
            "--script",
            "deny.json",
            "--tool",
            "calculator",
            "--store",
            &store,
            "--output",
            "json",
            "what is 2+3",
        ],
    );
    assert_eq!(first.status.code(), Some(10));
    let paused = json(&first);
    let thread = paused["thread_id"].as_str().unwrap();
    let call = paused["awaiting"]["call_id"].as_str().unwrap();
    let denied = keel(
        root,
        &[
            "deny",
            thread,
            call,
            "--reason",
            "not today",
            "--script",
            "deny.json",
            "--tool",
            "calculator",
            "--store",
            &store,
            "--output",
            "json",
        ],
    );
    assert_eq!(
        denied.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    let done = json(&denied);
    assert_eq!(done["end_state"], "done");
    assert_eq!(done["tool_calls"][0]["error_code"], "denied");
}

#[test]
fn reply_continues_a_clarify_needed_thread() {
    let (dir, store) = setup();
    let root = dir.path();
    // ask_user without an answer ends clarify_needed; `keel reply` continues the thread.
    let asked = keel(
        root,
        &[
            "run", "--script", "ask.json", "--store", &store, "--output", "json", "weather?",
        ],
    );
    assert_eq!(
        asked.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    let asked = json(&asked);
    assert_eq!(asked["clarification"]["question"], "Which city?");
    let thread = asked["thread_id"].as_str().unwrap();
    let replied = keel(
        root,
        &[
            "reply",
            thread,
            "Paris",
            "--script",
            "reply.json",
            "--store",
            &store,
            "--output",
            "json",
        ],
    );
    assert_eq!(
        replied.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replied.stderr)
    );
    let replied = json(&replied);
    assert_eq!(replied["thread_id"], thread);
    assert_eq!(replied["final_text"], "Paris it is.");
    let listed = json(&keel(
        root,
        &[
            "threads", "list", "--since", "1h", "--limit", "10", "--store", &store, "--output",
            "json",
        ],
    ));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["status"]["status"], "ended", "{listed}");
}
