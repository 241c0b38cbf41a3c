//! Event-store conformance cases.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use keel_core::EndState;
use keel_core::event::{Event, EventKind};
use keel_core::store::{
    AppendDurability, EventStore, StoreError, ThreadFilter, ThreadStatus, ThreadSummary,
};

use super::fixtures::{at, event, notice, rich_log, run_ended, run_started};
use super::{ConformanceError, ensure, ensure_eq, fail};

type R = Result<(), ConformanceError>;

fn backend<'a>(case: &'static str, what: &'a str) -> impl Fn(StoreError) -> ConformanceError + 'a {
    move |e| fail(case, format!("{what}: unexpected error {e}"))
}

fn is_conflict(result: &Result<(), StoreError>, actual: u64) -> bool {
    matches!(result, Err(StoreError::Conflict { actual: a, .. }) if *a == actual)
}

fn notices(thread: &str, from: u64, n: u64, ms: i64) -> Vec<Event> {
    (from..from + n)
        .map(|seq| event(thread, seq, ms, notice("n", &format!("{seq}"))))
        .collect()
}

async fn summary(
    case: &'static str,
    store: &dyn EventStore,
    thread: &str,
) -> Result<Option<ThreadSummary>, ConformanceError> {
    let all = store
        .list_threads(&ThreadFilter::default())
        .await
        .map_err(backend(case, "list_threads"))?;
    Ok(all.into_iter().find(|s| s.thread_id == thread))
}

/// Append in two batches and load back: every field of every event is preserved.
pub async fn round_trip(store: Arc<dyn EventStore>) -> R {
    const C: &str = "round_trip";
    let log = rich_log("t-round");
    ensure(
        C,
        !log.iter().any(
            |e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "fixture_invalid"),
        ),
        || format!("a fixture no longer parses (keel-core changed?): {log:?}"),
    )?;
    let (first, second) = log.split_at(5);
    store
        .append("t-round", 0, first)
        .await
        .map_err(backend(C, "append first batch"))?;
    store
        .append("t-round", 5, second)
        .await
        .map_err(backend(C, "append second batch"))?;
    let loaded = store.load("t-round").await.map_err(backend(C, "load"))?;
    ensure_eq(C, "event count", loaded.len(), log.len())?;
    for (got, want) in loaded.iter().zip(&log) {
        ensure_eq(C, "event", got, want)?;
    }
    ensure(
        C,
        store
            .load("t-missing")
            .await
            .map_err(backend(C, "load missing"))?
            .is_empty(),
        || "a missing thread must load as empty".into(),
    )?;
    let s = summary(C, store.as_ref(), "t-round")
        .await?
        .ok_or_else(|| fail(C, "thread not listed"))?;
    ensure_eq(
        C,
        "summary",
        s,
        ThreadSummary::from_events("t-round", &log).ok_or_else(|| fail(C, "no summary"))?,
    )
}

/// `load_from` reads the tail of a log, whatever the batches it was written in: from the
/// start, from the middle, from the last event, past the end, and of a missing thread.
pub async fn load_from(store: Arc<dyn EventStore>) -> R {
    const C: &str = "load_from";
    let log = rich_log("t-tail");
    let (first, second) = log.split_at(5);
    store
        .append("t-tail", 0, first)
        .await
        .map_err(backend(C, "append first batch"))?;
    store
        .append("t-tail", 5, second)
        .await
        .map_err(backend(C, "append second batch"))?;
    let len = log.len() as u64;
    for from in [0, 3, 5, len - 1, len, len + 7, u64::MAX] {
        let tail = store
            .load_from("t-tail", from)
            .await
            .map_err(backend(C, "load_from"))?;
        let want: Vec<&Event> = log.iter().filter(|e| e.seq >= from).collect();
        ensure_eq(C, "tail", tail.iter().collect::<Vec<_>>(), want)?;
    }
    ensure(
        C,
        store
            .load_from("t-missing", 0)
            .await
            .map_err(backend(C, "load_from missing"))?
            .is_empty(),
        || "a missing thread must load as empty".into(),
    )
}

