//! Speed benchmark of keel-local through the public `Model` API.
//!
//! `--mode decode` (default) generates a fixed number of tokens (end-of-turn ignored) and
//! reports tokens per second of the decode phase (from the first token to the last, so
//! prompt processing is excluded), the way `llama-bench -p 0 -n N` reports `tg N`.
//!
//! `--mode prompt` evaluates a prompt of about `--tokens` tokens (a repeated sentence in
//! one user turn) with the prompt cache off, so every run evaluates all of it, and reports
//! evaluated tokens per second of the prompt phase (the engine's own timing,
//! [`keel_local::GenerationStats::prompt_time`]), the way `llama-bench -p N -n 0` reports
//! `pp N`.
//!
//! `scripts/bench-local` runs it next to a llama.cpp baseline on the same file and thread
//! count.
//!
//! ```text
//! cargo run --release -p keel-local --example bench_decode -- [--mode decode|prompt] [--model PATH] [--threads N] [--tokens N] [--runs N]
//! ```
//! Prints one JSON line: `{"tokens_per_second": .., "runs": [..], ..}`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Instant;

use futures::StreamExt;
use keel_core::{Message, Model, ModelRequest, StreamEvent};
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
    let threads: u32 = arg(&args, "--threads").map_or(2, |v| v.parse().expect("--threads N"));
    let tokens: u32 = arg(&args, "--tokens").map_or(128, |v| v.parse().expect("--tokens N"));
    let runs: u32 = arg(&args, "--runs").map_or(3, |v| v.parse().expect("--runs N"));
    let mode = arg(&args, "--mode").unwrap_or_else(|| "decode".into());
    if mode == "prompt" {
        return prompt_speed(&spec, threads, tokens, runs).await;
    }

    let path = keel_local::resolve_model(&spec).unwrap_or_else(|e| panic!("{e}"));
    let mut options = LocalModelOptions::default()
        .with_threads(threads)
        .with_context_size(1024)
        .with_max_tokens(tokens);
    options.ignore_eos = true;
    let model = LocalModel::load(&path, options).unwrap_or_else(|e| panic!("{e}"));
    let messages = vec![Message::user(
        "Write a long story about a lighthouse keeper.",
    )];

    let mut rates = Vec::new();
    for run in 0..=runs {
        let mut stream = model.stream(ModelRequest::new(&messages));
        let mut first: Option<Instant> = None;
        let mut generated = 0u64;
        while let Some(event) = stream.next().await {
            match event.expect("generation failed") {
                StreamEvent::TextDelta(_) if first.is_none() => first = Some(Instant::now()),
                StreamEvent::Usage(usage) => generated = usage.output_tokens,
                _ => {}
            }
        }
        let elapsed = first.expect("no token generated").elapsed().as_secs_f64();
        // The first token's time is prompt processing; the rest is pure decode.
        let rate = (generated.saturating_sub(1)) as f64 / elapsed;
        if run > 0 {
            rates.push(rate); // run 0 warms up caches and is not counted
        }
    }
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    println!(
        "{}",
        serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "tokens": tokens,
            "runs": rates,
            "tokens_per_second": mean,
        })
    );
}

/// `--mode prompt`: prompt evaluation speed with the cache off.
async fn prompt_speed(spec: &str, threads: u32, tokens: u32, runs: u32) {
    let path = keel_local::resolve_model(spec).unwrap_or_else(|e| panic!("{e}"));
    let options = LocalModelOptions::default()
        .with_threads(threads)
        .with_context_size(tokens.saturating_mul(2).max(1024))
        .with_max_tokens(1)
        .with_cache_slots(0);
    let model = LocalModel::load(&path, options).unwrap_or_else(|e| panic!("{e}"));
    // A user turn of about `tokens` tokens (the chat template adds a few).
    let sentence = "The keeper climbed the stairs of the lighthouse and lit the lamp. ";
    let mut text = String::new();
    loop {
        let messages = vec![Message::user(text.clone())];
        if model.estimate_tokens(&ModelRequest::new(&messages)) >= u64::from(tokens) {
            break;
        }
        text.push_str(sentence);
    }
    let messages = vec![Message::user(text)];
    let mut rates = Vec::new();
    let mut evaluated = 0;
    for run in 0..=runs {
        let mut stream = model.stream(ModelRequest::new(&messages));
        while let Some(event) = stream.next().await {
            event.expect("generation failed");
        }
        let stats = model.last_generation().expect("generation stats");
        assert_eq!(stats.cached_tokens, 0, "the prompt cache is off");
        evaluated = stats.evaluated_tokens;
        if run > 0 {
            rates.push(stats.prompt_tokens_per_second());
        }
    }
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    println!(
        "{}",
        serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "prompt_tokens": evaluated,
            "runs": rates,
            "tokens_per_second": mean,
        })
    );
}
