//! [`SqliteStore`]: the default, embedded event-log store (one file, WAL journal).
//!
//! Every write goes through the store's group-commit writer
//! ([`crate::sqlite_writer`]): one thread, one connection, one transaction per group of
//! concurrent writes. An append is, inside that transaction and under its own savepoint,
//! the optimistic-concurrency check (the thread's last `seq`, read from the events'
//! `UNIQUE(thread_id, seq)` key, which also backs it), the summary row unless the thread
//! is running and stays so (migration `0004`: most batches write no summary page), and one
//! cached `INSERT` per event. Reads (`load`, queue lookups, `list_threads` — which takes a
//! running thread's count and time from its last event) see every append that has
//! returned; WAL lets them run beside the writer. `load` is one `SELECT` ordered by `seq`.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::event::Event;
use keel_core::store::{
    AppendDurability, AppendFence, EventStore, StoreError, ThreadFilter, ThreadStatus,
    ThreadSummary, check_batch,
};
use rusqlite::{Connection, OptionalExtension, params};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite};

use crate::rows::{
    Batch, BodyFormat, FencedRow, ThreadRow, backend, conflict, fence_refusal, status_columns,
    to_i64, ts_to_ns_saturating,
};
use crate::sqlite_reader::{SqliteReader, read_events};
use crate::sqlite_writer::{Guard, SqliteWriter, WriterConfig};

/// Where `keel` keeps its store by default, relative to the working directory.
pub const DEFAULT_SQLITE_PATH: &str = ".keel/keel.db";

/// How hard SQLite works to keep a committed transaction across a power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=NORMAL` in WAL mode: a commit survives a crash of the process (even
    /// `SIGKILL`); the last transactions may be lost on an OS crash or power loss. One
    /// fsync per checkpoint instead of per commit. The default.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is fsynced before it returns.
    Full,
}

/// Settings for [`SqliteStore::open_with`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Database file; parent directories are created.
    pub path: PathBuf,
    /// Sync level.
    pub durability: Durability,
    /// How long a writer waits for the write lock before failing.
    pub busy_timeout: Duration,
    /// Size of the read pool (`load`, `list_threads`, queue lookups). Writes always go
    /// through one writer connection.
    pub max_connections: u32,
}

impl SqliteOptions {
    /// Defaults for a file: `Durability::Normal`, 5 s busy timeout, 4 connections.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::Normal,
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
        }
    }
}

/// The SQLite event store (also a [`crate::RunQueue`]).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    pub(crate) writer: Arc<SqliteWriter>,
    reader: Arc<SqliteReader>,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (creating it and its parent directories if needed) the database at `path`
    /// with default settings, and applies the embedded migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(SqliteOptions::new(path.as_ref())).await
    }

    /// Opens with explicit settings.
    pub async fn open_with(options: SqliteOptions) -> Result<Self, StoreError> {
        let path = options.path.clone();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent).await.map_err(|e| {
                StoreError::Backend(format!(
                    "cannot create directory {} for the SQLite store: {e} (choose another path with --store)",
                    parent.display()
                ))
            })?;
        }
        let connect = SqliteConnectOptions::from_str("sqlite:")
            .map_err(|e| backend("sqlite options", e))?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.durability {
                Durability::Normal => SqliteSynchronous::Normal,
                Durability::Full => SqliteSynchronous::Full,
            })
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.busy_timeout.saturating_add(Duration::from_secs(5)))
            .connect_with(connect)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("cannot open SQLite store {}: {e}", path.display()))
            })?;
        crate::migrations::migrator(crate::migrations::SQLITE)
            .run(&pool)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("migrating SQLite store {}: {e}", path.display()))
            })?;
        let writer = SqliteWriter::start(WriterConfig {
            path: path.clone(),
            full_sync: options.durability == Durability::Full,
            busy_timeout: options.busy_timeout,
        })
        .await;
        let writer = match writer {
            Ok(writer) => Arc::new(writer),
            Err(e) => {
                pool.close().await;
                return Err(e);
            }
        };
        let reader = Arc::new(SqliteReader::new(path.clone(), options.busy_timeout));
        Ok(Self {
            pool,
            writer,
            reader,
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The read pool (for advanced use and tests). Write through the store: a write on
    /// this pool waits for the writer's lock like another process would.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes the store for every clone: writes already queued finish (their callers get
    /// their results), later writes fail with [`StoreError::Backend`]; then every
    /// connection is closed (checkpointing the WAL).
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close();
        self.pool.close().await;
    }
}

