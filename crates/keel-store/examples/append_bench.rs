//! Micro-benchmark of the event stores' append path, and of the SQLite engine choice.
//!
//! `cargo run --release -p keel-store --example append_bench -- [TASKS] [APPENDS]`
//! runs TASKS concurrent appenders (default 500), each appending APPENDS 3-event batches
//! (default 6) to its own thread, and prints appends/s and process CPU per append for:
//!
//! - `memory`: keel-core's `MemoryStore` (the floor);
//! - `sqlite`: [`SqliteStore`] (rusqlite writer thread, group commit);
//! - `sqlx-group`: the same group commit written on sqlx (one `SqliteConnection` driven
//!   by a task: what "keep sqlx" would cost);
//! - `sqlx-per-append`: the old design (a pool of 4 sqlx connections, one
//!   `BEGIN IMMEDIATE` transaction per append);
//! - `sqlite-full`: [`SqliteStore`] with `synchronous=FULL`;
//! - `postgres`: [`PostgresStore`] when `DATABASE_URL` is set (a throw-away schema).
//!
//! Then it times `load` of a 10,000-event thread on SQLite and Postgres.
//! CPU is read from `/proc/self/stat` (Linux; clock ticks, so runs are kept long enough).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use keel_core::event::{Event, EventKind};
use keel_store::{
    Durability, EventStore, MemoryStore, PostgresOptions, PostgresStore, SqliteOptions,
    SqliteStore, StoreError,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

mod common;

use common::cpu_seconds;

fn batch(thread: &str, from: u64) -> Vec<Event> {
    (from..from + 3)
        .map(|seq| Event {
            v: keel_core::EVENT_SCHEMA_VERSION,
            seq,
            ts: Utc::now(),
            thread_id: thread.to_string().into(),
            run_id: format!("run-{thread}").into(),
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            span_id: "b7ad6b7169203331".into(),
            kind: EventKind::Notice {
                code: "bench".into(),
                message: "a model answer of typical size ".repeat(8),
                data: None,
            },
        })
        .collect()
}

async fn run(name: &str, store: Arc<dyn EventStore>, tasks: usize, appends: u64) {
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("bench-{task}-{}", keel_core::new_id("t"));
            for i in 0..appends {
                store.append(&id, i * 3, &batch(&id, i * 3)).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let n = tasks as f64 * appends as f64;
    println!(
        "{name:<16} {tasks:>4} x {appends:>2} appends: {wall:>6.3} s wall, {:>8.0} appends/s, {:>6.1} us CPU/append",
        n / wall,
        cpu / n * 1e6
    );
}

async fn time_load(name: &str, store: Arc<dyn EventStore>) {
    let id = keel_core::new_id("long");
    for chunk in 0..10u64 {
        let events: Vec<Event> = (0..1000u64)
            .flat_map(|i| batch(&id, chunk * 1000 + i).into_iter().take(1))
            .collect();
        store.append(&id, chunk * 1000, &events).await.unwrap();
    }
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let log = store.load(&id).await.unwrap();
        best = best.min(start.elapsed());
        assert_eq!(log.len(), 10_000);
    }
    let bodies: Vec<String> = store
        .load(&id)
        .await
        .unwrap()
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    let start = Instant::now();
    let parsed: Vec<Event> = bodies
        .iter()
        .map(|b| serde_json::from_str(b).unwrap())
        .collect();
    let parse = start.elapsed();
    assert_eq!(parsed.len(), 10_000);
    println!(
        "{name:<16} load of a 10,000-event thread: {:.1} ms (best of 5; of which parsing the JSON alone takes {:.1} ms)",
        best.as_secs_f64() * 1e3,
        parse.as_secs_f64() * 1e3
    );
}

/// Group commit on sqlx: one connection owned by a task that drains a channel and runs
/// each group in one transaction with a savepoint per append (the alternative engine).
struct SqlxGroupStore {
    sender: mpsc::Sender<SqlxJob>,
}

/// One append sent to the sqlx writer task: thread, expected seq, events, reply.
type SqlxJob = (
    String,
    u64,
    Vec<Event>,
    oneshot::Sender<Result<(), StoreError>>,
);

impl SqlxGroupStore {
    async fn open(path: &std::path::Path) -> Self {
        // Create the schema with the real store, then take over the file.
        SqliteStore::open(path).await.unwrap().close().await;
        let options = SqliteConnectOptions::from_str("sqlite:")
            .unwrap()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
        let (sender, mut receiver) = mpsc::channel::<SqlxJob>(4096);
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let mut group = vec![first];
                while let Ok(next) = receiver.try_recv() {
                    group.push(next);
                }
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                let mut answers = Vec::new();
                for (thread, expected, events, reply) in group {
                    sqlx::query("SAVEPOINT job")
                        .execute(&mut conn)
                        .await
                        .unwrap();
                    let ok = append_sqlx(&mut conn, &thread, expected, &events).await;
                    let end = if ok { "RELEASE job" } else { "ROLLBACK TO job" };
                    sqlx::query(end).execute(&mut conn).await.unwrap();
                    if !ok {
                        sqlx::query("RELEASE job").execute(&mut conn).await.unwrap();
                    }
                    answers.push((reply, ok, thread, expected));
                }
                sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
                for (reply, ok, thread, expected) in answers {
                    let _ = reply.send(if ok {
                        Ok(())
                    } else {
                        Err(StoreError::Conflict {
                            thread_id: thread,
                            expected,
                            actual: 0,
                        })
                    });
                }
            }
        });
        Self { sender }
    }
}

