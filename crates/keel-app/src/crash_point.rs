//! A deterministic kill point for crash tests: with `KEEL_TEST_MODE=1` and
//! `KEEL_CRASH_AFTER_APPENDS=N`, the process aborts right after its Nth append to the event
//! store has returned — the event is durable, nothing has acted on it yet. A crash harness
//! runs the same conversation once per N and so crashes every durable point of a run
//! instead of sampling them (docs/reliability.md, "Exactly once").
//!
//! Nothing here is active unless both variables are set: the hook is a test seam, and the
//! test-mode switch keeps a stray variable in a production environment from arming it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::store::{ThreadFilter, ThreadSummary};
use keel_core::{AppendDurability, AppendFence, Event, EventStore, StoreError};

/// The variable naming the append after which the process aborts (1 = the first).
pub const CRASH_AFTER_APPENDS_ENV: &str = "KEEL_CRASH_AFTER_APPENDS";

/// `store` itself, or — when the kill point is armed — `store` behind the counter.
pub fn arm(store: Arc<dyn EventStore>) -> Arc<dyn EventStore> {
    let test_mode = std::env::var(keel_providers::TEST_MODE_VAR).is_ok_and(|v| v == "1");
    let after = std::env::var(CRASH_AFTER_APPENDS_ENV)
        .ok()
        .and_then(|value| value.trim().parse::<u64>().ok())
        .filter(|n| *n > 0);
    match after {
        Some(after) if test_mode => Arc::new(CrashAfterAppends {
            inner: store,
            after,
            appended: AtomicU64::new(0),
        }),
        _ => store,
    }
}

/// Aborts the process after the `after`th successful append.
struct CrashAfterAppends {
    inner: Arc<dyn EventStore>,
    after: u64,
    appended: AtomicU64,
}

impl CrashAfterAppends {
    fn count(&self) {
        let done = self
            .appended
            .fetch_add(1, Ordering::SeqCst)
            .saturating_add(1);
        if done >= self.after {
            // The kill point: the append is durable and nobody has acted on it. `abort`
            // ends the process at once, as a SIGKILL would (no destructor, no flush).
            std::process::abort();
        }
    }
}

#[async_trait]
impl EventStore for CrashAfterAppends {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        self.inner
            .append(thread_id, expected_next_seq, events)
            .await?;
        self.count();
        Ok(())
    }

    async fn append_with(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        self.inner
            .append_with(thread_id, expected_next_seq, events, durability)
            .await?;
        self.count();
        Ok(())
    }

    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        self.inner
            .append_shared(thread_id, expected_next_seq, events, durability)
            .await?;
        self.count();
        Ok(())
    }

    fn fences_appends(&self) -> bool {
        self.inner.fences_appends()
    }

    async fn append_fenced(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
        fence: AppendFence,
    ) -> Result<(), StoreError> {
        self.inner
            .append_fenced(thread_id, expected_next_seq, events, durability, fence)
            .await?;
        self.count();
        Ok(())
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.load(thread_id).await
    }

    async fn load_from(&self, thread_id: &str, from_seq: u64) -> Result<Vec<Event>, StoreError> {
        self.inner.load_from(thread_id, from_seq).await
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads(filter).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn list_runs(
        &self,
        query: &keel_core::runs::RunQuery,
    ) -> Result<keel_core::runs::RunPage, StoreError> {
        self.inner.list_runs(query).await
    }

    async fn run_facts(
        &self,
        query: &keel_core::run_metrics::FactsQuery,
    ) -> Result<keel_core::run_metrics::FactsPage, StoreError> {
        self.inner.run_facts(query).await
    }

    async fn fork_thread(
        &self,
        source: &str,
        at_seq: u64,
        target: &str,
    ) -> Result<u64, StoreError> {
        self.inner.fork_thread(source, at_seq, target).await
    }

    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        self.inner.purge_ended_before(cutoff).await
    }
}
