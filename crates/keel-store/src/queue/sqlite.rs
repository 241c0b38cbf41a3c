//! The run queue on SQLite. Each update is a single statement run by the store's writer
//! thread (inside its group transaction, like appends); SQLite serializes writers, so
//! `acquire` (one `UPDATE ... WHERE job_id = (SELECT ... LIMIT 1) RETURNING`) can never
//! hand one job to two workers, nor two jobs of one thread, in this process or another.
//! Lookups use the read pool. Lease times use this process's clock.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use keel_core::store::AppendDurability;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use sqlx::Row;

use super::{
    HOLDER_FIRST_SQL, Holding, JobId, JobInfo, JobState, Lease, NOTHING_AHEAD_SQL, QueueCounts,
    QueueError, RunQueue, backend, capped_error, check_claim, check_worker, claim_payload,
    delay_ns, to_u32, to_u64, ttl_ns,
};
use crate::SqliteStore;

/// The store's one clock for leases (and the fence of an append, `crate::sqlite`): every
/// process on a SQLite file runs on its machine, so this is the machine's real-time clock,
/// the one SQLite's own `'now'` reads.
pub(crate) fn now_ns() -> i64 {
    crate::rows::ts_to_ns_saturating(Utc::now())
}

fn lease_from_row(row: &rusqlite::Row<'_>, worker_id: &str) -> rusqlite::Result<RawLease> {
    Ok(RawLease {
        job_id: row.get("job_id")?,
        thread_id: row.get("thread_id")?,
        payload: row.get("payload")?,
        worker_id: worker_id.to_string(),
        token: row.get("lease_token")?,
        expires_at: row.get("lease_expires_at")?,
        attempts: row.get("attempts")?,
    })
}

/// A leased row as read on the writer thread (decoded into a [`Lease`] by the caller).
struct RawLease {
    job_id: i64,
    thread_id: String,
    payload: String,
    worker_id: String,
    token: i64,
    expires_at: i64,
    attempts: i64,
}

impl RawLease {
    fn into_lease(self) -> Result<Lease, QueueError> {
        Ok(Lease {
            job_id: self.job_id,
            thread_id: self.thread_id,
            payload: serde_json::from_str(&self.payload)
                .map_err(|e| backend("stored payload does not parse", e))?,
            worker_id: self.worker_id,
            token: to_u64(self.token),
            expires_at: crate::rows::ns_to_ts(self.expires_at),
            attempts: to_u32(self.attempts),
        })
    }
}

fn token(lease: &Lease) -> i64 {
    i64::try_from(lease.token).unwrap_or(i64::MAX)
}

#[async_trait]
impl RunQueue for SqliteStore {
    async fn enqueue(&self, thread_id: &str, payload: &Value) -> Result<JobId, QueueError> {
        insert(self, thread_id, payload, false).await
    }

