//! `keel submit` and `keel worker`: scale-out. `submit` enqueues a run on the store's run
//! queue and prints its thread id; `worker` leases queued runs (several workers can share
//! one Postgres store), renews the lease while it drives a run, and completes the job at
//! the end. A crashed worker's jobs are taken over once its lease expires; a worker that
//! loses its lease stops driving at once (writing nothing more), and the store's
//! optimistic append check is the last line of defence against two drivers.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{CancellationToken, EventKind, EventStore, Message, new_id};
use keel_runtime::{RunContext, Thread};
use keel_store::{Lease, QueueError, RunQueue};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Mutex, watch};

use crate::CliError;
use crate::agents::{self, AgentArgs, AgentSpec, StoreArgs};
use crate::output::OutputFormat;
use crate::recorded;

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
    /// Lease duration in seconds (renewed every third of it while a run is driven).
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
}

/// What `keel submit` puts on the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPayload {
    /// The agent flags.
    pub agent: AgentSpec,
    /// The user's message.
    pub message: String,
    /// The thread's length at submission: a `RunStarted` at or after it is this job's run.
    pub base_seq: u64,
}

/// Runs `keel submit`.
pub async fn submit(args: SubmitArgs) -> Result<u8, CliError> {
    let spec = args.agent.spec()?;
    spec.build(0)?;
    let opened = args.store.open().await?;
    let thread_id = args.thread.clone().unwrap_or_else(|| new_id("thr"));
    let thread = Thread::load(opened.events.as_ref(), &thread_id)
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {thread_id}: {e}")))?;
    if thread.state().run_in_progress() {
        return Err(CliError::failure(format!(
            "thread {thread_id} has a run in progress; resume it (`keel resume {thread_id}`) instead"
        )));
    }
    let payload = JobPayload {
        agent: spec,
        message: args.message.join(" "),
        base_seq: thread.state().next_seq(),
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
    if !(args.lease_ttl.is_finite() && args.lease_ttl > 0.0 && args.lease_ttl <= 86_400.0) {
        return Err(CliError::usage(
            "--lease-ttl must be a number of seconds in (0, 86400]",
        ));
    }
    if args.concurrency == 0 {
        return Err(CliError::usage("--concurrency must be at least 1"));
    }
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
    });
    eprintln!(
        "keel worker {} on {} (lease {:?}, concurrency {})",
        shared.worker_id, opened.backend, shared.ttl, args.concurrency
    );
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
}

/// One lease-drive-complete loop.
async fn slot(shared: Arc<Shared>) {
    loop {
        match shared.queue.acquire(&shared.worker_id, shared.ttl).await {
            Ok(Some(lease)) => drive_job(&shared, lease).await,
            Ok(None) => {
                if shared.exit_when_idle {
                    match shared.queue.counts().await {
                        Ok(counts) if counts.queued == 0 && counts.leased == 0 => return,
                        Ok(_) => {}
                        Err(e) => eprintln!("worker {}: cannot count jobs: {e}", shared.worker_id),
                    }
                }
                tokio::time::sleep(shared.poll).await;
            }
            Err(e) => {
                eprintln!("worker {}: acquire failed: {e}", shared.worker_id);
                tokio::time::sleep(shared.poll).await;
            }
        }
    }
}

