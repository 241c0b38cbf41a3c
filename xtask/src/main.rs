//! `cargo xtask`: Keel's reliability harness (see `docs/reliability.md`).
//!
//! - `cargo xtask chaos [--conversations 1000] [--concurrency 32] [--fault-rate 0.3]
//!   [--seed N] [--store memory|sqlite]`
//! - `cargo xtask soak [--conversations 1000] [--turns 50] [--concurrency 32] ...`
//! - `cargo xtask bench-serve [--chats 500] [--concurrency 500] [--store sqlite|postgres] ...`
//!   (the load benchmark of `keel serve`; docs/server.md, "Load")
//!
//! Each prints a report and exits 1 when an assertion fails (2 when it cannot run).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use xtask::chaos::{self, ChaosOptions};
use xtask::serve_bench::{self, ServeBenchOptions, ServeStore};
use xtask::soak::{self, SoakOptions};
use xtask::store::StoreKind;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Keel's reliability harness (issue 14) and the load benchmark of keel serve (issue 17)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Many concurrent conversations under seeded provider and tool faults.
    Chaos {
        /// Conversations in total.
        #[arg(long, default_value_t = 1000)]
        conversations: usize,
        /// Conversations running at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Share of model requests and tool attempts that fail (0.0 to 1.0).
        #[arg(long, default_value_t = 0.3)]
        fault_rate: f64,
        /// Seed of the injected faults.
        #[arg(long, default_value_t = 14)]
        seed: u64,
        /// The event store.
        #[arg(long, value_enum, default_value_t = StoreKind::Memory)]
        store: StoreKind,
        /// Provider attempts per model call, the first included.
        #[arg(long, default_value_t = 6)]
        max_attempts: u32,
        /// Longest retry-after a 429 asks for, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        max_retry_after_ms: u64,
    },
    /// Many long conversations with compaction; memory, tasks and descriptors must not grow.
    Soak {
        /// Conversations in total.
        #[arg(long, default_value_t = 1000)]
        conversations: usize,
        /// User turns (runs) per conversation.
        #[arg(long, default_value_t = 50)]
        turns: usize,
        /// Conversations running at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Conversations of the warm-up phase (default: a tenth, at least the concurrency).
        #[arg(long)]
        warmup: Option<usize>,
        /// The agents' context window in tokens (small, so compaction happens).
        #[arg(long, default_value_t = 3000)]
        context_window: u32,
        /// The event store.
        #[arg(long, value_enum, default_value_t = StoreKind::Memory)]
        store: StoreKind,
        /// Largest allowed growth of resident memory after warm-up, in percent.
        #[arg(long, default_value_t = 5.0)]
        max_rss_drift: f64,
    },
    /// Load benchmark of `keel serve`: concurrent streaming chats against `keel mock-llm`
    /// (figures for docs/server.md; fails only on errors).
    BenchServe {
        /// Chats of the measured load (and streams of the baseline straight to the mock).
        #[arg(long, default_value_t = 500)]
        chats: usize,
        /// Chats in flight at once.
        #[arg(long, default_value_t = 500)]
        concurrency: usize,
        /// Embedded workers of `keel serve` (default: the concurrency).
        #[arg(long)]
        workers: Option<usize>,
        /// The mock's latency before the response headers, in ms.
        #[arg(long, default_value_t = 50)]
        latency_ms: u64,
        /// The mock's pause between stream frames, in ms.
        #[arg(long, default_value_t = 5)]
        chunk_delay_ms: u64,
        /// Words of each answer (streamed two per chunk).
        #[arg(long, default_value_t = 40)]
        words: usize,
        /// Chats (and baseline streams) run before the measured phases.
        #[arg(long, default_value_t = 20)]
        warmup: usize,
        /// The store of `keel serve` (postgres: a fresh schema of $DATABASE_URL).
        #[arg(long, value_enum, default_value_t = ServeStore::Sqlite)]
        store: ServeStore,
        /// The agent's model (an `openai:` spec; the mock answers any name).
        #[arg(long, default_value = "openai:gpt-4.1-mini")]
        model: String,
        /// Use this keel binary instead of building the release one.
        #[arg(long, value_name = "PATH")]
        keel: Option<PathBuf>,
        /// Where to write report.md and report.json (default target/bench-serve).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// The longest one chat may take, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("xtask: cannot start the tokio runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let outcome: anyhow::Result<(String, bool)> = runtime.block_on(async {
        match cli.command {
            Command::Chaos {
                conversations,
                concurrency,
                fault_rate,
                seed,
                store,
                max_attempts,
                max_retry_after_ms,
            } => {
                let report = chaos::run(ChaosOptions {
                    conversations,
                    concurrency,
                    fault_rate,
                    seed,
                    store,
                    max_attempts,
                    max_retry_after_ms,
                })
                .await?;
                Ok((report.to_string(), report.failures().is_empty()))
            }
            Command::Soak {
                conversations,
                turns,
                concurrency,
                warmup,
                context_window,
                store,
                max_rss_drift,
            } => {
                let report = soak::run(SoakOptions {
                    conversations,
                    turns,
                    concurrency,
                    warmup,
                    context_window,
                    store,
                    max_rss_drift_percent: max_rss_drift,
                })
                .await?;
                Ok((report.to_string(), report.failures().is_empty()))
            }
            Command::BenchServe {
                chats,
                concurrency,
                workers,
                latency_ms,
                chunk_delay_ms,
                words,
                warmup,
                store,
                model,
                keel,
                out,
                timeout_secs,
            } => {
                let report = serve_bench::run(ServeBenchOptions {
                    chats,
                    concurrency,
                    workers,
                    latency_ms,
                    chunk_delay_ms,
                    words,
                    warmup,
                    store,
                    model,
                    keel,
                    out,
                    timeout: Duration::from_secs(timeout_secs),
                })
                .await?;
                let dir = serve_bench::write_report(&report)?;
                eprintln!(
                    "bench-serve: report written to {}/report.{{md,json}}",
                    dir.display()
                );
                Ok((report.to_string(), report.failures().is_empty()))
            }
        }
    });
    match outcome {
        Ok((report, passed)) => {
            print!("{report}");
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::from(2)
        }
    }
}