async fn append_sqlx(
    conn: &mut SqliteConnection,
    thread: &str,
    expected: u64,
    events: &[Event],
) -> bool {
    let n = events.len() as i64;
    let last = events
        .last()
        .map(|e| e.ts.timestamp_nanos_opt().unwrap_or(0))
        .unwrap_or(0);
    let updated = sqlx::query(
        "UPDATE threads SET event_count = event_count + ?1, updated_at = ?2 WHERE thread_id = ?3 AND event_count = ?4",
    )
    .bind(n)
    .bind(last)
    .bind(thread)
    .bind(expected as i64)
    .execute(&mut *conn)
    .await
    .unwrap()
    .rows_affected();
    if updated == 0 {
        if expected != 0 {
            return false;
        }
        sqlx::query(
            "INSERT INTO threads (thread_id, agent, status, end_state, event_count, created_at, updated_at) \
             VALUES (?1, NULL, 'running', NULL, ?2, ?3, ?3)",
        )
        .bind(thread)
        .bind(n)
        .bind(last)
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    for e in events {
        sqlx::query("INSERT INTO events (thread_id, seq, type, run_id, ts, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(thread)
            .bind(e.seq as i64)
            .bind(e.kind.name())
            .bind(e.run_id.as_ref())
            .bind(e.ts.timestamp_nanos_opt().unwrap_or(0))
            .bind(serde_json::to_string(e).unwrap())
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    true
}

/// The old design: one `BEGIN IMMEDIATE` transaction per append on a pool of 4.
struct SqlxPerAppendStore {
    pool: sqlx::SqlitePool,
}

impl SqlxPerAppendStore {
    async fn open(path: &std::path::Path) -> Self {
        SqliteStore::open(path).await.unwrap().close().await;
        let options = SqliteConnectOptions::from_str("sqlite:")
            .unwrap()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .unwrap();
        Self { pool }
    }
}

#[async_trait::async_trait]
impl EventStore for SqlxPerAppendStore {
    async fn append(
        &self,
        thread_id: &str,
        expected: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let ok = append_sqlx(&mut tx, thread_id, expected, events).await;
        tx.commit().await.unwrap();
        if ok {
            Ok(())
        } else {
            Err(StoreError::Conflict {
                thread_id: thread_id.into(),
                expected,
                actual: 0,
            })
        }
    }
    async fn load(&self, _: &str) -> Result<Vec<Event>, StoreError> {
        Ok(Vec::new())
    }
    async fn list_threads(
        &self,
        _: &keel_store::ThreadFilter,
    ) -> Result<Vec<keel_store::ThreadSummary>, StoreError> {
        Ok(Vec::new())
    }
    async fn delete_thread(&self, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
}

#[async_trait::async_trait]
impl EventStore for SqlxGroupStore {
    async fn append(
        &self,
        thread_id: &str,
        expected: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send((thread_id.to_string(), expected, events.to_vec(), reply))
            .await
            .map_err(|_| StoreError::Backend("writer gone".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Backend("writer gone".into()))?
    }
    async fn load(&self, _: &str) -> Result<Vec<Event>, StoreError> {
        Ok(Vec::new())
    }
    async fn list_threads(
        &self,
        _: &keel_store::ThreadFilter,
    ) -> Result<Vec<keel_store::ThreadSummary>, StoreError> {
        Ok(Vec::new())
    }
    async fn delete_thread(&self, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tasks: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(500);
    let appends: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(6);
    let only = args.get(3).cloned();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        if want("memory") {
            run("memory", Arc::new(MemoryStore::new()), tasks, appends).await;
        }
        if want("sqlite") {
            let store = SqliteStore::open(dir.path().join("rusqlite.db"))
                .await
                .unwrap();
            run("sqlite", Arc::new(store.clone()), tasks, appends).await;
            time_load("sqlite", Arc::new(store.clone())).await;
            store.close().await;
        }
        if want("sqlx-group") {
            let store = SqlxGroupStore::open(&dir.path().join("sqlx-group.db")).await;
            run("sqlx-group", Arc::new(store), tasks, appends).await;
        }
        if want("sqlx-per-append") {
            let store = SqlxPerAppendStore::open(&dir.path().join("sqlx-per.db")).await;
            run("sqlx-per-append", Arc::new(store), tasks, appends).await;
        }
        if want("sqlite-full") {
            let mut options = SqliteOptions::new(dir.path().join("full.db"));
            options.durability = Durability::Full;
            let store = SqliteStore::open_with(options).await.unwrap();
            run("sqlite-full", Arc::new(store.clone()), tasks, appends).await;
            store.close().await;
        }
        if want("postgres") {
            if let Ok(url) = std::env::var("DATABASE_URL") {
                let schema = format!("keel_bench_{}", uuid::Uuid::new_v4().simple());
                let store = PostgresStore::connect_with(PostgresOptions::new(url).schema(schema))
                    .await
                    .unwrap();
                run("postgres", Arc::new(store.clone()), tasks, appends).await;
                time_load("postgres", Arc::new(store.clone())).await;
                store.drop_schema().await.unwrap();
            } else {
                println!("postgres         skipped: DATABASE_URL is not set");
            }
        }
    });
}
