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
    load_from,
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
    queue_continuations_lease_first,
    queue_dead_letter_snooze_and_cancel_queued,
);

/// Store-side fencing: the SQL stores check an append's lease in its transaction; the
/// memory store says it does not (its callers check their own view of the lease).
mod fenced_appends {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let (_dir, store) = super::sqlite().await;
        check(conformance::fenced_appends(Arc::new(store.clone()), Arc::new(store.clone())).await);
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        let store = super::postgres().await;
        let result =
            conformance::fenced_appends(Arc::new(store.clone()), Arc::new(store.clone())).await;
        store.drop_schema().await.unwrap();
        check(result);
    }

    #[test]
    fn memory_does_not_claim_to_fence() {
        assert!(!MemoryStore::new().fences_appends());
    }
}

/// The case lists used by `run_all` name exactly the cases above.
#[test]
fn case_lists_are_complete() {
    assert_eq!(conformance::EVENT_CASES.len(), 22);
    assert_eq!(conformance::QUEUE_CASES.len(), 11);
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

/// Races of the Postgres run queue that only concurrent transactions show (issue 45).
mod postgres_queue_races {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::*;

    const LONG: Duration = Duration::from_secs(60);
    const DEADLINE: Duration = Duration::from_secs(60);

    /// A test trigger: an inserted job whose payload has `stall: K` waits, inside its
    /// transaction (after its id was taken), for advisory lock K.
    async fn install_stall_trigger(store: &PostgresStore) {
        for sql in [
            "CREATE FUNCTION keel_test_stall() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF (NEW.payload::jsonb) ? 'stall' THEN \
             PERFORM pg_advisory_xact_lock((NEW.payload::jsonb ->> 'stall')::bigint); END IF; \
             RETURN NEW; END $$",
            "CREATE TRIGGER keel_test_stall AFTER INSERT ON run_queue FOR EACH ROW \
             EXECUTE FUNCTION keel_test_stall()",
        ] {
            sqlx::query(sql).execute(store.pool()).await.unwrap();
        }
    }

    /// Polls `probe` until it answers `Some`, failing after [`DEADLINE`].
    async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(found) = probe().await {
                return found;
            }
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Enqueue A takes the lower id and commits late; enqueue B of the same thread starts
    /// after A took its id. The jobs are leased in id order (A first), and no acquire fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_jobs_lease_in_enqueue_order_when_the_lower_id_commits_later() {
        let store = postgres().await;
        install_stall_trigger(&store).await;
        let key = i64::try_from(uuid::Uuid::new_v4().as_u128() & 0x3fff_ffff).unwrap() | 1;
        let mut holder = store.pool().acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .unwrap();
        let queue: Arc<dyn RunQueue> = Arc::new(store.clone());
        let thread = format!("t-{key}");
        let a = tokio::spawn({
            let queue = queue.clone();
            let thread = thread.clone();
            async move {
                queue
                    .enqueue(&thread, &json!({"stall": key, "n": "a"}))
                    .await
            }
        });
        // A holds its id, waiting (in its transaction) for the test's lock.
        let pool = store.pool().clone();
        let a_pid: i32 = wait_for("enqueue A to wait inside its transaction", || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                     AND classid::bigint = 0 AND objid::bigint = $1 AND objsubid = 1",
                )
                .bind(key)
                .fetch_optional(&pool)
                .await
                .unwrap()
            }
        })
        .await;
        let b = tokio::spawn({
            let queue = queue.clone();
            let thread = thread.clone();
            async move { queue.enqueue(&thread, &json!({"n": "b"})).await }
        });
        // B either committed or waits behind A.
        wait_for("enqueue B to commit or wait for A", || {
            let pool = pool.clone();
            let finished = b.is_finished();
            async move {
                let blocked: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                )
                .bind(a_pid)
                .fetch_one(&pool)
                .await
                .unwrap();
                (finished || blocked > 0).then_some(())
            }
        })
        .await;
        // Whatever an acquire finds now must be A's job, never B's.
        let early = queue.acquire("w1", LONG).await.unwrap();
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .unwrap();
        drop(holder);
        let id_a = a.await.unwrap().unwrap();
        let id_b = b.await.unwrap().unwrap();
        assert!(id_a < id_b, "ids {id_a}, {id_b}");
        let mut order = Vec::new();
        if let Some(lease) = early {
            order.push(lease.job_id);
            queue.complete(&lease).await.unwrap();
        }
        while let Some(lease) = queue
            .acquire("w1", LONG)
            .await
            .unwrap_or_else(|e| panic!("acquire failed after {order:?}: {e}"))
        {
            order.push(lease.job_id);
            queue.complete(&lease).await.unwrap();
        }
        store.drop_schema().await.unwrap();
        assert_eq!(
            order,
            vec![id_a, id_b],
            "jobs of one thread leased out of enqueue order"
        );
    }

    /// A thread whose leased job has an older job queued (what a late commit left on
    /// main): acquisition skips that thread instead of failing on the unique index
    /// `run_queue_one_lease_per_thread`, so other threads' jobs still go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_acquire_skips_a_thread_with_a_lease() {
        let store = postgres().await;
        let queue: Arc<dyn RunQueue> = Arc::new(store.clone());
        let older = queue.enqueue("t", &json!({"n": 0})).await.unwrap();
        let leased = queue.enqueue("t", &json!({"n": 1})).await.unwrap();
        sqlx::query(
            "UPDATE run_queue SET state = 'leased', worker_id = 'w0', lease_token = 1, \
             attempts = 1, lease_expires_at = now() + interval '1 hour' WHERE job_id = $1",
        )
        .bind(leased)
        .execute(store.pool())
        .await
        .unwrap();
        let other = queue.enqueue("u", &json!({"n": 2})).await.unwrap();
        let got = queue.acquire("w1", LONG).await;
        let again = queue.acquire("w1", LONG).await;
        store.drop_schema().await.unwrap();
        let got = got.unwrap_or_else(|e| panic!("acquire stalled by the unique index: {e}"));
        assert_eq!(got.map(|l| l.job_id), Some(other), "older job {older}");
        let again = again.unwrap_or_else(|e| panic!("acquire stalled by the unique index: {e}"));
        assert_eq!(again, None, "thread t has a lease: nothing else is ready");
    }
}

