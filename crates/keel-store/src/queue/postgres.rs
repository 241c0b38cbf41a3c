//! The run queue on Postgres: `acquire` locks the oldest ready job with
//! `FOR UPDATE SKIP LOCKED`, so concurrent workers never wait on nor share a job. Lease
//! times use the database clock, so workers on machines with skewed clocks agree.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{
    JobId, JobInfo, JobState, Lease, QueueCounts, QueueError, RunQueue, backend, check_worker,
    to_u32, to_u64, ttl_ns,
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
        if thread_id.is_empty() {
            return Err(QueueError::InvalidArgument(
                "thread_id must not be empty".into(),
            ));
        }
        let body = serde_json::to_string(payload)
            .map_err(|e| QueueError::InvalidArgument(format!("payload: {e}")))?;
        sqlx::query_scalar(
            "INSERT INTO run_queue (thread_id, payload, state) VALUES ($1, $2::text::json, 'queued') \
             ON CONFLICT (thread_id) WHERE state IN ('queued', 'leased') DO UPDATE SET payload = EXCLUDED.payload, \
             rerun = (run_queue.state = 'leased'), updated_at = now() RETURNING job_id",
        )
        .bind(thread_id)
        .bind(body)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| backend("postgres enqueue", e))
    }

    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
        check_worker(worker_id)?;
        let row = sqlx::query(
            "UPDATE run_queue SET state = 'leased', worker_id = $1, lease_token = lease_token + 1, \
             lease_expires_at = now() + ($2::float8 * interval '1 microsecond'), attempts = attempts + 1, \
             updated_at = now() \
             WHERE job_id = (SELECT job_id FROM run_queue WHERE state = 'queued' \
             OR (state = 'leased' AND lease_expires_at <= now()) ORDER BY job_id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING job_id, thread_id, payload::text AS payload, lease_token, lease_expires_at, attempts",
        )
        .bind(worker_id)
        .bind(ttl_micros(ttl)?)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("postgres acquire", e))?;
        row.map(|row| lease_from_row(&row, worker_id)).transpose()
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
        finish(self, lease, "CASE WHEN rerun THEN 'queued' ELSE 'done' END").await
    }

    async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
        finish(self, lease, "'queued'").await
    }

    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
        let row = sqlx::query(
            "SELECT job_id, thread_id, state, worker_id, lease_token, attempts FROM run_queue WHERE job_id = $1",
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
            match JobState::parse(&state)? {
                JobState::Queued => counts.queued = to_u64(n),
                JobState::Leased => counts.leased = to_u64(n),
                JobState::Done => counts.done = to_u64(n),
            }
        }
        Ok(counts)
    }
}

/// Ends a held lease, moving the job to `next_state` (an SQL expression from this module).
async fn finish(
    store: &PostgresStore,
    lease: &Lease,
    next_state: &'static str,
) -> Result<(), QueueError> {
    let sql = format!(
        "UPDATE run_queue SET state = {next_state}, rerun = FALSE, lease_expires_at = NULL, updated_at = now() \
         WHERE job_id = $1 AND lease_token = $2 AND state = 'leased' AND lease_expires_at > now()"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(lease.job_id)
        .bind(token(lease))
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
