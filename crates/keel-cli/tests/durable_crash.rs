//! Crash harness (issue 14, "Crash"), on SQLite and on Postgres: a child `keel run` whose
//! agent has a mutating tool is SIGKILLed at seeded, machine-calibrated random points —
//! during model calls, inside tool calls (the mutating `test_append` among them), between
//! events — and `keel resume` (itself killed at a random point in a third of the runs)
//! then finishes every run.
//!
//! Checked for every run:
//! - 100% finish: the final resume reports `done` with the scripted answer;
//! - 0 lost events: after every kill the log read back through the store is the log seen
//!   before that process started plus new events, seq contiguous; the tool calls and
//!   results the killed process showed on its live output (`→ tool` / `← tool` lines,
//!   printed as the run folds them) agree in order with those in the log, and a run it
//!   reported ended (`[end]`, printed only after the append returned) is in it; every side
//!   effect in the `test_append` log has its `tool_call_started` in the log (the durability
//!   rule); the final log keeps all of it;
//! - 0 mutating calls twice: counted by `test_append` itself (one line per execution,
//!   keyed by the idempotency key) — a call reported `ok` ran exactly once, an interrupted
//!   one at most once, and its result tells the model the key;
//! - exactly one `run_started` and one `run_ended` per run, every tool call requested and
//!   answered once, each model turn answered once.
//!
//! Size: `KEEL_CRASH_KILLS` kills of `keel run` must land mid-run (after its first event,
//! before `run_ended`) on each store; the default keeps `./scripts/test` short. The full
//! harness is `scripts/crash` (100 kills per store, release build). Each test prints a
//! report (runs, kills by phase, resumes, figures) on stderr (`-- --nocapture`).
//!
//! Postgres needs DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test; the test
//! fails when it is unset) and works in a throw-away schema, dropped when the test passes
//! (kept for inspection when it fails; its name is printed first). On Postgres a killed
//! process's last append can commit after the kill (the server finishes the statement);
//! such events are counted, and a resume refused by that late commit (append conflict,
//! nothing written) is tried again. On SQLite either would fail the test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::{Rng, check_appends, run_and_kill_logged};
use keel_core::{EndState, Event, EventKind, EventStore};
use keel_store::{PostgresOptions, PostgresStore};
use serde_json::Value;

/// How many kills of `keel run` must land mid-run on each store.
const KILLS_VAR: &str = "KEEL_CRASH_KILLS";
/// The short size run by `./scripts/test`.
const DEFAULT_KILLS: usize = 25;
const SEED_SQLITE: u64 = 0x5eed_cafe_f00d_0001;
const SEED_POSTGRES: u64 = 0x5eed_cafe_f00d_0002;

const SCRIPT: &str = r#"{"steps": [
  {"text": "Working on it.", "delay_ms": 30, "tool_calls": [
     {"name": "calculator", "arguments": {"expression": "6*7"}},
     {"name": "test_append", "arguments": {"text": "first", "delay_before_ms": 40, "delay_after_ms": 40}}]},
  {"delay_ms": 30, "tool_calls": [{"name": "delay", "arguments": {"ms": 40}},
     {"name": "test_append", "arguments": {"text": "second", "delay_before_ms": 20, "delay_after_ms": 20}}]},
  {"text": "All done: 42.", "delay_ms": 40}
]}"#;
const FINAL_TEXT: &str = "All done: 42.";
/// Tool calls the script makes in one run.
const CALLS_PER_RUN: usize = 4;
/// Model turns in one run.
const TURNS_PER_RUN: usize = 3;

/// How many times a run is resumed (or restarted) before the test gives up. Attempts after
/// the first happen only when a process was refused because a killed process's last
/// append was still committing (see [`Target::late_commits`]).
const MAX_ATTEMPTS: u32 = 20;

const BEFORE_FIRST_EVENT: &str = "before the first event";
const AFTER_THE_END: &str = "after the end";
const MODEL_CALL: &str = "model call";
const MUTATING_CALL: &str = "mutating tool call";
const READ_ONLY_CALL: &str = "read-only tool call";
const BETWEEN_EVENTS: &str = "between events";

fn required_kills() -> usize {
    match std::env::var(KILLS_VAR) {
        Ok(value) => value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| {
                panic!("{KILLS_VAR}={value:?}: expected a positive whole number of kills")
            }),
        Err(_) => DEFAULT_KILLS,
    }
}

