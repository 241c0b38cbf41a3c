//! `keel submit` / `keel worker` on a SQLite store (issue 14):
//!
//! - two messages submitted for one thread both run, in order, each answered (the queue
//!   used to overwrite the first with the second);
//! - a job's custom base URL or agent file is refused unless the worker allows it, before
//!   any connection is made (the worker's API key goes nowhere), and accepted when allowed;
//! - a failed lease renewal cancels the run at once: a mutating call in flight never takes
//!   effect after it, and the job is continued (its call settled as interrupted) by the
//!   next holder of the lease;
//! - a lease much shorter than a tool call is kept by renewals (no takeover);
//! - a store URL's password never reaches stderr.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::MockLlm;
use keel_core::{EndState, Event, EventKind, EventStore};
use keel_store::{JobState, RunQueue, SqliteStore};
use serde_json::Value;

/// Generous: the machine is shared and may be busy.
const DEADLINE: Duration = Duration::from_secs(120);

fn keel(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_MODE", "1")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("KEEL_WORKER_ALLOW_BASE_URLS")
        .env_remove("KEEL_WORKER_ALLOW_AGENT_DIRS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store_url: String,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let store_url = format!("sqlite://{}", root.join("keel.db").display());
        Self {
            _dir: dir,
            root,
            store_url,
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.root.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `keel submit ... --output json`; returns (thread id, job id).
    fn submit(&self, args: &[&str], env: &[(&str, &str)]) -> (String, i64) {
        let mut all = vec!["submit", "--store", &self.store_url, "--output", "json"];
        all.extend_from_slice(args);
        let mut command = keel(&self.root, &all);
        for (name, value) in env {
            command.env(name, value);
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "submit {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            json["thread_id"].as_str().unwrap().to_string(),
            json["job_id"].as_i64().unwrap(),
        )
    }

    /// Starts `keel worker` with stderr in `NAME.log`.
    fn worker(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
        let log = std::fs::File::create(self.root.join(format!("{name}.log"))).unwrap();
        let mut all = vec![
            "worker",
            "--store",
            &self.store_url,
            "--worker-id",
            name,
            "--poll-ms",
            "20",
            "--exit-when-idle",
        ];
        all.extend_from_slice(args);
        let mut command = keel(&self.root, &all);
        for (name, value) in env {
            command.env(name, value);
        }
        command.stdout(Stdio::null()).stderr(log).spawn().unwrap()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.root.join(format!("{name}.log"))).unwrap_or_default()
    }

    async fn store(&self) -> SqliteStore {
        SqliteStore::open(self.root.join("keel.db")).await.unwrap()
    }
}

/// Waits for a worker started with `--exit-when-idle` to exit successfully.
fn wait_exit(child: &mut Child, setup: &Setup, name: &str) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "{name} exited with {status}:\n{}",
                setup.log(name)
            );
            return;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{name} did not finish:\n{}", setup.log(name));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `check` until it holds (generous deadline).
async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn texts(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage { message } => Some(("user".into(), message.text())),
            EventKind::ModelResponded { message, .. } => Some(("assistant".into(), message.text())),
            _ => None,
        })
        .collect()
}

