//! Scale-out: [`submit`] enqueues a job (agent recipe + message) on the store's run queue;
//! a [`Worker`] leases queued jobs (several workers can share one Postgres store) — the
//! jobs of one thread one at a time, in submit order — and drives each job's run while a
//! [`LeaseKeeper`] renews the lease. A crashed worker's jobs are taken over once its lease
//! expires. A worker that loses its lease, or can no longer confirm it, cancels the run at
//! once and writes nothing more ([`FencedStore`]); the store's append check is the last
//! line of defence. A job's custom base URL or agent file is used only when the worker
//! allows it ([`JobPolicy`]).
//!
//! Shutdown ([`Worker::with_shutdown`]): the worker leases nothing more and lets its runs
//! in progress go on; with [`Worker::with_shutdown_grace`], runs still going once the
//! grace period has passed are interrupted — the lease is given up ([`Loss::Shutdown`]),
//! so the run is cancelled and writes nothing more (no `RunEnded`: the run stays in
//! progress) — and, once each has stopped, its job is released to the queue at once, so
//! another worker continues the run from its log without waiting for the lease to expire.
//! A mutating call the interrupted run had started is settled there as interrupted, never
//! run again.
//!
//! The application decides what a job's agent recipe is and how it becomes an agent
//! ([`JobAgents`]); the `keel worker` command and servers embedding workers share all the
//! rest.

mod allow;
mod job;
mod lease;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use keel_core::{CancellationToken, EventStore};
use keel_store::{Lease, QueueError, RunQueue};
use tokio::time::Instant;

pub use allow::{JobPolicy, LOOPBACK, display_url};
pub use job::{
    BuildError, JobAgents, JobPayload, JobSpec, JobStart, SubmitError, Submitted, run_error, submit,
};
pub use lease::{FencedStore, LeaseKeeper, Loss};

use crate::AppError;
use job::JobFailure;

/// Where a worker reports what it does, one line at a time (job outcomes, lost leases,
/// store errors). Lines may name base URLs; redact them as any error before printing.
pub type WorkerLog = Arc<dyn Fn(&str) + Send + Sync>;

/// How a worker works.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This worker's name in leases.
    pub worker_id: String,
    /// Lease duration (renewed every third of it while a run is driven; a run whose lease
    /// cannot be confirmed for two thirds of it is cancelled). 0.3 s to 24 h.
    pub lease_ttl: Duration,
    /// Runs driven at once (at least 1).
    pub concurrency: usize,
    /// How long to wait between polls when the queue is empty (at least 1 ms).
    pub poll: Duration,
    /// Return once no job is queued or leased.
    pub exit_when_idle: bool,
    /// What jobs may make this worker do with its credentials.
    pub policy: JobPolicy,
    /// Attempts a job gets (acquisitions, a takeover after a crash included; waiting for
    /// another run of the thread is not one): a job that fails transiently on its last
    /// attempt, or is leased again after it, is dead-lettered with its last error. At
    /// least 1.
    pub max_attempts: u32,
    /// The first retry's delay; each later retry waits twice as long as the one before,
    /// up to [`MAX_RETRY_DELAY`].
    pub retry_base: Duration,
}

impl Default for WorkerOptions {
    /// `worker-PID`, a 30 s lease, one run at a time, polling every 500 ms, nothing
    /// custom allowed, [`DEFAULT_MAX_ATTEMPTS`] attempts with retries from 1 s.
    fn default() -> Self {
        Self {
            worker_id: default_worker_id(),
            lease_ttl: Duration::from_secs(30),
            concurrency: 1,
            poll: Duration::from_millis(500),
            exit_when_idle: false,
            policy: JobPolicy::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry_base: Duration::from_secs(1),
        }
    }
}

/// The default [`WorkerOptions::max_attempts`]: with retries from 1 s doubling up to
/// [`MAX_RETRY_DELAY`], a job failing every time is dead-lettered after about 2 h 15 min.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 20;

/// The longest delay between two attempts of a job.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(600);

/// How long a job whose thread has another run in progress waits before it looks again.
const WAIT_RECHECK: Duration = Duration::from_secs(2);

/// The delay before the next attempt of a job whose attempt `attempts` failed: `base`,
/// doubled with every attempt, at most [`MAX_RETRY_DELAY`].
pub fn retry_delay(base: Duration, attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(31);
    base.saturating_mul(1u32 << doublings).min(MAX_RETRY_DELAY)
}

/// `worker-PID`.
pub fn default_worker_id() -> String {
    format!("worker-{}", std::process::id())
}

