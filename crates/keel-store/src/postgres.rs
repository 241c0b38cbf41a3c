//! [`PostgresStore`]: the event-log store for several processes sharing one database.
//!
//! Appends go through the group-commit writer ([`crate::postgres_writer`]): the appends of
//! all concurrent runs of this process are gathered into one call of the
//! `keel_append_group` SQL function, one transaction. In it, each append is an `UPDATE` of
//! the thread's summary row guarded by the expected event count (Postgres row locks make
//! concurrent appenders on one thread — in this process or another — queue behind each
//! other; the loser re-checks the guard and gets a conflict, so there is exactly one
//! winner per seq), then one `INSERT ... SELECT FROM UNNEST(...)` of its batch, backed by
//! the `(thread_id, seq)` primary key (one subtransaction per group, one per append when
//! something raises: [`crate::postgres_writer`]). Fork, delete, purge
//! and the run queue use the pool directly. `load` is one `SELECT`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::event::Event;
use keel_core::store::{EventStore, StoreError, ThreadFilter, ThreadSummary, check_batch};

use crate::postgres_writer::PgGroupWriter;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, Postgres, QueryBuilder, Row, Transaction};

use crate::rows::{
    Batch, BodyFormat, ThreadRow, backend, conflict, is_unique_violation, parse_event, rebase,
    status_columns, to_i64, ts_to_ns_saturating,
};

/// Settings for [`PostgresStore::connect_with`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host:port/db` (any libpq-style URL sqlx accepts).
    pub url: String,
    /// Keep all tables in this schema (created if missing) instead of the default search
    /// path. Letters, digits and `_` only.
    pub schema: Option<String>,
    /// Pool size.
    pub max_connections: u32,
    /// How long to wait for a connection (also the connect timeout).
    pub acquire_timeout: Duration,
    /// Server-side `statement_timeout` for every statement.
    pub statement_timeout: Duration,
}

impl PostgresOptions {
    /// Defaults: no schema, 10 connections, 10 s acquire timeout, 30 s statement timeout.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
        }
    }

    /// Sets [`PostgresOptions::schema`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }
}

/// The Postgres event store (also a [`crate::RunQueue`]).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pub(crate) pool: PgPool,
    writer: Arc<PgGroupWriter>,
    schema: Option<String>,
}

fn valid_schema(schema: &str) -> bool {
    !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit())
}

impl PostgresStore {
    /// Connects with default settings and applies the embedded migrations.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(PostgresOptions::new(url)).await
    }

    /// Connects with explicit settings and applies the embedded migrations.
    pub async fn connect_with(options: PostgresOptions) -> Result<Self, StoreError> {
        let mut connect = PgConnectOptions::from_str(&options.url).map_err(|e| {
            StoreError::Backend(format!(
                "invalid Postgres URL (expected postgres://user@host:port/db): {e}"
            ))
        })?;
        let timeout_ms = options.statement_timeout.as_millis().to_string();
        // synchronous_commit=on whatever the server's default: a returned append is on the
        // server's stable storage (what `AppendDurability::Sync` asks for).
        let mut settings = vec![
            ("statement_timeout", timeout_ms),
            ("synchronous_commit", "on".to_string()),
        ];
        if let Some(schema) = &options.schema {
            if !valid_schema(schema) {
                return Err(StoreError::Backend(format!(
                    "invalid Postgres schema name {schema:?}: use letters, digits and _ only"
                )));
            }
            let mut conn = tokio::time::timeout(options.acquire_timeout, connect.connect())
                .await
                .map_err(|_| {
                    StoreError::Backend(format!(
                        "connecting to Postgres timed out after {:?}",
                        options.acquire_timeout
                    ))
                })?
                .map_err(|e| backend("connecting to Postgres", e))?;
            let create = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
            match conn.execute(sqlx::AssertSqlSafe(create)).await {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(backend("creating Postgres schema", e)),
            }
            conn.close().await.ok();
            settings.push(("search_path", format!("\"{schema}\"")));
        }
        connect = connect.options(settings);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| {
                StoreError::Backend(format!(
                    "cannot connect to Postgres: {e} (check the URL and that the server is running)"
                ))
            })?;
        crate::migrations::migrator(crate::migrations::POSTGRES)
            .run(&pool)
            .await
            .map_err(|e| backend("migrating Postgres store", e))?;
        // Half the pool at most for append groups; reads and the queue keep the rest.
        let in_flight = usize::try_from(options.max_connections / 2)
            .unwrap_or(1)
            .clamp(1, 4);
        let call_timeout = options
            .statement_timeout
            .saturating_add(options.acquire_timeout);
        let writer = Arc::new(PgGroupWriter::start(pool.clone(), in_flight, call_timeout));
        Ok(Self {
            pool,
            writer,
            schema: options.schema,
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema given at connect time.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Drops this store's schema with everything in it and closes the pool (for tests
    /// that use a throw-away schema). Does nothing to the database without a schema.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        self.writer.close().await;
        if let Some(schema) = &self.schema {
            let drop = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
            self.pool
                .execute(sqlx::AssertSqlSafe(drop))
                .await
                .map_err(|e| backend("dropping schema", e))?;
        }
        self.pool.close().await;
        Ok(())
    }

    /// Closes the store for every clone: queued appends are answered first, later ones
    /// fail with [`StoreError::Backend`]; then every connection is closed.
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        self.pool
            .begin()
            .await
            .map_err(|e| backend("postgres begin", e))
    }
}

