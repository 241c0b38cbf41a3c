//! The conformance suite every [`EventStore`] and [`RunQueue`] must pass.
//!
//! Each case is a public async function taking a FRESH store (cases assume an empty
//! store) and returning `Err(ConformanceError)` instead of panicking, so it can run from
//! any test harness. [`run_all`] / [`run_all_queue`] run every case, each on a new store
//! from a factory. Backends' integration tests call each case as its own `#[test]`.

mod events;
mod fencing;
pub mod fixtures;
mod queue;
mod runs;

use std::future::Future;
use std::sync::Arc;

use keel_core::store::EventStore;

use crate::queue::RunQueue;

pub use events::{
    append_shared, append_with_sync, batch_atomicity, concurrent_appenders,
    concurrent_conflicts_isolated, conflict_on_wrong_seq, delete, empty_append, fork,
    invalid_batch, invalid_batch_among_valid, list_threads, load_from, long_thread, purge,
    read_your_writes, round_trip, same_thread_race,
};
pub use fencing::fenced_appends;
pub use queue::{
    queue_claims_exclude_other_drivers, queue_continuations_lease_first,
    queue_dead_letter_snooze_and_cancel_queued, queue_enqueue_acquire_complete,
    queue_exclusive_under_concurrency, queue_expired_lease_taken_over, queue_invalid_arguments,
    queue_one_job_per_message_in_order, queue_release, queue_retry_later_and_fail,
    queue_thread_jobs_serialized_under_concurrency,
};
pub use runs::{
    list_runs_figures_and_filters, list_runs_follows_the_log, list_runs_sorted_pages,
    run_facts_follow_the_log,
};

/// A failed conformance check.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("conformance case {case} failed: {message}")]
pub struct ConformanceError {
    /// The case.
    pub case: &'static str,
    /// What was wrong.
    pub message: String,
}

pub(crate) fn fail(case: &'static str, message: impl Into<String>) -> ConformanceError {
    ConformanceError {
        case,
        message: message.into(),
    }
}

/// Fails the case when `condition` is false.
pub(crate) fn ensure(
    case: &'static str,
    condition: bool,
    message: impl FnOnce() -> String,
) -> Result<(), ConformanceError> {
    if condition {
        Ok(())
    } else {
        Err(fail(case, message()))
    }
}

/// Fails the case when `left != right`.
pub(crate) fn ensure_eq<T: PartialEq + std::fmt::Debug>(
    case: &'static str,
    what: &str,
    left: T,
    right: T,
) -> Result<(), ConformanceError> {
    ensure(case, left == right, || {
        format!("{what}: got {left:?}, expected {right:?}")
    })
}

/// The event-store case names, in the order [`run_all`] runs them.
pub const EVENT_CASES: &[&str] = &[
    "round_trip",
    "load_from",
    "conflict_on_wrong_seq",
    "batch_atomicity",
    "invalid_batch",
    "empty_append",
    "concurrent_appenders",
    "list_threads",
    "fork",
    "delete",
    "purge",
    "long_thread",
    "concurrent_conflicts_isolated",
    "same_thread_race",
    "invalid_batch_among_valid",
    "read_your_writes",
    "append_with_sync",
    "append_shared",
    "list_runs_figures_and_filters",
    "list_runs_sorted_pages",
    "list_runs_follows_the_log",
    "run_facts_follow_the_log",
];

/// Runs one event-store case by name.
pub async fn run_event_case(
    name: &str,
    store: Arc<dyn EventStore>,
) -> Result<(), ConformanceError> {
    match name {
        "round_trip" => round_trip(store).await,
        "load_from" => load_from(store).await,
        "conflict_on_wrong_seq" => conflict_on_wrong_seq(store).await,
        "batch_atomicity" => batch_atomicity(store).await,
        "invalid_batch" => invalid_batch(store).await,
        "empty_append" => empty_append(store).await,
        "concurrent_appenders" => concurrent_appenders(store).await,
        "list_threads" => list_threads(store).await,
        "fork" => fork(store).await,
        "delete" => delete(store).await,
        "purge" => purge(store).await,
        "long_thread" => long_thread(store).await,
        "concurrent_conflicts_isolated" => concurrent_conflicts_isolated(store).await,
        "same_thread_race" => same_thread_race(store).await,
        "invalid_batch_among_valid" => invalid_batch_among_valid(store).await,
        "read_your_writes" => read_your_writes(store).await,
        "append_with_sync" => append_with_sync(store).await,
        "append_shared" => append_shared(store).await,
        "list_runs_figures_and_filters" => list_runs_figures_and_filters(store).await,
        "list_runs_sorted_pages" => list_runs_sorted_pages(store).await,
        "list_runs_follows_the_log" => list_runs_follows_the_log(store).await,
        "run_facts_follow_the_log" => run_facts_follow_the_log(store).await,
        other => Err(fail("run_event_case", format!("unknown case {other:?}"))),
    }
}

/// Runs every event-store case, each on a fresh store from `make`.
pub async fn run_all<F, Fut>(make: F) -> Result<(), ConformanceError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn EventStore>>,
{
    for name in EVENT_CASES {
        run_event_case(name, make().await).await?;
    }
    Ok(())
}

/// The run-queue case names, in the order [`run_all_queue`] runs them.
pub const QUEUE_CASES: &[&str] = &[
    "queue_enqueue_acquire_complete",
    "queue_exclusive_under_concurrency",
    "queue_expired_lease_taken_over",
    "queue_release",
    "queue_one_job_per_message_in_order",
    "queue_thread_jobs_serialized_under_concurrency",
    "queue_retry_later_and_fail",
    "queue_invalid_arguments",
    "queue_claims_exclude_other_drivers",
    "queue_continuations_lease_first",
    "queue_dead_letter_snooze_and_cancel_queued",
];

/// Runs one run-queue case by name.
pub async fn run_queue_case(name: &str, queue: Arc<dyn RunQueue>) -> Result<(), ConformanceError> {
    match name {
        "queue_enqueue_acquire_complete" => queue_enqueue_acquire_complete(queue).await,
        "queue_exclusive_under_concurrency" => queue_exclusive_under_concurrency(queue).await,
        "queue_expired_lease_taken_over" => queue_expired_lease_taken_over(queue).await,
        "queue_release" => queue_release(queue).await,
        "queue_one_job_per_message_in_order" => queue_one_job_per_message_in_order(queue).await,
        "queue_thread_jobs_serialized_under_concurrency" => {
            queue_thread_jobs_serialized_under_concurrency(queue).await
        }
        "queue_retry_later_and_fail" => queue_retry_later_and_fail(queue).await,
        "queue_invalid_arguments" => queue_invalid_arguments(queue).await,
        "queue_claims_exclude_other_drivers" => queue_claims_exclude_other_drivers(queue).await,
        "queue_continuations_lease_first" => queue_continuations_lease_first(queue).await,
        "queue_dead_letter_snooze_and_cancel_queued" => {
            queue_dead_letter_snooze_and_cancel_queued(queue).await
        }
        other => Err(fail("run_queue_case", format!("unknown case {other:?}"))),
    }
}

/// Runs every run-queue case, each on a fresh queue from `make`.
pub async fn run_all_queue<F, Fut>(make: F) -> Result<(), ConformanceError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn RunQueue>>,
{
    for name in QUEUE_CASES {
        run_queue_case(name, make().await).await?;
    }
    Ok(())
}