/// A wrong `expected_next_seq` (behind or ahead) is a conflict naming the real length.
pub async fn conflict_on_wrong_seq(store: Arc<dyn EventStore>) -> R {
    const C: &str = "conflict_on_wrong_seq";
    store
        .append("t-c", 0, &notices("t-c", 0, 3, 0))
        .await
        .map_err(backend(C, "append"))?;
    let behind = store.append("t-c", 2, &notices("t-c", 2, 1, 1)).await;
    ensure(C, is_conflict(&behind, 3), || {
        format!("append at 2 on a 3-event log: {behind:?}")
    })?;
    let ahead = store.append("t-c", 5, &notices("t-c", 5, 1, 1)).await;
    ensure(C, is_conflict(&ahead, 3), || {
        format!("append at 5 on a 3-event log: {ahead:?}")
    })?;
    let new_thread = store
        .append("t-c-new", 1, &notices("t-c-new", 1, 1, 1))
        .await;
    ensure(C, is_conflict(&new_thread, 0), || {
        format!("append at 1 on an empty log: {new_thread:?}")
    })?;
    ensure_eq(
        C,
        "log length",
        store.load("t-c").await.map_err(backend(C, "load"))?.len(),
        3,
    )?;
    ensure(
        C,
        store
            .load("t-c-new")
            .await
            .map_err(backend(C, "load"))?
            .is_empty(),
        || "nothing written".into(),
    )?;
    ensure(
        C,
        summary(C, store.as_ref(), "t-c-new").await?.is_none(),
        || "conflicting new thread was listed".into(),
    )
}

/// A conflicting batch writes nothing, not even its first events.
pub async fn batch_atomicity(store: Arc<dyn EventStore>) -> R {
    const C: &str = "batch_atomicity";
    store
        .append("t-a", 0, &notices("t-a", 0, 2, 0))
        .await
        .map_err(backend(C, "append"))?;
    store
        .append("t-a", 2, &notices("t-a", 2, 1, 1))
        .await
        .map_err(backend(C, "append winner"))?;
    let loser = store.append("t-a", 2, &notices("t-a", 2, 3, 2)).await;
    ensure(C, is_conflict(&loser, 3), || {
        format!("stale batch: {loser:?}")
    })?;
    let loaded = store.load("t-a").await.map_err(backend(C, "load"))?;
    ensure_eq(C, "log length", loaded.len(), 3)?;
    ensure_eq(
        C,
        "last event time",
        loaded.last().map(|e| e.ts),
        Some(at(1)),
    )?;
    let s = summary(C, store.as_ref(), "t-a")
        .await?
        .ok_or_else(|| fail(C, "not listed"))?;
    ensure_eq(C, "summary event_count", s.event_count, 3)?;
    ensure_eq(C, "summary updated_at", s.updated_at, at(1))?;
    // The next append still works at the right seq.
    store
        .append("t-a", 3, &notices("t-a", 3, 2, 3))
        .await
        .map_err(backend(C, "append after conflict"))?;
    ensure_eq(
        C,
        "log length",
        store.load("t-a").await.map_err(backend(C, "load"))?.len(),
        5,
    )
}

/// Non-consecutive seqs or a foreign thread id are rejected and write nothing.
pub async fn invalid_batch(store: Arc<dyn EventStore>) -> R {
    const C: &str = "invalid_batch";
    let mut gap = notices("t-i", 0, 3, 0);
    if let Some(e) = gap.get_mut(2) {
        e.seq = 5;
    }
    let r = store.append("t-i", 0, &gap).await;
    ensure(C, matches!(r, Err(StoreError::InvalidBatch(_))), || {
        format!("gap in batch: {r:?}")
    })?;
    let foreign = notices("t-other", 0, 2, 0);
    let r = store.append("t-i", 0, &foreign).await;
    ensure(C, matches!(r, Err(StoreError::InvalidBatch(_))), || {
        format!("foreign thread id: {r:?}")
    })?;
    let offset = notices("t-i", 1, 2, 0);
    let r = store.append("t-i", 0, &offset).await;
    ensure(C, matches!(r, Err(StoreError::InvalidBatch(_))), || {
        format!("batch not starting at expected seq: {r:?}")
    })?;
    ensure(
        C,
        store
            .load("t-i")
            .await
            .map_err(backend(C, "load"))?
            .is_empty(),
        || "invalid batch wrote events".into(),
    )?;
    ensure(
        C,
        summary(C, store.as_ref(), "t-i").await?.is_none(),
        || "invalid batch created a thread".into(),
    )
}

/// An empty batch checks the seq and writes nothing.
pub async fn empty_append(store: Arc<dyn EventStore>) -> R {
    const C: &str = "empty_append";
    store
        .append("t-e", 0, &[])
        .await
        .map_err(backend(C, "empty append on a new thread"))?;
    ensure(
        C,
        summary(C, store.as_ref(), "t-e").await?.is_none(),
        || "empty append created a listed thread".into(),
    )?;
    store
        .append("t-e", 0, &notices("t-e", 0, 2, 0))
        .await
        .map_err(backend(C, "append"))?;
    store
        .append("t-e", 2, &[])
        .await
        .map_err(backend(C, "empty append at the end"))?;
    let r = store.append("t-e", 1, &[]).await;
    ensure(C, is_conflict(&r, 2), || {
        format!("empty append at a stale seq: {r:?}")
    })
}