/// What a worker did, once [`Worker::run`] returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Jobs whose run ended or paused awaiting approval (completed on the queue).
    pub completed: u64,
    /// Jobs failed for good (bad payload, refused or unbuildable agent).
    pub failed: u64,
    /// Jobs dead-lettered: they failed on every attempt allowed (`max_attempts`).
    pub dead: u64,
    /// Jobs given back to be retried (store failure, another process drove the thread).
    pub retried: u64,
    /// Jobs given back to wait for another run on their thread.
    pub waited: u64,
    /// Jobs whose lease was lost while their run was driven.
    pub lost: u64,
    /// Jobs whose run was interrupted at shutdown and given back to the queue.
    pub released: u64,
}

#[derive(Default)]
struct Counters {
    completed: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    retried: AtomicU64,
    waited: AtomicU64,
    lost: AtomicU64,
    released: AtomicU64,
}

impl Counters {
    fn report(&self) -> WorkerReport {
        WorkerReport {
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            waited: self.waited.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }
}

/// A queue worker over one store (see the module docs).
pub struct Worker<A: JobAgents> {
    shared: Shared<A>,
    concurrency: usize,
}

impl<A: JobAgents> std::fmt::Debug for Worker<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.shared.worker_id)
            .field("lease_ttl", &self.shared.ttl)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

struct Shared<A> {
    agents: A,
    events: Arc<dyn EventStore>,
    queue: Arc<dyn RunQueue>,
    worker_id: String,
    ttl: Duration,
    poll: Duration,
    exit_when_idle: bool,
    policy: JobPolicy,
    max_attempts: u32,
    retry_base: Duration,
    log: WorkerLog,
    shutdown: CancellationToken,
    /// After shutdown, how long runs in progress may go on before they are interrupted
    /// and their jobs released (`None`: until they end).
    grace: Option<Duration>,
    counters: Counters,
}

impl<A: JobAgents> Shared<A> {
    fn say(&self, line: &str) {
        (self.log)(line);
    }
}

/// The shortest lease TTL a worker takes: the keeper stops the run two thirds into the TTL
/// (its safe deadline), and the remaining third must outlast the grace a cancelled tool
/// gets to finish ([`keel_runtime::TOOL_CANCEL_GRACE`], 0.5 s) with as much again to spare,
/// so no effect of the old holder can land after another worker took the job over.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The longest lease TTL a worker takes (a crashed worker's jobs wait this long at most).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);

impl<A: JobAgents> Worker<A> {
    /// A worker driving the jobs of `queue` on `events` with `agents`. Options out of range
    /// are an [`AppError::Invalid`].
    pub fn new(
        events: Arc<dyn EventStore>,
        queue: Arc<dyn RunQueue>,
        agents: A,
        options: WorkerOptions,
    ) -> Result<Self, AppError> {
        let ttl = options.lease_ttl;
        if ttl < MIN_LEASE_TTL || ttl > MAX_LEASE_TTL {
            return Err(AppError::Invalid(format!(
                "the lease TTL must be within [{} s, 24 h], not {ttl:?}: the worker stops acting \
                 two thirds into the TTL, and the last third must outlast the {} ms a cancelled \
                 tool is given to answer",
                MIN_LEASE_TTL.as_secs_f64(),
                keel_runtime::TOOL_CANCEL_GRACE.as_millis()
            )));
        }
        if options.concurrency == 0 {
            return Err(AppError::Invalid(
                "a worker's concurrency must be at least 1".into(),
            ));
        }
        if options.max_attempts == 0 {
            return Err(AppError::Invalid(
                "a worker's max_attempts must be at least 1".into(),
            ));
        }
        Ok(Self {
            concurrency: options.concurrency,
            shared: Shared {
                agents,
                events,
                queue,
                worker_id: options.worker_id,
                ttl,
                poll: options.poll.max(Duration::from_millis(1)),
                exit_when_idle: options.exit_when_idle,
                policy: options.policy,
                max_attempts: options.max_attempts,
                retry_base: options.retry_base,
                log: Arc::new(|_: &str| {}),
                shutdown: CancellationToken::new(),
                grace: None,
                counters: Counters::default(),
            },
        })
    }

    /// Reports through `log` (default: nowhere).
    #[must_use]
    pub fn with_log(mut self, log: WorkerLog) -> Self {
        self.shared.log = log;
        self
    }

