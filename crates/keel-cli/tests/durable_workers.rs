//! Scale-out on Postgres: 200 runs submitted with `keel submit`, two `keel worker`
//! processes lease them, one is killed with SIGKILL midway; all 200 finish, each run was
//! started once and ended once, and no mutating tool call executed twice. And several
//! messages submitted for each of several threads all run, each thread's in submit order,
//! shared by two workers.
//!
//! Needs PostgreSQL: set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test). The
//! test works in a throw-away schema, so repeated runs do not interfere.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_core::{EventKind, EventStore};
use keel_store::{PostgresOptions, PostgresStore, RunQueue};

const RUNS: usize = 200;

const SCRIPT: &str = r#"{"steps": [
  {"text": "Writing.", "delay_ms": 40, "tool_calls": [
     {"name": "test_append", "arguments": {"text": "once", "delay_before_ms": 40, "delay_after_ms": 40}}]},
  {"text": "Done.", "delay_ms": 40}
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

fn worker(dir: &Path, store: &str, name: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    keel(
        dir,
        &[
            "worker",
            "--store",
            store,
            "--worker-id",
            name,
            "--lease-ttl",
            "2",
            "--concurrency",
            "6",
            "--poll-ms",
            "50",
            "--exit-when-idle",
        ],
    )
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .unwrap()
}

/// A store in a throw-away schema, and the `--store` URL that reaches it.
async fn schema_store() -> (PostgresStore, String) {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!("DATABASE_URL is not set: this test needs PostgreSQL (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/test; scripts/test sets it when the local server runs)")
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!(
        "keel_workers_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000
    );
    let store = PostgresStore::connect_with(PostgresOptions::new(&url).schema(&schema))
        .await
        .unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let store_url = format!("{url}{separator}options[search_path]={schema}");
    (store, store_url)
}

