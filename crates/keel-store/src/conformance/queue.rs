//! Run-queue conformance cases.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{ConformanceError, ensure, ensure_eq, fail};
use crate::queue::{JobState, QueueError, RunQueue};

type R = Result<(), ConformanceError>;

const LONG: Duration = Duration::from_secs(60);

fn backend<'a>(case: &'static str, what: &'a str) -> impl Fn(QueueError) -> ConformanceError + 'a {
    move |e| fail(case, format!("{what}: unexpected error {e}"))
}

fn lost<T: std::fmt::Debug>(r: &Result<T, QueueError>) -> bool {
    matches!(r, Err(QueueError::LeaseLost { .. }))
}

/// Jobs come out oldest first with their payload, token 1, and finish as done.
pub async fn queue_enqueue_acquire_complete(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_enqueue_acquire_complete";
    let ids = [
        queue
            .enqueue("q-1", &json!({"n": 1}))
            .await
            .map_err(backend(C, "enqueue"))?,
        queue
            .enqueue("q-2", &json!({"n": 2, "s": "ü\u{0}"}))
            .await
            .map_err(backend(C, "enqueue"))?,
        queue
            .enqueue("q-3", &json!({"n": 3}))
            .await
            .map_err(backend(C, "enqueue"))?,
    ];
    ensure(C, ids.iter().collect::<HashSet<_>>().len() == 3, || {
        format!("job ids not distinct: {ids:?}")
    })?;
    let mut leases = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let lease = queue
            .acquire("w1", LONG)
            .await
            .map_err(backend(C, "acquire"))?
            .ok_or_else(|| fail(C, "no job"))?;
        ensure_eq(C, "job order", lease.job_id, *id)?;
        ensure_eq(C, "thread", lease.thread_id.clone(), format!("q-{}", i + 1))?;
        ensure_eq(C, "token", lease.token, 1)?;
        ensure_eq(C, "attempts", lease.attempts, 1)?;
        ensure_eq(C, "worker", lease.worker_id.as_str(), "w1")?;
        leases.push(lease);
    }
    ensure_eq(
        C,
        "payload",
        leases.get(1).map(|l| l.payload.clone()),
        Some(json!({"n": 2, "s": "ü\u{0}"})),
    )?;
    ensure(
        C,
        queue
            .acquire("w2", LONG)
            .await
            .map_err(backend(C, "acquire"))?
            .is_none(),
        || "acquired a held job".into(),
    )?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(C, "leased count", counts.leased, 3)?;
    for lease in &leases {
        let renewed = queue
            .renew(lease, LONG)
            .await
            .map_err(backend(C, "renew"))?;
        ensure(C, renewed.expires_at >= lease.expires_at, || {
            "renew moved expiry backwards".into()
        })?;
        queue
            .complete(lease)
            .await
            .map_err(backend(C, "complete"))?;
    }
    let again = queue
        .complete(leases.first().ok_or_else(|| fail(C, "no lease"))?)
        .await;
    ensure(C, lost(&again), || format!("second complete: {again:?}"))?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(
        C,
        "done count",
        (counts.queued, counts.leased, counts.done),
        (0, 0, 3),
    )?;
    let info = queue
        .job(ids.first().copied().unwrap_or_default())
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "job state", info.state, JobState::Done)?;
    ensure(
        C,
        queue
            .acquire("w1", LONG)
            .await
            .map_err(backend(C, "acquire"))?
            .is_none(),
        || "done job handed out".into(),
    )
}

/// Many concurrent acquirers never get the same job while its lease is valid.
pub async fn queue_exclusive_under_concurrency(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_exclusive_under_concurrency";
    const JOBS: usize = 40;
    for i in 0..JOBS {
        queue
            .enqueue(&format!("x-{i}"), &json!({"i": i}))
            .await
            .map_err(backend(C, "enqueue"))?;
    }
    let mut handles = Vec::new();
    for w in 0..8 {
        let queue = queue.clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                match queue.acquire(&format!("w{w}"), LONG).await {
                    Ok(Some(lease)) => got.push(lease.job_id),
                    Ok(None) => return Ok(got),
                    Err(e) => return Err(e.to_string()),
                }
            }
        }));
    }
    let joined = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(handles))
        .await
        .map_err(|_| fail(C, "acquirers did not finish within 60 s"))?;
    let mut all = Vec::new();
    for r in joined {
        all.extend(
            r.map_err(|e| fail(C, format!("task panicked: {e}")))?
                .map_err(|e| fail(C, e))?,
        );
    }
    let distinct: HashSet<_> = all.iter().collect();
    ensure_eq(C, "jobs acquired", all.len(), JOBS)?;
    ensure_eq(C, "distinct jobs acquired", distinct.len(), JOBS)
}

