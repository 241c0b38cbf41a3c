//! Crash test: a child `keel run` on a SQLite store is killed with SIGKILL at seeded random
//! points (during model calls, tool calls, between events) 80 times — at least 50 after
//! their first event — and `keel resume` (itself sometimes killed too) then finishes every
//! run. Asserts: seq contiguous, exactly one RunStarted/RunEnded per run, every tool call
//! requested and answered exactly once, no duplicated model answer, and the mutating
//! `test_append` tool (enabled by `KEEL_TEST_TOOLS=1`) never executed twice.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Rng, check_appends, run_and_kill};
use serde_json::Value;

/// Kills that must land after a run's first event (the issue asks for at least 50).
const REQUIRED_KILLS: usize = 50;
/// Upper bound on runs, so a pathological machine fails instead of looping.
const MAX_RUNS: usize = 200;
const SEED: u64 = 0x5eed_cafe_f00d_0001;

const SCRIPT: &str = r#"{"steps": [
  {"text": "Working on it.", "delay_ms": 30, "tool_calls": [
     {"name": "calculator", "arguments": {"expression": "6*7"}},
     {"name": "test_append", "arguments": {"text": "first", "delay_before_ms": 40, "delay_after_ms": 40}}]},
  {"delay_ms": 30, "tool_calls": [{"name": "delay", "arguments": {"ms": 40}},
     {"name": "test_append", "arguments": {"text": "second", "delay_before_ms": 20, "delay_after_ms": 20}}]},
  {"text": "All done: 42.", "delay_ms": 40}
]}"#;

fn keel(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env_remove("KEEL_STORE")
        .stdin(Stdio::null());
    command
}

