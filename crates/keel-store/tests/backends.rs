#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! Backend-specific checks: `open_store` URL forms, SQLite pragmas, and several store
//! instances (separate pools, as separate processes would have) sharing one database.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use keel_core::event::Event;
use keel_store::conformance;
use keel_store::{
    Durability, EventStore, PostgresOptions, PostgresStore, RunQueue, SqliteOptions, SqliteStore,
    StoreError, ThreadFilter, ThreadSummary, open, open_store,
};

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: the Postgres store tests need a server. Run them through \
             ./scripts/test (which sets DATABASE_URL=postgres://postgres@127.0.0.1:5432/test), or \
             export DATABASE_URL yourself."
        )
    })
}

/// Sends each call to the next of several stores over the same database.
struct RoundRobin {
    stores: Vec<Arc<dyn EventStore>>,
    next: AtomicUsize,
}

impl RoundRobin {
    fn pick(&self) -> &Arc<dyn EventStore> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.stores.len();
        &self.stores[i]
    }
}

#[async_trait]
impl EventStore for RoundRobin {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        self.pick()
            .append(thread_id, expected_next_seq, events)
            .await
    }
    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.pick().load(thread_id).await
    }
    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        self.pick().list_threads(filter).await
    }
    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        self.pick().delete_thread(thread_id).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_uses_wal_and_the_configured_sync_level() {
    let dir = tempfile::tempdir().unwrap();
    let normal = SqliteStore::open(dir.path().join("a/b/normal.db"))
        .await
        .unwrap();
    assert!(
        dir.path().join("a/b/normal.db").exists(),
        "parent directories and file are created"
    );
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(normal.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(normal.pool())
        .await
        .unwrap();
    assert_eq!(sync, 1, "NORMAL by default");
    let mut options = SqliteOptions::new(dir.path().join("full.db"));
    options.durability = Durability::Full;
    let full = SqliteStore::open_with(options).await.unwrap();
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(full.pool())
        .await
        .unwrap();
    assert_eq!(sync, 2, "FULL when configured");
    let url = format!(
        "sqlite://{}?synchronous=full",
        dir.path().join("url.db").display()
    );
    let opened = open(&url).await.unwrap();
    assert_eq!(opened.backend, "sqlite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reopens_with_data_and_migrations_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let first = SqliteStore::open(&path).await.unwrap();
    let log = conformance::fixtures::rich_log("t-reopen");
    first.append("t-reopen", 0, &log).await.unwrap();
    first.close().await;
    let again = open_store(path.to_str().unwrap()).await.unwrap();
    assert_eq!(again.load("t-reopen").await.unwrap(), log);
}

/// Since migration 0010 an event's body leaves out what its row's columns hold; rows
/// written before it hold the whole event. Both read back as the same events, in a load,
/// a fork and the runs index alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_bodies_with_and_without_the_row_columns() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.db")).await.unwrap();
    let log = conformance::fixtures::rich_log("t-new");
    store.append("t-new", 0, &log).await.unwrap();
    let (body,): (String,) =
        sqlx::query_as("SELECT body FROM events WHERE thread_id = 't-new' AND seq = 0")
            .fetch_one(store.pool())
            .await
            .unwrap();
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    for column in ["seq", "ts", "thread_id", "run_id"] {
        assert!(
            body.get(column).is_none(),
            "{column} is in the body: {body}"
        );
    }
    assert_eq!(body["type"], serde_json::json!("run_started"), "{body}");
    // The same log as an earlier build wrote it: whole events in the body.
    let old = conformance::fixtures::rich_log("t-old");
    for event in &old {
        sqlx::query(
            "INSERT INTO events (thread_id, seq, type, run_id, ts, body) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&*event.thread_id)
        .bind(i64::try_from(event.seq).unwrap())
        .bind(event.kind.name())
        .bind(&*event.run_id)
        .bind(event.ts.timestamp_nanos_opt().unwrap())
        .bind(serde_json::to_string(event).unwrap())
        .execute(store.pool())
        .await
        .unwrap();
    }
    assert_eq!(store.load("t-new").await.unwrap(), log);
    assert_eq!(store.load("t-old").await.unwrap(), old);
    let forked = store.fork_thread("t-old", 2, "t-fork").await.unwrap();
    assert_eq!(forked, 3);
    let fork = store.load("t-fork").await.unwrap();
    assert_eq!(fork.len(), 3);
    for (copy, original) in fork.iter().zip(&old) {
        assert_eq!(&*copy.thread_id, "t-fork");
        assert_eq!(
            (copy.seq, copy.ts, &copy.run_id, &copy.kind),
            (original.seq, original.ts, &original.run_id, &original.kind)
        );
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_store_accepts_every_form() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(open("memory:").await.unwrap().backend, "memory");
    assert_eq!(
        open(&format!("sqlite:{}", dir.path().join("x.db").display()))
            .await
            .unwrap()
            .backend,
        "sqlite"
    );
    assert_eq!(
        open(dir.path().join("plain.db").to_str().unwrap())
            .await
            .unwrap()
            .backend,
        "sqlite"
    );
    for bad in [
        "",
        "mysql://root@localhost/db",
        "sqlite::memory:",
        "sqlite://x.db?cache=shared",
    ] {
        let err = open_store(bad)
            .await
            .err()
            .unwrap_or_else(|| panic!("{bad:?} must be rejected"));
        assert!(matches!(err, StoreError::Backend(_)), "{bad:?}: {err:?}");
    }
    let pg = open(&database_url()).await.unwrap();
    assert_eq!(pg.backend, "postgres");
    let alt = database_url().replacen("postgres://", "postgresql://", 1);
    assert_eq!(open(&alt).await.unwrap().backend, "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sqlite_stores_on_one_file_never_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    let both = RoundRobin {
        stores: vec![Arc::new(a.clone()), Arc::new(b.clone())],
        next: AtomicUsize::new(0),
    };
    if let Err(e) = conformance::concurrent_appenders(Arc::new(both)).await {
        panic!("{e}");
    }
    // Both see the same queue too.
    let queues: Vec<Arc<dyn RunQueue>> = vec![Arc::new(a), Arc::new(b)];
    shared_queue_exclusive(queues).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_pools_never_interleave() {
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    let a =
        PostgresStore::connect_with(PostgresOptions::new(database_url()).schema(schema.clone()))
            .await
            .unwrap();
    let b = PostgresStore::connect_with(PostgresOptions::new(database_url()).schema(schema))
        .await
        .unwrap();
    let both = RoundRobin {
        stores: vec![Arc::new(a.clone()), Arc::new(b.clone())],
        next: AtomicUsize::new(0),
    };
    let result = conformance::concurrent_appenders(Arc::new(both)).await;
    let queues: Vec<Arc<dyn RunQueue>> = vec![Arc::new(a.clone()), Arc::new(b.clone())];
    shared_queue_exclusive(queues).await;
    b.close().await;
    a.drop_schema().await.unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// An append that fails inside a group (here on a corrupt log: an event row without its
/// summary row, so the append's insert hits the primary key) fails alone, as a conflict,
/// and writes nothing; the appends sent at the same time (in the same groups) are all
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failing_append_in_a_group_fails_alone() {
    use keel_store::conformance::fixtures::{event, notice};
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    let store =
        PostgresStore::connect_with(PostgresOptions::new(database_url()).schema(schema.clone()))
            .await
            .unwrap();
    sqlx::query(
        "INSERT INTO events (thread_id, seq, type, run_id, ts, body) \
         VALUES ('t-corrupt', 0, 'notice', 'r', 0, '{}'::json)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let result = async {
        for round in 0..5 {
            let mut calls = Vec::new();
            for i in 0..24 {
                let thread = format!("t-good-{round}-{i}");
                let batch = vec![event(&thread, 0, 1, notice("good", "x"))];
                let s = store.clone();
                calls.push(tokio::spawn(
                    async move { s.append(&thread, 0, &batch).await },
                ));
            }
            let corrupt = vec![event("t-corrupt", 0, 1, notice("bad", "x"))];
            let s = store.clone();
            calls.push(tokio::spawn(async move {
                s.append("t-corrupt", 0, &corrupt).await
            }));
            let mut results = Vec::new();
            for call in calls {
                results.push(call.await.unwrap());
            }
            let (bad, good) = results.split_last().unwrap();
            assert!(
                matches!(bad, Err(StoreError::Conflict { .. })),
                "round {round}: the corrupt thread's append: {bad:?}"
            );
            for (i, result) in good.iter().enumerate() {
                assert!(result.is_ok(), "round {round}, append {i}: {result:?}");
                let log = store.load(&format!("t-good-{round}-{i}")).await.unwrap();
                assert_eq!(log.len(), 1, "round {round}, thread {i}");
            }
        }
        let corrupt: Vec<(String,)> =
            sqlx::query_as("SELECT type FROM events WHERE thread_id = 't-corrupt'")
                .fetch_all(store.pool())
                .await
                .unwrap();
        assert_eq!(corrupt, vec![("notice".to_string(),)]);
        let rows: (i64,) =
            sqlx::query_as("SELECT count(*) FROM threads WHERE thread_id = 't-corrupt'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(rows.0, 0, "the failed append left no summary row");
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    store.drop_schema().await.unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// 60 jobs, 8 workers spread over the given queue handles: each job leased exactly once.
async fn shared_queue_exclusive(queues: Vec<Arc<dyn RunQueue>>) {
    let first = queues[0].clone();
    for i in 0..60 {
        first
            .enqueue(&format!("shared-{i}"), &serde_json::json!({"i": i}))
            .await
            .unwrap();
    }
    let mut handles = Vec::new();
    for w in 0..8usize {
        let queue = queues[w % queues.len()].clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(lease) = queue
                .acquire(&format!("w{w}"), std::time::Duration::from_secs(60))
                .await
                .unwrap()
            {
                got.push(lease.job_id);
                queue.complete(&lease).await.unwrap();
            }
            got
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let distinct: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "every job leased once");
    assert_eq!(distinct.len(), 60, "no job leased twice");
    assert_eq!(first.counts().await.unwrap().done, 60);
}

/// Closing the store while appends are queued: every caller gets an answer (no hang),
/// each append that returned Ok is in the file, and writes after close fail saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_close_with_pending_appends_answers_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closing.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let mut handles = Vec::new();
    for i in 0..300 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("t-close-{i}");
            let batch = conformance::fixtures::rich_log(&id);
            (id, store.append(&format!("t-close-{i}"), 0, &batch).await)
        }));
    }
    let closer = {
        let store = store.clone();
        tokio::spawn(async move { store.close().await })
    };
    let answers = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        futures::future::join_all(handles),
    )
    .await
    .expect("every pending append is answered");
    tokio::time::timeout(std::time::Duration::from_secs(120), closer)
        .await
        .expect("close returns")
        .unwrap();
    let after = store
        .append("t-after", 0, &conformance::fixtures::rich_log("t-after"))
        .await;
    assert!(
        matches!(&after, Err(StoreError::Backend(m)) if m.contains("closed")),
        "{after:?}"
    );
    let reopened = SqliteStore::open(&path).await.unwrap();
    let mut ok = 0;
    for answer in answers {
        let (id, result) = answer.unwrap();
        let stored = reopened.load(&id).await.unwrap();
        match result {
            Ok(()) => {
                ok += 1;
                assert_eq!(stored.len(), 12, "{id} returned Ok but is not stored whole");
            }
            Err(StoreError::Backend(_)) => assert!(stored.is_empty(), "{id} failed but wrote"),
            Err(other) => panic!("{id}: unexpected {other:?}"),
        }
    }
    eprintln!("{ok} of 300 appends landed before close");
    reopened.close().await;
}

/// Crash safety: a child process appends as fast as it can and prints each append once
/// it returned Ok; after 400 acknowledgments it is killed with SIGKILL mid-appends. Every
/// acknowledged append must be in the file. (The child is this same test binary, run
/// with `KEEL_STORE_CRASH_CHILD` naming the database.)
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_acknowledged_appends_survive_sigkill() {
    use tokio::io::AsyncBufReadExt;
    const CHILD_ENV: &str = "KEEL_STORE_CRASH_CHILD";
    if let Ok(db) = std::env::var(CHILD_ENV) {
        crash_child(&db).await;
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &test_path("sqlite_acknowledged_appends_survive_sigkill"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked: Vec<(String, u64)> = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("acked ") {
                let (thread, len) = rest.split_once(' ').unwrap();
                acked.push((thread.to_string(), len.parse().unwrap()));
                if acked.len() >= 400 {
                    return true;
                }
            }
        }
        false
    };
    let enough = tokio::time::timeout(std::time::Duration::from_secs(300), read)
        .await
        .expect("the child acknowledges 400 appends");
    assert!(enough, "the child exited before acknowledging 400 appends");
    child.start_kill().unwrap(); // SIGKILL
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "the child was killed: {status:?}");
    let store = SqliteStore::open(&db).await.unwrap();
    for (thread, len) in &acked {
        let log = store.load(thread).await.unwrap();
        assert!(
            log.len() as u64 >= *len,
            "{thread}: acknowledged {len} events but {} are stored",
            log.len()
        );
        assert!(log.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    }
    store.close().await;
}

/// The child side of the SIGKILL test: 8 tasks appending 3-event batches to their own
/// threads forever, printing `acked THREAD LEN` after each append returned Ok.
#[cfg(unix)]
async fn crash_child(db: &str) {
    use std::io::Write;
    let store = SqliteStore::open(db).await.unwrap();
    let mut handles = Vec::new();
    for task in 0..8 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("t-crash-{task}");
            let mut next = 0u64;
            loop {
                let batch: Vec<Event> = (next..next + 3)
                    .map(|seq| {
                        conformance::fixtures::event(
                            &id,
                            seq,
                            0,
                            conformance::fixtures::notice("crash", "x"),
                        )
                    })
                    .collect();
                store.append(&id, next, &batch).await.unwrap();
                next += 3;
                let mut out = std::io::stdout().lock();
                writeln!(out, "acked {id} {next}").unwrap();
                out.flush().unwrap();
            }
        }));
    }
    // The tasks never end: the parent kills this process.
    futures::future::join_all(handles).await;
}