fn summary_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<ThreadSummary, StoreError> {
    let decode = |e: sqlx::Error| backend("sqlite decode thread row", e);
    ThreadRow {
        thread_id: row.try_get("thread_id").map_err(decode)?,
        agent: row.try_get("agent").map_err(decode)?,
        status: row.try_get("status").map_err(decode)?,
        end_state: row.try_get("end_state").map_err(decode)?,
        event_count: row.try_get("event_count").map_err(decode)?,
        created_at: row.try_get("created_at").map_err(decode)?,
        updated_at: row.try_get("updated_at").map_err(decode)?,
    }
    .into_summary()
}

/// The event count of a thread (0 when it does not exist), on the writer's connection:
/// the last `seq` plus one, read from the events' `(thread_id, seq)` key.
fn event_count(conn: &Connection, thread_id: &str) -> Result<i64, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT max(seq) FROM events WHERE thread_id = ?1")
        .map_err(|e| backend("sqlite read the last seq", e))?;
    let last: Option<i64> = stmt
        .query_row([thread_id], |row| row.get(0))
        .map_err(|e| backend("sqlite read the last seq", e))?;
    Ok(last.map_or(0, |seq| seq.saturating_add(1)))
}

/// Whether a rusqlite error is a UNIQUE / PRIMARY KEY violation.
fn is_unique_violation_rs(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error().map(|e| e.extended_code),
        Some(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
    )
}

/// Most rows in one `INSERT` (6 parameters each: far below SQLite's parameter limit).
const ROWS_PER_INSERT: usize = 16;

/// The `INSERT` of `n` event rows (1..=[`ROWS_PER_INSERT`]), built once per row count.
fn insert_sql(n: usize) -> &'static str {
    static SQL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let all = SQL.get_or_init(|| {
        (1..=ROWS_PER_INSERT)
            .map(|n| {
                let values = vec!["(?, ?, ?, ?, ?, ?)"; n].join(", ");
                format!(
                    "INSERT OR FAIL INTO events (thread_id, seq, type, run_id, ts, body) \
                     VALUES {values}"
                )
            })
            .collect()
    });
    all.get(n.clamp(1, ROWS_PER_INSERT) - 1)
        .map_or("", String::as_str)
}

/// Inserts the rows of a batch, up to [`ROWS_PER_INSERT`] per cached statement: one
/// statement per batch instead of one per event (W1: 10 executions per conversation → 3,
/// each with its cache lookup and bindings).
///
/// `OR FAIL`, not the default `OR ABORT`: an aborting multi-row `INSERT` makes SQLite copy
/// every page it touches into a statement journal first, to undo the statement's own
/// rows should a later row fail (15 % of the SQLite store's instructions in W1). A row
/// here cannot fail — [`write_batch`] has checked the thread's last `seq` under the write
/// lock and the batch's seqs follow it — and should one fail anyway, the rows before it
/// are undone with the job: a lone job's transaction is rolled back, and in a group the
/// writer sees the changes of a failed [`Guard::Unwritten`] job and rolls the whole group
/// back (`sqlite_writer::run_group`).
fn insert_events(conn: &Connection, thread_id: &str, batch: &Batch) -> Result<(), rusqlite::Error> {
    for chunk in batch.rows.chunks(ROWS_PER_INSERT) {
        let mut stmt = conn.prepare_cached(insert_sql(chunk.len()))?;
        let mut index = 0;
        let mut bind = |value: &dyn rusqlite::ToSql| {
            index += 1;
            stmt.raw_bind_parameter(index, value)
        };
        for row in chunk {
            bind(&thread_id)?;
            bind(&row.seq)?;
            bind(&row.kind)?;
            bind(&&*row.run_id)?;
            bind(&row.ts)?;
            bind(&batch.body(row))?;
        }
        stmt.raw_execute()?;
    }
    Ok(())
}

