//! The run queue on Postgres: `acquire` locks the oldest ready job with
//! `FOR UPDATE SKIP LOCKED`, so concurrent workers never wait on nor share a job. A job is
//! ready only when it heads its thread (whatever the lock state of the jobs ahead) and no
//! job of its thread is leased, so two workers never lease two jobs of one thread and an
//! acquire never picks a job the unique index `run_queue_one_lease_per_thread` (which backs
//! that up) would refuse. An enqueue (and a claim) takes a transaction-scoped advisory lock
//! of its thread before its job id is drawn, so one thread's ids are drawn in commit order:
//! a job with a lower id never commits after a later job of its thread was leased. Lease
//! times use the database clock, so workers on machines with skewed clocks agree.

use std::sync::LazyLock;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{
    HOLDER_FIRST_SQL, Holding, JobId, JobInfo, JobState, Lease, NOTHING_AHEAD_SQL, QueueCounts,
    QueueError, RunQueue, backend, capped_error, check_claim, check_worker, claim_payload,
    delay_ns, to_u32, to_u64, ttl_ns,
};
use crate::PostgresStore;

fn ttl_micros(ttl: Duration) -> Result<i64, QueueError> {
    Ok((ttl_ns(ttl)? / 1000).max(1))
}

fn token(lease: &Lease) -> i64 {
    i64::try_from(lease.token).unwrap_or(i64::MAX)
}

fn lease_from_row(row: &PgRow, worker_id: &str) -> Result<Lease, QueueError> {
    let decode = |e: sqlx::Error| backend("postgres decode lease", e);
    let payload: String = row.try_get("payload").map_err(decode)?;
    Ok(Lease {
        job_id: row.try_get("job_id").map_err(decode)?,
        thread_id: row.try_get("thread_id").map_err(decode)?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| backend("stored payload does not parse", e))?,
        worker_id: worker_id.to_string(),
        token: to_u64(row.try_get("lease_token").map_err(decode)?),
        expires_at: row.try_get("lease_expires_at").map_err(decode)?,
        attempts: to_u32(i64::from(
            row.try_get::<i32, _>("attempts").map_err(decode)?,
        )),
    })
}