/// 8 tasks x 50 appends on ONE thread, retrying on conflict: 400 events, seq 0..399, each
/// (task, i) exactly once.
pub async fn concurrent_appenders(store: Arc<dyn EventStore>) -> R {
    const C: &str = "concurrent_appenders";
    const TASKS: u64 = 8;
    const EACH: u64 = 50;
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut next = 0u64;
            let mut attempts = 0u32;
            for i in 0..EACH {
                loop {
                    attempts += 1;
                    if attempts > 20_000 {
                        return Err(format!("task {task} gave up after {attempts} attempts"));
                    }
                    let e = event(
                        "t-conc",
                        next,
                        i64::try_from(next).unwrap_or(0),
                        notice(&format!("w{task}"), &i.to_string()),
                    );
                    match store.append("t-conc", next, std::slice::from_ref(&e)).await {
                        Ok(()) => {
                            next += 1;
                            break;
                        }
                        Err(StoreError::Conflict { actual, .. }) => next = actual,
                        Err(other) => return Err(format!("task {task}: {other}")),
                    }
                }
            }
            Ok(())
        }));
    }
    let joined = tokio::time::timeout(Duration::from_secs(180), futures::future::join_all(handles))
        .await
        .map_err(|_| fail(C, "appenders did not finish within 180 s"))?;
    for result in joined {
        result
            .map_err(|e| fail(C, format!("task panicked: {e}")))?
            .map_err(|e| fail(C, e))?;
    }
    let log = store.load("t-conc").await.map_err(backend(C, "load"))?;
    ensure_eq(C, "event count", log.len() as u64, TASKS * EACH)?;
    let mut seen = HashSet::new();
    for (index, e) in log.iter().enumerate() {
        ensure_eq(C, "seq", e.seq, index as u64)?;
        let EventKind::Notice { code, message, .. } = &e.kind else {
            return Err(fail(C, format!("event {index} is not a notice")));
        };
        ensure(C, seen.insert((code.clone(), message.clone())), || {
            format!("duplicate append {code}/{message}")
        })?;
    }
    let s = summary(C, store.as_ref(), "t-conc")
        .await?
        .ok_or_else(|| fail(C, "not listed"))?;
    ensure_eq(C, "summary event_count", s.event_count, TASKS * EACH)
}

