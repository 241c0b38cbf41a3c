//! Run leasing for scale-out workers: a queue of runs to drive, each handed to at most one
//! worker at a time under a time-limited lease.
//!
//! A worker calls [`RunQueue::acquire`] to lease a ready job (queued, or whose previous
//! lease expired because its worker crashed), renews the lease while it drives the run,
//! and completes (or releases) it at the end. Every acquisition increments the job's
//! fencing token; `renew`, `complete` and `release` succeed only for the current token
//! of an unexpired lease, so a worker that stalled past its lease cannot touch the job
//! after another worker took it over ([`QueueError::LeaseLost`]).
//!
//! Every `enqueue` adds a job (one per submitted message: nothing is ever merged or
//! overwritten). The jobs of one thread run **one at a time, in enqueue order**: only the
//! oldest unfinished job of a thread (its *head*) can be leased, so a thread never has two
//! leases and its second message waits until its first is done (or failed). Jobs of
//! different threads are independent and run in parallel. The backends enforce this in
//! the database (`acquire` picks heads only and skips a thread that has a job leased; a
//! unique index allows one lease per thread). Enqueue order is commit order: on Postgres
//! an enqueue holds a lock of its thread from before its id is taken until it commits, so
//! a job with a lower id can never become visible after a later one of its thread.
//!
//! A *continuation* ([`RunQueue::enqueue_continuation`]: the job that resumes a paused
//! run once it is approved, denied, answered or cancelled) goes ahead of its thread's
//! queued jobs that are not continuations — those may be waiting for that very run to end,
//! so a continuation must never wait behind them — but never while another job of the
//! thread is leased, and continuations keep their order among themselves.
//!
//! Every job ends: `done` ([`RunQueue::complete`]), `failed` with a reason
//! ([`RunQueue::fail`], for jobs that can never succeed), `dead` with its last error
//! ([`RunQueue::dead_letter`], once its attempts are used up: the worker's
//! `max_attempts`), or `cancelled` before any worker took it ([`RunQueue::cancel_queued`]).
//! [`RunQueue::release`] gives a job back at once and [`RunQueue::retry_later`] after a
//! delay, keeping its place at the head of its thread; [`RunQueue::snooze`] does the same
//! for a job that waits for something else and did not fail (the acquisition is not
//! counted as an attempt).

mod memory;
mod postgres;

pub(crate) use postgres::LOCK_THREAD_SQL;
pub(crate) mod sqlite;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use memory::MemoryRunQueue;

/// A job's id.
pub type JobId = i64;

/// Why a queue operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueError {
    /// The lease expired or was taken over; the caller must stop driving the run.
    #[error(
        "lease on job {job_id} (token {token}) is no longer held: it expired or another worker took it over"
    )]
    LeaseLost {
        /// Job.
        job_id: JobId,
        /// The stale fencing token.
        token: u64,
    },
    /// [`RunQueue::claim`] refused: another driver holds the thread, or a worker will.
    #[error("{message}")]
    Held {
        /// The thread.
        thread_id: String,
        /// The job that holds it.
        job_id: JobId,
        /// Who holds it (a worker id, or a claim's holder: process, host, since when).
        holder: Option<String>,
        /// The whole explanation, naming the holder and what to do.
        message: String,
    },
    /// A bad argument (names the field).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backend failed.
    #[error("queue backend error: {0}")]
    Backend(String),
}

impl QueueError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::LeaseLost { .. } => "lease_lost",
            Self::Held { .. } => "thread_held",
            Self::InvalidArgument(_) => "invalid_argument",
            Self::Backend(_) => "backend",
        }
    }
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker (the lease may have expired; then it is ready again).
    Leased,
    /// Completed.
    Done,
    /// Given up: it can never succeed (the reason is in [`JobInfo::error`]).
    Failed,
    /// Dead-lettered: it failed on every attempt it was allowed (the last error is in
    /// [`JobInfo::error`]).
    Dead,
    /// Cancelled while queued, before any worker took it (the reason is in
    /// [`JobInfo::error`]).
    Cancelled,
}

