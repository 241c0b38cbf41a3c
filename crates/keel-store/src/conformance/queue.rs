//! Run-queue conformance cases.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
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
        ensure_eq(
            C,
            "thread",
            lease.thread_id.to_string(),
            format!("q-{}", i + 1),
        )?;
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

/// Every enqueue is a job of its own (a second message for a thread never replaces the
/// first); a thread's jobs are leased one at a time in enqueue order, other threads' jobs
/// meanwhile; a released job keeps its place.
pub async fn queue_one_job_per_message_in_order(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_one_job_per_message_in_order";
    let enqueue = |thread: &'static str, payload: serde_json::Value| {
        let queue = queue.clone();
        async move {
            queue
                .enqueue(thread, &payload)
                .await
                .map_err(backend(C, "enqueue"))
        }
    };
    let acquire = |worker: &'static str| {
        let queue = queue.clone();
        async move {
            queue
                .acquire(worker, LONG)
                .await
                .map_err(backend(C, "acquire"))
        }
    };
    let first = enqueue("m-1", json!({"message": "first"})).await?;
    let second = enqueue("m-1", json!({"message": "second"})).await?;
    let other = enqueue("m-2", json!({"message": "other"})).await?;
    ensure(C, first != second, || {
        format!("the second message for a thread reused job {first}")
    })?;
    let a = acquire("w1").await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "first job", a.job_id, first)?;
    ensure_eq(
        C,
        "first payload",
        a.payload.clone(),
        json!({"message": "first"}),
    )?;
    let b = acquire("w2")
        .await?
        .ok_or_else(|| fail(C, "other thread's job not ready"))?;
    ensure_eq(
        C,
        "the other thread runs while m-1's first job is leased",
        b.job_id,
        other,
    )?;
    let none = acquire("w3").await?;
    ensure(C, none.is_none(), || {
        format!("a second job of a thread was leased while its first is leased: {none:?}")
    })?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(C, "counts", (counts.queued, counts.leased), (1, 2))?;
    let info = queue
        .job(second)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "second job missing"))?;
    ensure_eq(C, "second job waits", info.state, JobState::Queued)?;
    queue.complete(&a).await.map_err(backend(C, "complete"))?;
    let c = acquire("w3")
        .await?
        .ok_or_else(|| fail(C, "second job not ready"))?;
    ensure_eq(C, "second job", c.job_id, second)?;
    ensure_eq(
        C,
        "second payload",
        c.payload.clone(),
        json!({"message": "second"}),
    )?;
    // A third message while the second runs; the released second job stays ahead of it.
    let third = enqueue("m-1", json!({"message": "third"})).await?;
    queue.release(&c).await.map_err(backend(C, "release"))?;
    let d = acquire("w1")
        .await?
        .ok_or_else(|| fail(C, "released job not ready"))?;
    ensure_eq(C, "released job comes back first", d.job_id, second)?;
    ensure(C, acquire("w2").await?.is_none(), || {
        "the third job was leased while the second is leased".into()
    })?;
    queue.complete(&d).await.map_err(backend(C, "complete"))?;
    let e = acquire("w2")
        .await?
        .ok_or_else(|| fail(C, "third job not ready"))?;
    ensure_eq(C, "third job", e.job_id, third)?;
    queue.complete(&e).await.map_err(backend(C, "complete"))?;
    queue.complete(&b).await.map_err(backend(C, "complete"))?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(
        C,
        "all done",
        (counts.queued, counts.leased, counts.done, counts.failed),
        (0, 0, 4, 0),
    )
}