fn agent_flags(store: &str) -> Vec<String> {
    [
        "--script",
        "script.json",
        "--store",
        store,
        "--tool",
        "calculator",
        "--tool",
        "delay",
        "--tool",
        "test_append",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn output(mut command: Command) -> Output {
    command.output().unwrap()
}

#[test]
fn killed_runs_resume_without_duplicates_or_losses() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("script.json"), SCRIPT).unwrap();
    let store = format!("sqlite://{}", root.join("crash.db").display());
    let flags = agent_flags(&store);
    let mut rng = Rng(SEED);
    let started = Instant::now();
    let mut killed = 0;
    let mut phases: HashMap<&'static str, usize> = HashMap::new();
    // Calibrate kill times to this machine: a loaded CI box starts processes slower, and
    // kills before the first event do not count.
    let calibration = {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(flags.clone());
        args.extend([
            "--thread".into(),
            "calibration".into(),
            "--output".into(),
            "json".into(),
            "compute 6*7".into(),
        ]);
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
    let mut runs = 0;
    for i in 0..MAX_RUNS {
        let before_start = phases.get("before the first event").copied().unwrap_or(0);
        if killed - before_start >= REQUIRED_KILLS {
            break;
        }
        runs += 1;
        let thread = format!("crash_{i}");
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(flags.clone());
        args.extend([
            "--thread".into(),
            thread.clone(),
            "--output".into(),
            "json".into(),
            "compute 6*7".into(),
        ]);
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let kill_at = Duration::from_millis(rng.below(calibration));
        if run_and_kill(keel(root, &arg_refs), kill_at) {
            killed += 1;
            *phases
                .entry(phase_at_kill(root, &store, &thread))
                .or_insert(0) += 1;
        }
        let mut resume: Vec<String> = vec!["resume".into(), thread.clone()];
        resume.extend(flags.clone());
        resume.extend(["--output".into(), "json".into()]);
        let resume_refs: Vec<&str> = resume.iter().map(String::as_str).collect();
        // A third of the runs: kill the first resume too.
        if i % 3 == 0 {
            run_and_kill(
                keel(root, &resume_refs),
                Duration::from_millis(rng.below(250)),
            );
        }
        let mut finished = None;
        for _attempt in 0..3 {
            let out = output(keel(root, &resume_refs));
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("has no events") {
                // Killed before the first event was written: start it again.
                let out = output(keel(root, &arg_refs));
                assert!(
                    out.status.success(),
                    "rerun {thread}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            assert!(
                out.status.success(),
                "resume {thread} (killed at {kill_at:?}): {stderr}"
            );
            let json: Value = serde_json::from_slice(&out.stdout).unwrap();
            finished = Some(json);
            break;
        }
        let json = finished.unwrap_or_else(|| panic!("{thread} never finished"));
        assert_eq!(json["end_state"], "done", "{thread}: {json}");
        assert_eq!(json["final_text"], "All done: 42.", "{thread}: {json}");
        check_thread(root, &store, &thread);
    }
    let before_start = phases.get("before the first event").copied().unwrap_or(0);
    assert!(
        killed - before_start >= REQUIRED_KILLS,
        "only {} of {runs} children were killed after their first event",
        killed - before_start
    );
    check_appends(root);
    eprintln!(
        "{runs} runs, {killed} killed mid-run ({phases:?}), in {:?}",
        started.elapsed()
    );
    // Kills between events (after a step's append, before the next) land in sub-millisecond
    // windows and are counted but not required; the wide windows must be hit.
    for phase in ["model call", "tool call"] {
        assert!(
            phases.get(phase).copied().unwrap_or(0) >= 3,
            "too few kills landed during a {phase}: {phases:?}"
        );
    }
}

/// Where the killed run was, judged by the last event it wrote: waiting for the model
/// (`model_requested`), inside a tool (`tool_call_started` of a call without a result —
/// approximated by the last event), or between events.
fn phase_at_kill(root: &Path, store: &str, thread: &str) -> &'static str {
    let out = output(keel(
        root,
        &[
            "threads", "show", thread, "--store", store, "--output", "json",
        ],
    ));
    if !out.status.success() {
        return "before the first event";
    }
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = shown["events"].as_array().unwrap();
    let started: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool_call_started")
        .filter_map(|e| e["call_id"].as_str())
        .collect();
    let finished: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool_call_finished")
        .filter_map(|e| e["result"]["call_id"].as_str())
        .collect();
    match events.last().and_then(|e| e["type"].as_str()) {
        Some("model_requested") => "model call",
        Some("run_ended") => "after the end",
        _ if started.iter().any(|id| !finished.contains(id)) => "tool call",
        _ => "between events",
    }
}

fn check_thread(root: &Path, store: &str, thread: &str) {
    let out = output(keel(
        root,
        &[
            "threads", "show", thread, "--store", store, "--output", "json",
        ],
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = shown["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"].as_u64().unwrap(),
            i as u64,
            "{thread}: seq gap/dup at {i}: {kinds:?}"
        );
    }
    let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!(count("run_started"), 1, "{thread}: {kinds:?}");
    assert_eq!(count("run_ended"), 1, "{thread}: {kinds:?}");
    assert_eq!(*kinds.last().unwrap(), "run_ended", "{thread}: {kinds:?}");
    assert_eq!(count("model_responded"), 3, "{thread}: {kinds:?}");
    let mut turns = HashMap::new();
    let mut requested: HashMap<String, usize> = HashMap::new();
    let mut answered: HashMap<String, usize> = HashMap::new();
    for event in events {
        match event["type"].as_str().unwrap() {
            "model_responded" => *turns.entry(event["turn"].as_u64().unwrap()).or_insert(0) += 1,
            "tool_call_requested" => {
                *requested
                    .entry(event["call"]["id"].as_str().unwrap().to_string())
                    .or_insert(0) += 1
            }
            "tool_call_finished" => {
                *answered
                    .entry(event["result"]["call_id"].as_str().unwrap().to_string())
                    .or_insert(0) += 1
            }
            _ => {}
        }
    }
    assert!(
        turns.values().all(|n| *n == 1),
        "{thread}: a turn answered twice: {turns:?}"
    );
    assert_eq!(requested.len(), 4, "{thread}: {requested:?}");
    assert!(
        requested.values().all(|n| *n == 1),
        "{thread}: {requested:?}"
    );
    assert_eq!(
        requested.keys().collect::<std::collections::BTreeSet<_>>(),
        answered.keys().collect(),
        "{thread}"
    );
    assert!(
        answered.values().all(|n| *n == 1),
        "{thread}: a call answered twice: {answered:?}"
    );
    // A test_append call reported ok must have written exactly one line; an interrupted one
    // at most one.
    let log = std::fs::read_to_string(root.join("appends.log")).unwrap_or_default();
    for event in events
        .iter()
        .filter(|e| e["type"] == "tool_call_finished" && e["result"]["name"] == "test_append")
    {
        let key = format!("{thread}:{}", event["result"]["call_id"].as_str().unwrap());
        let lines = log
            .lines()
            .filter(|l| l.split('\t').next() == Some(key.as_str()))
            .count();
        let outcome = &event["result"]["outcome"];
        if outcome["status"] == "ok" {
            assert_eq!(
                lines, 1,
                "{key}: ok call must have run exactly once ({outcome})"
            );
        } else {
            assert!(lines <= 1, "{key}: ran {lines} times");
            assert!(
                event["result"]["content"].as_str().unwrap().contains(&key),
                "{key}: the model is told the idempotency key"
            );
        }
    }
}