/// `delete_thread` (issue 45): it locks the thread before deleting, so an append racing it
/// cannot leave events without a thread, and it removes the thread's queued and finished
/// jobs and its cancel requests.
mod delete_thread_cleanup {
    use std::time::{Duration, Instant};

    use keel_store::ServingStore;
    use keel_store::conformance::fixtures::{event, notice};
    use serde_json::json;

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(60);

    async fn check_cleanup(
        events: &dyn EventStore,
        queue: &dyn RunQueue,
        serving: &dyn ServingStore,
    ) {
        let thread = "del-1";
        events
            .append(thread, 0, &[event(thread, 0, 0, notice("a", "one"))])
            .await
            .unwrap();
        let done = queue
            .enqueue(thread, &json!({"message": "first"}))
            .await
            .unwrap();
        let lease = queue.acquire("w", DEADLINE).await.unwrap().unwrap();
        assert_eq!(lease.job_id, done);
        queue.complete(&lease).await.unwrap();
        let queued = queue
            .enqueue(thread, &json!({"message": "second"}))
            .await
            .unwrap();
        let other = queue
            .enqueue("del-2", &json!({"message": "kept"}))
            .await
            .unwrap();
        serving.request_cancel(thread, "run_del").await.unwrap();
        serving.request_cancel("del-2", "run_kept").await.unwrap();

        assert!(events.delete_thread(thread).await.unwrap());
        assert!(events.load(thread).await.unwrap().is_empty());
        for job in [done, queued] {
            assert_eq!(
                queue.job(job).await.unwrap(),
                None,
                "job {job} of the deleted thread"
            );
        }
        assert!(
            queue.job(other).await.unwrap().is_some(),
            "another thread's job"
        );
        assert!(!serving.cancel_requested("run_del").await.unwrap());
        assert!(serving.cancel_requested("run_kept").await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_delete_thread_removes_its_jobs_and_cancellations() {
        let (_dir, store) = sqlite().await;
        check_cleanup(&store, &store, &store).await;
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_delete_thread_removes_its_jobs_and_cancellations() {
        let store = postgres().await;
        check_cleanup(&store, &store, &store).await;
        store.drop_schema().await.unwrap();
    }

    /// A delete stalled (by a test trigger) after it removed the events and before it
    /// removed the thread; an append to the thread meanwhile must not survive it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_an_append_racing_delete_thread_leaves_no_events() {
        let store = postgres().await;
        let thread = "del-race";
        store
            .append(
                thread,
                0,
                &[
                    event(thread, 0, 0, notice("a", "one")),
                    event(thread, 1, 1, notice("b", "two")),
                ],
            )
            .await
            .unwrap();
        let key = i64::try_from(uuid::Uuid::new_v4().as_u128() & 0x3fff_ffff).unwrap() | 1;
        for sql in [
            format!(
                "CREATE FUNCTION keel_test_stall_delete() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN PERFORM pg_advisory_xact_lock({key}); RETURN NULL; END $$"
            ),
            "CREATE TRIGGER keel_test_stall_delete AFTER DELETE ON events FOR EACH STATEMENT \
             EXECUTE FUNCTION keel_test_stall_delete()"
                .to_string(),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(store.pool())
                .await
                .unwrap();
        }
        let mut holder = store.pool().acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .unwrap();
        let delete = tokio::spawn({
            let store = store.clone();
            async move { store.delete_thread(thread).await }
        });
        let pool = store.pool().clone();
        let start = Instant::now();
        let delete_pid: i32 = loop {
            let pid: Option<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND classid::bigint = 0 AND objid::bigint = $1 AND objsubid = 1",
            )
            .bind(key)
            .fetch_optional(&pool)
            .await
            .unwrap();
            if let Some(pid) = pid {
                break pid;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the delete never reached the trigger"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let append = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .append(thread, 2, &[event(thread, 2, 2, notice("c", "three"))])
                    .await
            }
        });
        // The append either committed or waits for the delete.
        loop {
            let blocked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            )
            .bind(delete_pid)
            .fetch_one(&pool)
            .await
            .unwrap();
            if append.is_finished() || blocked > 0 {
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the append neither ended nor waited"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *holder)
            .await
            .unwrap();
        drop(holder);
        assert!(delete.await.unwrap().unwrap());
        let appended = append.await.unwrap();
        let left = store.load(thread).await.unwrap();
        // The thread starts again from nothing.
        let fresh = store
            .append(thread, 0, &[event(thread, 0, 3, notice("d", "again"))])
            .await;
        store.drop_schema().await.unwrap();
        assert!(
            left.is_empty(),
            "events left without a thread after the delete (the racing append: {appended:?}): {left:?}"
        );
        assert!(
            appended.is_err(),
            "the racing append must see the thread gone"
        );
        fresh.unwrap();
    }
}
