//! `keel submit` and `keel worker`: scale-out. `submit` enqueues one job per message on
//! the store's run queue and prints its thread id; `worker` leases queued jobs (several
//! workers can share one Postgres store) — the jobs of one thread one at a time, in
//! submit order — and drives each job's run while [`lease::LeaseKeeper`] renews the lease.
//! A crashed worker's jobs are taken over once its lease expires. A worker that loses its
//! lease, or can no longer confirm it, cancels the run at once and writes nothing more
//! ([`lease::FencedStore`]); the store's append check is the last line of defence.
//! A job's custom base URL or agent file is used only when the worker allows it
//! ([`allow::JobPolicy`]).

mod allow;
mod lease;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_core::store::ThreadStatus;
use keel_core::{CancellationToken, EventKind, EventStore, Message, new_id};
use keel_runtime::{RunContext, Thread};
use keel_store::{Lease, QueueError, RunQueue};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

use crate::CliError;
use crate::agents::{self, AgentArgs, AgentSpec, StoreArgs};
use crate::output::OutputFormat;
use crate::recorded;
use allow::JobPolicy;
use lease::{FencedStore, LeaseKeeper, Loss};

/// Flags of `keel submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Continue this thread (default: a new thread).
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// The user's message.
    #[arg(value_name = "MESSAGE", required = true)]
    pub message: Vec<String>,
}

/// Flags of `keel worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// This worker's name in leases (default `worker-PID`).
    #[arg(long, value_name = "ID")]
    pub worker_id: Option<String>,
    /// Lease duration in seconds (renewed every third of it while a run is driven; a run
    /// whose lease cannot be confirmed for two thirds of it is cancelled).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub lease_ttl: f64,
    /// Runs driven at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub concurrency: usize,
    /// How long to wait between polls when the queue is empty, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub poll_ms: u64,
    /// Exit once no job is queued or leased.
    #[arg(long)]
    pub exit_when_idle: bool,
    /// A base URL jobs may send this worker's API keys to (repeatable, or comma-separated
    /// in KEEL_WORKER_ALLOW_BASE_URLS): `scheme://host[:port][/path]` allows that origin and
    /// the paths under it; `loopback` allows 127.0.0.0/8, ::1 and localhost. Jobs with any
    /// other `--base-url` fail before any model call.
    #[arg(
        long = "allow-base-url",
        value_name = "URL",
        env = "KEEL_WORKER_ALLOW_BASE_URLS",
        value_delimiter = ','
    )]
    pub allow_base_urls: Vec<String>,
    /// A directory whose agent files jobs may use (repeatable, or comma-separated in
    /// KEEL_WORKER_ALLOW_AGENT_DIRS; symlinks are resolved). Jobs with an agent file
    /// elsewhere fail before any model call.
    #[arg(
        long = "allow-agent-dir",
        value_name = "DIR",
        env = "KEEL_WORKER_ALLOW_AGENT_DIRS",
        value_delimiter = ','
    )]
    pub allow_agent_dirs: Vec<PathBuf>,
}

/// What `keel submit` puts on the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPayload {
    /// The agent flags.
    pub agent: AgentSpec,
    /// The user's message.
    pub message: String,
    /// The thread's length at submission (jobs submitted before submission ids: a
    /// `RunStarted` at or after it is this job's run).
    pub base_seq: u64,
    /// This submission's id, recorded in the run it starts: a worker taking the job over
    /// finds the job's own run by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
}

