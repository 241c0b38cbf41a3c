//! Store-side fencing seen from a driver (issue 44): the machine's clock steps past a
//! claim's lease expiry, a second driver takes the thread over, and the first — whose own
//! keeper still believes its lease good for most of a TTL — writes nothing more. Before the
//! store checked the lease itself, the first driver's append went through.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use keel_app::claim::{CLAIM_TTL, ThreadClaim};
use keel_core::{EventStore, StoreError};
use keel_store::conformance::fixtures::{event, notice};
use keel_store::{PostgresOptions, PostgresStore, RunQueue, SqliteStore};

/// Claims `thread`, has `step_clock` move the store's view of time past the lease's
/// expiry, lets a second driver take over, and checks the first is fenced out.
async fn first_holder_is_fenced_out<F>(
    events: Arc<dyn EventStore>,
    queue: Arc<dyn RunQueue>,
    step_clock: F,
) where
    F: AsyncFnOnce(&str),
{
    let thread = "fenced-thread";
    let first = ThreadClaim::take(events.clone(), queue.clone(), thread, "keel run")
        .await
        .unwrap();
    first
        .store()
        .append(thread, 0, &[event(thread, 0, 1, notice("n", "first"))])
        .await
        .unwrap();
    step_clock(thread).await;
    let second = queue
        .claim(thread, "keel resume (the second driver)", CLAIM_TTL, None)
        .await
        .expect("the lapsed lease is free to take");
    let late = first
        .store()
        .append(thread, 1, &[event(thread, 1, 2, notice("n", "late"))])
        .await;
    assert!(
        matches!(&late, Err(StoreError::Fenced { reason, .. }) if reason.contains("taken over")),
        "the first driver wrote after the takeover: {late:?}"
    );
    let log = events.load(thread).await.unwrap();
    assert_eq!(log.len(), 1, "nothing of the fenced append is in the log");
    // Once fenced, the first driver's keeper knows: its run is cancelled.
    assert!(first.cancelled_on_loss().is_cancelled());
    queue.complete(&second).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_clock_step_and_a_takeover_fence_out_the_first_driver() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.db")).await.unwrap();
    let pool = store.pool().clone();
    first_holder_is_fenced_out(
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        async |thread: &str| {
            // The wall clock jumps forward past the lease: to the store it has lapsed.
            sqlx::query("UPDATE run_queue SET lease_expires_at = 0 WHERE thread_id = ?1")
                .bind(thread)
                .execute(&pool)
                .await
                .unwrap();
        },
    )
    .await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_clock_step_and_a_takeover_fence_out_the_first_driver() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run through ./scripts/test, which sets it");
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    let store = PostgresStore::connect_with(PostgresOptions::new(url).schema(schema))
        .await
        .unwrap();
    let pool = store.pool().clone();
    first_holder_is_fenced_out(
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        async |thread: &str| {
            sqlx::query(
                "UPDATE run_queue SET lease_expires_at = now() - interval '1 second' \
                 WHERE thread_id = $1 AND state = 'leased'",
            )
            .bind(thread)
            .execute(&pool)
            .await
            .unwrap();
        },
    )
    .await;
    store.drop_schema().await.unwrap();
}

/// The keeper's own view: after the clock step and before any takeover, the first driver
/// is still inside its safe deadline — only the store can tell it has lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_lease_lapsed_by_the_store_clock_refuses_appends_before_any_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.db")).await.unwrap();
    let thread = "lapsed-thread";
    let claim = ThreadClaim::take(
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        thread,
        "keel run",
    )
    .await
    .unwrap();
    sqlx::query("UPDATE run_queue SET lease_expires_at = 0 WHERE thread_id = ?1")
        .bind(thread)
        .execute(store.pool())
        .await
        .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(60),
        claim
            .store()
            .append(thread, 0, &[event(thread, 0, 1, notice("n", "x"))]),
    )
    .await
    .unwrap();
    assert!(
        matches!(&refused, Err(StoreError::Fenced { reason, .. }) if reason.contains("lapsed")),
        "{refused:?}"
    );
    assert!(store.load(thread).await.unwrap().is_empty());
    store.close().await;
}
