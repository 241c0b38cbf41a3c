//! `keel submit` and `keel worker`: scale-out. `submit` enqueues one job per message on
//! the store's run queue and prints its thread id; `worker` runs a [`keel_app::worker`]
//! over the store (leases, renewals, fencing and the allowlists live there). This file is
//! the flags, the output, and how a job's [`AgentSpec`] becomes an agent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_app::worker::{self, BuildError, JobAgents, JobPolicy, JobStart, Worker, WorkerOptions};
use keel_core::{CancellationToken, Event, EventStore};
use keel_runtime::{Agent, RunContext};
use serde_json::json;

use crate::CliError;
use crate::agents::{self, AgentArgs, AgentSpec, RecipeExt, StoreArgs};
use crate::config::app_error;
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
    /// Attempts a job gets before it is dead-lettered with its last error (transient
    /// failures are retried with exponential backoff from 1 s, at most 10 minutes apart;
    /// waiting for another run of the thread uses up no attempt).
    #[arg(long, value_name = "N", default_value_t = worker::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// On SIGTERM or Ctrl-C, lease nothing more and give runs in progress this many
    /// milliseconds to end; runs still going are then interrupted and their jobs given
    /// back to the queue at once (another worker continues them).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,
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

/// Runs `keel submit`.
pub async fn submit(args: SubmitArgs) -> Result<u8, CliError> {
    let spec = args.agent.new_run_spec()?;
    spec.build(0).await?;
    let opened = args.store.open().await?;
    let message = args.message.join(" ");
    let submitted = worker::submit(
        opened.events.as_ref(),
        opened.queue.as_ref(),
        args.thread,
        spec,
        message,
    )
    .await
    .map_err(|e| CliError::failure(e.0))?;
    let thread_id = submitted.thread_id;
    if submitted.run_in_progress {
        eprintln!(
            "keel: thread {thread_id} has a run in progress; this message runs after it ends \
             (a worker continues it, or approve, deny, reply to or resume it)"
        );
    }
    match args.output {
        OutputFormat::Json => println!(
            "{}",
            json!({"thread_id": thread_id, "job_id": submitted.job_id})
        ),
        OutputFormat::Text => println!("{thread_id}"),
    }
    Ok(0)
}

/// Runs `keel worker`.
pub async fn worker(args: WorkerArgs) -> Result<u8, CliError> {
    let (min, max) = (
        worker::MIN_LEASE_TTL.as_secs_f64(),
        worker::MAX_LEASE_TTL.as_secs_f64(),
    );
    if !(args.lease_ttl.is_finite() && args.lease_ttl >= min && args.lease_ttl <= max) {
        return Err(CliError::usage(format!(
            "--lease-ttl must be a number of seconds in [{min}, {max}]: a third of the TTL must \
             outlast the {} ms a cancelled tool is given to answer",
            keel_runtime::TOOL_CANCEL_GRACE.as_millis()
        )));
    }
    if args.concurrency == 0 {
        return Err(CliError::usage("--concurrency must be at least 1"));
    }
    if args.max_attempts == 0 {
        return Err(CliError::usage("--max-attempts must be at least 1"));
    }
    let policy =
        JobPolicy::new(&args.allow_base_urls, &args.allow_agent_dirs).map_err(CliError::usage)?;
    let opened = args.store.open().await?;
    let options = WorkerOptions {
        worker_id: args.worker_id.unwrap_or_else(worker::default_worker_id),
        lease_ttl: Duration::from_secs_f64(args.lease_ttl),
        concurrency: args.concurrency,
        poll: Duration::from_millis(args.poll_ms.max(1)),
        exit_when_idle: args.exit_when_idle,
        policy,
        max_attempts: args.max_attempts,
        retry_base: Duration::from_secs(1),
    };
    say(&format!(
        "keel worker {} on {} (lease {:?}, concurrency {}; {})",
        options.worker_id,
        opened.backend,
        options.lease_ttl,
        options.concurrency,
        options.policy.describe()
    ));
    let shutdown = CancellationToken::new();
    let grace = Duration::from_millis(args.shutdown_grace_ms);
    let worker = Worker::new(opened.events, opened.queue, CliJobs, options)
        .map_err(app_error)?
        .with_log(Arc::new(say))
        .with_shutdown(shutdown.clone())
        .with_shutdown_grace(grace);
    let on_signal = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            stop_signal().await;
            say(&format!(
                "keel worker: stopping (runs in progress get {grace:?} to end, then go back \
                 to the queue)"
            ));
            shutdown.cancel();
        }
    });
    let report = worker.run().await;
    on_signal.abort();
    if report.released > 0 {
        say(&format!(
            "keel worker: {} run(s) interrupted and given back to the queue",
            report.released
        ));
    }
    Ok(0)
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A line on stderr, redacted like every other error the CLI prints.
fn say(line: &str) {
    eprintln!("{}", crate::redaction::for_stderr(line));
}

/// Jobs carry the agent flags ([`AgentSpec`]); runs record them (see [`recorded`]).
struct CliJobs;

#[async_trait]
impl JobAgents for CliJobs {
    type Spec = AgentSpec;

    fn recorded(&self, run_events: &[std::sync::Arc<Event>]) -> Result<Option<AgentSpec>, String> {
        recorded::recorded_spec(run_events).map_err(|e| e.message)
    }

    /// No terminal: approvals pause the run; cancelled when the lease is lost.
    async fn build(
        &self,
        spec: &AgentSpec,
        _thread_id: &str,
        start: JobStart<'_>,
        store: Arc<dyn EventStore>,
        cancel: CancellationToken,
    ) -> Result<(Box<dyn Agent>, RunContext), BuildError> {
        let steps = match start {
            JobStart::Resume { run_id, run_events } => agents::consumed_steps(run_events, run_id),
            JobStart::New => 0,
        };
        // A usage error (an unknown agent, tool or model, a bad flag) can never work; a
        // failure (the store, a tool's server) may on a later attempt.
        let built = spec.build(steps).await.map_err(|e| {
            if e.code == crate::EXIT_USAGE {
                BuildError::Permanent(e.message)
            } else {
                BuildError::Transient(e.message)
            }
        })?;
        let context = spec.base_context(&built, store).with_cancel(cancel);
        Ok((Box::new(built.agent), context))
    }
}