impl JobState {
    /// snake_case name (as stored).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Leased => "leased",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Self, QueueError> {
        match s {
            "queued" => Ok(Self::Queued),
            "leased" => Ok(Self::Leased),
            "done" => Ok(Self::Done),
            "failed" => Ok(Self::Failed),
            "dead" => Ok(Self::Dead),
            "cancelled" => Ok(Self::Cancelled),
            other => Err(QueueError::Backend(format!(
                "stored job state {other:?} is unknown"
            ))),
        }
    }
}

/// A worker's time-limited claim on a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// The thread to drive.
    pub thread_id: String,
    /// What was enqueued (e.g. agent, input).
    pub payload: Value,
    /// Holder.
    pub worker_id: String,
    /// Fencing token: increases with every acquisition of this job.
    pub token: u64,
    /// When the lease lapses unless renewed (by the backend's clock).
    pub expires_at: DateTime<Utc>,
    /// How many times the job was acquired, this time included (> 1 means the job
    /// was taken over, released or retried).
    pub attempts: u32,
}

/// A job as seen by an observer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The job.
    pub job_id: JobId,
    /// Its thread.
    pub thread_id: String,
    /// State.
    pub state: JobState,
    /// Last (or current) holder.
    pub worker_id: Option<String>,
    /// Current fencing token.
    pub token: u64,
    /// Acquisitions so far.
    pub attempts: u32,
    /// Why the job failed, died or was cancelled ([`JobState::Failed`],
    /// [`JobState::Dead`], [`JobState::Cancelled`]).
    pub error: Option<String>,
}

/// How many jobs are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCounts {
    /// Waiting.
    pub queued: u64,
    /// Leased (including expired leases not yet taken over).
    pub leased: u64,
    /// Completed.
    pub done: u64,
    /// Given up.
    pub failed: u64,
    /// Dead-lettered (attempts used up).
    #[serde(default)]
    pub dead: u64,
    /// Cancelled while queued.
    #[serde(default)]
    pub cancelled: u64,
}

impl QueueCounts {
    /// Adds one job in `state`.
    pub(crate) fn add(&mut self, state: JobState, n: u64) {
        match state {
            JobState::Queued => self.queued += n,
            JobState::Leased => self.leased += n,
            JobState::Done => self.done += n,
            JobState::Failed => self.failed += n,
            JobState::Dead => self.dead += n,
            JobState::Cancelled => self.cancelled += n,
        }
    }
}

/// A queue of runs leased to workers. Implemented by [`crate::PostgresStore`] (using
/// `FOR UPDATE SKIP LOCKED`), [`crate::SqliteStore`] (one process or several on one
/// machine) and [`MemoryRunQueue`].
#[async_trait]
pub trait RunQueue: Send + Sync {
    /// Adds a new job for `thread_id`; it runs after every earlier unfinished job of the
    /// same thread.
    async fn enqueue(&self, thread_id: &str, payload: &Value) -> Result<JobId, QueueError>;

    /// Adds the continuation of the run in progress on `thread_id` (see the module docs):
    /// it is leased before every queued job of the thread that is not a continuation, once
    /// no job of the thread is leased, and after the continuations queued before it.
    async fn enqueue_continuation(
        &self,
        thread_id: &str,
        payload: &Value,
    ) -> Result<JobId, QueueError>;

    /// Leases the oldest ready job to `worker_id` for `ttl`, or `None` when nothing is
    /// ready. A job is ready when its lease expired, or when it is queued (and its
    /// `retry_later` delay has passed), no job of its thread is leased, and it is its
    /// thread's head: the first of the thread's continuations, or — with none queued — the
    /// oldest of its other queued jobs. Never hands a job to two workers while a lease on
    /// it is valid, nor leases two jobs of one thread.
    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError>;

    /// Extends a valid lease to `ttl` from now; returns the lease with its new expiry.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError>;