#[test]
fn sqlite_killed_runs_resume_without_duplicates_or_losses() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("crash.db").display());
    let runtime = runtime();
    // Opening it here also creates the schema before any child races to.
    let reader = runtime
        .block_on(keel_store::open_store(&url))
        .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    let target = Target {
        label: "sqlite",
        url,
        reader,
        runtime,
        late_commits: false,
    };
    crash_harness(&target, dir.path(), SEED_SQLITE);
}

#[test]
fn postgres_killed_runs_resume_without_duplicates_or_losses() {
    let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!("DATABASE_URL is not set: the Postgres crash test needs PostgreSQL (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/test; scripts/test sets it when the local server runs)")
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!(
        "keel_crash_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000
    );
    let runtime = runtime();
    let store = runtime
        .block_on(PostgresStore::connect_with(
            PostgresOptions::new(&base).schema(&schema),
        ))
        .unwrap_or_else(|e| panic!("cannot open Postgres at DATABASE_URL: {e}"));
    eprintln!("postgres: throw-away schema {schema} (dropped when the test passes)");
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options[search_path]={schema}");
    let dir = tempfile::tempdir().unwrap();
    let target = Target {
        label: "postgres",
        url,
        reader: Arc::new(store.clone()),
        runtime,
        late_commits: true,
    };
    crash_harness(&target, dir.path(), SEED_POSTGRES);
    target.runtime.block_on(store.drop_schema()).unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The store under test: the URL the children get, and this process's own handle to read
/// logs back.
struct Target {
    label: &'static str,
    url: String,
    reader: Arc<dyn EventStore>,
    runtime: tokio::runtime::Runtime,
    /// Whether a SIGKILLed process's last append can still commit after the kill. On
    /// Postgres it can: the server finishes a statement whose client died, so the next
    /// process may load the log before that commit and then be refused with an append
    /// conflict (writing nothing) — it is tried again. On SQLite the dead process's
    /// commit is in the file or not at all, so a refusal or a late event fails the test.
    late_commits: bool,
}

impl Target {
    /// A resume (or restart) refused because the log moved under it: allowed, and tried
    /// again after a pause, only where a killed process's append can land late.
    fn refused(&self, thread: &str, stderr: &str, attempt: u32, tally: &mut Tally) {
        assert!(
            self.late_commits,
            "[{}] {thread}: refused although no other process is alive: {stderr}",
            self.label
        );
        tally.refused += 1;
        std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
    }

    fn load(&self, thread: &str) -> Vec<Event> {
        self.runtime
            .block_on(self.reader.load(thread))
            .unwrap_or_else(|e| panic!("[{}] cannot load {thread}: {e}", self.label))
    }
}

/// What the harness counted, for the report and the final assertions.
#[derive(Default)]
struct Tally {
    runs: usize,
    /// Kills of `keel run`, by the phase the run was in.
    run_kills: BTreeMap<&'static str, usize>,
    /// `keel run` children that exited before their kill time.
    run_exited: usize,
    /// Kills of a first `keel resume`, by phase.
    resume_kills: BTreeMap<&'static str, usize>,
    /// `keel resume` processes started (killed or not).
    resumes: usize,
    /// Runs started again because the kill came before their first event.
    reruns: usize,
    /// Resumes or restarts refused because a killed process's last append committed after
    /// they loaded the log (Postgres only), then tried again.
    refused: usize,
    /// Events of a killed process that appeared only after the log was read right after
    /// its kill (Postgres only).
    late_events: usize,
    done: usize,
    /// Events in the final logs, all checked.
    events: usize,
    /// Events a killed process showed on its live output, each consistent with the log.
    reported: usize,
    /// `test_append` calls that ran exactly once and reported ok.
    mutating_ok: usize,
    /// `test_append` calls cut by a kill, settled as interrupted, never run again.
    mutating_interrupted: usize,
    /// Lines `test_append` wrote (one per execution).
    side_effects: usize,
}

impl Tally {
    fn mid_run_kills(&self) -> usize {
        self.run_kills
            .iter()
            .filter(|(phase, _)| ![BEFORE_FIRST_EVENT, AFTER_THE_END].contains(phase))
            .map(|(_, n)| n)
            .sum()
    }

    fn kills(&self, phase: &str) -> usize {
        self.run_kills.get(phase).copied().unwrap_or(0)
    }
}

fn keel(dir: &Path, args: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .stdin(Stdio::null());
    command
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn agent_flags(store: &str) -> Vec<String> {
    strings(&[
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
    ])
}

/// `keel run` with live text output (what a killed child reports on stderr).
fn run_args(store: &str, thread: &str) -> Vec<String> {
    let mut args = strings(&["run"]);
    args.extend(agent_flags(store));
    args.extend(strings(&["--thread", thread, "compute 6*7"]));
    args
}

fn resume_args(store: &str, thread: &str, json: bool) -> Vec<String> {
    let mut args = strings(&["resume", thread]);
    args.extend(agent_flags(store));
    if json {
        args.extend(strings(&["--output", "json"]));
    }
    args
}

fn output(mut command: Command) -> Output {
    command.output().unwrap()
}

fn crash_harness(target: &Target, root: &Path, seed: u64) {
    let label = target.label;
    let required = required_kills();
    let max_runs = required * 4 + 20;
    std::fs::write(root.join("script.json"), SCRIPT).unwrap();
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let started = Instant::now();

    // Calibrate kill times to this machine and store: a loaded box starts processes
    // slower, and kills before the first event do not count.
    let calibration = {
        let start = Instant::now();
        let out = output(keel(root, &run_args(&target.url, "calibration")));
        assert!(
            out.status.success(),
            "[{label}] calibration run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap().max(300);
        let events = target.load("calibration");
        check_final(target, root, "calibration", &events, &mut tally);
        elapsed
    };

    let mut i = 0;
    while tally.mid_run_kills() < required {
        assert!(
            i < max_runs,
            "[{label}] only {} of {i} runs were killed mid-run (need {required}): {:?}",
            tally.mid_run_kills(),
            tally.run_kills
        );
        let thread = format!("crash_{i}");
        tally.runs += 1;
        let run = run_args(&target.url, &thread);

        let kill_at = Duration::from_millis(rng.below(calibration));
        let log = root.join(format!("{thread}.run.stderr"));
        let mut durable: Vec<Event> = Vec::new();
        let spawned = Utc::now();
        if run_and_kill_logged(keel(root, &run), kill_at, &log) {
            durable = after_kill(target, root, &thread, &durable, spawned, &log, &mut tally);
            *tally.run_kills.entry(phase(&durable)).or_insert(0) += 1;
        } else {
            tally.run_exited += 1;
            durable = target.load(&thread);
        }

        // A third of the runs: kill the first resume too.
        if i % 3 == 0 {
            tally.resumes += 1;
            let log = root.join(format!("{thread}.resume.stderr"));
            let kill_at = Duration::from_millis(rng.below(calibration));
            let spawned = Utc::now();
            if run_and_kill_logged(
                keel(root, &resume_args(&target.url, &thread, false)),
                kill_at,
                &log,
            ) {
                durable = after_kill(target, root, &thread, &durable, spawned, &log, &mut tally);
                *tally.resume_kills.entry(phase(&durable)).or_insert(0) += 1;
            }
        }

        let mut finished = None;
        for attempt in 1..=MAX_ATTEMPTS {
            tally.resumes += 1;
            let out = output(keel(root, &resume_args(&target.url, &thread, true)));
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("has no events") {
                // Killed before the first event was written: start it again.
                assert!(durable.is_empty(), "[{label}] {thread}: {stderr}");
                tally.reruns += 1;
                let out = output(keel(root, &run));
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() && refused_by_late_commit(&stderr) {
                    target.refused(&thread, &stderr, attempt, &mut tally);
                    continue;
                }
                assert!(out.status.success(), "[{label}] rerun {thread}: {stderr}");
                continue;
            }
            if !out.status.success() && refused_by_late_commit(&stderr) {
                target.refused(&thread, &stderr, attempt, &mut tally);
                continue;
            }
            assert!(
                out.status.success(),
                "[{label}] resume {thread} (run killed at {kill_at:?}): {stderr}"
            );
            finished = Some(serde_json::from_slice::<Value>(&out.stdout).unwrap());
            break;
        }
        let json = finished.unwrap_or_else(|| panic!("[{label}] {thread} never finished"));
        assert_eq!(json["end_state"], "done", "[{label}] {thread}: {json}");
        assert_eq!(json["final_text"], FINAL_TEXT, "[{label}] {thread}: {json}");
        let events = target.load(&thread);
        assert!(
            events.starts_with(&durable),
            "[{label}] {thread}: resuming changed events that were already in the log"
        );
        check_final(target, root, &thread, &events, &mut tally);
        i += 1;
    }
    check_appends(root);
    let side_effects = std::fs::read_to_string(root.join("appends.log"))
        .unwrap_or_default()
        .lines()
        .count();
    tally.side_effects = side_effects;
    let elapsed = started.elapsed();
    report(target, &tally, required, elapsed);

    // Kills between events (after one append, before the next) land in sub-millisecond
    // windows and are counted but not required; the wide windows must be hit. A model call
    // is not a durable point (docs/durability.md, "The durability rule"): a kill during one
    // leaves the log at the point before it, so it is counted by that point's phase.
    let floor = (required / 10).max(1);
    assert!(
        tally.kills(MUTATING_CALL) >= floor,
        "[{label}] fewer than {floor} kills landed during a {MUTATING_CALL}: {:?}",
        tally.run_kills
    );
    assert!(
        tally.kills(MUTATING_CALL) + tally.kills(READ_ONLY_CALL) >= 2 * floor,
        "[{label}] too few kills landed inside tool calls: {:?}",
        tally.run_kills
    );
}

fn report(target: &Target, tally: &Tally, required: usize, elapsed: Duration) {
    let phases = |kills: &BTreeMap<&'static str, usize>| {
        kills
            .iter()
            .map(|(phase, n)| format!("{phase} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let resume_kills: usize = tally.resume_kills.values().sum();
    eprintln!(
        "\n== crash harness [{store}] ({var}={required}) ==\n\
         runs:       {runs} (+1 calibration), {done} finished done after resume ({pct:.0}%)\n\
         run kills:  {mid} mid-run; by phase: {run_phases}; {exited} exited before their kill time\n\
         resumes:    {resumes} started, {resume_kills} killed ({resume_phases}); {reruns} runs restarted (killed before their first event); {refused} refused by a killed process's late commit and retried\n\
         events:     {events} in the final logs, seq contiguous; {reported} shown by killed processes, consistent with the log; {late} committed after their process's kill; 0 lost\n\
         mutating:   {ok} test_append calls ran exactly once, {interrupted} cut by a kill and never repeated; {side} executions logged by the tool; 0 twice\n\
         time:       {secs:.1} s ({per:.0} ms per run)",
        store = target.label,
        var = KILLS_VAR,
        runs = tally.runs,
        done = tally.done,
        pct = 100.0 * tally.done as f64 / (tally.runs + 1) as f64,
        mid = tally.mid_run_kills(),
        run_phases = phases(&tally.run_kills),
        exited = tally.run_exited,
        resumes = tally.resumes,
        resume_phases = phases(&tally.resume_kills),
        reruns = tally.reruns,
        refused = tally.refused,
        late = tally.late_events,
        events = tally.events,
        reported = tally.reported,
        ok = tally.mutating_ok,
        interrupted = tally.mutating_interrupted,
        side = tally.side_effects,
        secs = elapsed.as_secs_f64(),
        per = elapsed.as_secs_f64() * 1000.0 / tally.runs.max(1) as f64,
    );
}

/// Where a killed run was, judged by the last event in its log: waiting for the model,
/// inside a tool call (one started and not finished), between events, or already ended.
fn phase(events: &[Event]) -> &'static str {
    let Some(last) = events.last() else {
        return BEFORE_FIRST_EVENT;
    };
    match &last.kind {
        EventKind::RunEnded { .. } => return AFTER_THE_END,
        EventKind::ModelRequested { .. } => return MODEL_CALL,
        _ => {}
    }
    let finished: BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.call_id.as_str()),
            _ => None,
        })
        .collect();
    let in_flight: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallStarted { call_id, name, .. }
                if !finished.contains(call_id.as_str()) =>
            {
                Some(name.as_str())
            }
            _ => None,
        })
        .collect();
    if in_flight.contains(&"test_append") {
        MUTATING_CALL
    } else if !in_flight.is_empty() {
        READ_ONLY_CALL
    } else {
        BETWEEN_EVENTS
    }
}