/// What a batch checks and reads before writing: the thread's event count (its last
/// `seq` plus one, from the events' `(thread_id, seq)` key) and its summary row's status
/// (`None`: no row yet), in one statement.
fn thread_position(
    conn: &Connection,
    thread_id: &str,
) -> Result<(i64, Option<String>), StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT (SELECT max(seq) FROM events WHERE thread_id = ?1), \
             (SELECT status FROM threads WHERE thread_id = ?1)",
        )
        .map_err(|e| backend("sqlite read the thread's position", e))?;
    let (last, status): (Option<i64>, Option<String>) = stmt
        .query_row([thread_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(|e| backend("sqlite read the thread's position", e))?;
    Ok((last.map_or(0, |seq| seq.saturating_add(1)), status))
}

/// Writes a checked, non-empty batch on the writer's connection (inside its group
/// transaction): the optimistic-concurrency check against the events' last `seq`, the
/// summary row (inserted for a new thread; updated unless the thread is running and stays
/// so with the same agent — migration `0004`), then the events. It checks before it
/// writes, so a conflict writes nothing (appends run without a savepoint of their own:
/// [`Guard::Unwritten`]).
fn write_batch(
    conn: &Connection,
    thread_id: &str,
    expected: u64,
    batch: &Batch,
) -> Result<(), StoreError> {
    let expected_i = to_i64("expected_next_seq", expected)?;
    let (actual, stored_status) = thread_position(conn, thread_id)?;
    if actual != expected_i {
        return Err(conflict(thread_id, expected, actual));
    }
    let count = i64::try_from(batch.rows.len()).unwrap_or(i64::MAX);
    if stored_status.is_none() {
        let (status, end_state) = status_columns(batch.initial_status());
        conn.prepare_cached(
            "INSERT INTO threads (thread_id, agent, status, end_state, event_count, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                thread_id,
                batch.agent.as_deref(),
                status,
                end_state,
                expected_i.saturating_add(count),
                batch.first_ts,
                batch.last_ts
            ])
        })
        .map_err(|e| backend("sqlite insert thread", e))?;
    } else if stored_status.as_deref() != Some("running")
        || batch.status.is_some_and(|s| s != ThreadStatus::Running)
        || batch.agent.is_some()
    {
        // The row is rewritten unless the thread is running and stays so with the same
        // agent (most batches, which skip this statement): a running thread's count and
        // time are read from its last event instead (`list_threads`), every other row
        // stays exact.
        let (status, end_state) = match batch.status.map(status_columns) {
            Some((s, e)) => (Some(s), e),
            None => (None, None),
        };
        conn.prepare_cached(
            "UPDATE threads SET status = COALESCE(?1, status), \
             end_state = CASE WHEN ?1 IS NULL THEN end_state ELSE ?2 END, \
             agent = COALESCE(?3, agent), event_count = ?4, updated_at = ?5 WHERE thread_id = ?6 \
             AND (status <> 'running' OR (?1 IS NOT NULL AND (status IS NOT ?1 OR end_state IS NOT ?2)) \
                  OR (?3 IS NOT NULL AND agent IS NOT ?3))",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                status,
                end_state,
                batch.agent.as_deref(),
                expected_i.saturating_add(count),
                batch.last_ts,
                thread_id
            ])
        })
        .map_err(|e| backend("sqlite update thread", e))?;
    }
    match insert_events(conn, thread_id, batch) {
        Ok(()) => Ok(()),
        Err(e) if is_unique_violation_rs(&e) => {
            Err(conflict(thread_id, expected, event_count(conn, thread_id)?))
        }
        Err(e) => Err(backend("sqlite insert events", e)),
    }
}