/// Runs `keel submit`.
pub async fn submit(args: SubmitArgs) -> Result<u8, CliError> {
    let spec = args.agent.new_run_spec()?;
    spec.build(0).await?;
    let opened = args.store.open().await?;
    let thread_id = args.thread.clone().unwrap_or_else(|| new_id("thr"));
    let thread = Thread::load(opened.events.as_ref(), &thread_id)
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {thread_id}: {e}")))?;
    if thread.state().run_in_progress() {
        eprintln!(
            "keel: thread {thread_id} has a run in progress; this message runs after it ends \
             (a worker continues it, or approve, deny, reply to or resume it)"
        );
    }
    let payload = JobPayload {
        agent: spec,
        message: args.message.join(" "),
        base_seq: thread.state().next_seq(),
        submission: Some(new_id("sub")),
    };
    let payload = serde_json::to_value(&payload)
        .map_err(|e| CliError::failure(format!("cannot serialize the job: {e}")))?;
    let job_id = opened
        .queue
        .enqueue(&thread_id, &payload)
        .await
        .map_err(|e| CliError::failure(format!("cannot enqueue: {e}")))?;
    match args.output {
        OutputFormat::Json => println!("{}", json!({"thread_id": thread_id, "job_id": job_id})),
        OutputFormat::Text => println!("{thread_id}"),
    }
    Ok(0)
}

/// Runs `keel worker`.
pub async fn worker(args: WorkerArgs) -> Result<u8, CliError> {
    if !(args.lease_ttl.is_finite() && args.lease_ttl >= 0.3 && args.lease_ttl <= 86_400.0) {
        return Err(CliError::usage(
            "--lease-ttl must be a number of seconds in [0.3, 86400]",
        ));
    }
    if args.concurrency == 0 {
        return Err(CliError::usage("--concurrency must be at least 1"));
    }
    let policy =
        JobPolicy::new(&args.allow_base_urls, &args.allow_agent_dirs).map_err(CliError::usage)?;
    let opened = args.store.open().await?;
    let shared = Arc::new(Shared {
        events: opened.events,
        queue: opened.queue,
        worker_id: args
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("worker-{}", std::process::id())),
        ttl: Duration::from_secs_f64(args.lease_ttl),
        poll: Duration::from_millis(args.poll_ms.max(1)),
        exit_when_idle: args.exit_when_idle,
        policy,
    });
    say(&format!(
        "keel worker {} on {} (lease {:?}, concurrency {}; {})",
        shared.worker_id,
        opened.backend,
        shared.ttl,
        args.concurrency,
        shared.policy.describe()
    ));
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        slots.spawn(slot(shared.clone()));
    }
    while slots.join_next().await.is_some() {}
    Ok(0)
}

struct Shared {
    events: Arc<dyn EventStore>,
    queue: Arc<dyn RunQueue>,
    worker_id: String,
    ttl: Duration,
    poll: Duration,
    exit_when_idle: bool,
    policy: JobPolicy,
}

/// A line on stderr, redacted like every other error the CLI prints.
fn say(line: &str) {
    eprintln!("{}", crate::redaction::for_stderr(line));
}

/// One lease-drive-complete loop.
async fn slot(shared: Arc<Shared>) {
    loop {
        let sent = Instant::now();
        match shared.queue.acquire(&shared.worker_id, shared.ttl).await {
            Ok(Some(lease)) => drive_job(&shared, lease, sent).await,
            Ok(None) => {
                if shared.exit_when_idle {
                    match shared.queue.counts().await {
                        Ok(counts) if counts.queued == 0 && counts.leased == 0 => return,
                        Ok(_) => {}
                        Err(e) => say(&format!(
                            "worker {}: cannot count jobs: {e}",
                            shared.worker_id
                        )),
                    }
                }
                tokio::time::sleep(shared.poll).await;
            }
            Err(e) => {
                say(&format!("worker {}: acquire failed: {e}", shared.worker_id));
                tokio::time::sleep(shared.poll).await;
            }
        }
    }
}