    /// Stops the worker when `shutdown` is cancelled: no job is leased after that and
    /// [`run`](Self::run) returns once the runs in progress end (dropping its future
    /// instead stops at once; the leases then expire and other workers take the jobs
    /// over).
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shared.shutdown = shutdown;
        self
    }

    /// After shutdown, gives runs in progress `grace` to end; runs still going then are
    /// interrupted (cancelled, writing nothing more, so they stay in progress) and, once
    /// stopped, their jobs are released to the queue at once for another worker to
    /// continue (see the module docs). Without it, [`run`](Self::run) waits for every run
    /// in progress to end.
    #[must_use]
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shared.grace = Some(grace);
        self
    }

    /// This worker's name in leases.
    pub fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    /// Drives jobs until shut down (or, with `exit_when_idle`, until no job is queued or
    /// leased).
    pub async fn run(self) -> WorkerReport {
        let shared = Arc::new(self.shared);
        let mut slots = tokio::task::JoinSet::new();
        for _ in 0..self.concurrency {
            slots.spawn(slot(shared.clone()));
        }
        while slots.join_next().await.is_some() {}
        shared.counters.report()
    }
}

/// One lease-drive-complete loop.
async fn slot<A: JobAgents>(shared: Arc<Shared<A>>) {
    while !shared.shutdown.is_cancelled() {
        let sent = Instant::now();
        match shared.queue.acquire(&shared.worker_id, shared.ttl).await {
            Ok(Some(lease)) => drive_job(&shared, lease, sent).await,
            Ok(None) => {
                if shared.exit_when_idle {
                    match shared.queue.counts().await {
                        Ok(counts) if counts.queued == 0 && counts.leased == 0 => return,
                        Ok(_) => {}
                        Err(e) => shared.say(&format!(
                            "worker {}: cannot count jobs: {e}",
                            shared.worker_id
                        )),
                    }
                }
                pause(&shared).await;
            }
            Err(e) => {
                shared.say(&format!("worker {}: acquire failed: {e}", shared.worker_id));
                pause(&shared).await;
            }
        }
    }
}

/// Waits one poll interval, or until shutdown.
async fn pause<A>(shared: &Shared<A>) {
    tokio::select! {
        () = tokio::time::sleep(shared.poll) => {}
        () = shared.shutdown.cancelled() => {}
    }
}