/// Store-side fencing ([`AppendFence`]): fails unless `fence`'s job is still leased with
/// its token and unexpired by the queue's clock. Runs in the append's own transaction on
/// the one writer, so no takeover can commit between this check and the append.
fn check_fence(conn: &Connection, thread_id: &str, fence: AppendFence) -> Result<(), StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT state, lease_token, COALESCE(lease_expires_at > ?2, 0) FROM run_queue WHERE job_id = ?1",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![fence.job_id, crate::queue::sqlite::now_ns()], |row| {
                Ok(FencedRow {
                    state: row.get(0)?,
                    token: row.get(1)?,
                    live: row.get(2)?,
                })
            })
            .optional()
        })
        .map_err(|e| backend("sqlite check the append's lease", e))?;
    fence_refusal(thread_id, fence, found).map_or(Ok(()), Err)
}

impl SqliteStore {
    /// Appends owned or shared events alike (serialized on the caller's task), after
    /// checking `fence` in the same transaction when there is one.
    async fn append_events<E: Borrow<Event>>(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[E],
        durability: AppendDurability,
        fence: Option<AppendFence>,
    ) -> Result<(), StoreError> {
        check_batch(
            thread_id,
            expected_next_seq,
            events.iter().map(Borrow::borrow),
        )?;
        let thread = thread_id.to_string();
        if events.is_empty() {
            let expected_i = to_i64("expected_next_seq", expected_next_seq)?;
            return self
                .writer
                .call_guarded(durability, Guard::Unwritten, move |conn: &Connection| {
                    if let Some(fence) = fence {
                        check_fence(conn, &thread, fence)?;
                    }
                    let actual = event_count(conn, &thread)?;
                    if actual == expected_i {
                        Ok(())
                    } else {
                        Err(conflict(&thread, expected_next_seq, actual))
                    }
                })
                .await;
        }
        // Serializing happens here, on the caller's task, not on the writer thread.
        let batch = Batch::new(events, BodyFormat::WithoutColumns)?;
        // Guard::Unwritten: write_batch checks before it writes (sqlite_writer docs).
        self.writer
            .call_guarded(durability, Guard::Unwritten, move |conn: &Connection| {
                if let Some(fence) = fence {
                    check_fence(conn, &thread, fence)?;
                }
                write_batch(conn, &thread, expected_next_seq, &batch)
            })
            .await
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        self.append_with(
            thread_id,
            expected_next_seq,
            events,
            AppendDurability::Default,
        )
        .await
    }