    /// Finishes the job (`done`); the thread's next job becomes ready.
    async fn complete(&self, lease: &Lease) -> Result<(), QueueError>;

    /// Gives the job back to the queue at once (e.g. on worker shutdown).
    async fn release(&self, lease: &Lease) -> Result<(), QueueError>;

    /// Gives the job back, ready again once `delay` has passed (still ahead of its
    /// thread's later jobs).
    async fn retry_later(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError>;

    /// Gives the job back like [`retry_later`](Self::retry_later), without counting this
    /// acquisition as an attempt: the job waits for something else (another run of its
    /// thread) and did not fail, so waiting never uses up its attempts.
    async fn snooze(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError>;

    /// Gives the job up (`failed`, with `error` kept for [`RunQueue::job`]); the thread's
    /// next job becomes ready.
    async fn fail(&self, lease: &Lease, error: &str) -> Result<(), QueueError>;

    /// Dead-letters the job (`dead`, with its last `error` kept for [`RunQueue::job`]): it
    /// failed on every attempt it was allowed. The thread's next job becomes ready.
    async fn dead_letter(&self, lease: &Lease, error: &str) -> Result<(), QueueError>;

    /// Cancels job `job_id` while it is queued — no worker holds it — (`cancelled`, with
    /// `reason` kept for [`RunQueue::job`]); `Ok(false)` when it is not queued (leased, or
    /// it ended) or does not exist.
    async fn cancel_queued(&self, job_id: JobId, reason: &str) -> Result<bool, QueueError>;

    /// Looks a job up.
    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError>;

    /// Jobs per state.
    async fn counts(&self) -> Result<QueueCounts, QueueError>;

    /// Takes the lease of `thread_id` for a driver outside the queue (`keel resume`,
    /// `approve`, `deny`, `reply`, a UI's resume): a job row of its own, leased to
    /// `holder` for `ttl` ([`claim_payload`]), renewed and completed like any lease. The
    /// same one-lease-per-thread rule as workers', so two drivers never drive one thread:
    /// refused with [`QueueError::Held`] naming the holder while the thread has a live
    /// lease or a job queued for a worker (which will drive it). An expired claim — its
    /// driver died — is taken over; an expired worker lease is not (a worker continues
    /// its job, message and all). A worker that leases an expired claim closes it.
    /// `dead_holder` names a claim's holder the caller knows has died (a process of this
    /// machine that is gone): that claim is taken over at once, expired or not.
    async fn claim(
        &self,
        thread_id: &str,
        holder: &str,
        ttl: Duration,
        dead_holder: Option<&str>,
    ) -> Result<Lease, QueueError> {
        let _ = (holder, ttl, dead_holder);
        Err(QueueError::Backend(format!(
            "this run queue cannot claim thread {thread_id} for a driver outside the queue"
        )))
    }
}

/// The payload key of a claim's job row ([`RunQueue::claim`]).
pub const CLAIM_KEY: &str = "keel_claim";

/// The payload of a claim's job row: who holds it.
pub fn claim_payload(holder: &str) -> Value {
    serde_json::json!({ CLAIM_KEY: { "holder": holder } })
}

/// The holder, when `payload` is a claim's ([`claim_payload`]).
pub fn claim_holder(payload: &Value) -> Option<&str> {
    payload.get(CLAIM_KEY)?.get("holder")?.as_str()
}

/// What a claim found holding its thread: an active job of it.
pub(crate) struct Holding {
    pub(crate) job_id: JobId,
    pub(crate) state: JobState,
    pub(crate) worker_id: Option<String>,
    pub(crate) expired: bool,
    pub(crate) payload: Value,
}

impl Holding {
    /// Whether a claim may take this job over: a claim that expired, or whose holder is
    /// `dead_holder` (a driver known to have died).
    pub(crate) fn taken_over_by_claim(&self, dead_holder: Option<&str>) -> bool {
        let Some(holder) = claim_holder(&self.payload) else {
            return false;
        };
        self.state == JobState::Leased && (self.expired || dead_holder == Some(holder))
    }

    /// The refusal of a claim on `thread_id`, naming the holder and what to do.
    pub(crate) fn refusal(self, thread_id: &str) -> QueueError {
        let holder = claim_holder(&self.payload)
            .map(str::to_string)
            .or(self.worker_id.clone());
        let who = holder.clone().unwrap_or_else(|| "a worker".into());
        let job_id = self.job_id;
        let message = match (self.state, self.expired) {
            (JobState::Leased, false) => format!(
                "thread {thread_id} is being driven by {who} (job {job_id}): two drivers never \
                 drive one thread; wait until it finishes, or stop that process"
            ),
            (JobState::Leased, true) => format!(
                "thread {thread_id}'s job {job_id} was leased by {who}, whose lease expired: a \
                 worker will continue it (start `keel worker` if none runs)"
            ),
            _ => format!(
                "thread {thread_id} has job {job_id} queued for a worker, which will drive it \
                 (start `keel worker` if none runs)"
            ),
        };
        QueueError::Held {
            thread_id: thread_id.to_string(),
            job_id,
            holder,
            message,
        }
    }
}

/// The SQL condition (SQLite and Postgres alike) that queued job `q` is its thread's head
/// and no job of its thread is leased — or, for an expired lease `q`, nothing (it holds
/// the thread): no other active job `e` of the thread is leased, nor queued ahead of it (a
/// continuation ahead of a job that is not one, else an older job of the same kind).
pub(crate) const NOTHING_AHEAD_SQL: &str = "NOT EXISTS (SELECT 1 FROM run_queue e \
     WHERE e.thread_id = q.thread_id AND e.job_id <> q.job_id AND (e.state = 'leased' \
     OR (q.state = 'queued' AND e.state = 'queued' AND (e.continuation > q.continuation \
     OR (e.continuation = q.continuation AND e.job_id < q.job_id)))))";

/// The order in which a claim looks at a thread's active jobs: the leased one, else its
/// head (see [`NOTHING_AHEAD_SQL`]).
pub(crate) const HOLDER_FIRST_SQL: &str =
    "ORDER BY (state = 'leased') DESC, continuation DESC, job_id LIMIT 1";

pub(crate) fn ttl_ns(ttl: Duration) -> Result<i64, QueueError> {
    let ns = i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX);
    if ns <= 0 {
        return Err(QueueError::InvalidArgument(
            "lease ttl must be greater than zero".into(),
        ));
    }
    Ok(ns)
}

/// A `retry_later` delay in nanoseconds (zero allowed).
pub(crate) fn delay_ns(delay: Duration) -> i64 {
    i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX)
}

/// At most this many bytes of a failure reason are kept.
pub(crate) const MAX_ERROR_BYTES: usize = 4096;

/// `error` cut to [`MAX_ERROR_BYTES`] at a character boundary.
pub(crate) fn capped_error(error: &str) -> String {
    if error.len() <= MAX_ERROR_BYTES {
        return error.to_string();
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", error.get(..end).unwrap_or_default())
}

pub(crate) fn backend(operation: &str, error: impl std::fmt::Display) -> QueueError {
    QueueError::Backend(format!("{operation}: {error}"))
}

pub(crate) fn check_worker(worker_id: &str) -> Result<(), QueueError> {
    if worker_id.is_empty() {
        return Err(QueueError::InvalidArgument(
            "worker_id must not be empty".into(),
        ));
    }
    Ok(())
}

/// The arguments of [`RunQueue::claim`]: a thread and a holder, neither empty.
pub(crate) fn check_claim(thread_id: &str, holder: &str) -> Result<(), QueueError> {
    if thread_id.is_empty() {
        return Err(QueueError::InvalidArgument(
            "thread_id must not be empty".into(),
        ));
    }
    check_worker(holder)
}

pub(crate) fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn to_u32(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
