//! [`SqliteStore`]: the default, embedded event-log store (one file, WAL journal).
//!
//! Every append is ONE `BEGIN IMMEDIATE` transaction: an `UPDATE` of the thread's summary
//! row guarded by the expected event count (the optimistic-concurrency check), one
//! multi-row `INSERT` of the events (a `UNIQUE(thread_id, seq)` constraint backs the
//! check), and the commit. `load` is one `SELECT` ordered by `seq`.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::event::Event;
use keel_core::store::{EventStore, StoreError, ThreadFilter, ThreadSummary, check_batch};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};

use crate::rows::{
    Batch, ThreadRow, backend, conflict, is_unique_violation, parse_event, status_columns, to_i64,
    ts_to_ns_saturating,
};

/// Where `keel` keeps its store by default, relative to the working directory.
pub const DEFAULT_SQLITE_PATH: &str = ".keel/keel.db";

/// Rows per multi-row `INSERT` (6 parameters each stays far below SQLite's limit).
const INSERT_CHUNK: usize = 1000;

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
    /// Pool size.
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
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("migrating SQLite store {}: {e}", path.display()))
            })?;
        Ok(Self { pool, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection pool (for advanced use and tests).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every connection (checkpointing the WAL).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| backend("sqlite begin", e))
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

async fn event_count(
    tx: &mut Transaction<'static, Sqlite>,
    thread_id: &str,
) -> Result<i64, StoreError> {
    let count: Option<i64> =
        sqlx::query_scalar("SELECT event_count FROM threads WHERE thread_id = ?1")
            .bind(thread_id)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| backend("sqlite read event_count", e))?;
    Ok(count.unwrap_or(0))
}

