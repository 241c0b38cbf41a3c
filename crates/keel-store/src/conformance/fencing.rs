//! Store-side fencing cases ([`keel_core::AppendFence`]): for a store whose run queue lives
//! in the same database as its log, an append conditional on a lease is written only while
//! that lease holds by the store's own clock — whatever the appending process believes.

use std::sync::Arc;
use std::time::Duration;

use keel_core::event::Event;
use keel_core::store::{AppendDurability, AppendFence, EventStore, StoreError};
use serde_json::json;

use super::fixtures::{event, notice};
use super::{ConformanceError, ensure, ensure_eq, fail};
use crate::queue::{Lease, QueueError, RunQueue};

type R = Result<(), ConformanceError>;

const C: &str = "fenced_appends";
const LONG: Duration = Duration::from_secs(60);

fn queue_error(what: &'static str) -> impl Fn(QueueError) -> ConformanceError {
    move |e| fail(C, format!("{what}: unexpected error {e}"))
}

fn fence(lease: &Lease) -> AppendFence {
    AppendFence {
        job_id: lease.job_id,
        token: lease.token,
    }
}

fn batch(thread: &str, seq: u64) -> Vec<Arc<Event>> {
    vec![Arc::new(event(
        thread,
        seq,
        1,
        notice("n", &seq.to_string()),
    ))]
}

async fn append(
    store: &dyn EventStore,
    thread: &str,
    seq: u64,
    with: AppendFence,
) -> Result<(), StoreError> {
    store
        .append_fenced(
            thread,
            seq,
            &batch(thread, seq),
            AppendDurability::Default,
            with,
        )
        .await
}

/// Refused as fenced, with `reason` in its message, and nothing written.
async fn refused(
    store: &dyn EventStore,
    thread: &str,
    seq: u64,
    with: AppendFence,
    reason: &str,
) -> R {
    let result = append(store, thread, seq, with).await;
    ensure(
        C,
        matches!(&result, Err(StoreError::Fenced { reason: r, .. }) if r.contains(reason)),
        || format!("append with {with:?}: expected Fenced ({reason}), got {result:?}"),
    )?;
    let len = store
        .load(thread)
        .await
        .map_err(|e| fail(C, format!("load: {e}")))?
        .len();
    ensure_eq(C, "events after a refused append", len as u64, seq)
}

/// A fenced append holds while its lease does: refused with a wrong token, after a
/// takeover (the old holder), once the job has ended, and once the lease lapsed by the
/// store's clock although nobody took it over — the case of a clock step or a paused
/// process, where the holder's own view of its lease is wrong — and, many at once, each by
/// its own fence.
pub async fn fenced_appends(store: Arc<dyn EventStore>, queue: Arc<dyn RunQueue>) -> R {
    ensure(C, store.fences_appends(), || {
        "the store does not say it fences appends".into()
    })?;
    let thread = "fenced-1";
    queue
        .enqueue(thread, &json!({}))
        .await
        .map_err(queue_error("enqueue"))?;
    let first = queue
        .acquire("w1", LONG)
        .await
        .map_err(queue_error("acquire"))?
        .ok_or_else(|| fail(C, "no job"))?;
    append(store.as_ref(), thread, 0, fence(&first))
        .await
        .map_err(|e| fail(C, format!("append under a valid lease: {e}")))?;
    let forged = AppendFence {
        token: first.token.saturating_add(1),
        ..fence(&first)
    };
    refused(store.as_ref(), thread, 1, forged, "taken over").await?;
    let unknown = AppendFence {
        job_id: first.job_id.saturating_add(1000),
        ..fence(&first)
    };
    refused(store.as_ref(), thread, 1, unknown, "no longer exists").await?;

    // Given back and leased again: the first holder is fenced out, the second writes.
    queue
        .release(&first)
        .await
        .map_err(queue_error("release"))?;
    let second = queue
        .acquire("w2", LONG)
        .await
        .map_err(queue_error("acquire again"))?
        .ok_or_else(|| fail(C, "released job not leased again"))?;
    refused(store.as_ref(), thread, 1, fence(&first), "taken over").await?;
    append(store.as_ref(), thread, 1, fence(&second))
        .await
        .map_err(|e| fail(C, format!("append of the new holder: {e}")))?;
    queue
        .complete(&second)
        .await
        .map_err(queue_error("complete"))?;
    let ended = append(store.as_ref(), thread, 2, fence(&second)).await;
    ensure(C, matches!(ended, Err(StoreError::Fenced { .. })), || {
        format!("append after the job completed: {ended:?}")
    })?;

    // Many at once (the SQL stores group concurrent appends): each append is answered by
    // its own fence, a refused one never fails nor blocks the others of its group.
    let mut leases = Vec::new();
    for n in 0..16 {
        let thread = format!("fenced-many-{n}");
        queue
            .enqueue(&thread, &json!({}))
            .await
            .map_err(queue_error("enqueue"))?;
        let lease = queue
            .acquire("w-many", LONG)
            .await
            .map_err(queue_error("acquire"))?
            .ok_or_else(|| fail(C, "no job"))?;
        leases.push((thread, lease));
    }
    let mut appends = tokio::task::JoinSet::new();
    for (n, (thread, lease)) in leases.iter().enumerate() {
        let store = store.clone();
        let thread = thread.clone();
        let mut with = fence(lease);
        if n % 2 == 1 {
            with.token = with.token.saturating_add(7);
        }
        appends.spawn(async move {
            let written = append(store.as_ref(), &thread, 0, with).await;
            (n, written)
        });
    }
    while let Some(joined) = appends.join_next().await {
        let (n, written) = joined.map_err(|e| fail(C, format!("append task: {e}")))?;
        let fenced = matches!(written, Err(StoreError::Fenced { .. }));
        ensure(
            C,
            (n % 2 == 1) == fenced && (fenced || written.is_ok()),
            || format!("concurrent append {n}: {written:?}"),
        )?;
    }
    for (n, (thread, _)) in leases.iter().enumerate() {
        let len = store
            .load(thread)
            .await
            .map_err(|e| fail(C, format!("load: {e}")))?
            .len();
        ensure_eq(
            C,
            "events of a concurrent append",
            len,
            usize::from(n % 2 == 0),
        )?;
    }

    // Lapsed by the store's clock, nobody else holding it.
    let lapsing = "fenced-2";
    queue
        .enqueue(lapsing, &json!({}))
        .await
        .map_err(queue_error("enqueue"))?;
    let short = queue
        .acquire("w3", Duration::from_millis(300))
        .await
        .map_err(queue_error("acquire"))?
        .ok_or_else(|| fail(C, "no job"))?;
    // Past its expiry by any clock (wall time passes however loaded the machine is).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    refused(store.as_ref(), lapsing, 0, fence(&short), "lapsed").await
}