/// Waits for a worker started with `--exit-when-idle` to exit successfully.
fn wait_idle_exit(child: &mut Child, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "worker exited with {status}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            return;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!(
                "worker did not finish:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_one_thread_run_in_submit_order_across_workers() {
    const THREADS: usize = 4;
    const MESSAGES: usize = 3;
    let (store, store_url) = schema_store().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(
        root.join("step.json"),
        r#"[{"text": "Noted.", "delay_ms": 30}]"#,
    )
    .unwrap();
    for m in 0..MESSAGES {
        for t in 0..THREADS {
            let (thread, message) = (format!("thr_order_{t}"), format!("thread {t} message {m}"));
            let out = keel(
                &root,
                &[
                    "submit",
                    "--script",
                    "step.json",
                    "--store",
                    &store_url,
                    "--thread",
                    &thread,
                    &message,
                ],
            )
            .output()
            .unwrap();
            assert!(
                out.status.success(),
                "submit: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!(
        store.counts().await.unwrap().queued,
        (THREADS * MESSAGES) as u64
    );
    let mut a = worker(&root, &store_url, "order_a");
    let mut b = worker(&root, &store_url, "order_b");
    wait_idle_exit(&mut a, &root.join("order_a.log"));
    wait_idle_exit(&mut b, &root.join("order_b.log"));
    for t in 0..THREADS {
        let events = store.load(&format!("thr_order_{t}")).await.unwrap();
        let users: Vec<String> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::UserMessage { message } => Some(message.text()),
                _ => None,
            })
            .collect();
        let expected: Vec<String> = (0..MESSAGES)
            .map(|m| format!("thread {t} message {m}"))
            .collect();
        assert_eq!(users, expected, "thread {t}");
        let ends = events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::RunEnded {
                        end_state: keel_core::EndState::Done,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(ends, MESSAGES, "thread {t}: {ends} runs ended done");
    }
    let counts = store.counts().await.unwrap();
    assert_eq!(
        (counts.queued, counts.leased, counts.done, counts.failed),
        (0, 0, (THREADS * MESSAGES) as u64, 0)
    );
    store.drop_schema().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_one_killed_all_runs_finish_once() {
    let (store, store_url) = schema_store().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("script.json"), SCRIPT).unwrap();

    // Submit 200 runs, 8 processes at a time.
    let started = Instant::now();
    let mut threads = Vec::new();
    for chunk in (0..RUNS).collect::<Vec<_>>().chunks(8) {
        let children: Vec<Child> = chunk
            .iter()
            .map(|i| {
                let message = format!("job {i}");
                keel(
                    &root,
                    &[
                        "submit",
                        "--script",
                        "script.json",
                        "--tool",
                        "test_append",
                        "--store",
                        &store_url,
                        &message,
                    ],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "submit: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            threads.push(String::from_utf8(out.stdout).unwrap().trim().to_string());
        }
    }
    assert_eq!(threads.len(), RUNS);
    assert_eq!(store.counts().await.unwrap().queued, RUNS as u64);
    eprintln!("submitted {RUNS} runs in {:?}", started.elapsed());

    // Two workers; kill A once about a quarter of the runs are done.
    let mut a = worker(&root, &store_url, "worker_a");
    let mut b = worker(&root, &store_url, "worker_b");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = store.counts().await.unwrap();
        if counts.done >= (RUNS / 4) as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "workers made no progress: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill().unwrap(); // SIGKILL
    a.wait().unwrap();
    let killed_at = store.counts().await.unwrap();
    eprintln!("killed worker_a at {killed_at:?}");
    assert!(
        killed_at.done < RUNS as u64,
        "worker_a was killed after everything finished"
    );

    // B takes over A's runs once their leases expire, then exits when idle.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = b.try_wait().unwrap() {
            assert!(status.success(), "worker_b exited with {status}");
            break;
        }
        if Instant::now() > deadline {
            b.kill().unwrap();
            panic!(
                "worker_b did not finish: {:?}",
                store.counts().await.unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = store.counts().await.unwrap();
    assert_eq!(
        (counts.queued, counts.leased, counts.done),
        (0, 0, RUNS as u64),
        "{counts:?}"
    );

    let log_a = std::fs::read_to_string(root.join("worker_a.log")).unwrap();
    let log_b = std::fs::read_to_string(root.join("worker_b.log")).unwrap();
    assert!(
        log_a.contains("ended done"),
        "worker_a drove nothing:\n{log_a}"
    );
    assert!(
        log_b.contains("ended done"),
        "worker_b drove nothing:\n{log_b}"
    );
    assert!(
        log_b.contains("(resumed an interrupted run)"),
        "worker_b took over none of worker_a's runs:\n{log_b}"
    );

    // Every run: started once, ended once (done), seq contiguous, calls answered once.
    let appends = std::fs::read_to_string(root.join("appends.log")).unwrap();
    let mut lines: HashMap<&str, usize> = HashMap::new();
    for line in appends.lines() {
        *lines.entry(line.split('\t').next().unwrap()).or_insert(0) += 1;
    }
    let twice: Vec<_> = lines.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "mutating calls executed twice: {twice:?}");
    let mut interrupted = 0;
    for thread in &threads {
        let events = store.load(thread).await.unwrap();
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event.seq, i as u64, "{thread}: seq gap");
        }
        let started = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
            .count();
        let ended: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::RunEnded { end_state, .. } => Some(*end_state),
                _ => None,
            })
            .collect();
        assert_eq!(started, 1, "{thread}: run started {started} times");
        assert_eq!(ended, vec![keel_core::EndState::Done], "{thread}");
        let results: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolCallFinished { result } => Some(result),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 1, "{thread}: {} tool results", results.len());
        let key = format!("{thread}:{}", results[0].call_id);
        let ran = lines.get(key.as_str()).copied().unwrap_or(0);
        if results[0].outcome.is_ok() {
            assert_eq!(ran, 1, "{key}: ok but ran {ran} times");
        } else {
            interrupted += 1;
            assert!(
                ran <= 1 && results[0].content.contains(&key),
                "{key}: {}",
                results[0].content
            );
        }
    }
    eprintln!(
        "{RUNS} runs finished in {:?}; {interrupted} mutating calls interrupted by the kill",
        started.elapsed()
    );
    store.drop_schema().await.unwrap();
}
