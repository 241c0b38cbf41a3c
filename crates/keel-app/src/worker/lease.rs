//! Holding a job's lease while its run is driven, and stopping the moment it is in doubt.
//!
//! [`LeaseKeeper`] renews the lease every third of its TTL and keeps a local *safe
//! deadline*: the instant the last confirmed renewal was **sent** plus two thirds of the
//! TTL. The store's lease cannot end before that renewal's send time plus the whole TTL, so
//! the last third is the margin in which the worker stops. The lease is *lost* — the run's
//! [`CancellationToken`] is cancelled at once and nothing more is written — as soon as
//! a renewal fails (taken over, expired, or any store error), a renewal does not answer
//! before the safe deadline, or the deadline passes without one.
//!
//! [`FencedStore`] is the event store a worker's run writes through: it refuses every
//! append once the lease is lost or past its safe deadline, has the store itself check the
//! lease in the append's transaction where it can (SQLite, Postgres: store-side fencing by
//! the store's clock, [`AppendFence`]), checks again after each append returns, and before
//! an append made with [`AppendDurability::Sync`] — the batch that starts a mutating tool
//! call — it renews the lease first, so a mutating call starts only with a freshly
//! confirmed lease (a full TTL on the store's clock) and is cancelled before that lease can
//! lapse.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::store::{
    AppendDurability, AppendFence, EventStore, StoreError, ThreadFilter, ThreadSummary,
};
use keel_core::{CancellationToken, Event};
use keel_store::{Lease, QueueError, RunQueue};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why the lease was given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// The store says the lease is no longer ours (expired or taken over).
    Lost(String),
    /// A renewal failed or did not answer in time: the lease may still be valid, but this
    /// worker can no longer prove it.
    Unconfirmed(String),
    /// The worker gave the lease up to shut down (it is still valid on the store until
    /// the worker releases the job or the lease expires).
    Shutdown(String),
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lost(why) | Self::Unconfirmed(why) | Self::Shutdown(why) => f.write_str(why),
        }
    }
}

struct State {
    lease: Lease,
    /// Act only before this instant unless a renewal confirms the lease again.
    safe_until: Instant,
    loss: Option<Loss>,
}

/// Renews one job's lease and cancels its run when the lease is lost (see the module docs).
pub struct LeaseKeeper {
    queue: Arc<dyn RunQueue>,
    ttl: Duration,
    cancel: CancellationToken,
    state: Mutex<State>,
    lost: Notify,
}

