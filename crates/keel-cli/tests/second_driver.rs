//! Two drivers never drive one thread (issue 44): while `keel run` drives a thread, a
//! `keel resume`, `approve`, `reply`, `run --workflow` or a `keel chat` turn on it is refused with the holder named (command,
//! pid, host, since when) and writes nothing — before, the second process settled the live
//! run's in-flight call as "interrupted, may have run" and the live run's real result was
//! then rejected with a conflict. A driver that was SIGKILLed holds nothing: the next
//! command of this machine takes its lease over at once (its process is gone).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::output_within;

/// One call of the mutating test tool, which waits for the file `gate` before it writes:
/// the run stays in its call until the test opens the gate.
const SCRIPT: &str = r#"{"steps": [
  {"tool_calls": [{"name": "test_append", "arguments": {"text": "once", "wait_for_file": "GATE"}}]},
  {"text": "waited"}
]}"#;

const DEADLINE: Duration = Duration::from_secs(120);

fn keel(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env(
            "KEEL_STORE",
            format!("sqlite://{}", dir.join("keel.db").display()),
        )
        .env_remove("KEEL_CONFIG")
        .stdin(Stdio::null());
    command
}

fn events(dir: &Path, thread: &str) -> Vec<Value> {
    let out = keel(dir, &["threads", "show", thread, "--output", "json"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new();
    }
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["events"].as_array().cloned().unwrap_or_default()
}

/// Starts `keel run` on `thread` and waits until its call has started (it then waits for
/// the gate).
fn start_slow_run(dir: &Path, thread: &str) -> std::process::Child {
    let gate = dir.join("gate");
    std::fs::write(
        dir.join("script.json"),
        SCRIPT.replace("GATE", gate.to_str().unwrap()),
    )
    .unwrap();
    let child = keel(
        dir,
        &[
            "run",
            "--script",
            "script.json",
            "--tool",
            "test_append",
            "--thread",
            thread,
            "--output",
            "json",
            "wait a bit",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let started = Instant::now();
    while !events(dir, thread)
        .iter()
        .any(|e| e["type"] == "tool_call_started")
    {
        assert!(
            started.elapsed() < DEADLINE,
            "the run never started its call"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `keel chat --thread THREAD` with one entry on stdin (no terminal: plain lines), then
/// end of input; returns what it printed (stdout and stderr).
fn chat_once(dir: &Path, thread: &str, entry: &str) -> String {
    std::fs::write(dir.join("chat-input.txt"), format!("{entry}\n")).unwrap();
    std::fs::write(
        dir.join("chat-script.json"),
        r#"{"steps": [{"text": "hi"}]}"#,
    )
    .unwrap();
    let mut child = keel(
        dir,
        &["chat", "--script", "chat-script.json", "--thread", thread],
    )
    .stdin(std::fs::File::open(dir.join("chat-input.txt")).unwrap())
    .stdout(std::fs::File::create(dir.join("chat-out.txt")).unwrap())
    .stderr(std::fs::File::create(dir.join("chat-err.txt")).unwrap())
    .spawn()
    .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("keel chat did not end within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(dir.join("chat-out.txt")).unwrap()
        + &std::fs::read_to_string(dir.join("chat-err.txt")).unwrap()
}

#[test]
fn a_second_driver_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let first = start_slow_run(root, "thr_two_drivers");
    let before = events(root, "thr_two_drivers").len();
    for args in [
        vec!["resume", "thr_two_drivers"],
        vec!["reply", "thr_two_drivers", "an answer"],
        vec!["approve", "thr_two_drivers", "call_0_0"],
    ] {
        let out = output_within(&mut keel(root, &args), DEADLINE);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} drove a live thread: {stderr}"
        );
        assert!(
            stderr.contains("is being driven by keel run (pid ")
                && stderr.contains(&format!("pid {}", first.id()))
                && stderr.contains("since "),
            "{args:?}: the refusal names the holder: {stderr}"
        );
    }
    // `keel run --workflow` and a `keel chat` turn take the same lease (refused before the
    // workflow is even built); chat says so and goes on to its next entry.
    let out = output_within(
        &mut keel(
            root,
            &[
                "run",
                "--workflow",
                "review",
                "--thread",
                "thr_two_drivers",
                "go",
            ],
        ),
        DEADLINE,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("keel run (pid {}", first.id())),
        "keel run --workflow drove a live thread: {stderr}"
    );
    let chat = chat_once(root, "thr_two_drivers", "hello from a second terminal");
    assert!(
        chat.contains("is being driven by keel run (pid ")
            && chat.contains(&format!("pid {}", first.id())),
        "keel chat's turn drove a live thread: {chat}"
    );
    assert_eq!(
        events(root, "thr_two_drivers").len(),
        before,
        "a refused driver wrote to the thread"
    );
    std::fs::write(root.join("gate"), "open").unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    let log = events(root, "thr_two_drivers");
    let finished: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "tool_call_finished")
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(
        finished[0]["result"]["outcome"]["status"], "ok",
        "{finished:?}"
    );
    // Free again once the first driver finished.
    let out = output_within(&mut keel(root, &["resume", "thr_two_drivers"]), DEADLINE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_killed_driver_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut first = start_slow_run(root, "thr_killed_driver");
    first.kill().unwrap();
    first.wait().unwrap();
    // At once — not after the lease's 30 s TTL (a live lease refuses the resume): the
    // holder's process is gone. The resumed run settles the killed call, never re-runs it.
    std::fs::write(root.join("gate"), "open").unwrap();
    let out = output_within(
        &mut keel(root, &["resume", "thr_killed_driver", "--output", "json"]),
        DEADLINE,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    let appended = std::fs::read_to_string(root.join("appends.log")).unwrap_or_default();
    assert!(
        appended.is_empty(),
        "the killed call ran on resume: {appended}"
    );
}