async fn insert_events(
    tx: &mut Transaction<'static, Sqlite>,
    thread_id: &str,
    batch: &Batch,
) -> Result<(), sqlx::Error> {
    for chunk in batch.rows.chunks(INSERT_CHUNK) {
        let mut builder: QueryBuilder<Sqlite> =
            QueryBuilder::new("INSERT INTO events (thread_id, seq, type, run_id, ts, body) ");
        builder.push_values(chunk, |mut b, row| {
            b.push_bind(thread_id)
                .push_bind(row.seq)
                .push_bind(row.kind)
                .push_bind(row.run_id.as_str())
                .push_bind(row.ts)
                .push_bind(row.body.as_str());
        });
        builder.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes a checked, non-empty batch inside `tx`: the guarded summary update (or insert
/// for a new thread), then the events.
async fn write_batch(
    tx: &mut Transaction<'static, Sqlite>,
    thread_id: &str,
    expected: u64,
    batch: &Batch,
) -> Result<(), StoreError> {
    let expected_i = to_i64("expected_next_seq", expected)?;
    let count = i64::try_from(batch.rows.len()).unwrap_or(i64::MAX);
    let (status, end_state) = match batch.status.map(status_columns) {
        Some((s, e)) => (Some(s), e),
        None => (None, None),
    };
    let updated = sqlx::query(
        "UPDATE threads SET event_count = event_count + ?1, status = COALESCE(?2, status), \
         end_state = CASE WHEN ?2 IS NULL THEN end_state ELSE ?3 END, agent = COALESCE(?4, agent), \
         updated_at = ?5 WHERE thread_id = ?6 AND event_count = ?7",
    )
    .bind(count)
    .bind(status)
    .bind(end_state)
    .bind(batch.agent.as_deref())
    .bind(batch.last_ts)
    .bind(thread_id)
    .bind(expected_i)
    .execute(&mut **tx)
    .await
    .map_err(|e| backend("sqlite update thread", e))?
    .rows_affected();
    if updated == 0 {
        if expected != 0 {
            return Err(conflict(
                thread_id,
                expected,
                event_count(tx, thread_id).await?,
            ));
        }
        let (status, end_state) = status_columns(batch.initial_status());
        let inserted = sqlx::query(
            "INSERT INTO threads (thread_id, agent, status, end_state, event_count, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (thread_id) DO NOTHING",
        )
        .bind(thread_id)
        .bind(batch.agent.as_deref())
        .bind(status)
        .bind(end_state)
        .bind(count)
        .bind(batch.first_ts)
        .bind(batch.last_ts)
        .execute(&mut **tx)
        .await
        .map_err(|e| backend("sqlite insert thread", e))?
        .rows_affected();
        if inserted == 0 {
            return Err(conflict(
                thread_id,
                expected,
                event_count(tx, thread_id).await?,
            ));
        }
    }
    match insert_events(tx, thread_id, batch).await {
        Ok(()) => Ok(()),
        Err(e) if is_unique_violation(&e) => Err(conflict(
            thread_id,
            expected,
            event_count(tx, thread_id).await?,
        )),
        Err(e) => Err(backend("sqlite insert events", e)),
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
        check_batch(thread_id, expected_next_seq, events)?;
        if events.is_empty() {
            let actual: Option<i64> =
                sqlx::query_scalar("SELECT event_count FROM threads WHERE thread_id = ?1")
                    .bind(thread_id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| backend("sqlite read event_count", e))?;
            let actual = actual.unwrap_or(0);
            return if to_i64("expected_next_seq", expected_next_seq)? == actual {
                Ok(())
            } else {
                Err(conflict(thread_id, expected_next_seq, actual))
            };
        }
        let batch = Batch::new(events)?;
        let mut tx = self.begin().await?;
        write_batch(&mut tx, thread_id, expected_next_seq, &batch).await?;
        tx.commit().await.map_err(|e| backend("sqlite commit", e))
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        let bodies: Vec<String> =
            sqlx::query_scalar("SELECT body FROM events WHERE thread_id = ?1 ORDER BY seq")
                .bind(thread_id)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("sqlite load", e))?;
        bodies
            .iter()
            .map(|body| parse_event(thread_id, body))
            .collect()
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at FROM threads WHERE 1 = 1",
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

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM events WHERE thread_id = ?1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("sqlite delete events", e))?;
        let gone = sqlx::query("DELETE FROM threads WHERE thread_id = ?1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("sqlite delete thread", e))?
            .rows_affected();
        tx.commit().await.map_err(|e| backend("sqlite commit", e))?;
        Ok(gone > 0)
    }

    async fn fork_thread(
        &self,
        source: &str,
        at_seq: u64,
        target: &str,
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let existing = event_count(&mut tx, target).await?;
        if existing != 0 {
            return Err(conflict(target, 0, existing));
        }
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT body FROM events WHERE thread_id = ?1 AND seq <= ?2 ORDER BY seq",
        )
        .bind(source)
        .bind(i64::try_from(at_seq).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| backend("sqlite fork read", e))?;
        if bodies.is_empty() {
            return Err(StoreError::NotFound(source.to_string()));
        }
        let events = crate::rows::rebase(source, target, &bodies)?;
        let batch = Batch::new(&events)?;
        write_batch(&mut tx, target, 0, &batch).await?;
        tx.commit().await.map_err(|e| backend("sqlite commit", e))?;
        Ok(events.len() as u64)
    }

    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let cutoff = ts_to_ns_saturating(cutoff);
        let mut tx = self.begin().await?;
        sqlx::query(
            "DELETE FROM events WHERE thread_id IN \
             (SELECT thread_id FROM threads WHERE status = 'ended' AND updated_at < ?1)",
        )
        .bind(cutoff)
        .execute(&mut *tx)
        .await
        .map_err(|e| backend("sqlite purge events", e))?;
        let purged = sqlx::query("DELETE FROM threads WHERE status = 'ended' AND updated_at < ?1")
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("sqlite purge threads", e))?
            .rows_affected();
        tx.commit().await.map_err(|e| backend("sqlite commit", e))?;
        Ok(purged)
    }
}