/// Drives one leased job while a background task renews the lease; stops driving (and
/// writes nothing more) as soon as the lease is lost.
async fn drive_job(shared: &Shared, lease: Lease) {
    let job = lease.job_id;
    let thread_id = lease.thread_id.clone();
    let current = Arc::new(Mutex::new(lease));
    let (lost_tx, mut lost_rx) = watch::channel(false);
    let renewer = tokio::spawn(renew_loop(
        shared.queue.clone(),
        current.clone(),
        shared.ttl,
        lost_tx,
    ));
    let payload = current.lock().await.payload.clone();
    let result = tokio::select! {
        result = drive(shared.events.clone(), &thread_id, payload) => Some(result),
        _ = lost_rx.wait_for(|lost| *lost) => None,
    };
    renewer.abort();
    let lease = current.lock().await.clone();
    match result {
        None => eprintln!("job {job} thread {thread_id}: lease lost; stopped driving"),
        Some(Ok(status)) => match shared.queue.complete(&lease).await {
            Ok(()) => eprintln!("job {job} thread {thread_id}: {status}"),
            Err(e) => {
                eprintln!("job {job} thread {thread_id}: {status}, but completing failed: {e}")
            }
        },
        Some(Err(JobFailure::Permanent(message))) => {
            // Retrying cannot help (bad payload, unknown tool, unreadable script).
            eprintln!("job {job} thread {thread_id}: {message}; dropping the job");
            if let Err(e) = shared.queue.complete(&lease).await {
                eprintln!("job {job}: completing failed: {e}");
            }
        }
        Some(Err(JobFailure::Transient(message))) => {
            eprintln!("job {job} thread {thread_id}: {message}; giving the job back");
            tokio::time::sleep(shared.poll).await;
            if let Err(e) = shared.queue.release(&lease).await {
                eprintln!("job {job}: release failed: {e}");
            }
        }
    }
}

/// Renews every third of the TTL; reports a lost lease (taken over, or not renewed
/// within its TTL).
async fn renew_loop(
    queue: Arc<dyn RunQueue>,
    current: Arc<Mutex<Lease>>,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let every = ttl / 3;
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let lease = current.lock().await.clone();
        match queue.renew(&lease, ttl).await {
            Ok(renewed) => {
                *current.lock().await = renewed;
                last_ok = tokio::time::Instant::now();
            }
            Err(QueueError::LeaseLost { .. }) => {
                let _ = lost.send(true);
                return;
            }
            Err(e) => {
                eprintln!("renewing lease on job {}: {e}", lease.job_id);
                if last_ok.elapsed() >= ttl {
                    let _ = lost.send(true);
                    return;
                }
            }
        }
    }
}

/// Why a job could not be driven.
enum JobFailure {
    /// Retrying cannot help: the job is dropped.
    Permanent(String),
    /// The store failed or another process drives the thread: the job goes back.
    Transient(String),
}

/// A worker's run context: no terminal, approvals pause the run.
fn worker_context(store: Arc<dyn EventStore>, spec: &AgentSpec) -> RunContext {
    RunContext::new(store)
        .with_cancel(CancellationToken::new())
        .with_approval_mode(spec.approve.mode())
}

/// Starts or resumes the job's run; returns a one-line status.
async fn drive(
    store: Arc<dyn EventStore>,
    thread_id: &str,
    payload: serde_json::Value,
) -> Result<String, JobFailure> {
    use JobFailure::{Permanent, Transient};
    let job: JobPayload =
        serde_json::from_value(payload).map_err(|e| Permanent(format!("bad job payload: {e}")))?;
    // The log is read once; the thread keeps its latest run's events.
    let mut thread = Thread::load(store.as_ref(), thread_id)
        .await
        .map_err(|e| Transient(format!("cannot load thread: {e}")))?;
    let started_here = thread
        .run_events()
        .iter()
        .any(|e| e.seq >= job.base_seq && matches!(e.kind, EventKind::RunStarted { .. }));
    let resumed = thread.state().run_in_progress();
    let outcome = match thread.state().run() {
        Some(run) if resumed => {
            // The run's own record of its agent wins over the submitted flags.
            let spec = recorded::recorded_spec(thread.run_events())
                .map_err(|e| Permanent(e.message))?
                .unwrap_or_else(|| job.agent.clone());
            let built = spec
                .build(agents::consumed_steps(thread.run_events(), &run.run_id))
                .map_err(|e| Permanent(e.message))?;
            let context = worker_context(store.clone(), &spec);
            built.agent.resume(&mut thread, &context).await
        }
        Some(run) if started_here => {
            return Ok(format!(
                "already ended ({})",
                run.ended.map(|e| e.as_str()).unwrap_or("?")
            ));
        }
        _ => {
            let built = job.agent.build(0).map_err(|e| Permanent(e.message))?;
            let context = worker_context(store.clone(), &job.agent);
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
    let how = if resumed {
        " (resumed an interrupted run)"
    } else {
        ""
    };
    Ok(match outcome.end_state() {
        Some(end_state) => format!("ended {end_state}{how}"),
        None => format!("paused awaiting approval{how}"),
    })
}
