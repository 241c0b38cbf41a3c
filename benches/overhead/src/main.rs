//! `keel-bench-overhead`: Keel's overhead over a bare reqwest + tokio loop against a
//! loopback mock LLM — CPU per conversation (W1), wall / CPU / peak RSS under 500
//! concurrent conversations (W2) and cold start, for Keel with the memory, SQLite and
//! Postgres stores. Run it with `./scripts/bench`; what it measures is in
//! `docs/performance.md`.
//!
//! One binary, three roles: `run` (the orchestrator), `mock` (the mock LLM, in its own
//! process) and `worker` (one measured configuration and workload, in its own process).

mod bare;
mod keel;
mod measure;
mod mock;
mod orchestrate;
mod worker;

use clap::{Parser, Subcommand};

// Heap profiling (feature `dhat-heap`): every allocation goes through dhat, which records
// its site; the worker writes `dhat-heap-*.json` (view it with dhat's viewer).
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[derive(Parser)]
#[command(about = "Keel overhead benchmark (see docs/performance.md)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every configuration and print the table (what ./scripts/bench calls).
    Run(orchestrate::RunArgs),
    /// Serve the mock LLM until stdin closes.
    Mock {
        /// Port on 127.0.0.1 (0 = any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// Measure one configuration and workload; prints one JSON line.
    Worker(worker::WorkerArgs),
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run(args) => orchestrate::run(args),
        Cmd::Mock { port } => {
            runtime().and_then(|rt| rt.block_on(mock::serve(port)).map(|()| true))
        }
        Cmd::Worker(args) => runtime().and_then(|rt| rt.block_on(worker::run(args)).map(|()| true)),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(error) => {
            eprintln!("keel-bench-overhead: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}