impl LeaseKeeper {
    /// Keeps `lease`, acquired by a request sent at `sent`; `cancel` is the run's token.
    pub fn new(
        queue: Arc<dyn RunQueue>,
        lease: Lease,
        ttl: Duration,
        sent: Instant,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            queue,
            ttl,
            cancel,
            state: Mutex::new(State {
                lease,
                safe_until: sent + safe_span(ttl),
                loss: None,
            }),
            lost: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The lease as last renewed.
    pub fn lease(&self) -> Lease {
        self.lock().lease.clone()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<Loss> {
        self.lock().loss.clone()
    }

    /// Gives the lease up: records why (the first reason wins), cancels the run and wakes
    /// [`LeaseKeeper::wait_lost`].
    pub fn lose(&self, loss: Loss) {
        {
            let mut state = self.lock();
            if state.loss.is_some() {
                return;
            }
            state.loss = Some(loss);
        }
        self.cancel.cancel();
        self.lost.notify_waiters();
    }

    /// Resolves once the lease is lost.
    pub async fn wait_lost(&self) {
        loop {
            let notified = self.lost.notified();
            if self.loss().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Fails when the lease is lost or its safe deadline has passed (no store call).
    pub fn check(&self) -> Result<(), Loss> {
        let safe_until = {
            let state = self.lock();
            if let Some(loss) = &state.loss {
                return Err(loss.clone());
            }
            state.safe_until
        };
        if Instant::now() >= safe_until {
            self.lose(Loss::Unconfirmed(format!(
                "no renewal confirmed the lease within {:?} (two thirds of its TTL)",
                safe_span(self.ttl)
            )));
            return Err(self
                .loss()
                .unwrap_or(Loss::Unconfirmed("deadline passed".into())));
        }
        Ok(())
    }

    /// Renews the lease now; on any failure the lease is lost (and the run cancelled).
    pub async fn confirm(&self) -> Result<(), Loss> {
        let (lease, safe_until) = {
            let state = self.lock();
            if let Some(loss) = &state.loss {
                return Err(loss.clone());
            }
            (state.lease.clone(), state.safe_until)
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout_at(safe_until, self.queue.renew(&lease, self.ttl)).await;
        let loss = match answer {
            Ok(Ok(renewed)) => {
                let mut state = self.lock();
                if let Some(loss) = &state.loss {
                    return Err(loss.clone());
                }
                state.lease = renewed;
                state.safe_until = state.safe_until.max(sent + safe_span(self.ttl));
                return Ok(());
            }
            Ok(Err(error @ QueueError::LeaseLost { .. })) => Loss::Lost(error.to_string()),
            Ok(Err(error)) => Loss::Unconfirmed(format!("renewing the lease failed: {error}")),
            Err(_) => Loss::Unconfirmed(format!(
                "renewing the lease did not answer within the lease's safe deadline ({:?} after \
                 the last confirmed renewal)",
                safe_span(self.ttl)
            )),
        };
        self.lose(loss);
        Err(self
            .loss()
            .unwrap_or(Loss::Unconfirmed("renewal failed".into())))
    }

    /// Renews every third of the TTL until the lease is lost; loses it when the safe
    /// deadline passes first (e.g. this task was starved).
    pub async fn keep(self: Arc<Self>) {
        let every = (self.ttl / 3).max(Duration::from_millis(1));
        let mut next = Instant::now() + every;
        loop {
            let safe_until = {
                let state = self.lock();
                if state.loss.is_some() {
                    return;
                }
                state.safe_until
            };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    next = Instant::now() + every;
                    if self.confirm().await.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(safe_until) => {
                    if self.check().is_err() {
                        return;
                    }
                }
                () = self.wait_lost() => return,
            }
        }
    }
}

/// How long a confirmed lease may be acted on: two thirds of its TTL.
fn safe_span(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 3)
}

/// The event store a worker's run writes through (see the module docs).
pub struct FencedStore {
    inner: Arc<dyn EventStore>,
    keeper: Arc<LeaseKeeper>,
}

impl FencedStore {
    /// Fences `inner` with `keeper`'s lease.
    pub fn new(inner: Arc<dyn EventStore>, keeper: Arc<LeaseKeeper>) -> Self {
        Self { inner, keeper }
    }

    fn refused(&self, thread_id: &str, loss: &Loss) -> StoreError {
        let lease = self.keeper.lease();
        StoreError::Backend(format!(
            "lease on job {} lost ({loss}); this worker writes nothing more to thread {thread_id}",
            lease.job_id
        ))
    }
}

#[async_trait]
impl EventStore for FencedStore {
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
        let shared: Vec<Arc<Event>> = events.iter().cloned().map(Arc::new).collect();
        self.append_shared(thread_id, expected_next_seq, &shared, durability)
            .await
    }

    async fn append_shared(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Arc<Event>],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        let before = match durability {
            AppendDurability::Sync => self.keeper.confirm().await,
            _ => self.keeper.check(),
        };
        before.map_err(|loss| self.refused(thread_id, &loss))?;
        if self.inner.fences_appends() && !events.is_empty() {
            // The store checks the lease itself, in the append's transaction, by its own
            // clock: a takeover this process has not heard of yet still stops the write.
            let lease = self.keeper.lease();
            let fence = AppendFence {
                job_id: lease.job_id,
                token: lease.token,
            };
            let written = self
                .inner
                .append_fenced(thread_id, expected_next_seq, events, durability, fence)
                .await;
            if let Err(refused @ StoreError::Fenced { .. }) = &written {
                self.keeper.lose(Loss::Lost(refused.to_string()));
            }
            written?;
        } else {
            self.inner
                .append_shared(thread_id, expected_next_seq, events, durability)
                .await?;
        }
        // Lost while the append was in flight: it is written, but the run must not act on
        // it (e.g. start the mutating call it announces); the next holder of the lease
        // settles whatever it left open.
        self.keeper
            .check()
            .map_err(|loss| self.refused(thread_id, &loss))
    }

    fn fences_appends(&self) -> bool {
        self.inner.fences_appends()
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
        self.keeper
            .check()
            .map_err(|loss| self.refused(thread_id, &loss))?;
        self.inner.delete_thread(thread_id).await
    }

    async fn fork_thread(
        &self,
        source: &str,
        at_seq: u64,
        target: &str,
    ) -> Result<u64, StoreError> {
        self.keeper
            .check()
            .map_err(|loss| self.refused(target, &loss))?;
        self.inner.fork_thread(source, at_seq, target).await
    }

    async fn purge_ended_before(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        self.keeper
            .check()
            .map_err(|loss| self.refused("*", &loss))?;
        self.inner.purge_ended_before(cutoff).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
    use std::sync::atomic::{AtomicU32, Ordering};

    use keel_core::{EventKind, MemoryStore};
    use keel_store::{JobId, JobInfo, MemoryRunQueue, QueueCounts};
    use serde_json::{Value, json};

    use super::*;

    /// A queue whose `renew` can be made to fail or to hang.
    #[derive(Default)]
    struct Faulty {
        inner: MemoryRunQueue,
        fail_renew: std::sync::atomic::AtomicBool,
        hang_renew: std::sync::atomic::AtomicBool,
        renewals: AtomicU32,
    }

    #[async_trait]
    impl RunQueue for Faulty {
        async fn enqueue(&self, thread_id: &str, payload: &Value) -> Result<JobId, QueueError> {
            self.inner.enqueue(thread_id, payload).await
        }
        async fn enqueue_continuation(
            &self,
            thread_id: &str,
            payload: &Value,
        ) -> Result<JobId, QueueError> {
            self.inner.enqueue_continuation(thread_id, payload).await
        }
        async fn snooze(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
            self.inner.snooze(lease, delay).await
        }
        async fn dead_letter(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
            self.inner.dead_letter(lease, error).await
        }
        async fn cancel_queued(&self, job_id: JobId, reason: &str) -> Result<bool, QueueError> {
            self.inner.cancel_queued(job_id, reason).await
        }
        async fn acquire(&self, worker: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
            self.inner.acquire(worker, ttl).await
        }
        async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError> {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            if self.hang_renew.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.fail_renew.load(Ordering::SeqCst) {
                return Err(QueueError::Backend("injected: connection reset".into()));
            }
            self.inner.renew(lease, ttl).await
        }
        async fn complete(&self, lease: &Lease) -> Result<(), QueueError> {
            self.inner.complete(lease).await
        }
        async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
            self.inner.release(lease).await
        }
        async fn retry_later(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
            self.inner.retry_later(lease, delay).await
        }
        async fn fail(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
            self.inner.fail(lease, error).await
        }
        async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
            self.inner.job(job_id).await
        }
        async fn counts(&self) -> Result<QueueCounts, QueueError> {
            self.inner.counts().await
        }
    }