    async fn enqueue_continuation(
        &self,
        thread_id: &str,
        payload: &Value,
    ) -> Result<JobId, QueueError> {
        insert(self, thread_id, payload, true).await
    }

    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
        check_worker(worker_id)?;
        let now = now_ns();
        let expires = now.saturating_add(ttl_ns(ttl)?);
        let worker = worker_id.to_string();
        let raw = self
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                conn.prepare_cached(&ACQUIRE_SQL)
                    .and_then(|mut stmt| {
                        stmt.query_row(params![worker, expires, now], |row| {
                            lease_from_row(row, &worker)
                        })
                        .optional()
                    })
                    .map_err(|e| backend("sqlite acquire", e))
            })
            .await?;
        raw.map(RawLease::into_lease).transpose()
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError> {
        let now = now_ns();
        let expires = now.saturating_add(ttl_ns(ttl)?);
        let (job_id, token) = (lease.job_id, token(lease));
        let done = self
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                conn.prepare_cached(
                    "UPDATE run_queue SET lease_expires_at = ?1, updated_at = ?2 WHERE job_id = ?3 AND lease_token = ?4 \
                     AND state = 'leased' AND lease_expires_at > ?2",
                )
                .and_then(|mut stmt| stmt.execute(params![expires, now, job_id, token]))
                .map_err(|e| backend("sqlite renew", e))
            })
            .await?;
        if done == 0 {
            return Err(QueueError::LeaseLost {
                job_id: lease.job_id,
                token: lease.token,
            });
        }
        Ok(Lease {
            expires_at: crate::rows::ns_to_ts(expires),
            ..lease.clone()
        })
    }

    async fn complete(&self, lease: &Lease) -> Result<(), QueueError> {
        finish(self, lease, JobState::Done, None, None, false).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
        finish(self, lease, JobState::Queued, None, None, false).await
    }

    async fn retry_later(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        finish(self, lease, JobState::Queued, Some(delay), None, false).await
    }

    async fn snooze(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        finish(self, lease, JobState::Queued, Some(delay), None, true).await
    }

    async fn fail(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        finish(
            self,
            lease,
            JobState::Failed,
            None,
            Some(capped_error(error)),
            false,
        )
        .await
    }

    async fn dead_letter(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        finish(
            self,
            lease,
            JobState::Dead,
            None,
            Some(capped_error(error)),
            false,
        )
        .await
    }

    async fn cancel_queued(&self, job_id: JobId, reason: &str) -> Result<bool, QueueError> {
        cancel_queued(self, job_id, &capped_error(reason)).await
    }

    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
        let row = sqlx::query(
            "SELECT job_id, thread_id, state, worker_id, lease_token, attempts, error FROM run_queue WHERE job_id = ?1",
        )
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("sqlite job", e))?;
        let Some(row) = row else { return Ok(None) };
        let decode = |e: sqlx::Error| backend("sqlite decode job", e);
        let state: String = row.try_get("state").map_err(decode)?;
        Ok(Some(JobInfo {
            job_id: row.try_get("job_id").map_err(decode)?,
            thread_id: row.try_get("thread_id").map_err(decode)?,
            state: JobState::parse(&state)?,
            worker_id: row.try_get("worker_id").map_err(decode)?,
            token: to_u64(row.try_get("lease_token").map_err(decode)?),
            attempts: to_u32(row.try_get("attempts").map_err(decode)?),
            error: row.try_get("error").map_err(decode)?,
        }))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, COUNT(*) FROM run_queue GROUP BY state")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("sqlite counts", e))?;
        let mut counts = QueueCounts::default();
        for (state, n) in rows {
            counts.add(JobState::parse(&state)?, to_u64(n));
        }
        Ok(counts)
    }

    async fn claim(
        &self,
        thread_id: &str,
        holder: &str,
        ttl: Duration,
        dead_holder: Option<&str>,
    ) -> Result<Lease, QueueError> {
        check_claim(thread_id, holder)?;
        let now = now_ns();
        let expires = now.saturating_add(ttl_ns(ttl)?);
        let body = serde_json::to_string(&claim_payload(holder))
            .map_err(|e| backend("claim payload", e))?;
        let (thread, worker) = (thread_id.to_string(), holder.to_string());
        let dead_holder = dead_holder.map(str::to_string);
        // One closure on the writer thread: what holds the thread is read and the claim
        // written with no other write in between (SQLite serializes writers; the unique
        // index on one lease per thread backs it up across processes).
        let claimed = self
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                let holding = conn
                    .prepare_cached(&CLAIM_LOOKUP_SQL)
                    .and_then(|mut stmt| {
                        stmt.query_row(params![thread], |row| {
                            Ok((
                                row.get::<_, i64>(0)?,
                                row.get::<_, String>(1)?,
                                row.get::<_, Option<String>>(2)?,
                                row.get::<_, Option<i64>>(3)?,
                                row.get::<_, String>(4)?,
                            ))
                        })
                        .optional()
                    })
                    .map_err(|e| backend("sqlite claim lookup", e))?;
                let holding = holding
                    .map(|(job_id, state, worker_id, expires_at, payload)| {
                        Ok::<_, QueueError>(Holding {
                            job_id,
                            state: JobState::parse(&state)?,
                            worker_id,
                            expired: expires_at.is_some_and(|at| at <= now),
                            payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
                        })
                    })
                    .transpose()?;
                let raw = match holding {
                    Some(holding) if holding.taken_over_by_claim(dead_holder.as_deref()) => conn
                        .prepare_cached(
                            "UPDATE run_queue SET worker_id = ?1, payload = ?2, lease_token = lease_token + 1, \
                             lease_expires_at = ?3, attempts = attempts + 1, updated_at = ?4 WHERE job_id = ?5 \
                             RETURNING job_id, thread_id, payload, lease_token, lease_expires_at, attempts",
                        )
                        .and_then(|mut stmt| {
                            stmt.query_row(
                                params![worker, body, expires, now, holding.job_id],
                                |row| lease_from_row(row, &worker),
                            )
                        })
                        .map_err(|e| backend("sqlite claim takeover", e))?,
                    Some(holding) => return Ok::<_, QueueError>(Err(holding)),
                    None => conn
                        .prepare_cached(
                            "INSERT INTO run_queue (thread_id, payload, state, worker_id, lease_token, \
                             lease_expires_at, attempts, enqueued_at, updated_at) \
                             VALUES (?1, ?2, 'leased', ?3, 1, ?4, 1, ?5, ?5) \
                             RETURNING job_id, thread_id, payload, lease_token, lease_expires_at, attempts",
                        )
                        .and_then(|mut stmt| {
                            stmt.query_row(params![thread, body, worker, expires, now], |row| {
                                lease_from_row(row, &worker)
                            })
                        })
                        .map_err(|e| backend("sqlite claim", e))?,
                };
                Ok::<_, QueueError>(Ok(raw))
            })
            .await?;
        match claimed {
            Ok(raw) => raw.into_lease(),
            Err(holding) => Err(holding.refusal(thread_id)),
        }
    }
}