#[async_trait]
impl RunQueue for PostgresStore {
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
        let row = sqlx::query(ACQUIRE_SQL.as_str())
            .bind(worker_id)
            .bind(ttl_micros(ttl)?)
            .fetch_optional(&self.pool)
            .await;
        match row {
            Ok(row) => row.map(|row| lease_from_row(&row, worker_id)).transpose(),
            // A lease of the thread committed between this statement's snapshot and its
            // update (a claim, or another worker that saw an older snapshot): nothing of
            // that thread is ready, and the next acquire no longer picks it.
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => Ok(None),
            Err(e) => Err(backend("postgres acquire", e)),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError> {
        let expires: Option<DateTime<Utc>> = sqlx::query_scalar(
            "UPDATE run_queue SET lease_expires_at = now() + ($1::float8 * interval '1 microsecond'), updated_at = now() \
             WHERE job_id = $2 AND lease_token = $3 AND state = 'leased' AND lease_expires_at > now() \
             RETURNING lease_expires_at",
        )
        .bind(ttl_micros(ttl)?)
        .bind(lease.job_id)
        .bind(token(lease))
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("postgres renew", e))?;
        match expires {
            Some(expires_at) => Ok(Lease {
                expires_at,
                ..lease.clone()
            }),
            None => Err(QueueError::LeaseLost {
                job_id: lease.job_id,
                token: lease.token,
            }),
        }
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
            "SELECT job_id, thread_id, state, worker_id, lease_token, attempts, error FROM run_queue WHERE job_id = $1",
        )
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("postgres job", e))?;
        let Some(row) = row else { return Ok(None) };
        let decode = |e: sqlx::Error| backend("postgres decode job", e);
        let state: String = row.try_get("state").map_err(decode)?;
        Ok(Some(JobInfo {
            job_id: row.try_get("job_id").map_err(decode)?,
            thread_id: row.try_get("thread_id").map_err(decode)?,
            state: JobState::parse(&state)?,
            worker_id: row.try_get("worker_id").map_err(decode)?,
            token: to_u64(row.try_get("lease_token").map_err(decode)?),
            attempts: to_u32(i64::from(
                row.try_get::<i32, _>("attempts").map_err(decode)?,
            )),
            error: row.try_get("error").map_err(decode)?,
        }))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, COUNT(*) FROM run_queue GROUP BY state")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| backend("postgres counts", e))?;
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
        let body = serde_json::to_string(&claim_payload(holder))
            .map_err(|e| backend("claim payload", e))?;
        let micros = ttl_micros(ttl)?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| backend("postgres claim", e))?;
        // The thread's lock (as an enqueue takes it), then its holder or head, locked;
        // expiry on the database's clock.
        sqlx::query(LOCK_THREAD_SQL)
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| backend("postgres claim lock", e))?;
        let row = sqlx::query(CLAIM_LOOKUP_SQL.as_str())
            .bind(thread_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| backend("postgres claim lookup", e))?;
        let holding = match row {
            Some(row) => {
                let decode = |e: sqlx::Error| backend("postgres decode claim", e);
                let state: String = row.try_get("state").map_err(decode)?;
                let payload: String = row.try_get("payload").map_err(decode)?;
                Some(Holding {
                    job_id: row.try_get("job_id").map_err(decode)?,
                    state: JobState::parse(&state)?,
                    worker_id: row.try_get("worker_id").map_err(decode)?,
                    expired: row
                        .try_get::<Option<bool>, _>("expired")
                        .map_err(decode)?
                        .unwrap_or(false),
                    payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
                })
            }
            None => None,
        };
        let claimed = match holding {
            Some(holding) if holding.taken_over_by_claim(dead_holder) => {
                sqlx::query(
                    "UPDATE run_queue SET worker_id = $1, payload = $2::text::json, \
                     lease_token = lease_token + 1, \
                     lease_expires_at = now() + ($3::float8 * interval '1 microsecond'), \
                     attempts = attempts + 1, updated_at = now() WHERE job_id = $4 \
                     RETURNING job_id, thread_id, payload::text AS payload, lease_token, lease_expires_at, attempts",
                )
                .bind(holder)
                .bind(&body)
                .bind(micros)
                .bind(holding.job_id)
                .fetch_one(&mut *tx)
                .await
            }
            Some(holding) => {
                // Ended now, not when the dropped transaction's rollback gets its turn: until
                // then the row lock would hide the job from workers (`SKIP LOCKED`).
                tx.rollback()
                    .await
                    .map_err(|e| backend("postgres claim rollback", e))?;
                return Err(holding.refusal(thread_id));
            }
            None => {
                sqlx::query(
                    "INSERT INTO run_queue (thread_id, payload, state, worker_id, lease_token, \
                     lease_expires_at, attempts) VALUES ($1, $2::text::json, 'leased', $3, 1, \
                     now() + ($4::float8 * interval '1 microsecond'), 1) \
                     RETURNING job_id, thread_id, payload::text AS payload, lease_token, lease_expires_at, attempts",
                )
                .bind(thread_id)
                .bind(&body)
                .bind(holder)
                .bind(micros)
                .fetch_one(&mut *tx)
                .await
            }
        };
        let row = match claimed {
            Ok(row) => row,
            // Another driver or a worker leased the thread between the lookup and the
            // insert: the unique index on one lease per thread refused this one.
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                tx.rollback()
                    .await
                    .map_err(|e| backend("postgres claim rollback", e))?;
                return Err(QueueError::Held {
                    thread_id: thread_id.to_string(),
                    job_id: 0,
                    holder: None,
                    message: format!(
                        "thread {thread_id} was leased by another driver at the same moment: \
                         two drivers never drive one thread; try again once it finishes"
                    ),
                });
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(backend("postgres claim", e));
            }
        };
        let lease = lease_from_row(&row, holder)?;
        tx.commit()
            .await
            .map_err(|e| backend("postgres claim commit", e))?;
        Ok(lease)
    }
}

/// The advisory lock of thread `$1` of this schema, held until the transaction ends (taken
/// by enqueues, claims and `delete_thread`).
pub(crate) const LOCK_THREAD_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended(\
     'keel.run_queue:' || current_schema() || ':' || $1, 0))";

