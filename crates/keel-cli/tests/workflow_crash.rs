//! Durable workflows under SIGKILL (issue 15): a three-step workflow — a fan-out to two
//! agents, then a summarizing agent, each step calling the mutating `test_append` tool —
//! is started with `keel run --workflow` against `keel mock-llm` and SIGKILLed at seeded
//! random points 30 times. A kill point is a number of events: the test polls the store
//! until the workflow's threads (its own and its steps') hold that many, then kills —
//! no fixed sleeps. `keel resume THREAD`, with no other flag (the log says which workflow
//! and which overrides), then finishes it; a fifth of the resumes are killed too.
//!
//! Checked every time: the workflow ends `done` once; every step was started and
//! finished exactly once in the workflow's log, and its agent ran exactly one run on the
//! step's thread (`run_started` and `run_ended` once); every `test_append` execution has
//! its `tool_call_started` in the log, a call reported ok ran exactly once and an
//! interrupted one at most once — no mutating call ever ran twice.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{MockLlm, Rng, check_appends};
use keel_core::{EndState, Event, EventKind, EventStore};

const KILLS: usize = 30;
const SEED: u64 = 0x0f10_0015_dead_beef;
const STEPS: [&str; 3] = ["researcher", "critic", "summarizer"];
/// How long one process may take before the test gives up on it (a hang, not a pace).
const DEADLINE: Duration = Duration::from_secs(60);

/// Every conversation follows the script on its own (`turn_by: conversation`), so a model
/// call repeated after a kill gets the same answer.
const MOCK_SCRIPT: &str = r#"{"turn_by": "conversation", "when_exhausted": "error", "turns": [
  {"text": "Noting it.", "delay_ms": 5, "tool_calls": [
     {"id": "call_note", "name": "test_append", "arguments": {"text": "note", "delay_before_ms": 10, "delay_after_ms": 10}}]},
  {"text": "Done.", "delay_ms": 5}
]}"#;

const KEEL_TOML: &str = r#"
[agents.researcher]
model = "openai:gpt-4.1"
instructions = "Research the topic, note what you found with test_append, then answer."
tools = ["test_append"]

[agents.critic]
model = "openai:gpt-4.1"
instructions = "Criticize the topic, note your objection with test_append, then answer."
tools = ["test_append"]

[agents.summarizer]
model = "openai:gpt-4.1"
instructions = "Summarize the results, note the summary with test_append, then answer."
tools = ["test_append"]

[workflows.review]
kind = "parallel"
description = "Research and criticize a topic, then summarize both."
agents = ["researcher", "critic"]
then = "summarizer"
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
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

struct Harness {
    root: std::path::PathBuf,
    base_url: String,
    reader: Arc<dyn EventStore>,
    runtime: tokio::runtime::Runtime,
}

impl Harness {
    fn load(&self, thread: &str) -> Vec<Event> {
        self.runtime
            .block_on(self.reader.load(thread))
            .unwrap_or_else(|e| panic!("cannot load {thread}: {e}"))
    }

    /// Events of the workflow's thread and of its steps' threads.
    fn count(&self, thread: &str) -> usize {
        let mut total = self.load(thread).len();
        for step in STEPS {
            total += self.load(&format!("{thread}.{step}")).len();
        }
        total
    }

    fn run(&self, thread: &str) -> Child {
        keel(
            &self.root,
            &[
                "run",
                "--workflow",
                "review",
                "--base-url",
                &self.base_url,
                "--thread",
                thread,
                "--output",
                "json",
                "Is Rust a good fit for agent runtimes?",
            ],
        )
        .spawn()
        .unwrap()
    }

    fn resume(&self, thread: &str) -> Child {
        keel(&self.root, &["resume", thread, "--output", "json"])
            .spawn()
            .unwrap()
    }

    /// Waits until the workflow's threads hold at least `events` events (then SIGKILLs
    /// the child and returns true) or the child exits on its own (false).
    fn kill_at(&self, mut child: Child, thread: &str, events: usize) -> bool {
        let started = Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            if self.count(thread) >= events {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                return true;
            }
            assert!(started.elapsed() < DEADLINE, "{thread}: child hangs");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs `keel resume THREAD` to its end; returns its JSON outcome.
    fn finish(&self, thread: &str) -> serde_json::Value {
        let out = self.resume(thread).wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{thread}: resume failed: {stderr}");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{thread}: resume output is not JSON ({e}): {stderr}"))
    }
}