/// An expired lease is taken over with a higher token; the old holder is fenced off.
pub async fn queue_expired_lease_taken_over(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_expired_lease_taken_over";
    let id = queue
        .enqueue("e-1", &json!({}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let old = queue
        .acquire("crashy", Duration::from_millis(300))
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "no job"))?;
    ensure(
        C,
        queue
            .acquire("w2", LONG)
            .await
            .map_err(backend(C, "acquire"))?
            .is_none(),
        || "job handed out while its lease was valid".into(),
    )?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let new = queue
        .acquire("w2", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "expired job not taken over"))?;
    ensure_eq(C, "job", new.job_id, id)?;
    ensure(C, new.token > old.token, || {
        format!("token did not increase: {} -> {}", old.token, new.token)
    })?;
    ensure_eq(C, "attempts", new.attempts, 2)?;
    let r = queue.renew(&old, LONG).await;
    ensure(C, lost(&r), || format!("stale renew: {r:?}"))?;
    let r = queue.complete(&old).await;
    ensure(C, lost(&r), || format!("stale complete: {r:?}"))?;
    let r = queue.release(&old).await;
    ensure(C, lost(&r), || format!("stale release: {r:?}"))?;
    queue.renew(&new, LONG).await.map_err(backend(C, "renew"))?;
    queue.complete(&new).await.map_err(backend(C, "complete"))?;
    let info = queue
        .job(id)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "state", info.state, JobState::Done)?;
    ensure_eq(C, "worker", info.worker_id.as_deref(), Some("w2"))
}

/// A released job is ready again at once.
pub async fn queue_release(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_release";
    let id = queue
        .enqueue("r-1", &json!({"a": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let first = queue
        .acquire("w1", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "no job"))?;
    queue.release(&first).await.map_err(backend(C, "release"))?;
    let second = queue
        .acquire("w2", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "released job not ready"))?;
    ensure_eq(C, "job", second.job_id, id)?;
    ensure_eq(C, "token", second.token, first.token + 1)?;
    let r = queue.complete(&first).await;
    ensure(C, lost(&r), || format!("complete after release: {r:?}"))
}

/// Enqueue is idempotent per active thread; enqueueing a leased thread makes it run again.
pub async fn queue_idempotent_enqueue_and_rerun(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_idempotent_enqueue_and_rerun";
    let a = queue
        .enqueue("i-1", &json!({"v": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let b = queue
        .enqueue("i-1", &json!({"v": 2}))
        .await
        .map_err(backend(C, "enqueue again"))?;
    ensure_eq(C, "same job while queued", b, a)?;
    let lease = queue
        .acquire("w1", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "latest payload", lease.payload.clone(), json!({"v": 2}))?;
    let c = queue
        .enqueue("i-1", &json!({"v": 3}))
        .await
        .map_err(backend(C, "enqueue while leased"))?;
    ensure_eq(C, "same job while leased", c, a)?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    let info = queue
        .job(a)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "re-queued after complete", info.state, JobState::Queued)?;
    let rerun = queue
        .acquire("w2", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "rerun not ready"))?;
    ensure_eq(C, "rerun payload", rerun.payload.clone(), json!({"v": 3}))?;
    queue
        .complete(&rerun)
        .await
        .map_err(backend(C, "complete"))?;
    let info = queue
        .job(a)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "done", info.state, JobState::Done)?;
    let d = queue
        .enqueue("i-1", &json!({"v": 4}))
        .await
        .map_err(backend(C, "enqueue after done"))?;
    ensure(C, d != a, || "a finished job was reused".into())
}

/// Bad arguments are typed errors.
pub async fn queue_invalid_arguments(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_invalid_arguments";
    queue
        .enqueue("v-1", &json!({}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let r = queue.acquire("w", Duration::ZERO).await;
    ensure(C, matches!(r, Err(QueueError::InvalidArgument(_))), || {
        format!("zero ttl: {r:?}")
    })?;
    let r = queue.acquire("", LONG).await;
    ensure(C, matches!(r, Err(QueueError::InvalidArgument(_))), || {
        format!("empty worker: {r:?}")
    })?;
    let r = queue.enqueue("", &json!({})).await;
    ensure(C, matches!(r, Err(QueueError::InvalidArgument(_))), || {
        format!("empty thread: {r:?}")
    })?;
    ensure(
        C,
        queue
            .job(987_654)
            .await
            .map_err(backend(C, "job"))?
            .is_none(),
        || "unknown job found".into(),
    )
}