/// An enqueue: the thread's lock first, then the id, in one statement (see the module docs).
const INSERT_SQL: &str = "WITH thread_lock AS (SELECT pg_advisory_xact_lock(hashtextextended(\
     'keel.run_queue:' || current_schema() || ':' || $1, 0))) \
     INSERT INTO run_queue (thread_id, payload, state, continuation) \
     SELECT $1, $2::text::json, 'queued', $3 FROM thread_lock RETURNING job_id";

static ACQUIRE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE run_queue SET state = 'leased', worker_id = $1, lease_token = lease_token + 1, \
         lease_expires_at = now() + ($2::float8 * interval '1 microsecond'), ready_at = NULL, \
         attempts = attempts + 1, updated_at = now() \
         WHERE job_id = (SELECT q.job_id FROM run_queue q \
         WHERE ((q.state = 'queued' AND (q.ready_at IS NULL OR q.ready_at <= now())) \
         OR (q.state = 'leased' AND q.lease_expires_at <= now())) AND {NOTHING_AHEAD_SQL} \
         ORDER BY q.job_id LIMIT 1 FOR UPDATE OF q SKIP LOCKED) \
         RETURNING job_id, thread_id, payload::text AS payload, lease_token, lease_expires_at, attempts"
    )
});

static CLAIM_LOOKUP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT job_id, state, worker_id, (lease_expires_at <= now()) AS expired, \
         payload::text AS payload FROM run_queue \
         WHERE thread_id = $1 AND state IN ('queued', 'leased') {HOLDER_FIRST_SQL} FOR UPDATE"
    )
});

/// Adds a job (a continuation when `continuation`) under its thread's lock.
async fn insert(
    store: &PostgresStore,
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
    sqlx::query_scalar(INSERT_SQL)
        .bind(thread_id)
        .bind(body)
        .bind(continuation)
        .fetch_one(&store.pool)
        .await
        .map_err(|e| backend("postgres enqueue", e))
}

/// Cancels job `job_id` when it is queued (see [`RunQueue::cancel_queued`]).
async fn cancel_queued(
    store: &PostgresStore,
    job_id: JobId,
    reason: &str,
) -> Result<bool, QueueError> {
    let done = sqlx::query(
        "UPDATE run_queue SET state = 'cancelled', ready_at = NULL, error = $1, updated_at = now() \
         WHERE job_id = $2 AND state = 'queued'",
    )
    .bind(reason)
    .bind(job_id)
    .execute(&store.pool)
    .await
    .map_err(|e| backend("postgres cancel queued job", e))?
    .rows_affected();
    Ok(done > 0)
}

/// Ends a held lease: the job moves to `state` (when queued, ready again after `ready_in`),
/// keeping `error` when given; with `uncount`, the acquisition is not counted as an attempt.
async fn finish(
    store: &PostgresStore,
    lease: &Lease,
    state: JobState,
    ready_in: Option<Duration>,
    error: Option<String>,
    uncount: bool,
) -> Result<(), QueueError> {
    // A snooze gives back the attempt its acquisition counted.
    let uncount = i32::from(uncount);
    // NULL delay = ready now.
    let ready_micros = ready_in.map(|delay| delay_ns(delay) / 1000);
    let done = sqlx::query(
        "UPDATE run_queue SET state = $1, ready_at = now() + ($2::float8 * interval '1 microsecond'), \
         error = $3, lease_expires_at = NULL, attempts = GREATEST(attempts - $6, 0), updated_at = now() \
         WHERE job_id = $4 AND lease_token = $5 AND state = 'leased' AND lease_expires_at > now()",
    )
    .bind(state.as_str())
    .bind(ready_micros)
    .bind(error)
    .bind(lease.job_id)
    .bind(token(lease))
    .bind(uncount)
    .execute(&store.pool)
    .await
    .map_err(|e| backend("postgres finish lease", e))?
    .rows_affected();
    if done == 0 {
        return Err(QueueError::LeaseLost {
            job_id: lease.job_id,
            token: lease.token,
        });
    }
    Ok(())
}
