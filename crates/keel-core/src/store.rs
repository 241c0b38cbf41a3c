//! The event-log store contract and an in-memory implementation.
//!
//! A store keeps each thread's events in sequence order. Appends carry the sequence number
//! the caller expects to write next (optimistic concurrency): a conflicting append fails
//! with [`StoreError::Conflict`] and never interleaves. Durable implementations (SQLite,
//! Postgres) live in `keel-store` and pass the same conformance suite.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::decide::EndState;
use crate::event::{Event, EventKind};

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Someone else appended first.
    #[error(
        "append conflict on thread {thread_id}: expected next seq {expected}, log is at {actual}"
    )]
    Conflict {
        /// Thread.
        thread_id: String,
        /// What the caller expected.
        expected: u64,
        /// Where the log really is.
        actual: u64,
    },
    /// Events in a batch do not carry consecutive sequence numbers or the right thread.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// No such thread.
    #[error("thread {0} not found")]
    NotFound(String),
    /// The backend failed.
    #[error("store backend error: {0}")]
    Backend(String),
    /// A query the store cannot answer as asked (see [`crate::runs::RunQuery::validate`]).
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A fenced append ([`EventStore::append_fenced`]) found its lease gone: taken over by
    /// another driver, lapsed by the store's clock, or ended. Nothing was written.
    #[error(
        "append to thread {thread_id} refused: the lease on job {job_id} (token {token}) {reason}; this driver writes nothing more to the thread"
    )]
    Fenced {
        /// Thread.
        thread_id: String,
        /// The run-queue job whose lease the append was conditional on.
        job_id: i64,
        /// The fencing token the append carried.
        token: u64,
        /// What the store found instead (e.g. "was taken over (token 3 now)").
        reason: String,
    },
}

/// The lease an append is conditional on (store-side fencing, docs/durability.md "Leases
/// and fencing"): the store writes the batch only while run-queue job `job_id` is leased
/// with fencing token `token` and its lease has not lapsed by the store's own clock —
/// checked inside the append's transaction, so a driver that lost its lease (a paused
/// process, a clock step, a takeover it has not heard of yet) can never write after the
/// next holder started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendFence {
    /// The run-queue job (a worker's job, or a command's claim).
    pub job_id: i64,
    /// Its fencing token, as the lease was granted.
    pub token: u64,
}

/// Where a thread stands, derived from its last events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "end_state")]
pub enum ThreadStatus {
    /// A run is in progress (or was interrupted).
    Running,
    /// Waiting for an approval decision.
    AwaitingApproval,
    /// Waiting for the user's answer.
    AwaitingUser,
    /// The last run ended.
    Ended(EndState),
}

impl ThreadStatus {
    /// The status implied by the latest event, given the previous status.
    pub fn after(previous: ThreadStatus, event: &EventKind) -> ThreadStatus {
        match event {
            EventKind::RunEnded { end_state, .. } => ThreadStatus::Ended(*end_state),
            EventKind::ApprovalRequested { .. } => ThreadStatus::AwaitingApproval,
            EventKind::UserAsked { .. } => ThreadStatus::AwaitingUser,
            EventKind::RunStarted { .. }
            | EventKind::ApprovalGranted { .. }
            | EventKind::ApprovalDenied { .. }
            | EventKind::UserAnswered { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::ToolCallStarted { .. } => ThreadStatus::Running,
            _ => previous,
        }
    }
}

/// A line in a thread listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSummary {
    /// Thread id.
    pub thread_id: String,
    /// Agent of the latest run.
    pub agent: Option<String>,
    /// Number of events.
    pub event_count: u64,
    /// Status.
    pub status: ThreadStatus,
    /// First event time.
    pub created_at: DateTime<Utc>,
    /// Last event time.
    pub updated_at: DateTime<Utc>,
}

impl ThreadSummary {
    /// Builds a summary by scanning a log (for stores that do not index it).
    pub fn from_events<E: Borrow<Event>>(thread_id: &str, events: &[E]) -> Option<Self> {
        let first = events.first()?.borrow();
        let last = events.last()?.borrow();
        let mut status = ThreadStatus::Running;
        let mut agent = None;
        for event in events.iter().map(Borrow::borrow) {
            status = ThreadStatus::after(status, &event.kind);
            if let EventKind::RunStarted { agent: name, .. } = &event.kind {
                agent = Some(name.clone());
            }
        }
        Some(Self {
            thread_id: thread_id.to_string(),
            agent,
            event_count: events.len() as u64,
            status,
            created_at: first.ts,
            updated_at: last.ts,
        })
    }
}