fn ended(events: &[Event]) -> Vec<EndState> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RunEnded { end_state, .. } => Some(*end_state),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_messages_for_one_thread_both_run_in_order() {
    let setup = Setup::new();
    setup.write("one.json", r#"[{"text": "Answer one."}]"#);
    setup.write("two.json", r#"[{"text": "Answer two."}]"#);
    setup.write("other.json", r#"[{"text": "Other answer."}]"#);
    let (thread, first) = setup.submit(&["--script", "one.json", "first message"], &[]);
    let (same, second) = setup.submit(
        &[
            "--thread",
            &thread,
            "--script",
            "two.json",
            "second message",
        ],
        &[],
    );
    assert_eq!(same, thread);
    assert_ne!(first, second, "the second message reused the first's job");
    let (other, _) = setup.submit(&["--script", "other.json", "another thread"], &[]);

    let mut worker = setup.worker("w", &["--concurrency", "2", "--lease-ttl", "10"], &[]);
    wait_exit(&mut worker, &setup, "w");

    let store = setup.store().await;
    let events = store.load(&thread).await.unwrap();
    assert_eq!(
        texts(&events),
        vec![
            ("user".to_string(), "first message".to_string()),
            ("assistant".to_string(), "Answer one.".to_string()),
            ("user".to_string(), "second message".to_string()),
            ("assistant".to_string(), "Answer two.".to_string()),
        ],
        "{}",
        setup.log("w")
    );
    assert_eq!(ended(&events), vec![EndState::Done, EndState::Done]);
    let other_events = store.load(&other).await.unwrap();
    assert_eq!(ended(&other_events), vec![EndState::Done]);
    let counts = store.counts().await.unwrap();
    assert_eq!(
        (counts.queued, counts.leased, counts.done, counts.failed),
        (0, 0, 3, 0)
    );
    store.close().await;
}

const TINY_AGENT: &str = r#"
name = "tiny"
instructions = "Answer briefly."
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_base_urls_and_agent_files_need_the_workers_allowance() {
    let setup = Setup::new();
    setup.write("one.json", r#"[{"text": "Answer one."}]"#);
    let key = "sk-worker-secret-0123456789abcdef";
    let api = [("OPENAI_API_KEY", key)];
    // Where a job would send the worker's key: nothing may ever connect here.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_url = format!("http://127.0.0.1:{}/v1", trap.local_addr().unwrap().port());
    let untrusted = setup.write("untrusted/agent.toml", TINY_AGENT);
    let (url_thread, url_job) = setup.submit(
        &[
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
            &trap_url,
            "hello",
        ],
        &api,
    );
    let (file_thread, file_job) = setup.submit(
        &[
            "--script",
            "one.json",
            "--agent",
            untrusted.to_str().unwrap(),
            "hello",
        ],
        &api,
    );

    let mut worker = setup.worker("strict", &[], &api);
    wait_exit(&mut worker, &setup, "strict");
    let log = setup.log("strict");
    assert!(
        matches!(trap.accept(), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the worker connected to the job's base URL:\n{log}"
    );
    assert!(!log.contains(key), "{log}");
    let store = setup.store().await;
    for (thread, job, flag) in [
        (&url_thread, url_job, "--allow-base-url"),
        (&file_thread, file_job, "--allow-agent-dir"),
    ] {
        let info = store.job(job).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::Failed, "{log}");
        let error = info.error.unwrap_or_default();
        assert!(error.contains(flag), "{error}");
        assert!(log.contains(flag), "{log}");
        assert!(
            store.load(thread).await.unwrap().is_empty(),
            "a refused job wrote to its thread"
        );
    }

    // Allowed: loopback base URLs and the trusted agent directory.
    setup.write(
        "mock.json",
        r#"{"turns": [{"text": "Hello from the mock."}], "when_exhausted": "error"}"#,
    );
    let mock = MockLlm::start(&setup.root, "mock.json");
    let trusted = setup.write("trusted/agent.toml", TINY_AGENT);
    let (url_thread, _) = setup.submit(
        &[
            "--model",
            "openai:gpt-4o-mini",
            "--base-url",
            &mock.base_url,
            "hello",
        ],
        &api,
    );
    let (file_thread, _) = setup.submit(
        &[
            "--script",
            "one.json",
            "--agent",
            trusted.to_str().unwrap(),
            "hello",
        ],
        &api,
    );
    let trusted_dir = setup.root.join("trusted");
    let mut worker = setup.worker(
        "allowing",
        &[
            "--allow-base-url",
            "loopback",
            "--allow-agent-dir",
            trusted_dir.to_str().unwrap(),
        ],
        &api,
    );
    wait_exit(&mut worker, &setup, "allowing");
    let log = setup.log("allowing");
    for thread in [&url_thread, &file_thread] {
        let events = store.load(thread).await.unwrap();
        assert_eq!(ended(&events), vec![EndState::Done], "{log}");
    }
    assert_eq!(
        texts(&store.load(&url_thread).await.unwrap())[1].1,
        "Hello from the mock."
    );
    store.close().await;
}

/// Makes every lease renewal on the store fail (an `UPDATE` that keeps a job leased under
/// the same token is aborted), as a broken connection or a full disk would.
fn break_renewals(db: &Path, broken: bool) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    if broken {
        conn.execute_batch(
            "CREATE TRIGGER test_broken_renewals BEFORE UPDATE OF lease_expires_at ON run_queue \
             WHEN OLD.state = 'leased' AND NEW.state = 'leased' AND NEW.lease_token = OLD.lease_token \
             BEGIN SELECT RAISE(ABORT, 'injected renewal failure'); END;",
        )
        .unwrap();
    } else {
        conn.execute_batch("DROP TRIGGER test_broken_renewals;")
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_renewal_stops_a_mutating_call_before_its_effect() {
    let setup = Setup::new();
    let gate = setup.root.join("gate");
    let script = format!(
        r#"[{{"text": "Writing.", "tool_calls": [{{"name": "test_append",
             "arguments": {{"text": "effect", "wait_for_file": "{}"}}}}]}},
            {{"text": "Done."}}]"#,
        gate.display()
    );
    setup.write("script.json", &script);
    let (thread, job) = setup.submit(
        &[
            "--script",
            "script.json",
            "--tool",
            "test_append",
            "write it",
        ],
        &[],
    );
    let mut worker = setup.worker("w", &["--lease-ttl", "6"], &[]);
    let store = setup.store().await;
    wait_until("the mutating call to start", || {
        let store = store.clone();
        let thread = thread.clone();
        async move {
            store
                .load(&thread)
                .await
                .unwrap()
                .iter()
                .any(|e| matches!(e.kind, EventKind::ToolCallStarted { .. }))
        }
    })
    .await;
    // The call is in flight, waiting for the gate. Break renewals; once the worker has
    // seen a renewal fail, open the gate: the call must not take effect any more.
    break_renewals(&setup.root.join("keel.db"), true);
    wait_until("a renewal to fail", || {
        let log = setup.log("w");
        async move { log.contains("injected renewal failure") }
    })
    .await;
    std::fs::write(&gate, "go").unwrap();
    wait_until("the worker to give the run up", || {
        let log = setup.log("w");
        async move { log.contains("lease lost") }
    })
    .await;
    break_renewals(&setup.root.join("keel.db"), false);
    wait_exit(&mut worker, &setup, "w");

    let log = setup.log("w");
    let appends = std::fs::read_to_string(setup.root.join("appends.log")).unwrap_or_default();
    assert!(
        appends.is_empty(),
        "the mutating call took effect after the lease could not be renewed:\n{appends}\n{log}"
    );
    assert!(
        log.contains("cancelled the run; nothing more was written"),
        "{log}"
    );
    let events = store.load(&thread).await.unwrap();
    let results: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{log}");
    assert!(!results[0].outcome.is_ok(), "{:?}", results[0]);
    assert!(
        results[0].content.contains("may or may not"),
        "the next holder settles the call as interrupted: {}",
        results[0].content
    );
    assert_eq!(ended(&events), vec![EndState::Done], "{log}");
    let info = store.job(job).await.unwrap().unwrap();
    assert_eq!(info.state, JobState::Done);
    assert_eq!(info.attempts, 2, "given back once, then continued");
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_shorter_than_a_tool_call_is_kept_by_renewals() {
    let setup = Setup::new();
    setup.write(
        "script.json",
        r#"[{"text": "Writing.", "tool_calls": [{"name": "test_append",
             "arguments": {"text": "slow", "delay_before_ms": 7000}}]},
            {"text": "Done."}]"#,
    );
    let (thread, job) = setup.submit(
        &[
            "--script",
            "script.json",
            "--tool",
            "test_append",
            "write slowly",
        ],
        &[],
    );
    let mut a = setup.worker("a", &["--lease-ttl", "2"], &[]);
    let store = setup.store().await;
    wait_until("worker a to start the call", || {
        let store = store.clone();
        let thread = thread.clone();
        async move {
            store
                .load(&thread)
                .await
                .unwrap()
                .iter()
                .any(|e| matches!(e.kind, EventKind::ToolCallStarted { .. }))
        }
    })
    .await;
    // A second worker polls the whole time the call runs (3.5 TTLs).
    let mut b = setup.worker("b", &["--lease-ttl", "2"], &[]);
    wait_exit(&mut a, &setup, "a");
    wait_exit(&mut b, &setup, "b");
    let (log_a, log_b) = (setup.log("a"), setup.log("b"));
    assert!(!log_a.contains("lease lost"), "{log_a}");
    assert!(
        !log_b.contains(&thread),
        "worker b took the job over:\n{log_b}"
    );
    let info = store.job(job).await.unwrap().unwrap();
    assert_eq!((info.state, info.attempts), (JobState::Done, 1));
    let appends = std::fs::read_to_string(setup.root.join("appends.log")).unwrap();
    assert_eq!(appends.lines().count(), 1, "{appends}");
    let events = store.load(&thread).await.unwrap();
    assert_eq!(ended(&events), vec![EndState::Done]);
    store.close().await;
}

#[test]
fn a_store_url_password_never_reaches_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let url = "postgres://keel:secretpw@127.0.0.1:1/x";
    std::fs::write(dir.path().join("one.json"), r#"[{"text": "Hi."}]"#).unwrap();
    // Each waits out the store's connect timeout: run them side by side.
    let children: Vec<_> = [
        vec!["threads", "list", "--store", url],
        vec!["worker", "--store", url, "--exit-when-idle"],
        vec!["submit", "--store", url, "--script", "one.json", "hi"],
        vec!["stats", "--store", url],
    ]
    .into_iter()
    .map(|args| {
        let child = keel(dir.path(), &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (args, child)
    })
    .collect();
    for (args, child) in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!stderr.contains("secretpw"), "{args:?}: {stderr}");
        assert!(
            stderr.contains("127.0.0.1:1"),
            "{args:?}: the error should still name the store: {stderr}"
        );
    }
}