    async fn append_with(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        self.append_events(thread_id, expected_next_seq, events, durability, None)
            .await
    }

    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        self.append_events(thread_id, expected_next_seq, events, durability, None)
            .await
    }

    fn fences_appends(&self) -> bool {
        true
    }

    async fn append_fenced(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
        fence: AppendFence,
    ) -> Result<(), StoreError> {
        self.append_events(
            thread_id,
            expected_next_seq,
            events,
            durability,
            Some(fence),
        )
        .await
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.reader.load(thread_id).await
    }

    async fn load_from(&self, thread_id: &str, from_seq: u64) -> Result<Vec<Event>, StoreError> {
        self.reader.load_from(thread_id, from_seq).await
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        // A running thread's summary row is not rewritten by every append (migration
        // `0004`): its count and time come from its last event; every other row is exact.
        let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at FROM ( \
             SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at \
             FROM threads WHERE status <> 'running' \
             UNION ALL \
             SELECT t.thread_id, t.agent, t.status, t.end_state, e.seq + 1, t.created_at, e.ts \
             FROM threads t JOIN events e ON e.rowid = (SELECT m.rowid FROM events m \
             WHERE m.thread_id = t.thread_id ORDER BY m.seq DESC LIMIT 1) \
             WHERE t.status = 'running') WHERE 1 = 1",
        );
        if let Some(agent) = &filter.agent {
            q.push(" AND agent = ").push_bind(agent.clone());
        }
        if let Some(since) = filter.updated_since {
            q.push(" AND updated_at >= ")
                .push_bind(ts_to_ns_saturating(since));
        }
        if let Some(status) = filter.status {
            let (s, e) = status_columns(status);
            q.push(" AND status = ").push_bind(s);
            if let Some(e) = e {
                q.push(" AND end_state = ").push_bind(e);
            }
        }
        if let Some(prefix) = &filter.id_prefix {
            // Bytes, not LIKE: `_` and `%` in a prefix are themselves.
            q.push(" AND substr(CAST(thread_id AS BLOB), 1, ")
                .push_bind(i64::try_from(prefix.len()).unwrap_or(i64::MAX))
                .push(") = CAST(")
                .push_bind(prefix.clone())
                .push(" AS BLOB)");
        }
        q.push(" ORDER BY updated_at DESC, thread_id ASC");
        if let Some(limit) = filter.limit {
            q.push(" LIMIT ")
                .push_bind(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let rows = q
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(|e| backend("sqlite list threads", e))?;
        rows.iter().map(summary_from_row).collect()
    }

    async fn list_runs(
        &self,
        query: &keel_core::runs::RunQuery,
    ) -> Result<keel_core::runs::RunPage, StoreError> {
        crate::run_index::sqlite::list_runs(self, query).await
    }

    async fn run_facts(
        &self,
        query: &keel_core::run_metrics::FactsQuery,
    ) -> Result<keel_core::run_metrics::FactsPage, StoreError> {
        crate::run_index::sqlite::run_facts(self, query).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        let thread = thread_id.to_string();
        self.writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                conn.execute("DELETE FROM events WHERE thread_id = ?1", [&thread])
                    .map_err(|e| backend("sqlite delete events", e))?;
                // Its jobs (their payloads hold the user's messages) but one a worker
                // holds, and its cancellations. One writer: no append or enqueue between.
                conn.execute(
                    "DELETE FROM run_queue WHERE thread_id = ?1 AND state <> 'leased'",
                    [&thread],
                )
                .map_err(|e| backend("sqlite delete thread's jobs", e))?;
                conn.execute(
                    "DELETE FROM run_cancellations WHERE thread_id = ?1",
                    [&thread],
                )
                .map_err(|e| backend("sqlite delete thread's cancellations", e))?;
                let gone = conn
                    .execute("DELETE FROM threads WHERE thread_id = ?1", [&thread])
                    .map_err(|e| backend("sqlite delete thread", e))?;
                Ok(gone > 0)
            })
            .await
    }

    async fn fork_thread(
        &self,
        source: &str,
        at_seq: u64,
        target: &str,
    ) -> Result<u64, StoreError> {
        let (source, target) = (source.to_string(), target.to_string());
        self.writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                let existing = event_count(conn, &target)?;
                if existing != 0 {
                    return Err(conflict(&target, 0, existing));
                }
                // Read as the target's events: the body holds no thread id (`BodyFormat`).
                let events = read_events(
                    conn,
                    "SELECT seq, ts, run_id, body FROM events WHERE thread_id = ?1 AND seq <= ?2 \
                     ORDER BY seq",
                    params![source, i64::try_from(at_seq).unwrap_or(i64::MAX)],
                    &target,
                )?;
                if events.is_empty() {
                    return Err(StoreError::NotFound(source));
                }
                let batch = Batch::new(&events, BodyFormat::WithoutColumns)?;
                write_batch(conn, &target, 0, &batch)?;
                Ok(events.len() as u64)
            })
            .await
    }

    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let cutoff = ts_to_ns_saturating(cutoff);
        self.writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                // An ended thread's summary row is exact (migration `0004`).
                conn.execute(
                    "DELETE FROM events WHERE thread_id IN \
                     (SELECT thread_id FROM threads WHERE status = 'ended' AND updated_at < ?1)",
                    [cutoff],
                )
                .map_err(|e| backend("sqlite purge events", e))?;
                let purged = conn
                    .execute(
                        "DELETE FROM threads WHERE status = 'ended' AND updated_at < ?1",
                        [cutoff],
                    )
                    .map_err(|e| backend("sqlite purge threads", e))?;
                Ok(purged as u64)
            })
            .await
    }
}