/// Eight concurrent workers over six threads of five jobs each: no thread ever has two
/// jobs leased at once, and each thread's jobs are leased in enqueue order.
pub async fn queue_thread_jobs_serialized_under_concurrency(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_thread_jobs_serialized_under_concurrency";
    const THREADS: usize = 6;
    const PER_THREAD: usize = 5;
    for n in 0..PER_THREAD {
        for t in 0..THREADS {
            queue
                .enqueue(&format!("s-{t}"), &json!({"n": n}))
                .await
                .map_err(backend(C, "enqueue"))?;
        }
    }
    let held: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
    let order: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut handles = Vec::new();
    for w in 0..8 {
        let (queue, held, order) = (queue.clone(), held.clone(), order.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let lease = match queue.acquire(&format!("w{w}"), LONG).await {
                    Ok(Some(lease)) => lease,
                    Ok(None) => match queue.counts().await {
                        Ok(counts) if counts.queued == 0 && counts.leased == 0 => return Ok(()),
                        Ok(_) => {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            continue;
                        }
                        Err(e) => return Err(e.to_string()),
                    },
                    Err(e) => return Err(e.to_string()),
                };
                if !lock(&held).insert(lease.thread_id.clone()) {
                    return Err(format!("thread {} leased twice at once", lease.thread_id));
                }
                let n = lease.payload.get("n").and_then(serde_json::Value::as_u64);
                lock(&order)
                    .entry(lease.thread_id.clone())
                    .or_default()
                    .push(n.unwrap_or(u64::MAX));
                tokio::task::yield_now().await;
                // Leave the set before completing: once complete returns, the thread's
                // next job may be leased by another worker.
                lock(&held).remove(&lease.thread_id);
                queue.complete(&lease).await.map_err(|e| e.to_string())?;
            }
        }));
    }
    let joined = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(handles))
        .await
        .map_err(|_| fail(C, "workers did not finish within 60 s"))?;
    for r in joined {
        r.map_err(|e| fail(C, format!("task panicked: {e}")))?
            .map_err(|e| fail(C, e))?;
    }
    let order = lock(&order).clone();
    ensure_eq(C, "threads served", order.len(), THREADS)?;
    let expected: Vec<u64> = (0..PER_THREAD as u64).collect();
    for (thread, got) in &order {
        ensure(C, *got == expected, || {
            format!("thread {thread}: jobs leased in order {got:?}, expected {expected:?}")
        })?;
    }
    Ok(())
}