/// Filters for [`EventStore::list_threads`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadFilter {
    /// Only threads whose latest run used this agent.
    pub agent: Option<String>,
    /// Only threads updated at or after this time.
    pub updated_since: Option<DateTime<Utc>>,
    /// Only threads in exactly this status.
    pub status: Option<ThreadStatus>,
    /// At most this many (most recently updated first).
    pub limit: Option<usize>,
    /// Only threads whose id starts with this (a tenant's namespace `acme.`, or a
    /// thread's sub-agent threads `<id>.sub.`), compared byte for byte — no pattern
    /// characters. The SQL stores filter in the query.
    pub id_prefix: Option<String>,
}

impl ThreadFilter {
    /// Whether a summary passes the filter.
    pub fn matches(&self, summary: &ThreadSummary) -> bool {
        self.agent
            .as_ref()
            .is_none_or(|agent| summary.agent.as_ref() == Some(agent))
            && self
                .updated_since
                .is_none_or(|since| summary.updated_at >= since)
            && self.status.is_none_or(|status| summary.status == status)
            && self
                .id_prefix
                .as_ref()
                .is_none_or(|prefix| summary.thread_id.starts_with(prefix.as_str()))
    }
}

/// Checks that a batch is consecutive from `expected_next_seq` and all on `thread_id`.
pub fn check_batch<'a>(
    thread_id: &str,
    expected_next_seq: u64,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<(), StoreError> {
    for (offset, event) in events.into_iter().enumerate() {
        let want = expected_next_seq.saturating_add(offset as u64);
        if event.seq != want {
            return Err(StoreError::InvalidBatch(format!(
                "event {offset} has seq {} but {want} was expected",
                event.seq
            )));
        }
        if &*event.thread_id != thread_id {
            return Err(StoreError::InvalidBatch(format!(
                "event {offset} belongs to thread {} not {thread_id}",
                event.thread_id
            )));
        }
    }
    Ok(())
}

/// How durable an append must be when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AppendDurability {
    /// The store's configured level (for SQLite's default: survives a crash of the
    /// process, may lose the last commits on power loss).
    #[default]
    Default,
    /// On stable storage (fsynced) before returning, whatever the store's level. The
    /// runtime asks for this for the batch that starts a mutating tool call.
    Sync,
}

/// When a run's events reach the store (docs/durability.md, "The durability rule").
///
/// Under both, every event is durable before any effect outside the process that depends
/// on it: before a tool call that is not read-only starts (synchronously), before a
/// sub-agent or a handoff starts, before the run pauses for a human, and before its
/// outcome is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunDurability {
    /// Only what the rule requires: a model's answer and read-only tool results ride with
    /// the next durable point, so a one-tool read-only conversation commits once. A crash
    /// before that point asks the model again (cost, never an effect).
    #[default]
    Effects,
    /// Also before every model call, so another process (a live viewer, `keel runs`)
    /// sees each step as it happens, at one commit per step.
    Steps,
}