/// What a killed `keel run`/`keel resume` printed on stderr before the kill. The text
/// printer is a run observer, called only after the event's append returned, so each line
/// proves one durable event: `→ NAME ARGS` a `tool_call_requested`, `← NAME ...` a
/// `tool_call_finished`, `[END_STATE...]` the `run_ended`. A line may be cut by the kill
/// (stderr is unbuffered), so only the name's prefix is compared.
#[derive(Debug, Default)]
struct Reported {
    requested: Vec<String>,
    finished: Vec<String>,
    ended: usize,
}

impl Reported {
    fn read(log: &Path) -> Self {
        let bytes = std::fs::read(log).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let mut reported = Self::default();
        let name = |rest: &str| rest.split(' ').next().unwrap_or_default().to_string();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("→ ") {
                reported.requested.push(name(rest));
            } else if let Some(rest) = line.strip_prefix("← ") {
                reported.finished.push(name(rest));
            } else if let Some(rest) = line.strip_prefix('[') {
                let state: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if rest.len() == state.len()
                    || rest[state.len()..].starts_with(']')
                    || rest[state.len()..].starts_with(':')
                {
                    reported.ended += 1;
                }
            }
        }
        reported
    }

    fn len(&self) -> usize {
        self.requested.len() + self.finished.len() + self.ended
    }
}