/// `retry_later` gives a job back behind a delay, still ahead of its thread's later jobs;
/// `fail` gives it up with its reason and lets the thread's next job run; stale leases
/// can do neither.
pub async fn queue_retry_later_and_fail(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_retry_later_and_fail";
    let acquire = |worker: &'static str| {
        let queue = queue.clone();
        async move {
            queue
                .acquire(worker, LONG)
                .await
                .map_err(backend(C, "acquire"))
        }
    };
    let bad = queue
        .enqueue("f-1", &json!({"n": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let next = queue
        .enqueue("f-1", &json!({"n": 2}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let a = acquire("w1").await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "job", a.job_id, bad)?;
    let reason = format!("base URL not allowed {}", "x".repeat(10_000));
    queue.fail(&a, &reason).await.map_err(backend(C, "fail"))?;
    let info = queue
        .job(bad)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "failed job missing"))?;
    ensure_eq(C, "state", info.state, JobState::Failed)?;
    let error = info.error.unwrap_or_default();
    ensure(
        C,
        error.starts_with("base URL not allowed") && error.len() <= 4100,
        || format!("kept error ({} bytes): {:.60}", error.len(), error),
    )?;
    let r = queue.complete(&a).await;
    ensure(C, lost(&r), || format!("complete after fail: {r:?}"))?;
    let b = acquire("w1")
        .await?
        .ok_or_else(|| fail(C, "job after a failed one not ready"))?;
    ensure_eq(C, "next job", b.job_id, next)?;
    queue
        .retry_later(&b, LONG)
        .await
        .map_err(backend(C, "retry_later"))?;
    let r = queue.retry_later(&b, LONG).await;
    ensure(C, lost(&r), || format!("stale retry_later: {r:?}"))?;
    let r = queue.fail(&b, "stale").await;
    ensure(C, lost(&r), || format!("stale fail: {r:?}"))?;
    let later = queue
        .enqueue("f-1", &json!({"n": 3}))
        .await
        .map_err(backend(C, "enqueue"))?;
    ensure(C, acquire("w2").await?.is_none(), || {
        "a job delayed by retry_later (or the one behind it) was handed out at once".into()
    })?;
    let info = queue
        .job(later)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "behind the delayed job", info.state, JobState::Queued)?;
    // A short delay: the job comes back (polled with a generous deadline).
    let short = queue
        .enqueue("f-2", &json!({"n": 4}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let c = acquire("w1").await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "job", c.job_id, short)?;
    queue
        .retry_later(&c, Duration::from_millis(200))
        .await
        .map_err(backend(C, "retry_later"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let again = loop {
        if let Some(lease) = acquire("w2").await? {
            break lease;
        }
        ensure(C, tokio::time::Instant::now() < deadline, || {
            "a job given back with a 200 ms delay was not ready within 30 s".into()
        })?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure_eq(C, "the delayed job came back", again.job_id, short)?;
    ensure_eq(C, "token", again.token, c.token + 1)?;
    queue
        .complete(&again)
        .await
        .map_err(backend(C, "complete"))?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(
        C,
        "counts",
        (counts.queued, counts.leased, counts.done, counts.failed),
        (2, 0, 1, 1),
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
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

fn held<T: std::fmt::Debug>(r: &Result<T, QueueError>) -> bool {
    matches!(r, Err(QueueError::Held { .. }))
}

/// A driver outside the queue claims a thread under the same one-lease-per-thread rule as
/// workers: a second claim, a worker's acquire and a claim on a thread with a queued or
/// leased job are refused (naming the holder); an expired claim is taken over by the next
/// claim (never an expired worker lease); a completed claim frees the thread; and a worker
/// that leases an expired claim gets the claim's payload, which names its holder.
pub async fn queue_claims_exclude_other_drivers(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_claims_exclude_other_drivers";
    let first = queue
        .claim("c-1", "keel resume (pid 1)", LONG, None)
        .await
        .map_err(backend(C, "claim"))?;
    ensure_eq(
        C,
        "claim holder",
        first.worker_id.as_str(),
        "keel resume (pid 1)",
    )?;
    ensure_eq(
        C,
        "claim payload",
        crate::queue::claim_holder(&first.payload),
        Some("keel resume (pid 1)"),
    )?;
    let second = queue.claim("c-1", "keel approve (pid 2)", LONG, None).await;
    ensure(C, held(&second), || format!("a second claim: {second:?}"))?;
    if let Err(QueueError::Held { message, .. }) = &second {
        ensure(C, message.contains("keel resume (pid 1)"), || {
            format!("the refusal does not name the holder: {message}")
        })?;
    }
    // A job enqueued meanwhile waits behind the claim; no worker leases the thread.
    let queued = queue
        .enqueue("c-1", &json!({"n": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let leased = queue
        .acquire("w1", LONG)
        .await
        .map_err(backend(C, "acquire"))?;
    ensure(C, leased.is_none(), || {
        format!("a worker leased a claimed thread: {leased:?}")
    })?;
    queue
        .renew(&first, LONG)
        .await
        .map_err(backend(C, "renew"))?;
    queue
        .complete(&first)
        .await
        .map_err(backend(C, "complete"))?;
    // Now the queued job is the thread's: a claim is refused while it waits or runs.
    let waiting = queue.claim("c-1", "keel resume (pid 3)", LONG, None).await;
    ensure(C, held(&waiting), || {
        format!("claim over a queued job: {waiting:?}")
    })?;
    let job = queue
        .acquire("w1", Duration::from_millis(300))
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "the queued job was not leased after the claim ended"))?;
    ensure_eq(C, "job", job.job_id, queued)?;
    let running = queue.claim("c-1", "keel resume (pid 3)", LONG, None).await;
    ensure(C, held(&running), || {
        format!("claim over a leased job: {running:?}")
    })?;
    // An expired worker lease is not taken over by a claim (a worker continues it).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let expired = queue.claim("c-1", "keel resume (pid 3)", LONG, None).await;
    ensure(C, held(&expired), || {
        format!("claim took over an expired worker lease: {expired:?}")
    })?;
    let job = queue
        .acquire("w2", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "expired job not taken over by a worker"))?;
    queue.complete(&job).await.map_err(backend(C, "complete"))?;
    // An expired claim (its driver died) is taken over by the next claim.
    let dead = queue
        .claim(
            "c-2",
            "keel resume (pid 4)",
            Duration::from_millis(300),
            None,
        )
        .await
        .map_err(backend(C, "claim"))?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let next = queue
        .claim("c-2", "keel resume (pid 5)", LONG, None)
        .await
        .map_err(backend(C, "claim over an expired claim"))?;
    ensure_eq(C, "taken-over job", next.job_id, dead.job_id)?;
    ensure(C, next.token > dead.token, || {
        "token did not increase".into()
    })?;
    let r = queue.complete(&dead).await;
    ensure(C, lost(&r), || format!("stale claim completed: {r:?}"))?;
    queue
        .complete(&next)
        .await
        .map_err(backend(C, "complete"))?;
    let free = queue
        .claim("c-2", "keel resume (pid 6)", LONG, None)
        .await
        .map_err(backend(C, "claim after complete"))?;
    queue
        .complete(&free)
        .await
        .map_err(backend(C, "complete"))?;
    // A live claim whose holder the caller knows is dead is taken over at once.
    let crashed = queue
        .claim("c-4", "keel run (pid 8)", LONG, None)
        .await
        .map_err(backend(C, "claim"))?;
    let other = queue
        .claim(
            "c-4",
            "keel resume (pid 9)",
            LONG,
            Some("keel run (pid 1000)"),
        )
        .await;
    ensure(C, held(&other), || {
        format!("a live claim was taken over for another dead holder: {other:?}")
    })?;
    let after_crash = queue
        .claim("c-4", "keel resume (pid 9)", LONG, Some("keel run (pid 8)"))
        .await
        .map_err(backend(C, "claim over a dead holder"))?;
    ensure_eq(C, "taken-over job", after_crash.job_id, crashed.job_id)?;
    let r = queue.renew(&crashed, LONG).await;
    ensure(C, lost(&r), || {
        format!("the dead holder's lease still renews: {r:?}")
    })?;
    queue
        .complete(&after_crash)
        .await
        .map_err(backend(C, "complete"))?;
    // A worker may lease an expired claim: it sees the claim's payload.
    let abandoned = queue
        .claim(
            "c-3",
            "keel resume (pid 7)",
            Duration::from_millis(300),
            None,
        )
        .await
        .map_err(backend(C, "claim"))?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let swept = queue
        .acquire("w3", LONG)
        .await
        .map_err(backend(C, "acquire"))?
        .ok_or_else(|| fail(C, "an expired claim was not leased by a worker"))?;
    ensure_eq(C, "swept job", swept.job_id, abandoned.job_id)?;
    ensure(
        C,
        crate::queue::claim_holder(&swept.payload).is_some(),
        || format!("the worker cannot tell a claim: {:?}", swept.payload),
    )?;
    queue
        .complete(&swept)
        .await
        .map_err(backend(C, "complete"))?;
    Ok(())
}

/// A continuation (the job resuming a paused run once it is approved, denied, answered or
/// cancelled) is leased before its thread's other queued jobs — also before one that waits
/// for that run (given back with `retry_later`) — but never while another job of its
/// thread is leased, and continuations keep their order among themselves.
pub async fn queue_continuations_lease_first(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_continuations_lease_first";
    let acquire = || {
        let queue = queue.clone();
        async move {
            queue
                .acquire("w1", LONG)
                .await
                .map_err(backend(C, "acquire"))
        }
    };
    let first = queue
        .enqueue("k-1", &json!({"n": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let lease = acquire().await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "first job", lease.job_id, first)?;
    let second = queue
        .enqueue("k-1", &json!({"n": 2}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let k1 = queue
        .enqueue_continuation("k-1", &json!({"k": 1}))
        .await
        .map_err(backend(C, "enqueue_continuation"))?;
    ensure(C, acquire().await?.is_none(), || {
        "a continuation was leased while another job of its thread was leased".into()
    })?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    let lease = acquire().await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "the continuation goes first", lease.job_id, k1)?;
    let k2 = queue
        .enqueue_continuation("k-1", &json!({"k": 2}))
        .await
        .map_err(backend(C, "enqueue_continuation"))?;
    ensure(C, acquire().await?.is_none(), || {
        "a second continuation was leased while the first was".into()
    })?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    let lease = acquire().await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "continuations in order", lease.job_id, k2)?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    let lease = acquire().await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "then the other job", lease.job_id, second)?;
    ensure_eq(C, "payload", lease.payload.clone(), json!({"n": 2}))?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;

    // A job waiting for the paused run (given back for a long while) does not hold up the
    // continuation that ends that run.
    let waiting = queue
        .enqueue("k-2", &json!({"n": 3}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let lease = acquire().await?.ok_or_else(|| fail(C, "no job"))?;
    ensure_eq(C, "waiting job", lease.job_id, waiting)?;
    queue
        .retry_later(&lease, LONG)
        .await
        .map_err(backend(C, "retry_later"))?;
    let k3 = queue
        .enqueue_continuation("k-2", &json!({"k": 3}))
        .await
        .map_err(backend(C, "enqueue_continuation"))?;
    let lease = acquire().await?.ok_or_else(|| {
        fail(
            C,
            "the continuation waited behind a job that waits for it (deadlock)",
        )
    })?;
    ensure_eq(C, "continuation ahead of the waiting job", lease.job_id, k3)?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    ensure(C, acquire().await?.is_none(), || {
        "the waiting job went before its delay".into()
    })?;
    let info = queue
        .job(waiting)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "waiting job state", info.state, JobState::Queued)
}

/// Every job ends: `snooze` gives a job back without using up an attempt, `dead_letter`
/// ends it `dead` with its last error (and frees its thread), and a queued job — never a
/// leased one — can be cancelled.
pub async fn queue_dead_letter_snooze_and_cancel_queued(queue: Arc<dyn RunQueue>) -> R {
    const C: &str = "queue_dead_letter_snooze_and_cancel_queued";
    let acquire = || {
        let queue = queue.clone();
        async move {
            queue
                .acquire("w1", LONG)
                .await
                .map_err(backend(C, "acquire"))?
                .ok_or_else(|| fail(C, "no job"))
        }
    };
    let a = queue
        .enqueue("d-1", &json!({"n": 1}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let behind = queue
        .enqueue("d-1", &json!({"n": 2}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let lease = acquire().await?;
    ensure_eq(C, "job", lease.job_id, a)?;
    queue
        .snooze(&lease, Duration::ZERO)
        .await
        .map_err(backend(C, "snooze"))?;
    let lease = acquire().await?;
    ensure_eq(C, "snoozed job comes back", lease.job_id, a)?;
    ensure_eq(C, "a snooze uses no attempt", lease.attempts, 1)?;
    queue
        .retry_later(&lease, Duration::ZERO)
        .await
        .map_err(backend(C, "retry_later"))?;
    let lease = acquire().await?;
    ensure_eq(C, "a retry counts", lease.attempts, 2)?;
    queue
        .dead_letter(&lease, "store unreachable")
        .await
        .map_err(backend(C, "dead_letter"))?;
    let r = queue.dead_letter(&lease, "again").await;
    ensure(C, lost(&r), || format!("stale dead_letter: {r:?}"))?;
    let info = queue
        .job(a)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "dead state", info.state, JobState::Dead)?;
    ensure_eq(
        C,
        "last error",
        info.error.as_deref(),
        Some("store unreachable"),
    )?;

    // The thread goes on; its queued job can be cancelled, a leased one cannot.
    let later = queue
        .enqueue("d-1", &json!({"n": 3}))
        .await
        .map_err(backend(C, "enqueue"))?;
    let cancelled = queue
        .cancel_queued(later, "the user withdrew it")
        .await
        .map_err(backend(C, "cancel_queued"))?;
    ensure(C, cancelled, || "a queued job was not cancelled".into())?;
    let again = queue
        .cancel_queued(later, "twice")
        .await
        .map_err(backend(C, "cancel_queued"))?;
    ensure(C, !again, || "a cancelled job was cancelled again".into())?;
    let lease = acquire().await?;
    ensure_eq(C, "the next job after the dead one", lease.job_id, behind)?;
    let leased = queue
        .cancel_queued(behind, "too late")
        .await
        .map_err(backend(C, "cancel_queued"))?;
    ensure(C, !leased, || "a leased job was cancelled".into())?;
    queue
        .complete(&lease)
        .await
        .map_err(backend(C, "complete"))?;
    ensure(
        C,
        queue
            .acquire("w1", LONG)
            .await
            .map_err(backend(C, "acquire"))?
            .is_none(),
        || "a cancelled job was handed out".into(),
    )?;
    let info = queue
        .job(later)
        .await
        .map_err(backend(C, "job"))?
        .ok_or_else(|| fail(C, "job missing"))?;
    ensure_eq(C, "cancelled state", info.state, JobState::Cancelled)?;
    ensure_eq(
        C,
        "cancel reason",
        info.error.as_deref(),
        Some("the user withdrew it"),
    )?;
    let missing = queue
        .cancel_queued(i64::MAX, "none")
        .await
        .map_err(backend(C, "cancel_queued"))?;
    ensure(C, !missing, || {
        "a job that does not exist was cancelled".into()
    })?;
    let counts = queue.counts().await.map_err(backend(C, "counts"))?;
    ensure_eq(
        C,
        "counts (queued, leased, done, dead, cancelled)",
        (
            counts.queued,
            counts.leased,
            counts.done,
            counts.dead,
            counts.cancelled,
        ),
        (0, 0, 1, 1, 1),
    )
}