async fn event_count(
    tx: &mut Transaction<'static, Postgres>,
    thread_id: &str,
) -> Result<i64, StoreError> {
    let count: Option<i64> =
        sqlx::query_scalar("SELECT event_count FROM threads WHERE thread_id = $1")
            .bind(thread_id)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| backend("postgres read event_count", e))?;
    Ok(count.unwrap_or(0))
}

async fn insert_events(
    tx: &mut Transaction<'static, Postgres>,
    thread_id: &str,
    batch: &Batch,
) -> Result<(), sqlx::Error> {
    let seqs: Vec<i64> = batch.rows.iter().map(|r| r.seq).collect();
    let kinds: Vec<&str> = batch.rows.iter().map(|r| r.kind).collect();
    let runs: Vec<&str> = batch.rows.iter().map(|r| &*r.run_id).collect();
    let ts: Vec<i64> = batch.rows.iter().map(|r| r.ts).collect();
    let bodies: Vec<&str> = batch.rows.iter().map(|r| batch.body(r)).collect();
    sqlx::query(
        "INSERT INTO events (thread_id, seq, type, run_id, ts, body) \
         SELECT $1, u.seq, u.kind, u.run_id, u.ts, u.body::json \
         FROM UNNEST($2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::text[]) AS u(seq, kind, run_id, ts, body)",
    )
    .bind(thread_id)
    .bind(seqs)
    .bind(kinds)
    .bind(runs)
    .bind(ts)
    .bind(bodies)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_batch(
    tx: &mut Transaction<'static, Postgres>,
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
        "UPDATE threads SET event_count = event_count + $1, status = COALESCE($2, status), \
         end_state = CASE WHEN $2::text IS NULL THEN end_state ELSE $3 END, agent = COALESCE($4, agent), \
         updated_at = $5 WHERE thread_id = $6 AND event_count = $7",
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
    .map_err(|e| backend("postgres update thread", e))?
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
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (thread_id) DO NOTHING",
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
        .map_err(|e| backend("postgres insert thread", e))?
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
        Err(e) if is_unique_violation(&e) => {
            Err(conflict(thread_id, expected, expected_i.saturating_add(1)))
        }
        Err(e) => Err(backend("postgres insert events", e)),
    }
}