/// Whether a process was refused because the log moved under it (another writer, here a
/// killed process's late commit): an append conflict, or — for `keel run` — a run found in
/// progress.
fn refused_by_late_commit(stderr: &str) -> bool {
    stderr.contains("another process is driving thread")
        || stderr.contains("in progress; resume it instead")
}

/// Checks the log right after a kill and returns it: the events there before the killed
/// process started are unchanged, seq is contiguous, everything the process reported as
/// appended is present, and every `test_append` execution so far has its
/// `tool_call_started` in the log. The process's own events are those stamped after it
/// was spawned; older ones beyond `before` are a previous killed process's late commit.
fn after_kill(
    target: &Target,
    root: &Path,
    thread: &str,
    before: &[Event],
    spawned: DateTime<Utc>,
    log: &Path,
    tally: &mut Tally,
) -> Vec<Event> {
    let label = target.label;
    let events = target.load(thread);
    assert!(
        events.starts_with(before),
        "[{label}] {thread}: the kill lost or changed events already in the log ({} before, {} after)",
        before.len(),
        events.len()
    );
    check_seq(label, thread, &events);
    let (late, new): (Vec<&Event>, Vec<&Event>) =
        events[before.len()..].iter().partition(|e| e.ts < spawned);
    assert!(
        late.is_empty() || target.late_commits,
        "[{label}] {thread}: events of a dead process appeared after its kill was observed: {:?}",
        late.iter().map(|e| e.kind.name()).collect::<Vec<_>>()
    );
    tally.late_events += late.len();
    let reported = Reported::read(log);
    let requested: Vec<&str> = new
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallRequested { call, .. } => Some(call.name.as_str()),
            _ => None,
        })
        .collect();
    let finished: Vec<&str> = new
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.name.as_str()),
            _ => None,
        })
        .collect();
    let ended = new
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunEnded { .. }))
        .count();
    let lost = |what: &str| -> String {
        format!(
            "[{label}] {thread}: the killed process reported {what} that is not in the log \
             (reported {reported:?}; new events {:?})",
            new.iter().map(|e| e.kind.name()).collect::<Vec<_>>()
        )
    };
    // The terminal prints each event as the run folds it (a live observer), so a tool call
    // or result it showed may still have been staged when the process died — the durability
    // rule makes it durable only before an effect depends on it (checked below: every side
    // effect has its start in the log) or the run ends. What is in the log agrees with what
    // was shown, in order; a run reported ended is in the log.
    for (shown, stored) in reported.requested.iter().zip(&requested) {
        assert!(
            stored.starts_with(shown.as_str()),
            "{}",
            lost("a tool call")
        );
    }
    for (shown, stored) in reported.finished.iter().zip(&finished) {
        assert!(
            stored.starts_with(shown.as_str()),
            "{}",
            lost("a tool result")
        );
    }
    assert!(reported.ended <= ended, "{}", lost("a run_ended"));
    tally.reported += reported.len();
    check_side_effects_logged(label, root, thread, &events);
    events
}