/// Listing: summaries, most recently updated first, filters by agent, status and time,
/// and a limit.
pub async fn list_threads(store: Arc<dyn EventStore>) -> R {
    const C: &str = "list_threads";
    // t1: agent a, ended (oldest); t2: agent b, awaiting approval; t3: agent a, running,
    // then a second run with agent b (latest agent wins); t4: agent a, ended failed.
    let t1 = vec![
        event("t1", 0, 0, run_started("a")),
        event("t1", 1, 10, run_ended(EndState::Done)),
    ];
    let t2 = vec![
        event("t2", 0, 20, run_started("b")),
        event(
            "t2",
            1,
            21,
            EventKind::ApprovalRequested {
                call_id: "c".into(),
                name: "x".into(),
                arguments: "{}".into(),
            },
        ),
    ];
    // A later batch that changes nothing in the summary but its count and time.
    let t2b = vec![event("t2", 2, 30, notice("n", "status unchanged"))];
    let t3a = vec![
        event("t3", 0, 5, run_started("a")),
        event("t3", 1, 6, run_ended(EndState::Done)),
    ];
    let t3b = vec![event("t3", 2, 40, run_started("b"))];
    // The running thread's count and time move with a batch that leaves it running.
    let t3c = vec![event("t3", 3, 45, notice("n", "still running"))];
    let t4 = vec![
        event("t4", 0, 1, run_started("a")),
        event("t4", 1, 35, run_ended(EndState::Failed)),
    ];
    for (id, from, batch) in [
        ("t1", 0, &t1),
        ("t2", 0, &t2),
        ("t2", 2, &t2b),
        ("t3", 0, &t3a),
        ("t3", 2, &t3b),
        ("t3", 3, &t3c),
        ("t4", 0, &t4),
    ] {
        store
            .append(id, from, batch)
            .await
            .map_err(backend(C, "append"))?;
    }
    let ids = |list: &[ThreadSummary]| {
        list.iter()
            .map(|s| s.thread_id.to_string())
            .collect::<Vec<_>>()
    };
    let all = store
        .list_threads(&ThreadFilter::default())
        .await
        .map_err(backend(C, "list"))?;
    ensure_eq(
        C,
        "order (most recently updated first)",
        ids(&all),
        vec!["t3".into(), "t4".into(), "t2".into(), "t1".into()],
    )?;
    let t3 = all.first().ok_or_else(|| fail(C, "empty list"))?;
    ensure_eq(C, "t3 agent (latest run)", t3.agent.as_deref(), Some("b"))?;
    ensure_eq(C, "t3 status", t3.status, ThreadStatus::Running)?;
    ensure_eq(C, "t3 event_count", t3.event_count, 4)?;
    ensure_eq(C, "t3 created_at", t3.created_at, at(5))?;
    ensure_eq(C, "t3 updated_at", t3.updated_at, at(45))?;
    let t2s = all
        .iter()
        .find(|s| s.thread_id == "t2")
        .ok_or_else(|| fail(C, "t2 missing"))?;
    ensure_eq(C, "t2 status", t2s.status, ThreadStatus::AwaitingApproval)?;
    ensure_eq(C, "t2 event_count", t2s.event_count, 3)?;
    ensure_eq(C, "t2 updated_at", t2s.updated_at, at(30))?;
    let by_agent = store
        .list_threads(&ThreadFilter {
            agent: Some("a".into()),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list by agent"))?;
    ensure_eq(C, "agent=a", ids(&by_agent), vec!["t4".into(), "t1".into()])?;
    let since = store
        .list_threads(&ThreadFilter {
            updated_since: Some(at(30)),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list since"))?;
    ensure_eq(
        C,
        "updated_since (inclusive)",
        ids(&since),
        vec!["t3".into(), "t4".into(), "t2".into()],
    )?;
    let latest = store
        .list_threads(&ThreadFilter {
            updated_since: Some(at(42)),
            status: Some(ThreadStatus::Running),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list running since"))?;
    ensure_eq(
        C,
        "running, updated_since its last event",
        ids(&latest),
        vec!["t3".into()],
    )?;
    let done = store
        .list_threads(&ThreadFilter {
            status: Some(ThreadStatus::Ended(EndState::Done)),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list by status"))?;
    ensure_eq(C, "status=ended(done)", ids(&done), vec!["t1".into()])?;
    let limited = store
        .list_threads(&ThreadFilter {
            agent: Some("a".into()),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list limited"))?;
    ensure_eq(C, "agent=a limit 1", ids(&limited), vec!["t4".into()])?;
    let none = store
        .list_threads(&ThreadFilter {
            limit: Some(0),
            ..Default::default()
        })
        .await
        .map_err(backend(C, "list 0"))?;
    ensure_eq(C, "limit 0", none.len(), 0)?;
    for (prefix, want) in [
        ("t1", vec!["t1"]),
        ("t", vec!["t3", "t4", "t2", "t1"]),
        ("t_", vec![]),
        ("%", vec![]),
    ] {
        let found = store
            .list_threads(&ThreadFilter {
                id_prefix: Some(prefix.into()),
                ..Default::default()
            })
            .await
            .map_err(backend(C, "list by prefix"))?;
        let want: Vec<String> = want.into_iter().map(String::from).collect();
        ensure_eq(C, &format!("id_prefix {prefix:?}"), ids(&found), want)?;
    }
    Ok(())
}

/// Fork copies a prefix under a new id; the source is untouched; a used target conflicts.
pub async fn fork(store: Arc<dyn EventStore>) -> R {
    const C: &str = "fork";
    let log = rich_log("t-src");
    store
        .append("t-src", 0, &log)
        .await
        .map_err(backend(C, "append"))?;
    let copied = store
        .fork_thread("t-src", 4, "t-fork")
        .await
        .map_err(backend(C, "fork"))?;
    ensure_eq(C, "copied", copied, 5)?;
    let forked = store
        .load("t-fork")
        .await
        .map_err(backend(C, "load fork"))?;
    ensure_eq(C, "fork length", forked.len(), 5)?;
    for (got, want) in forked.iter().zip(&log) {
        let mut want = want.clone();
        want.thread_id = "t-fork".into();
        ensure_eq(C, "forked event", got, &want)?;
    }
    ensure_eq(
        C,
        "source",
        store
            .load("t-src")
            .await
            .map_err(backend(C, "load source"))?,
        log.clone(),
    )?;
    let s = summary(C, store.as_ref(), "t-fork")
        .await?
        .ok_or_else(|| fail(C, "fork not listed"))?;
    ensure_eq(
        C,
        "fork summary",
        Some(s),
        ThreadSummary::from_events("t-fork", &forked),
    )?;
    store
        .append("t-fork", 5, &notices("t-fork", 5, 1, 100))
        .await
        .map_err(backend(C, "append to fork"))?;
    let again = store.fork_thread("t-src", 2, "t-fork").await;
    ensure(C, matches!(again, Err(StoreError::Conflict { .. })), || {
        format!("fork onto a used id: {again:?}")
    })?;
    let missing = store.fork_thread("t-nope", 2, "t-fork2").await;
    ensure(C, matches!(missing, Err(StoreError::NotFound(_))), || {
        format!("fork of a missing thread: {missing:?}")
    })?;
    let whole = store
        .fork_thread("t-src", u64::MAX, "t-whole")
        .await
        .map_err(backend(C, "fork beyond end"))?;
    ensure_eq(C, "fork beyond the end copies all", whole, log.len() as u64)
}

/// Delete removes the log and the listing; the id can be reused from seq 0.
pub async fn delete(store: Arc<dyn EventStore>) -> R {
    const C: &str = "delete";
    store
        .append("t-d", 0, &notices("t-d", 0, 3, 0))
        .await
        .map_err(backend(C, "append"))?;
    store
        .append("t-keep", 0, &notices("t-keep", 0, 1, 0))
        .await
        .map_err(backend(C, "append"))?;
    ensure(
        C,
        store
            .delete_thread("t-d")
            .await
            .map_err(backend(C, "delete"))?,
        || "delete returned false".into(),
    )?;
    ensure(
        C,
        store
            .load("t-d")
            .await
            .map_err(backend(C, "load"))?
            .is_empty(),
        || "events remain".into(),
    )?;
    ensure(
        C,
        summary(C, store.as_ref(), "t-d").await?.is_none(),
        || "still listed".into(),
    )?;
    ensure(
        C,
        !store
            .delete_thread("t-d")
            .await
            .map_err(backend(C, "delete again"))?,
        || "second delete returned true".into(),
    )?;
    ensure_eq(
        C,
        "other thread",
        store
            .load("t-keep")
            .await
            .map_err(backend(C, "load"))?
            .len(),
        1,
    )?;
    store
        .append("t-d", 0, &notices("t-d", 0, 1, 5))
        .await
        .map_err(backend(C, "reuse id"))?;
    ensure_eq(
        C,
        "reused",
        store.load("t-d").await.map_err(backend(C, "load"))?.len(),
        1,
    )
}

/// Retention: only threads that ended before the cutoff are purged.
pub async fn purge(store: Arc<dyn EventStore>) -> R {
    const C: &str = "purge";
    let old_done = vec![
        event("p-old", 0, 0, run_started("a")),
        event("p-old", 1, 10, run_ended(EndState::Done)),
    ];
    let new_done = vec![
        event("p-new", 0, 0, run_started("a")),
        event("p-new", 1, 100, run_ended(EndState::Failed)),
    ];
    // Ended before the cutoff, but its last event (a later batch) is after it.
    let late_done = vec![
        event("p-late", 0, 0, run_started("a")),
        event("p-late", 1, 10, run_ended(EndState::Done)),
    ];
    let late_notice = vec![event("p-late", 2, 60, notice("n", "after the end"))];
    let old_running = vec![event("p-run", 0, 0, run_started("a"))];
    let old_waiting = vec![
        event("p-wait", 0, 0, run_started("a")),
        event(
            "p-wait",
            1,
            1,
            EventKind::UserAsked {
                question: "?".into(),
                missing_fields: vec![],
            },
        ),
    ];
    for (id, batch) in [
        ("p-old", &old_done),
        ("p-new", &new_done),
        ("p-run", &old_running),
        ("p-wait", &old_waiting),
        ("p-late", &late_done),
    ] {
        store
            .append(id, 0, batch)
            .await
            .map_err(backend(C, "append"))?;
    }
    store
        .append("p-late", 2, &late_notice)
        .await
        .map_err(backend(C, "append"))?;
    let purged = store
        .purge_ended_before(at(50))
        .await
        .map_err(backend(C, "purge"))?;
    ensure_eq(C, "purged", purged, 1)?;
    ensure(
        C,
        store
            .load("p-old")
            .await
            .map_err(backend(C, "load"))?
            .is_empty(),
        || "old ended thread kept".into(),
    )?;
    for id in ["p-new", "p-run", "p-wait", "p-late"] {
        ensure(
            C,
            !store.load(id).await.map_err(backend(C, "load"))?.is_empty(),
            || format!("{id} was purged"),
        )?;
    }
    ensure_eq(
        C,
        "purge again",
        store
            .purge_ended_before(at(50))
            .await
            .map_err(backend(C, "purge"))?,
        0,
    )
}

/// A 10,000-event thread appended in batches loads whole and in order.
pub async fn long_thread(store: Arc<dyn EventStore>) -> R {
    const C: &str = "long_thread";
    for batch in 0..10u64 {
        let events = notices(
            "t-long",
            batch * 1000,
            1000,
            i64::try_from(batch).unwrap_or(0),
        );
        store
            .append("t-long", batch * 1000, &events)
            .await
            .map_err(backend(C, "append"))?;
    }
    let log = store.load("t-long").await.map_err(backend(C, "load"))?;
    ensure_eq(C, "length", log.len(), 10_000)?;
    ensure(
        C,
        log.iter().enumerate().all(|(i, e)| e.seq == i as u64),
        || "seqs out of order".into(),
    )
}

/// `n` notices on `thread` from `from`, tagged with `code` (to tell batches apart).
fn tagged(thread: &str, from: u64, n: u64, code: &str) -> Vec<Event> {
    (from..from + n)
        .map(|seq| event(thread, seq, 50, notice(code, &format!("{seq}"))))
        .collect()
}

/// The notice codes of a log, in order.
fn codes(log: &[Event]) -> Vec<String> {
    log.iter()
        .map(|e| match &e.kind {
            EventKind::Notice { code, .. } => code.clone(),
            other => format!("<{}>", other.name()),
        })
        .collect()
}

/// An append not yet awaited.
type PendingAppend =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send>>;

/// Runs `futures` concurrently (so a group-committing store puts them in shared groups)
/// with a generous deadline.
async fn all_at_once(
    case: &'static str,
    futures: Vec<PendingAppend>,
) -> Result<Vec<Result<(), StoreError>>, ConformanceError> {
    tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(futures))
        .await
        .map_err(|_| fail(case, "concurrent appends did not finish within 120 s"))
}

/// Many threads appended to at once, a third of them also by a stale and a future
/// appender: every caller gets its own answer, a conflicting batch writes nothing, and
/// the other threads are unaffected.
pub async fn concurrent_conflicts_isolated(store: Arc<dyn EventStore>) -> R {
    const C: &str = "concurrent_conflicts_isolated";
    const THREADS: usize = 48;
    let ids: Vec<String> = (0..THREADS).map(|i| format!("t-iso-{i}")).collect();
    for id in &ids {
        store
            .append(id, 0, &tagged(id, 0, 1, "seed"))
            .await
            .map_err(backend(C, "seed"))?;
    }
    let mut calls: Vec<PendingAppend> = Vec::new();
    let mut kinds = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let good = tagged(id, 1, 3, "good");
        let s = store.clone();
        let thread = id.clone();
        calls.push(Box::pin(async move { s.append(&thread, 1, &good).await }) as PendingAppend);
        kinds.push((i, "good"));
        if i % 3 == 0 {
            let stale = tagged(id, 0, 2, "stale");
            let s = store.clone();
            let thread = id.clone();
            calls.push(Box::pin(async move { s.append(&thread, 0, &stale).await }));
            kinds.push((i, "stale"));
            let ahead = tagged(id, 7, 2, "ahead");
            let s = store.clone();
            let thread = id.clone();
            calls.push(Box::pin(async move { s.append(&thread, 7, &ahead).await }));
            kinds.push((i, "ahead"));
        }
    }
    let results = all_at_once(C, calls).await?;
    for ((i, kind), result) in kinds.iter().zip(&results) {
        let ok = match *kind {
            "good" => result.is_ok(),
            // The log holds 1 event, or 4 once the good batch landed first.
            _ => is_conflict(result, 1) || is_conflict(result, 4),
        };
        ensure(C, ok, || format!("thread {i}, {kind} append: {result:?}"))?;
    }
    for id in &ids {
        let log = store.load(id).await.map_err(backend(C, "load"))?;
        ensure_eq(
            C,
            &format!("log of {id}"),
            codes(&log),
            vec![
                "seed".to_string(),
                "good".into(),
                "good".into(),
                "good".into(),
            ],
        )?;
        let s = summary(C, store.as_ref(), id)
            .await?
            .ok_or_else(|| fail(C, format!("{id} not listed")))?;
        ensure_eq(C, "summary event_count", s.event_count, 4)?;
    }
    Ok(())
}

/// Appends to ONE thread racing each other: 16 at seq 0 (exactly one wins, the others
/// conflict and write nothing), then 8 at seqs 3, 6, … 24 at once (the winners form a
/// chain from 3 with no gap, exactly as if they had run one after another).
pub async fn same_thread_race(store: Arc<dyn EventStore>) -> R {
    const C: &str = "same_thread_race";
    let mut calls: Vec<PendingAppend> = Vec::new();
    for racer in 0..16 {
        let s = store.clone();
        let batch = tagged("t-race", 0, 3, &format!("r{racer}"));
        calls.push(Box::pin(async move { s.append("t-race", 0, &batch).await }) as PendingAppend);
    }
    let results = all_at_once(C, calls).await?;
    let winners: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_ok())
        .map(|(i, _)| i)
        .collect();
    ensure_eq(C, "winners at seq 0", winners.len(), 1)?;
    for (i, result) in results.iter().enumerate() {
        ensure(C, result.is_ok() || is_conflict(result, 3), || {
            format!("racer {i}: {result:?}")
        })?;
    }
    let winner = format!("r{}", winners.first().copied().unwrap_or_default());
    let log = store.load("t-race").await.map_err(backend(C, "load"))?;
    ensure_eq(
        C,
        "log after the first race",
        codes(&log),
        vec![winner.clone(); 3],
    )?;

    let mut calls: Vec<PendingAppend> = Vec::new();
    for k in 1..=8u64 {
        let s = store.clone();
        let batch = tagged("t-race", 3 * k, 3, &format!("k{k}"));
        calls.push(
            Box::pin(async move { s.append("t-race", 3 * k, &batch).await }) as PendingAppend,
        );
    }
    let results = all_at_once(C, calls).await?;
    let succeeded: Vec<u64> = (1..=8u64)
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(k, _)| k)
        .collect();
    ensure(C, succeeded.first() == Some(&1), || {
        format!("the append at seq 3 must win its seq: results {results:?}")
    })?;
    ensure(
        C,
        succeeded.iter().zip(1u64..).all(|(k, want)| *k == want),
        || format!("winners must form a chain from seq 3: {succeeded:?}"),
    )?;
    let log = store.load("t-race").await.map_err(backend(C, "load"))?;
    let mut want = vec![winner; 3];
    for k in &succeeded {
        want.extend(vec![format!("k{k}"); 3]);
    }
    ensure_eq(C, "log after the chain race", codes(&log), want)?;
    ensure(
        C,
        log.iter().enumerate().all(|(i, e)| e.seq == i as u64),
        || "seqs are not contiguous".into(),
    )?;
    let s = summary(C, store.as_ref(), "t-race")
        .await?
        .ok_or_else(|| fail(C, "not listed"))?;
    ensure_eq(C, "summary event_count", s.event_count, log.len() as u64)
}

/// Invalid batches sent together with valid ones (on other threads and on the same
/// thread) are rejected alone; the valid ones are written.
pub async fn invalid_batch_among_valid(store: Arc<dyn EventStore>) -> R {
    const C: &str = "invalid_batch_among_valid";
    let mut calls: Vec<PendingAppend> = Vec::new();
    let mut valid = Vec::new();
    for i in 0..12 {
        let id = format!("t-mix-{i}");
        let s = store.clone();
        let batch = tagged(&id, 0, 2, "good");
        let thread = id.clone();
        calls.push(Box::pin(async move { s.append(&thread, 0, &batch).await }) as PendingAppend);
        valid.push(true);
        // An invalid batch on the same thread (a gap) and one on a fresh thread (foreign ids).
        let mut gap = tagged(&id, 0, 3, "gap");
        if let Some(e) = gap.get_mut(1) {
            e.seq = 9;
        }
        let s = store.clone();
        let thread = id.clone();
        calls.push(Box::pin(async move { s.append(&thread, 0, &gap).await }));
        valid.push(false);
        let foreign = tagged("t-elsewhere", 0, 1, "foreign");
        let s = store.clone();
        let thread = format!("t-bad-{i}");
        calls.push(Box::pin(
            async move { s.append(&thread, 0, &foreign).await },
        ));
        valid.push(false);
    }
    let results = all_at_once(C, calls).await?;
    for (i, (result, is_valid)) in results.iter().zip(&valid).enumerate() {
        let ok = if *is_valid {
            result.is_ok()
        } else {
            matches!(result, Err(StoreError::InvalidBatch(_)))
        };
        ensure(C, ok, || {
            format!("call {i} (valid: {is_valid}): {result:?}")
        })?;
    }
    for i in 0..12 {
        let id = format!("t-mix-{i}");
        let log = store.load(&id).await.map_err(backend(C, "load"))?;
        ensure_eq(
            C,
            &format!("log of {id}"),
            codes(&log),
            vec!["good".to_string(); 2],
        )?;
        ensure(
            C,
            summary(C, store.as_ref(), &format!("t-bad-{i}"))
                .await?
                .is_none(),
            || format!("invalid batch created t-bad-{i}"),
        )?;
    }
    Ok(())
}

/// Once `append` returned, `load` and `list_threads` see it (from many tasks at once).
pub async fn read_your_writes(store: Arc<dyn EventStore>) -> R {
    const C: &str = "read_your_writes";
    let mut handles = Vec::new();
    for task in 0..16u64 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("t-ryw-{task}");
            for step in 0..10u64 {
                let batch = tagged(&id, step * 2, 2, "w");
                store
                    .append(&id, step * 2, &batch)
                    .await
                    .map_err(|e| format!("{id} append {step}: {e}"))?;
                let log = store
                    .load(&id)
                    .await
                    .map_err(|e| format!("{id} load: {e}"))?;
                if log.len() as u64 != step * 2 + 2 {
                    return Err(format!(
                        "{id}: load after append {step} saw {} events, expected {}",
                        log.len(),
                        step * 2 + 2
                    ));
                }
                let listed = store
                    .list_threads(&ThreadFilter::default())
                    .await
                    .map_err(|e| format!("{id} list: {e}"))?;
                let count = listed
                    .iter()
                    .find(|s| s.thread_id == id)
                    .map(|s| s.event_count);
                if count != Some(step * 2 + 2) {
                    return Err(format!(
                        "{id}: listing after append {step} says {count:?} events"
                    ));
                }
            }
            Ok(())
        }));
    }
    let joined = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(handles))
        .await
        .map_err(|_| fail(C, "tasks did not finish within 120 s"))?;
    for result in joined {
        result
            .map_err(|e| fail(C, format!("task panicked: {e}")))?
            .map_err(|e| fail(C, e))?;
    }
    Ok(())
}

/// `append_with(Sync)` appends like `append` (alone and mixed with default appends), and
/// conflicts the same way.
pub async fn append_with_sync(store: Arc<dyn EventStore>) -> R {
    const C: &str = "append_with_sync";
    store
        .append_with(
            "t-sync",
            0,
            &tagged("t-sync", 0, 2, "s"),
            AppendDurability::Sync,
        )
        .await
        .map_err(backend(C, "sync append"))?;
    let stale = store
        .append_with(
            "t-sync",
            1,
            &tagged("t-sync", 1, 1, "x"),
            AppendDurability::Sync,
        )
        .await;
    ensure(C, is_conflict(&stale, 2), || {
        format!("stale sync append: {stale:?}")
    })?;
    let mut calls: Vec<PendingAppend> = Vec::new();
    for i in 0..20u64 {
        let s = store.clone();
        let id = format!("t-sync-{i}");
        let durability = if i % 4 == 0 {
            AppendDurability::Sync
        } else {
            AppendDurability::Default
        };
        calls.push(Box::pin(async move {
            let batch = tagged(&id, 0, 3, "m");
            s.append_with(&id, 0, &batch, durability).await
        }) as PendingAppend);
    }
    for (i, result) in all_at_once(C, calls).await?.iter().enumerate() {
        ensure(C, result.is_ok(), || {
            format!("mixed append {i}: {result:?}")
        })?;
    }
    for i in 0..20u64 {
        let id = format!("t-sync-{i}");
        ensure_eq(
            C,
            &format!("length of {id}"),
            store.load(&id).await.map_err(backend(C, "load"))?.len(),
            3,
        )?;
    }
    ensure_eq(
        C,
        "t-sync",
        codes(&store.load("t-sync").await.map_err(backend(C, "load"))?),
        vec!["s".to_string(); 2],
    )
}

/// `append_shared` (how the runner appends the events it keeps as `Arc<Event>`) has the
/// contract of `append_with`: the same log as owned appends on the same thread, a stale
/// shared batch is a conflict that writes nothing, a batch for another thread is refused,
/// and the caller's events are stored as they were.
pub async fn append_shared(store: Arc<dyn EventStore>) -> R {
    const C: &str = "append_shared";
    let shared = |from: u64, n: u64, code: &str| -> Vec<Arc<Event>> {
        tagged("t-shared", from, n, code)
            .into_iter()
            .map(Arc::new)
            .collect()
    };
    let first = shared(0, 2, "a");
    store
        .append_shared("t-shared", 0, &first, AppendDurability::Default)
        .await
        .map_err(backend(C, "first shared append"))?;
    store
        .append("t-shared", 2, &tagged("t-shared", 2, 1, "b"))
        .await
        .map_err(backend(C, "owned append after shared ones"))?;
    store
        .append_shared("t-shared", 3, &shared(3, 2, "c"), AppendDurability::Sync)
        .await
        .map_err(backend(C, "sync shared append"))?;
    let stale = store
        .append_shared("t-shared", 1, &shared(1, 1, "x"), AppendDurability::Default)
        .await;
    ensure(C, is_conflict(&stale, 5), || {
        format!("stale shared append: {stale:?}")
    })?;
    let foreign: Vec<Arc<Event>> = tagged("t-other", 5, 1, "y")
        .into_iter()
        .map(Arc::new)
        .collect();
    let refused = store
        .append_shared("t-shared", 5, &foreign, AppendDurability::Default)
        .await;
    ensure(
        C,
        matches!(refused, Err(StoreError::InvalidBatch(_))),
        || format!("a batch of another thread: {refused:?}"),
    )?;
    let log = store.load("t-shared").await.map_err(backend(C, "load"))?;
    ensure_eq(
        C,
        "codes",
        codes(&log),
        ["a", "a", "b", "c", "c"].map(String::from).to_vec(),
    )?;
    ensure_eq(
        C,
        "first events as appended",
        log.get(..2).map(<[Event]>::to_vec),
        Some(first.iter().map(|e| Event::clone(e)).collect::<Vec<_>>()),
    )
}