    const TTL: Duration = Duration::from_secs(30);

    async fn keeper(queue: &Arc<Faulty>) -> (Arc<LeaseKeeper>, CancellationToken) {
        queue.enqueue("t", &json!({})).await.unwrap();
        let sent = Instant::now();
        let lease = queue.acquire("w", TTL).await.unwrap().unwrap();
        let cancel = CancellationToken::new();
        let queue: Arc<dyn RunQueue> = queue.clone();
        let keeper = Arc::new(LeaseKeeper::new(queue, lease, TTL, sent, cancel.clone()));
        (keeper, cancel)
    }

    fn event(seq: u64) -> Event {
        Event {
            v: 1,
            seq,
            ts: Utc::now(),
            thread_id: "t".into(),
            run_id: "run_1".into(),
            trace_id: "0".repeat(32).into(),
            span_id: "0".repeat(16),
            kind: EventKind::Notice {
                code: "test".into(),
                message: "x".into(),
                data: None,
            },
        }
    }

    /// Renewals go on every third of the TTL for as long as the run lasts (here ten TTLs
    /// of virtual time): a long tool call never outlives its lease.
    #[tokio::test(start_paused = true)]
    async fn keeps_renewing_through_a_long_call() {
        let queue = Arc::new(Faulty::default());
        let (keeper, cancel) = keeper(&queue).await;
        let task = tokio::spawn(keeper.clone().keep());
        tokio::time::sleep(TTL * 10).await;
        assert!(keeper.loss().is_none(), "{:?}", keeper.loss());
        assert!(!cancel.is_cancelled());
        assert!(queue.renewals.load(Ordering::SeqCst) >= 29);
        task.abort();
    }