/// Every `test_append` execution for this thread (a line keyed `THREAD:CALL_ID`) has its
/// `tool_call_started` in the log: the start of a mutating call is durable before the
/// side effect.
fn check_side_effects_logged(label: &str, root: &Path, thread: &str, events: &[Event]) {
    let started: BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallStarted { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    let log = std::fs::read_to_string(root.join("appends.log")).unwrap_or_default();
    let prefix = format!("{thread}:");
    for line in log.lines() {
        let key = line.split('\t').next().unwrap_or_default();
        if let Some(call_id) = key.strip_prefix(prefix.as_str()) {
            assert!(
                started.contains(call_id),
                "[{label}] {key}: test_append ran but its tool_call_started is not in the log"
            );
        }
    }
}

fn check_seq(label: &str, thread: &str, events: &[Event]) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.seq,
            i as u64,
            "[{label}] {thread}: seq gap or duplicate at {i}: {:?}",
            events.iter().map(|e| e.kind.name()).collect::<Vec<_>>()
        );
    }
}

/// The finished log of one run: contiguous, one start and one end (last), every turn and
/// call answered once, and each `test_append` execution counted against its result.
fn check_final(target: &Target, root: &Path, thread: &str, events: &[Event], tally: &mut Tally) {
    let label = target.label;
    check_seq(label, thread, events);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!(count("run_started"), 1, "[{label}] {thread}: {kinds:?}");
    assert_eq!(count("run_ended"), 1, "[{label}] {thread}: {kinds:?}");
    assert_eq!(
        kinds.last(),
        Some(&"run_ended"),
        "[{label}] {thread}: {kinds:?}"
    );
    let mut turns: HashMap<u32, usize> = HashMap::new();
    let mut requested: HashMap<&str, usize> = HashMap::new();
    let mut answered: HashMap<&str, usize> = HashMap::new();
    for event in events {
        match &event.kind {
            EventKind::ModelResponded { turn, .. } => *turns.entry(*turn).or_insert(0) += 1,
            EventKind::ToolCallRequested { call, .. } => {
                *requested.entry(call.id.as_str()).or_insert(0) += 1;
            }
            EventKind::ToolCallFinished { result } => {
                *answered.entry(result.call_id.as_str()).or_insert(0) += 1;
            }
            EventKind::RunEnded {
                end_state,
                final_text,
                ..
            } => {
                assert_eq!(*end_state, EndState::Done, "[{label}] {thread}");
                assert_eq!(
                    final_text.as_deref(),
                    Some(FINAL_TEXT),
                    "[{label}] {thread}"
                );
            }
            _ => {}
        }
    }
    assert_eq!(turns.len(), TURNS_PER_RUN, "[{label}] {thread}: {turns:?}");
    assert!(
        turns.values().all(|n| *n == 1),
        "[{label}] {thread}: a turn answered twice: {turns:?}"
    );
    assert_eq!(
        requested.len(),
        CALLS_PER_RUN,
        "[{label}] {thread}: {requested:?}"
    );
    assert!(
        requested.values().all(|n| *n == 1),
        "[{label}] {thread}: a call requested twice: {requested:?}"
    );
    assert_eq!(
        requested.keys().collect::<BTreeSet<_>>(),
        answered.keys().collect(),
        "[{label}] {thread}: calls requested vs answered"
    );
    assert!(
        answered.values().all(|n| *n == 1),
        "[{label}] {thread}: a call answered twice: {answered:?}"
    );
    check_side_effects_logged(label, root, thread, events);
    // A test_append call reported ok must have written exactly one line; an interrupted one
    // at most one, and the model is told its idempotency key.
    let log = std::fs::read_to_string(root.join("appends.log")).unwrap_or_default();
    for event in events {
        let EventKind::ToolCallFinished { result } = &event.kind else {
            continue;
        };
        if result.name != "test_append" {
            continue;
        }
        let key = format!("{thread}:{}", result.call_id);
        let lines = log
            .lines()
            .filter(|l| l.split('\t').next() == Some(key.as_str()))
            .count();
        if result.outcome.is_ok() {
            assert_eq!(
                lines, 1,
                "[{label}] {key}: an ok call must have run exactly once ({})",
                result.content
            );
            tally.mutating_ok += 1;
        } else {
            assert!(lines <= 1, "[{label}] {key}: ran {lines} times");
            assert!(
                result.content.contains(&key),
                "[{label}] {key}: the model is told the idempotency key: {}",
                result.content
            );
            tally.mutating_interrupted += 1;
        }
    }
    tally.events += events.len();
    tally.done += 1;
}