fn summary_from_row(row: &sqlx::postgres::PgRow) -> Result<ThreadSummary, StoreError> {
    let decode = |e: sqlx::Error| backend("postgres decode thread row", e);
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

impl PostgresStore {
    /// Appends owned or shared events alike (serialized on the caller's task), written only
    /// while `fence` holds when there is one (an empty batch writes nothing, so it only has
    /// its position checked).
    async fn append_events<E: std::borrow::Borrow<Event>>(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[E],
        fence: Option<keel_core::AppendFence>,
    ) -> Result<(), StoreError> {
        check_batch(
            thread_id,
            expected_next_seq,
            events.iter().map(std::borrow::Borrow::borrow),
        )?;
        if events.is_empty() {
            let actual: Option<i64> =
                sqlx::query_scalar("SELECT event_count FROM threads WHERE thread_id = $1")
                    .bind(thread_id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| backend("postgres read event_count", e))?;
            let actual = actual.unwrap_or(0);
            return if to_i64("expected_next_seq", expected_next_seq)? == actual {
                Ok(())
            } else {
                Err(conflict(thread_id, expected_next_seq, actual))
            };
        }
        let expected = to_i64("expected_next_seq", expected_next_seq)?;
        // Serializing happens here, on the caller's task, before the group is formed.
        let batch = Batch::new(events, BodyFormat::Whole)?;
        self.writer
            .append(thread_id.to_string(), expected, batch, fence)
            .await
    }
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        self.append_events(thread_id, expected_next_seq, events, None)
            .await
    }

    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[std::sync::Arc<Event>],
        _durability: keel_core::AppendDurability,
    ) -> Result<(), StoreError> {
        // Every Postgres commit is synchronous: there is no weaker level to honour.
        self.append_events(thread_id, expected_next_seq, events, None)
            .await
    }

    fn fences_appends(&self) -> bool {
        true
    }

    async fn append_fenced(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[std::sync::Arc<Event>],
        _durability: keel_core::AppendDurability,
        fence: keel_core::AppendFence,
    ) -> Result<(), StoreError> {
        self.append_events(thread_id, expected_next_seq, events, Some(fence))
            .await
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.load_from(thread_id, 0).await
    }

    async fn load_from(&self, thread_id: &str, from_seq: u64) -> Result<Vec<Event>, StoreError> {
        // Sequence numbers are BIGINT: one past i64::MAX matches nothing.
        let Ok(from_seq) = i64::try_from(from_seq) else {
            return Ok(Vec::new());
        };
        let bodies: Vec<String> = sqlx::query_scalar(
            "SELECT body::text FROM events WHERE thread_id = $1 AND seq >= $2 ORDER BY seq",
        )
        .bind(thread_id)
        .bind(from_seq)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| backend("postgres load", e))?;
        bodies
            .iter()
            .map(|body| parse_event(thread_id, body))
            .collect()
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
            "SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at FROM threads WHERE TRUE",
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
            // `starts_with`, not LIKE: `_` and `%` in a prefix are themselves.
            q.push(" AND starts_with(thread_id, ")
                .push_bind(prefix.clone())
                .push(")");
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
            .map_err(|e| backend("postgres list threads", e))?;
        rows.iter().map(summary_from_row).collect()
    }

    async fn list_runs(
        &self,
        query: &keel_core::runs::RunQuery,
    ) -> Result<keel_core::runs::RunPage, StoreError> {
        crate::run_index::postgres::list_runs(self, query).await
    }

    async fn run_facts(
        &self,
        query: &keel_core::run_metrics::FactsQuery,
    ) -> Result<keel_core::run_metrics::FactsPage, StoreError> {
        crate::run_index::postgres::run_facts(self, query).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        // The thread's row first: an append committing meanwhile waits for this delete and
        // then finds the thread gone (a conflict), instead of leaving events that no thread
        // holds; then the queue's lock of the thread, so no job of it is enqueued meanwhile.
        for (sql, what) in [
            (
                "SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE",
                "postgres lock thread",
            ),
            (
                crate::queue::LOCK_THREAD_SQL,
                "postgres lock thread's queue",
            ),
            (
                "DELETE FROM events WHERE thread_id = $1",
                "postgres delete events",
            ),
            // Its jobs (their payloads hold the user's messages), but not one a worker
            // holds: that worker ends it.
            (
                "DELETE FROM run_queue WHERE thread_id = $1 AND state <> 'leased'",
                "postgres delete thread's jobs",
            ),
            (
                "DELETE FROM run_cancellations WHERE thread_id = $1",
                "postgres delete thread's cancellations",
            ),
        ] {
            sqlx::query(sql)
                .bind(thread_id)
                .execute(&mut *tx)
                .await
                .map_err(|e| backend(what, e))?;
        }
        let gone = sqlx::query("DELETE FROM threads WHERE thread_id = $1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("postgres delete thread", e))?
            .rows_affected();
        tx.commit()
            .await
            .map_err(|e| backend("postgres commit", e))?;
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
            "SELECT body::text FROM events WHERE thread_id = $1 AND seq <= $2 ORDER BY seq",
        )
        .bind(source)
        .bind(i64::try_from(at_seq).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| backend("postgres fork read", e))?;
        if bodies.is_empty() {
            return Err(StoreError::NotFound(source.to_string()));
        }
        let events = rebase(source, target, &bodies)?;
        let batch = Batch::new(&events, BodyFormat::Whole)?;
        write_batch(&mut tx, target, 0, &batch).await?;
        tx.commit()
            .await
            .map_err(|e| backend("postgres commit", e))?;
        Ok(events.len() as u64)
    }

    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let cutoff = ts_to_ns_saturating(cutoff);
        let mut tx = self.begin().await?;
        let ids: Vec<String> = sqlx::query_scalar(
            "DELETE FROM threads WHERE status = 'ended' AND updated_at < $1 RETURNING thread_id",
        )
        .bind(cutoff)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| backend("postgres purge threads", e))?;
        sqlx::query("DELETE FROM events WHERE thread_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("postgres purge events", e))?;
        tx.commit()
            .await
            .map_err(|e| backend("postgres commit", e))?;
        Ok(ids.len() as u64)
    }
}
