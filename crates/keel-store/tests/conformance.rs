#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]
//! Runs the conformance suite against every store: memory, SQLite (temp files) and
//! Postgres (`DATABASE_URL`, a fresh schema per test).

use std::sync::Arc;

use keel_store::conformance::{self, ConformanceError};
use keel_store::{
    EventStore, MemoryRunQueue, MemoryStore, PostgresOptions, PostgresStore, RunQueue, SqliteStore,
};

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: the Postgres store tests need a server. Run them through \
             ./scripts/test (which sets DATABASE_URL=postgres://postgres@127.0.0.1:5432/test), or \
             export DATABASE_URL yourself."
        )
    })
}

async fn postgres() -> PostgresStore {
    let schema = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
    PostgresStore::connect_with(PostgresOptions::new(database_url()).schema(schema))
        .await
        .expect("connect to Postgres at DATABASE_URL")
}

async fn sqlite() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("nested/dir/keel.db"))
        .await
        .unwrap();
    (dir, store)
}

fn check(result: Result<(), ConformanceError>) {
    if let Err(e) = result {
        panic!("{e}");
    }
}

macro_rules! event_cases {
    ($($case:ident),* $(,)?) => {
        mod memory_events {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
                    check(conformance::$case(store).await);
                }
            )*
        }
        mod sqlite_events {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = sqlite().await;
                    check(conformance::$case(Arc::new(store.clone())).await);
                    store.close().await;
                }
            )*
        }
        mod postgres_events {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = postgres().await;
                    let result = conformance::$case(Arc::new(store.clone())).await;
                    store.drop_schema().await.unwrap();
                    check(result);
                }
            )*
        }
    };
}

macro_rules! queue_cases {
    ($($case:ident),* $(,)?) => {
        mod memory_queue {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::new());
                    check(conformance::$case(queue).await);
                }
            )*
        }
        mod sqlite_queue {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = sqlite().await;
                    check(conformance::$case(Arc::new(store.clone())).await);
                    store.close().await;
                }
            )*
        }
        mod postgres_queue {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = postgres().await;
                    let result = conformance::$case(Arc::new(store.clone())).await;
                    store.drop_schema().await.unwrap();
                    check(result);
                }
            )*
        }
    };
}

event_cases!(
    round_trip,
    conflict_on_wrong_seq,
    batch_atomicity,
    invalid_batch,
    empty_append,
    concurrent_appenders,
    list_threads,
    fork,
    delete,
    purge,
    long_thread,
    concurrent_conflicts_isolated,
    same_thread_race,
    invalid_batch_among_valid,
    read_your_writes,
    append_with_sync,
    append_shared,
    list_runs_figures_and_filters,
    list_runs_sorted_pages,
    list_runs_follows_the_log,
    run_facts_follow_the_log,
);

queue_cases!(
    queue_enqueue_acquire_complete,
    queue_exclusive_under_concurrency,
    queue_expired_lease_taken_over,
    queue_release,
    queue_one_job_per_message_in_order,
    queue_thread_jobs_serialized_under_concurrency,
    queue_retry_later_and_fail,
    queue_invalid_arguments,
    queue_claims_exclude_other_drivers,
);

/// The case lists used by `run_all` name exactly the cases above.
#[test]
fn case_lists_are_complete() {
    assert_eq!(conformance::EVENT_CASES.len(), 21);
    assert_eq!(conformance::QUEUE_CASES.len(), 9);
}

/// `run_all` drives every case through a factory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_on_memory() {
    check(
        conformance::run_all(|| async { Arc::new(MemoryStore::new()) as Arc<dyn EventStore> })
            .await,
    );
    check(
        conformance::run_all_queue(|| async {
            Arc::new(MemoryRunQueue::new()) as Arc<dyn RunQueue>
        })
        .await,
    );
}