/// An append-only, per-thread event log.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Appends a batch atomically. `expected_next_seq` is the seq of the first event and
    /// must equal the log's current length; otherwise nothing is written and the call
    /// returns [`StoreError::Conflict`].
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError>;

    /// [`EventStore::append`] with an explicit durability request. Stores whose every
    /// append is already on stable storage when it returns (memory has none to give,
    /// Postgres commits synchronously) keep this default, which ignores `durability`.
    async fn append_with(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        let _ = durability;
        self.append(thread_id, expected_next_seq, events).await
    }

    /// [`EventStore::append_with`] for events the caller keeps too (the runner holds its
    /// run's events as `Arc<Event>`): a store that keeps events in memory can share them
    /// instead of copying; this default copies them and calls `append_with`. Same
    /// contract as `append_with`.
    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        let owned: Vec<Event> = events.iter().map(|event| Event::clone(event)).collect();
        self.append_with(thread_id, expected_next_seq, &owned, durability)
            .await
    }

    /// Whether this store checks an [`AppendFence`] itself, in the append's transaction
    /// ([`EventStore::append_fenced`]): the SQL stores, whose run queue lives in the same
    /// database. A store that does not (memory) leaves fencing to its caller's own view of
    /// the lease.
    fn fences_appends(&self) -> bool {
        false
    }

    /// [`EventStore::append_shared`], written only while `fence` holds (checked by the store
    /// in the same transaction; else [`StoreError::Fenced`] and nothing is written). This
    /// default, for stores that cannot check ([`EventStore::fences_appends`] is false),
    /// refuses every call.
    async fn append_fenced(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
        fence: AppendFence,
    ) -> Result<(), StoreError> {
        let _ = (expected_next_seq, events, durability);
        Err(StoreError::Backend(format!(
            "this store cannot check the lease of job {} on an append to thread {thread_id}",
            fence.job_id
        )))
    }

    /// All events of a thread in order (empty when the thread does not exist).
    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError>;

    /// The events of a thread from sequence number `from_seq` on, in order (empty when
    /// there are none): what a follower that has seen the log up to `from_seq - 1` reads
    /// on each wake-up, instead of the whole log. This default loads the whole log and
    /// drops the head; the SQL stores read only the tail, by the `(thread_id, seq)` key.
    async fn load_from(&self, thread_id: &str, from_seq: u64) -> Result<Vec<Event>, StoreError> {
        let mut events = self.load(thread_id).await?;
        events.retain(|event| event.seq >= from_seq);
        Ok(events)
    }

    /// Threads matching a filter, most recently updated first.
    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError>;

    /// Deletes a thread; returns whether it existed.
    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError>;

    /// One page of the runs list: threads with their runs summed up, filtered, sorted and
    /// paged by the store ([`crate::runs`]). This default folds the log of every thread
    /// the filters of [`EventStore::list_threads`] let through (right for the memory
    /// store); the SQL stores answer from an index without reading every log.
    async fn list_runs(
        &self,
        query: &crate::runs::RunQuery,
    ) -> Result<crate::runs::RunPage, StoreError> {
        crate::runs::list_runs_by_folding(self, query).await
    }

    /// The metrics facts of every run of the threads `query` lets through (for a dashboard
    /// or `keel stats`, see [`crate::run_metrics`]). This default folds the log of each
    /// (right for the memory store); the SQL stores answer from their run index.
    async fn run_facts(
        &self,
        query: &crate::run_metrics::FactsQuery,
    ) -> Result<crate::run_metrics::FactsPage, StoreError> {
        crate::run_metrics::run_facts_by_folding(self, query).await
    }

    /// Copies events `0..=at_seq` of `source` into a new thread `target`, rewriting their
    /// thread id. Fails with a conflict if `target` already has events.
    async fn fork_thread(
        &self,
        source: &str,
        at_seq: u64,
        target: &str,
    ) -> Result<u64, StoreError> {
        let events = self.load(source).await?;
        if events.is_empty() {
            return Err(StoreError::NotFound(source.to_string()));
        }
        let copied: Vec<Event> = events
            .into_iter()
            .take_while(|event| event.seq <= at_seq)
            .map(|mut event| {
                event.thread_id = target.into();
                event
            })
            .collect();
        self.append(target, 0, &copied).await?;
        Ok(copied.len() as u64)
    }

    /// Retention: deletes every thread whose last run ended before `cutoff` (by its last
    /// event time) and returns how many were deleted. Threads still running or waiting for
    /// a human are never purged.
    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let threads = self.list_threads(&ThreadFilter::default()).await?;
        let mut deleted = 0u64;
        for summary in threads {
            if matches!(summary.status, ThreadStatus::Ended(_))
                && summary.updated_at < cutoff
                && self.delete_thread(&summary.thread_id).await?
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

/// Keeps logs in memory. For tests and ephemeral runs. Events are kept as `Arc<Event>`,
/// so a runner appending through [`EventStore::append_shared`] and the store hold one copy.
#[derive(Debug, Default)]
pub struct MemoryStore {
    threads: Mutex<HashMap<String, Vec<Arc<Event>>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<Event>>>> {
        match self.threads.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Appends `events` (already checked by [`check_batch`]) if the log is where the
    /// caller expects it.
    fn append_checked(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: impl ExactSizeIterator<Item = Arc<Event>>,
    ) -> Result<(), StoreError> {
        let mut threads = self.lock();
        let log = threads.entry(thread_id.to_string()).or_default();
        let actual = log.len() as u64;
        if actual != expected_next_seq {
            return Err(StoreError::Conflict {
                thread_id: thread_id.to_string(),
                expected: expected_next_seq,
                actual,
            });
        }
        log.extend(events);
        Ok(())
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        check_batch(thread_id, expected_next_seq, events.iter())?;
        self.append_checked(
            thread_id,
            expected_next_seq,
            events.iter().map(|event| Arc::new(event.clone())),
        )
    }

    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        _durability: AppendDurability,
    ) -> Result<(), StoreError> {
        check_batch(thread_id, expected_next_seq, events.iter().map(|e| &**e))?;
        self.append_checked(thread_id, expected_next_seq, events.iter().cloned())
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        Ok(self
            .lock()
            .get(thread_id)
            .map(|log| log.iter().map(|event| Event::clone(event)).collect())
            .unwrap_or_default())
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        let threads = self.lock();
        let mut out: Vec<ThreadSummary> = threads
            .iter()
            .filter_map(|(id, events)| ThreadSummary::from_events(id, events))
            .filter(|summary| filter.matches(summary))
            .collect();
        out.sort_by_key(|summary| std::cmp::Reverse(summary.updated_at));
        if let Some(limit) = filter.limit {
            out.truncate(limit);
        }
        Ok(out)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().remove(thread_id).is_some())
    }
}
