//! A measured child process: one client configuration running one workload, printing one
//! JSON line ([`Report`]) on stdout. Each workload of each configuration runs in its own
//! process so CPU time and peak RSS (`ru_maxrss`) belong to that configuration alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use keel_runtime::{RunContext, ToolAgent};
use serde::{Deserialize, Serialize};

use crate::bare::{Bare, RequestTemplate};
use crate::keel::{self, OpenError, OpenStore, StoreKind};
use crate::measure;
use crate::mock::user_prompt;

/// The longest any single conversation may take before the workload fails.
const CONVERSATION_TIMEOUT: Duration = Duration::from_secs(120);

/// Which client a worker drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientKind {
    /// The plain reqwest + tokio loop.
    Bare,
    /// A Keel agent (with `--store`).
    Keel,
}

/// What a worker measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Sequential conversations, CPU time per conversation.
    W1,
    /// Concurrent conversations: wall, CPU, peak RSS.
    W2,
    /// One conversation, as fast as possible after spawn (the parent times it).
    Cold,
}

/// The worker's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Client.
    #[arg(long, value_enum)]
    pub client: ClientKind,
    /// Store of the Keel client.
    #[arg(long, value_enum, default_value = "memory")]
    pub store: StoreKind,
    /// Workload.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// The mock's base URL.
    #[arg(long)]
    pub base_url: String,
    /// Model name sent to the mock.
    #[arg(long)]
    pub model: String,
    /// The request template file (JSON) for the bare client.
    #[arg(long)]
    pub template: std::path::PathBuf,
    /// Conversations (per repetition for W1, concurrent for W2).
    #[arg(long, default_value_t = 1)]
    pub conversations: u32,
    /// W1 repetitions.
    #[arg(long, default_value_t = 1)]
    pub reps: u32,
    /// Tool turns per conversation.
    #[arg(long, default_value_t = 1)]
    pub tools: u32,
    /// Mock latency per request.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Warm-up conversations before measuring.
    #[arg(long, default_value_t = 10)]
    pub warmup: u32,
}

/// What a worker prints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Set when the configuration could not run (Postgres unreachable).
    pub skipped: Option<String>,
    /// W1: CPU milliseconds per conversation, one value per repetition.
    pub cpu_ms_per_conv: Vec<f64>,
    /// W2: wall seconds of the concurrent batch.
    pub wall_s: f64,
    /// W2: CPU seconds (user + system) of the concurrent batch.
    pub cpu_s: f64,
    /// Peak RSS of the process, MiB.
    pub peak_rss_mb: f64,
    /// W2: RSS just before the batch started, MiB.
    pub rss_before_mb: f64,
}

enum Client {
    Bare(Bare),
    Keel(Box<ToolAgent>, RunContext),
}

impl Client {
    async fn conversation(&self, prompt: &str) -> anyhow::Result<u32> {
        let run = async {
            match self {
                Client::Bare(bare) => bare.conversation(prompt).await,
                Client::Keel(agent, ctx) => keel::conversation(agent, ctx, prompt).await,
            }
        };
        tokio::time::timeout(CONVERSATION_TIMEOUT, run)
            .await
            .with_context(|| format!("a conversation took longer than {CONVERSATION_TIMEOUT:?}"))?
    }

    /// Runs one conversation and checks it made `tools + 1` model requests.
    async fn checked(&self, tools: u32, latency_ms: u64) -> anyhow::Result<()> {
        let requests = self.conversation(&user_prompt(tools, latency_ms)).await?;
        if requests != tools + 1 {
            bail!(
                "a conversation made {requests} model requests, expected {}",
                tools + 1
            );
        }
        Ok(())
    }
}

/// Runs the worker and prints its report; `Ok` also for a skipped configuration.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::builder()
        .file_name(format!(
            "dhat-heap-{:?}-{:?}-{:?}.json",
            args.client, args.store, args.workload
        ))
        .build();
    let (client, store) = match args.client {
        ClientKind::Bare => {
            let text = std::fs::read_to_string(&args.template)
                .with_context(|| format!("reading {}", args.template.display()))?;
            let template: RequestTemplate = serde_json::from_str(&text)?;
            (Client::Bare(Bare::new(&args.base_url, template)?), None)
        }
        ClientKind::Keel => {
            let store = match OpenStore::open(args.store).await {
                Ok(store) => store,
                Err(OpenError::Unreachable(reason)) => {
                    return print(&Report {
                        skipped: Some(reason),
                        ..Report::default()
                    });
                }
                Err(OpenError::Failed(e)) => return Err(e),
            };
            let agent = keel::agent(&args.model, &args.base_url)?;
            let ctx = RunContext::new(store.store.clone());
            (Client::Keel(Box::new(agent), ctx), Some(store))
        }
    };
    let client = Arc::new(client);
    let result = measure_workload(&client, &args).await;
    if std::env::var_os("KEEL_BENCH_DIAG").is_some()
        && let Some(store) = &store
    {
        log_stored_events(store.store.as_ref()).await?;
    }
    if let Some(store) = store {
        store.close().await?;
    }
    let report = result?;
    if args.workload != Workload::Cold {
        print(&report)?;
    }
    Ok(())
}

