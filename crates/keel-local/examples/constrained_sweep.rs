//! The long grammar-constrained generation sweep: N generations (default 100) against the
//! seeded random tool catalogues of `tests/common/catalogs.rs` (the test suite runs only
//! the first few of the same sequence), reporting validity, tokens and time. Every
//! generation must end on its own with tool calls that validate against their tool's
//! schema; the exit code is 1 when any does not. `scripts/bench-local` runs it.
//!
//! ```text
//! cargo run --release -p keel-local --example constrained_sweep -- [--model SPEC] [--threads N] [--generations N]
//! ```
//! Prints one JSON line: `{"generations": .., "valid_generations": .., "validity": .., ..}`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "../tests/common/catalogs.rs"]
mod catalogs;

use keel_local::{LocalModel, LocalModelOptions};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spec = arg(&args, "--model").unwrap_or_else(|| "smollm2".into());
    let threads: u32 = arg(&args, "--threads").map_or(1, |v| v.parse().expect("--threads N"));
    let generations: usize =
        arg(&args, "--generations").map_or(100, |v| v.parse().expect("--generations N"));

    let path = keel_local::resolve_model(&spec).unwrap_or_else(|e| panic!("{e}"));
    let options = catalogs::sweep_options(
        LocalModelOptions::default()
            .with_threads(threads)
            .with_context_size(2048)
            .with_temperature(0.0),
    );
    let model = LocalModel::load(&path, options).unwrap_or_else(|e| panic!("{e}"));
    let report = catalogs::sweep(&model, generations).await;
    for failure in &report.failures {
        eprintln!("invalid: {failure}");
    }
    println!(
        "{}",
        serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "generations": report.generations,
            "valid_generations": report.valid_generations,
            "validity": report.validity(),
            "calls_validated": report.calls_validated,
            "output_tokens": report.output_tokens,
            "seconds": report.seconds,
            "seconds_per_generation": report.seconds / report.generations.max(1) as f64,
        })
    );
    if !report.failures.is_empty() {
        std::process::exit(1);
    }
}