static ACQUIRE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE run_queue SET state = 'leased', worker_id = ?1, lease_token = lease_token + 1, \
         lease_expires_at = ?2, ready_at = NULL, attempts = attempts + 1, updated_at = ?3 \
         WHERE job_id = (SELECT q.job_id FROM run_queue q \
         WHERE ((q.state = 'queued' AND (q.ready_at IS NULL OR q.ready_at <= ?3)) \
         OR (q.state = 'leased' AND q.lease_expires_at <= ?3)) AND {NOTHING_AHEAD_SQL} \
         ORDER BY q.job_id LIMIT 1) \
         RETURNING job_id, thread_id, payload, lease_token, lease_expires_at, attempts"
    )
});

static CLAIM_LOOKUP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT job_id, state, worker_id, lease_expires_at, payload FROM run_queue \
         WHERE thread_id = ?1 AND state IN ('queued', 'leased') {HOLDER_FIRST_SQL}"
    )
});

/// Adds a job (a continuation when `continuation`); SQLite's one writer draws ids in
/// commit order.
async fn insert(
    store: &SqliteStore,
    thread_id: &str,
    payload: &Value,
    continuation: bool,
) -> Result<JobId, QueueError> {
    if thread_id.is_empty() {
        return Err(QueueError::InvalidArgument(
            "thread_id must not be empty".into(),
        ));
    }
    let body = serde_json::to_string(payload)
        .map_err(|e| QueueError::InvalidArgument(format!("payload: {e}")))?;
    let thread = thread_id.to_string();
    let now = now_ns();
    store
        .writer
        .call(AppendDurability::Default, move |conn: &Connection| {
            conn.prepare_cached(
                "INSERT INTO run_queue (thread_id, payload, state, continuation, enqueued_at, \
                 updated_at) VALUES (?1, ?2, 'queued', ?3, ?4, ?4) RETURNING job_id",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![thread, body, continuation, now], |row| row.get(0))
            })
            .map_err(|e| backend("sqlite enqueue", e))
        })
        .await
}

/// Cancels job `job_id` when it is queued (see [`RunQueue::cancel_queued`]).
async fn cancel_queued(
    store: &SqliteStore,
    job_id: JobId,
    reason: &str,
) -> Result<bool, QueueError> {
    let now = now_ns();
    let reason = reason.to_string();
    let done = store
        .writer
        .call(AppendDurability::Default, move |conn: &Connection| {
            conn.prepare_cached(
                "UPDATE run_queue SET state = 'cancelled', ready_at = NULL, error = ?1, \
                 updated_at = ?2 WHERE job_id = ?3 AND state = 'queued'",
            )
            .and_then(|mut stmt| stmt.execute(params![reason, now, job_id]))
            .map_err(|e| backend("sqlite cancel queued job", e))
        })
        .await?;
    Ok(done > 0)
}

/// Ends a held lease: the job moves to `state` (when queued, ready again after `ready_in`),
/// keeping `error` when given; with `uncount`, the acquisition is not counted as an attempt.
async fn finish(
    store: &SqliteStore,
    lease: &Lease,
    state: JobState,
    ready_in: Option<Duration>,
    error: Option<String>,
    uncount: bool,
) -> Result<(), QueueError> {
    // A snooze gives back the attempt its acquisition counted.
    let uncount = i64::from(uncount);
    let now = now_ns();
    let ready_at = ready_in.map(|delay| now.saturating_add(delay_ns(delay)));
    let (job_id, token) = (lease.job_id, token(lease));
    let done = store
        .writer
        .call(AppendDurability::Default, move |conn: &Connection| {
            conn.prepare_cached(
                "UPDATE run_queue SET state = ?1, ready_at = ?2, error = ?3, lease_expires_at = NULL, \
                 attempts = MAX(attempts - ?7, 0), updated_at = ?4 WHERE job_id = ?5 \
                 AND lease_token = ?6 AND state = 'leased' AND lease_expires_at > ?4",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    state.as_str(),
                    ready_at,
                    error,
                    now,
                    job_id,
                    token,
                    uncount
                ])
            })
            .map_err(|e| backend("sqlite finish lease", e))
        })
        .await?;
    if done == 0 {
        return Err(QueueError::LeaseLost {
            job_id: lease.job_id,
            token: lease.token,
        });
    }
    Ok(())
}