/// Drives one leased job (acquired by a request sent at `sent`) while a [`LeaseKeeper`]
/// renews the lease; when the lease is lost the run is cancelled, its writes are refused,
/// and the job is neither completed nor failed here.
async fn drive_job(shared: &Shared, lease: Lease, sent: Instant) {
    let job = lease.job_id;
    let thread_id = lease.thread_id.clone();
    let payload = lease.payload.clone();
    let attempts = lease.attempts;
    let cancel = CancellationToken::new();
    let keeper = Arc::new(LeaseKeeper::new(
        shared.queue.clone(),
        lease,
        shared.ttl,
        sent,
        cancel.clone(),
    ));
    let keeping = tokio::spawn(keeper.clone().keep());
    let store: Arc<dyn EventStore> =
        Arc::new(FencedStore::new(shared.events.clone(), keeper.clone()));
    let run = drive(store, &thread_id, payload, &shared.policy, cancel);
    tokio::pin!(run);
    let result = tokio::select! {
        result = &mut run => Some(result),
        () = lost_then(&keeper, shared.ttl) => None,
    };
    keeping.abort();
    let lease = keeper.lease();
    if let Some(loss) = keeper.loss() {
        let stopped = if result.is_some() {
            "cancelled the run; nothing more was written"
        } else {
            "the run did not stop within the lease TTL after it was cancelled; dropped it"
        };
        say(&format!(
            "job {job} thread {thread_id}: lease lost ({loss}); {stopped}"
        ));
        if matches!(loss, Loss::Unconfirmed(_)) {
            // The lease may still be ours: give the job back so another worker continues
            // the run without waiting for the lease to expire (this run has stopped).
            match shared.queue.release(&lease).await {
                Ok(()) | Err(QueueError::LeaseLost { .. }) => {}
                Err(e) => say(&format!("job {job}: giving the job back failed: {e}")),
            }
        }
        return;
    }
    let Some(result) = result else { return };
    let backoff = (shared.poll * attempts.max(1)).min(Duration::from_secs(30));
    match result {
        Ok(status) => match shared.queue.complete(&lease).await {
            Ok(()) => say(&format!("job {job} thread {thread_id}: {status}")),
            Err(e) => say(&format!(
                "job {job} thread {thread_id}: {status}, but completing failed: {e}"
            )),
        },
        Err(JobFailure::Permanent(message)) => {
            // Retrying cannot help (bad payload, refused agent, unknown tool).
            say(&format!("job {job} thread {thread_id}: failed: {message}"));
            if let Err(e) = shared.queue.fail(&lease, &message).await {
                say(&format!("job {job}: recording the failure failed: {e}"));
            }
        }
        Err(JobFailure::Transient(message)) => {
            say(&format!(
                "job {job} thread {thread_id}: {message}; retrying in {backoff:?}"
            ));
            if let Err(e) = shared.queue.retry_later(&lease, backoff).await {
                say(&format!("job {job}: giving the job back failed: {e}"));
            }
        }
        Err(JobFailure::Wait(message)) => {
            say(&format!(
                "job {job} thread {thread_id}: waits: {message}; next look in {backoff:?}"
            ));
            if let Err(e) = shared.queue.retry_later(&lease, backoff).await {
                say(&format!("job {job}: giving the job back failed: {e}"));
            }
        }
    }
}

/// Resolves `grace` after the lease is lost: how long a cancelled run gets to stop.
async fn lost_then(keeper: &LeaseKeeper, grace: Duration) {
    keeper.wait_lost().await;
    tokio::time::sleep(grace).await;
}

/// Why a job could not be driven.
enum JobFailure {
    /// Retrying cannot help: the job fails.
    Permanent(String),
    /// The store failed or another process drives the thread: the job is retried.
    Transient(String),
    /// The thread has a run in progress that is not this job's: the job waits for it.
    Wait(String),
}

/// A worker's run context: no terminal, approvals pause the run, cancelled when the
/// lease is lost.
fn worker_context(
    store: Arc<dyn EventStore>,
    spec: &AgentSpec,
    built: &agents::Built,
    cancel: CancellationToken,
) -> RunContext {
    spec.base_context(built, store).with_cancel(cancel)
}

