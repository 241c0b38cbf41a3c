//! What one sequential SQLite commit costs, through [`SqliteStore`] and without it.
//!
//! `cargo run --release -p keel-store --example sqlite_floor -- [CONVERSATIONS] [ROUNDS]`
//!
//! Each "conversation" is what a one-tool agent run appends (`./scripts/bench`'s W1): a new
//! thread, then three appends of 3, 4 and 3 events, each its own commit. Two sides,
//! alternating over ROUNDS rounds (default 5) of CONVERSATIONS (default 3,000) on fresh
//! databases with Keel's schema:
//!
//! - `store`: [`SqliteStore::append`] from one task (the writer's inline path; a body of
//!   ~440 bytes an event);
//! - `bare`: the same statements on a plain `rusqlite` connection with the writer's
//!   pragmas — `BEGIN IMMEDIATE`, the position check, the summary row's insert (first
//!   append) or update (last), one multi-row `INSERT`, `COMMIT` — and no Keel code at all
//!   (each event's `kind` as its body, ~350 bytes: a little less than the store writes).
//!
//! Both run on a current-thread runtime, measured by the process's CPU time (the store's
//! writer thread included), so the difference is Keel's writer (event serialization and
//! WAL growth included) and the `bare` figure is SQLite's own floor on this machine. It
//! prints each round's figures and each side's median per commit.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use chrono::Utc;
use keel_core::event::{Event, EventKind};
use keel_store::{EventStore, SqliteStore};

mod common;

use common::cpu_seconds;

/// The events of one conversation's appends: 3, 4 and 3.
const APPENDS: [u64; 3] = [3, 4, 3];

fn event(thread: &str, seq: u64) -> Event {
    Event {
        v: keel_core::EVENT_SCHEMA_VERSION,
        seq,
        ts: Utc::now(),
        thread_id: thread.to_string().into(),
        run_id: "run_0192aabbccddeeff00112233".into(),
        trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
        span_id: "b7ad6b7169203331".into(),
        kind: EventKind::Notice {
            code: "bench".into(),
            message: "a model answer of typical size ".repeat(10),
            data: None,
        },
    }
}

/// µs of CPU per commit through the store.
async fn through_store(conversations: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"))
        .await
        .unwrap();
    let start = cpu_seconds();
    for _ in 0..conversations {
        let thread = keel_core::new_id("thr");
        let mut seq = 0;
        for n in APPENDS {
            let batch: Vec<Event> = (seq..seq + n).map(|s| event(&thread, s)).collect();
            store.append(&thread, seq, &batch).await.unwrap();
            seq += n;
        }
    }
    let cpu = cpu_seconds() - start;
    store.close().await;
    cpu / (conversations as f64 * APPENDS.len() as f64) * 1e6
}

/// µs of CPU per commit with the same statements on a bare connection.
async fn bare(conversations: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare.db");
    // The store creates Keel's schema; then it is closed and only rusqlite writes.
    SqliteStore::open(&path).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY; \
         PRAGMA cache_size = -2000; PRAGMA wal_autocheckpoint = 0;",
    )
    .unwrap();
    let body = serde_json::to_string(&event("x", 0).kind).unwrap();
    let start = cpu_seconds();
    for _ in 0..conversations {
        let thread = keel_core::new_id("thr");
        let mut seq: i64 = 0;
        for (index, n) in APPENDS.into_iter().enumerate() {
            let n = n as i64;
            conn.prepare_cached("BEGIN IMMEDIATE")
                .unwrap()
                .execute([])
                .unwrap();
            let _position: (Option<i64>, Option<String>) = conn
                .prepare_cached(
                    "SELECT (SELECT max(seq) FROM events WHERE thread_id = ?1), \
                     (SELECT status FROM threads WHERE thread_id = ?1)",
                )
                .unwrap()
                .query_row([&thread], |row| Ok((row.get(0)?, row.get(1)?)))
                .unwrap();
            if index == 0 {
                conn.prepare_cached(
                    "INSERT INTO threads (thread_id, agent, status, end_state, event_count, \
                     created_at, updated_at) VALUES (?1, 'bench', 'running', NULL, ?2, 1, 1)",
                )
                .unwrap()
                .execute(rusqlite::params![thread, n])
                .unwrap();
            } else if index == APPENDS.len() - 1 {
                conn.prepare_cached(
                    "UPDATE threads SET status = 'ended', end_state = 'done', event_count = ?2, \
                     updated_at = 2 WHERE thread_id = ?1",
                )
                .unwrap()
                .execute(rusqlite::params![thread, seq + n])
                .unwrap();
            }
            let rows = vec!["(?, ?, ?, ?, ?, ?)"; n as usize].join(", ");
            let mut insert = conn
                .prepare_cached(&format!(
                    "INSERT INTO events (thread_id, seq, type, run_id, ts, body) VALUES {rows}"
                ))
                .unwrap();
            let mut parameter = 0;
            for s in seq..seq + n {
                let values: [&dyn rusqlite::ToSql; 6] = [
                    &thread,
                    &s,
                    &"notice",
                    &"run_0192aabbccddeeff00112233",
                    &1_i64,
                    &body,
                ];
                for value in values {
                    parameter += 1;
                    insert.raw_bind_parameter(parameter, value).unwrap();
                }
            }
            insert.raw_execute().unwrap();
            conn.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
            seq += n;
        }
    }
    let cpu = cpu_seconds() - start;
    cpu / (conversations as f64 * APPENDS.len() as f64) * 1e6
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let conversations: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3000);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    if conversations == 0 || rounds == 0 {
        eprintln!("usage: sqlite_floor [CONVERSATIONS] [ROUNDS], both at least 1");
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut store, mut plain) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        for round in 1..=rounds {
            let s = through_store(conversations).await;
            let b = bare(conversations).await;
            println!("round {round}: store {s:.1} us, bare {b:.1} us CPU per commit");
            store.push(s);
            plain.push(b);
        }
    });
    let (s, b) = (median(&mut store), median(&mut plain));
    println!(
        "median of {rounds} rounds × {conversations} conversations × {} commits: \
         SqliteStore {s:.1} us, bare rusqlite {b:.1} us CPU per commit ({:.2}×)",
        APPENDS.len(),
        s / b
    );
}