/// Drives one leased job (acquired by a request sent at `sent`) while a [`LeaseKeeper`]
/// renews the lease; when the lease is lost the run is cancelled, its writes are refused,
/// and the job is neither completed nor failed here.
async fn drive_job<A: JobAgents>(shared: &Shared<A>, lease: Lease, sent: Instant) {
    let job = lease.job_id;
    let thread_id = lease.thread_id.clone();
    let payload = lease.payload.clone();
    let attempts = lease.attempts;
    if attempts > shared.max_attempts && keel_store::claim_holder(&payload).is_none() {
        // Its earlier attempts never ended (the worker crashed, or lost the lease, every
        // time): a job that takes its worker down is not tried forever. (An expired
        // claim's row is only closed, however often it was taken over.)
        let last = match shared.queue.job(job).await {
            Ok(Some(info)) => info.error.map(|e| format!("; last error: {e}")),
            _ => None,
        };
        let message = format!(
            "leased {attempts} times, over max_attempts ({}): no attempt ended (its worker \
             crashed or lost the lease each time){}",
            shared.max_attempts,
            last.unwrap_or_default()
        );
        dead_letter(shared, &lease, &message).await;
        return;
    }
    let cancel = CancellationToken::new();
    let keeper = Arc::new(LeaseKeeper::new(
        shared.queue.clone(),
        lease,
        shared.ttl,
        sent,
        cancel.clone(),
    ));
    // Aborted when this future ends or is dropped (a worker stopped, a server task
    // aborted): a keeper outliving its run would renew the lease forever.
    let keeping = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(keeper.clone().keep()));
    let store: Arc<dyn EventStore> =
        Arc::new(FencedStore::new(shared.events.clone(), keeper.clone()));
    let run = job::drive(
        &shared.agents,
        store,
        &thread_id,
        payload,
        &shared.policy,
        cancel,
    );
    tokio::pin!(run);
    let result = tokio::select! {
        result = &mut run => Some(result),
        () = lost_then(&keeper, shared.ttl) => None,
        () = interrupt_at_shutdown(shared, &keeper) => None,
    };
    drop(keeping);
    let lease = keeper.lease();
    let counters = &shared.counters;
    let interrupted = matches!(keeper.loss(), Some(Loss::Shutdown(_)));
    if interrupted && matches!(result, Some(Ok(_))) {
        // The run ended (or paused) before the interruption could stop it: the lease is
        // still ours, complete the job as usual.
    } else if interrupted {
        if result.is_none() {
            shared.say(&format!(
                "job {job} thread {thread_id}: interrupted for shutdown, but the run did not \
                 stop within the lease TTL; dropped it (the lease expires)"
            ));
            return;
        }
        // The run has stopped and wrote nothing after the interruption: give the job back
        // so another worker continues the run now.
        match shared.queue.release(&lease).await {
            Ok(()) => {
                counters.released.fetch_add(1, Ordering::Relaxed);
                shared.say(&format!(
                    "job {job} thread {thread_id}: interrupted for shutdown; released to the \
                     queue (another worker continues the run)"
                ));
            }
            Err(e) => shared.say(&format!(
                "job {job} thread {thread_id}: interrupted for shutdown; giving the job back \
                 failed ({e}); another worker continues the run once the lease expires"
            )),
        }
        return;
    }
    if let Some(loss) = keeper.loss() {
        counters.lost.fetch_add(1, Ordering::Relaxed);
        let stopped = if result.is_some() {
            "cancelled the run; nothing more was written"
        } else {
            "the run did not stop within the lease TTL after it was cancelled; dropped it"
        };
        shared.say(&format!(
            "job {job} thread {thread_id}: lease lost ({loss}); {stopped}"
        ));
        if matches!(loss, Loss::Unconfirmed(_)) {
            // The lease may still be ours: give the job back so another worker continues
            // the run without waiting for the lease to expire (this run has stopped).
            match shared.queue.release(&lease).await {
                Ok(()) | Err(QueueError::LeaseLost { .. }) => {}
                Err(e) => shared.say(&format!("job {job}: giving the job back failed: {e}")),
            }
        }
        return;
    }
    let Some(result) = result else { return };
    match result {
        Ok(status) => {
            counters.completed.fetch_add(1, Ordering::Relaxed);
            match shared.queue.complete(&lease).await {
                Ok(()) => shared.say(&format!("job {job} thread {thread_id}: {status}")),
                Err(e) => shared.say(&format!(
                    "job {job} thread {thread_id}: {status}, but completing failed: {e}"
                )),
            }
        }
        Err(JobFailure::Permanent(message)) => {
            // Retrying cannot help (bad payload, refused agent, unknown tool).
            counters.failed.fetch_add(1, Ordering::Relaxed);
            shared.say(&format!("job {job} thread {thread_id}: failed: {message}"));
            if let Err(e) = shared.queue.fail(&lease, &message).await {
                shared.say(&format!("job {job}: recording the failure failed: {e}"));
            }
        }
        Err(JobFailure::Transient(message)) if attempts >= shared.max_attempts => {
            let message = format!(
                "{message} (attempt {attempts} of {}: dead-lettered)",
                shared.max_attempts
            );
            dead_letter(shared, &lease, &message).await;
        }
        Err(JobFailure::Transient(message)) => {
            counters.retried.fetch_add(1, Ordering::Relaxed);
            let delay = retry_delay(shared.retry_base, attempts);
            shared.say(&format!(
                "job {job} thread {thread_id}: {message}; attempt {attempts} of {}, retrying in \
                 {delay:?}",
                shared.max_attempts
            ));
            if let Err(e) = shared.queue.retry_later(&lease, delay).await {
                shared.say(&format!("job {job}: giving the job back failed: {e}"));
            }
        }
        Err(JobFailure::Wait(message)) => {
            counters.waited.fetch_add(1, Ordering::Relaxed);
            let delay = WAIT_RECHECK.min(shared.poll.saturating_mul(4));
            shared.say(&format!(
                "job {job} thread {thread_id}: waits: {message}; next look in {delay:?}"
            ));
            if let Err(e) = shared.queue.snooze(&lease, delay).await {
                shared.say(&format!("job {job}: giving the job back failed: {e}"));
            }
        }
    }
}

/// Ends a job `dead` with `message` (its last error).
async fn dead_letter<A: JobAgents>(shared: &Shared<A>, lease: &Lease, message: &str) {
    shared.counters.dead.fetch_add(1, Ordering::Relaxed);
    shared.say(&format!(
        "job {} thread {}: dead: {message}",
        lease.job_id, lease.thread_id
    ));
    if let Err(e) = shared.queue.dead_letter(lease, message).await {
        shared.say(&format!(
            "job {}: recording the dead letter failed: {e}",
            lease.job_id
        ));
    }
}

/// With a shutdown grace, gives the lease up ([`Loss::Shutdown`], which cancels the run and
/// fences its writes) once the worker has been shut down for that long; never resolves
/// (the run's end or [`lost_then`] ends the wait).
async fn interrupt_at_shutdown<A>(shared: &Shared<A>, keeper: &LeaseKeeper) {
    if let Some(grace) = shared.grace {
        shared.shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
        keeper.lose(Loss::Shutdown(format!(
            "the worker is shutting down and the run did not end within {grace:?}"
        )));
    }
    std::future::pending::<()>().await;
}

/// Resolves `grace` after the lease is lost: how long a cancelled run gets to stop.
async fn lost_then(keeper: &LeaseKeeper, grace: Duration) {
    keeper.wait_lost().await;
    tokio::time::sleep(grace).await;
}

#[cfg(test)]
mod tests;