#[test]
fn killed_workflows_resume_and_run_every_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("mock.json"), MOCK_SCRIPT).unwrap();
    std::fs::write(root.join("keel.toml"), KEEL_TOML).unwrap();
    std::fs::create_dir_all(root.join(".keel")).unwrap();
    let mock = MockLlm::start(&root, "mock.json");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // The default store of `keel` in that directory; opening it here creates the schema
    // before any child races to.
    let url = format!("sqlite://{}", root.join(".keel/keel.db").display());
    let reader = runtime.block_on(keel_store::open_store(&url)).unwrap();
    let harness = Harness {
        root: root.clone(),
        base_url: mock.base_url.clone(),
        reader,
        runtime,
    };
    let started = Instant::now();

    // One run undisturbed: how many events a whole workflow writes.
    let out = harness.run("whole").wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "undisturbed run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = harness.count("whole");
    check_workflow(&harness, "whole");

    let mut rng = Rng(SEED);
    let mut kills = 0;
    let mut resume_kills = 0;
    let mut points = BTreeMap::new();
    let mut i = 0;
    while kills < KILLS {
        assert!(i < KILLS * 3, "only {kills} kills in {i} runs");
        let thread = format!("wf_{i}");
        i += 1;
        // Kill after 1..total events: from the first event to just before the last.
        let point = 1 + usize::try_from(rng.below(u64::try_from(total - 1).unwrap())).unwrap();
        if !harness.kill_at(harness.run(&thread), &thread, point) {
            check_workflow(&harness, &thread);
            continue;
        }
        kills += 1;
        *points.entry(phase(&harness, &thread)).or_insert(0usize) += 1;
        if i % 5 == 0 {
            let now = harness.count(&thread);
            let later = now + 1 + usize::try_from(rng.below(4)).unwrap();
            if harness.kill_at(harness.resume(&thread), &thread, later) {
                resume_kills += 1;
            }
        }
        let outcome = harness.finish(&thread);
        assert_eq!(outcome["end_state"], "done", "{thread}: {outcome}");
        check_workflow(&harness, &thread);
    }
    check_appends(&root);
    eprintln!(
        "workflow crash: {kills} kills of `keel run --workflow` ({points:?}), {resume_kills} \
         kills of `keel resume`, {total} events per workflow, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Where the killed workflow stood: which step threads had a run in progress.
fn phase(harness: &Harness, thread: &str) -> &'static str {
    let workflow = harness.load(thread);
    let started = workflow
        .iter()
        .filter(|e| matches!(e.kind, EventKind::WorkflowStepStarted { .. }))
        .count();
    let finished = workflow
        .iter()
        .filter(|e| matches!(e.kind, EventKind::WorkflowStepFinished { .. }))
        .count();
    match (started, finished) {
        (0, _) => "before any step",
        (_, 3) => "after the last step",
        (s, f) if s > f => "steps running",
        _ => "between steps",
    }
}

fn count(events: &[Event], kind: &str) -> usize {
    events.iter().filter(|e| e.kind.name() == kind).count()
}

fn check_seq(thread: &str, events: &[Event]) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64, "{thread}: seq gap or duplicate at {i}");
    }
}

/// The finished workflow and its steps: each step started, finished and run once; no
/// mutating call run twice.
fn check_workflow(harness: &Harness, thread: &str) {
    let events = harness.load(thread);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    check_seq(thread, &events);
    assert_eq!(count(&events, "run_started"), 1, "{thread}: {kinds:?}");
    assert_eq!(count(&events, "run_ended"), 1, "{thread}: {kinds:?}");
    assert_eq!(kinds.last(), Some(&"run_ended"), "{thread}: {kinds:?}");
    let mut started = BTreeMap::new();
    let mut finished = BTreeMap::new();
    for event in &events {
        match &event.kind {
            EventKind::WorkflowStepStarted { step, .. } => {
                *started.entry(step.clone()).or_insert(0) += 1;
            }
            EventKind::WorkflowStepFinished {
                step, end_state, ..
            } => {
                assert_eq!(*end_state, EndState::Done, "{thread}: step {step}");
                *finished.entry(step.clone()).or_insert(0) += 1;
            }
            EventKind::RunEnded { end_state, .. } => {
                assert_eq!(*end_state, EndState::Done, "{thread}: {kinds:?}");
            }
            _ => {}
        }
    }
    let each_once: BTreeMap<String, i32> = STEPS.iter().map(|s| (s.to_string(), 1)).collect();
    assert_eq!(started, each_once, "{thread}: steps started");
    assert_eq!(finished, each_once, "{thread}: steps finished");
    let log = std::fs::read_to_string(harness.root.join("appends.log")).unwrap_or_default();
    for step in STEPS {
        let child = format!("{thread}.{step}");
        let events = harness.load(&child);
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
        check_seq(&child, &events);
        assert_eq!(count(&events, "run_started"), 1, "{child}: {kinds:?}");
        assert_eq!(count(&events, "run_ended"), 1, "{child}: {kinds:?}");
        let calls_started: BTreeSet<&str> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolCallStarted { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let prefix = format!("{child}:");
        for line in log.lines() {
            let key = line.split('\t').next().unwrap_or_default();
            if let Some(call_id) = key.strip_prefix(prefix.as_str()) {
                assert!(
                    calls_started.contains(call_id),
                    "{key}: test_append ran but its tool_call_started is not in the log"
                );
            }
        }
        for event in &events {
            let EventKind::ToolCallFinished { result } = &event.kind else {
                continue;
            };
            let key = format!("{child}:{}", result.call_id);
            let lines = log
                .lines()
                .filter(|l| l.split('\t').next() == Some(key.as_str()))
                .count();
            if result.outcome.is_ok() {
                assert_eq!(lines, 1, "{key}: an ok call runs exactly once");
            } else {
                assert!(lines <= 1, "{key}: ran {lines} times");
            }
        }
    }
}