/// The full libtest name of test `name` of this module (`module::name`), to run it alone
/// in a copy of this test binary.
#[cfg(unix)]
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}

/// Postgres: index rows without current metrics facts — indexed before migration `0008`,
/// or moved on by a build without it — are folded again from the first event, so
/// `run_facts` equals the fold of every log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_without_current_facts_are_folded_again() {
    use keel_core::run_metrics::{FactsQuery, run_facts_by_folding};
    use keel_core::runs::RunQuery;
    use keel_store::conformance::fixtures::rich_log;
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::connect_with(PostgresOptions::new(database_url()).schema(schema))
        .await
        .unwrap();
    for i in 0..6 {
        let id = format!("thr_{i}");
        store.append(&id, 0, &rich_log(&id)).await.unwrap();
    }
    store.list_runs(&RunQuery::default()).await.unwrap();
    sqlx::query(
        "UPDATE run_index SET facts = NULL, fold_state = NULL, facts_count = NULL \
         WHERE thread_id < 'thr_3'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(
        "UPDATE run_index SET facts = '[]', facts_count = indexed_count - 1 \
         WHERE thread_id >= 'thr_3'",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let query = FactsQuery::default();
    let page = store.run_facts(&query).await.unwrap();
    assert_eq!(page.threads.len(), 6);
    assert_eq!(page, run_facts_by_folding(&store, &query).await.unwrap());
    assert!(page.threads.iter().all(|t| !t.runs[0].answers.is_empty()));
}