    /// The first failed renewal cancels the run and fences the store at once.
    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_cancels_the_run_and_fences_appends() {
        let queue = Arc::new(Faulty::default());
        let (keeper, cancel) = keeper(&queue).await;
        let store = FencedStore::new(Arc::new(MemoryStore::new()), keeper.clone());
        store.append("t", 0, &[event(0)]).await.unwrap();
        let task = tokio::spawn(keeper.clone().keep());
        queue.fail_renew.store(true, Ordering::SeqCst);
        cancel.cancelled().await;
        assert!(
            matches!(keeper.loss(), Some(Loss::Unconfirmed(ref m)) if m.contains("connection reset")),
            "{:?}",
            keeper.loss()
        );
        assert_eq!(
            queue.renewals.load(Ordering::SeqCst),
            1,
            "one failure is enough"
        );
        let refused = store.append("t", 1, &[event(1)]).await.unwrap_err();
        assert!(refused.to_string().contains("lease on job"), "{refused}");
        assert_eq!(store.load("t").await.unwrap().len(), 1);
        task.await.unwrap();
    }

    /// A renewal that never answers loses the lease at the safe deadline (two thirds of the
    /// TTL after the last confirmed renewal was sent), before the store's lease can end.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_loses_the_lease_before_it_expires() {
        let queue = Arc::new(Faulty::default());
        let started = Instant::now();
        let (keeper, cancel) = keeper(&queue).await;
        queue.hang_renew.store(true, Ordering::SeqCst);
        let task = tokio::spawn(keeper.clone().keep());
        cancel.cancelled().await;
        let after = started.elapsed();
        assert!(after <= TTL * 2 / 3, "lost after {after:?}");
        assert!(matches!(keeper.loss(), Some(Loss::Unconfirmed(_))));
        task.await.unwrap();
    }

    /// A takeover (the store answers lease lost) is a loss too, and a mutating call's
    /// `Sync` append renews first, so it is refused before anything is written.
    #[tokio::test(start_paused = true)]
    async fn a_sync_append_confirms_the_lease_first() {
        let queue = Arc::new(Faulty::default());
        let (keeper, cancel) = keeper(&queue).await;
        let store = FencedStore::new(Arc::new(MemoryStore::new()), keeper.clone());
        store
            .append_with("t", 0, &[event(0)], AppendDurability::Sync)
            .await
            .unwrap();
        assert_eq!(queue.renewals.load(Ordering::SeqCst), 1);
        // Another worker holds the job now (as after an expiry and a takeover).
        queue.inner.release(&keeper.lease()).await.unwrap();
        let taken = queue.inner.acquire("other", TTL).await.unwrap();
        assert!(taken.is_some());
        let refused = store
            .append_with("t", 1, &[event(1)], AppendDurability::Sync)
            .await
            .unwrap_err();
        assert!(cancel.is_cancelled());
        assert!(
            matches!(keeper.loss(), Some(Loss::Lost(_))),
            "{:?}",
            keeper.loss()
        );
        assert!(
            refused.to_string().contains("writes nothing more"),
            "{refused}"
        );
        assert_eq!(store.load("t").await.unwrap().len(), 1);
    }
}