/// Starts or resumes the job's run; returns a one-line status.
async fn drive(
    store: Arc<dyn EventStore>,
    thread_id: &str,
    payload: serde_json::Value,
    policy: &JobPolicy,
    cancel: CancellationToken,
) -> Result<String, JobFailure> {
    use JobFailure::{Permanent, Transient, Wait};
    let job: JobPayload =
        serde_json::from_value(payload).map_err(|e| Permanent(format!("bad job payload: {e}")))?;
    // The log is read once; the thread keeps its latest run's events.
    let mut thread = Thread::load(store.as_ref(), thread_id)
        .await
        .map_err(|e| Transient(format!("cannot load thread: {e}")))?;
    let in_progress = thread.state().run_in_progress();
    // A recipe another keel version wrote cannot be this job's (nor be resumed here).
    let recorded = recorded::recorded_spec(thread.run_events()).ok().flatten();
    let own_run = match &job.submission {
        Some(submission) => recorded
            .as_ref()
            .is_some_and(|spec| spec.submission.as_ref() == Some(submission)),
        // Jobs from before submission ids: any run in progress, or one started since.
        None => {
            in_progress
                || thread.run_events().iter().any(|e| {
                    e.seq >= job.base_seq && matches!(e.kind, EventKind::RunStarted { .. })
                })
        }
    };
    let outcome = match thread.state().run() {
        Some(run) if own_run && in_progress => {
            // The run's own record of its agent wins over the submitted flags.
            let spec = match recorded::recorded_spec(thread.run_events())
                .map_err(|e| Permanent(e.message))?
            {
                Some(spec) => spec,
                None => AgentSpec {
                    submission: job.submission.clone(),
                    ..job.agent.clone()
                },
            };
            policy.check(&spec).map_err(Permanent)?;
            let built = spec
                .build(agents::consumed_steps(thread.run_events(), &run.run_id))
                .await
                .map_err(|e| Permanent(e.message))?;
            let context = worker_context(store.clone(), &spec, &built, cancel);
            built.agent.resume(&mut thread, &context).await
        }
        Some(run) if own_run => {
            return Ok(format!(
                "already ended ({})",
                run.ended.map(|e| e.as_str()).unwrap_or("?")
            ));
        }
        Some(_) if in_progress => {
            return Err(Wait(format!(
                "the thread has a run in progress ({}) that is not this job's; this job runs \
                 once it ends (a worker continues it, or approve, deny, reply to or resume it)",
                run_status(&thread)
            )));
        }
        _ => {
            let spec = AgentSpec {
                submission: job.submission.clone(),
                ..job.agent.clone()
            };
            policy.check(&spec).map_err(Permanent)?;
            let built = spec.build(0).await.map_err(|e| Permanent(e.message))?;
            let context = worker_context(store.clone(), &spec, &built, cancel);
            built
                .agent
                .run(
                    vec![Message::user(job.message.clone())],
                    &mut thread,
                    &context,
                )
                .await
        }
    };
    let outcome = outcome.map_err(|e| Transient(agents::run_error(e).message))?;
    let how = if in_progress {
        " (resumed an interrupted run)"
    } else {
        ""
    };
    Ok(match outcome.end_state() {
        Some(end_state) => format!("ended {end_state}{how}"),
        None => format!("paused awaiting approval{how}"),
    })
}

/// How the thread's run in progress stands, in words.
fn run_status(thread: &Thread) -> &'static str {
    let status = thread
        .run_events()
        .iter()
        .fold(ThreadStatus::Running, |status, event| {
            ThreadStatus::after(status, &event.kind)
        });
    match status {
        ThreadStatus::AwaitingApproval => "awaiting approval",
        ThreadStatus::AwaitingUser => "awaiting the user's answer",
        ThreadStatus::Running | ThreadStatus::Ended(_) => "running or interrupted",
    }
}