fn print(report: &Report) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(report)?)?;
    out.flush()?;
    Ok(())
}

async fn measure_workload(client: &Arc<Client>, args: &WorkerArgs) -> anyhow::Result<Report> {
    let mut report = Report::default();
    match args.workload {
        Workload::Cold => {
            client.checked(args.tools, 0).await?;
            // The parent stops its clock at this line.
            print(&report)?;
        }
        Workload::W1 => {
            for _ in 0..args.warmup {
                client.checked(args.tools, 0).await?;
            }
            for _ in 0..args.reps {
                let before = measure::usage()?;
                for _ in 0..args.conversations {
                    client.checked(args.tools, 0).await?;
                }
                let after = measure::usage()?;
                let cpu_ms = (after.cpu_us - before.cpu_us) as f64 / 1000.0;
                report
                    .cpu_ms_per_conv
                    .push(cpu_ms / f64::from(args.conversations.max(1)));
            }
        }
        Workload::W2 => {
            concurrent(client, args.warmup, 1, 0).await?;
            report.rss_before_mb = measure::current_rss_kib().unwrap_or(0) as f64 / 1024.0;
            let before = measure::usage()?;
            let started = Instant::now();
            concurrent(client, args.conversations, args.tools, args.latency_ms).await?;
            report.wall_s = started.elapsed().as_secs_f64();
            let after = measure::usage()?;
            report.cpu_s = (after.cpu_us - before.cpu_us) as f64 / 1e6;
            #[cfg(feature = "dhat-heap")]
            {
                let stats = dhat::HeapStats::get();
                eprintln!(
                    "dhat: {} allocations ({} bytes) in all; peak live {} bytes in {} blocks; live now {} bytes",
                    stats.total_blocks,
                    stats.total_bytes,
                    stats.max_bytes,
                    stats.max_blocks,
                    stats.curr_bytes
                );
            }
        }
    }
    report.peak_rss_mb = measure::usage()?.max_rss_kib as f64 / 1024.0;
    Ok(report)
}

/// `n` conversations at once; the first failure fails the batch.
async fn concurrent(
    client: &Arc<Client>,
    n: u32,
    tools: u32,
    latency_ms: u64,
) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let client = client.clone();
        set.spawn(async move { client.checked(tools, latency_ms).await });
    }
    let mut failures = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{e:#}")),
            Err(e) => failures.push(format!("task failed: {e}")),
        }
    }
    if let Some(first) = failures.first() {
        bail!(
            "{} of {n} concurrent conversations failed; first: {first}",
            failures.len()
        );
    }
    Ok(())
}

/// Diagnostics (`KEEL_BENCH_DIAG=1`): how many events the store holds and their size as
/// JSON — for the memory store, what stays resident after the conversations end.
async fn log_stored_events(store: &dyn keel_core::EventStore) -> anyhow::Result<()> {
    let threads = store
        .list_threads(&keel_core::store::ThreadFilter::default())
        .await?;
    let (mut events, mut bytes) = (0_usize, 0_usize);
    let mut by_kind: std::collections::BTreeMap<&'static str, (usize, usize)> =
        std::collections::BTreeMap::new();
    for thread in &threads {
        for event in store.load(&thread.thread_id).await? {
            let size = serde_json::to_vec(&event)?.len();
            events += 1;
            bytes += size;
            let entry = by_kind.entry(event.kind.name()).or_default();
            entry.0 += 1;
            entry.1 += size;
        }
    }
    for (kind, (count, size)) in &by_kind {
        eprintln!(
            "diag: {kind}: {count} events, {} bytes each on average",
            size / count.max(&1)
        );
    }
    eprintln!(
        "diag: size_of Event {} B, EventKind {} B, Part {} B, Message {} B",
        std::mem::size_of::<keel_core::Event>(),
        std::mem::size_of::<keel_core::EventKind>(),
        std::mem::size_of::<keel_core::Part>(),
        std::mem::size_of::<keel_core::Message>()
    );
    let per = threads.len().max(1);
    eprintln!(
        "diag: {} threads, {events} events ({} per thread), {bytes} bytes as JSON ({} per thread)",
        threads.len(),
        events / per,
        bytes / per
    );
    Ok(())
}
