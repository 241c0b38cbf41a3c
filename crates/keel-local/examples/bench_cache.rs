//! Prompt-cache benchmark of keel-local: a conversation of `--turns` user turns (default
//! 10) under one system prompt, run once with the prompt (KV) cache on and once with it
//! off (`cache_slots = 0`), replaying the same messages; reports, per turn, the prompt
//! tokens, the tokens served from the cache and the time to first token of both runs
//! ([`keel_local::GenerationStats::time_to_first_token`]). `scripts/bench-local` prints it
//! as a table.
//!
//! ```text
//! cargo run --release -p keel-local --example bench_cache -- [--model PATH] [--threads N] [--turns N] [--answer-tokens N]
//! ```
//! Prints one JSON line: `{"turns": [{"turn": 1, "prompt_tokens": .., "cached_tokens": ..,
//! "ttft_ms_cache": .., "ttft_ms_no_cache": ..}, ..], ..}`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use futures::StreamExt;
use keel_core::model::ResponseAssembler;
use keel_core::{Message, Model, ModelRequest};
use keel_local::{GenerationStats, LocalModel, LocalModelOptions};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

const SYSTEM: &str = "You are the keeper's assistant at the Skerry Point lighthouse. You \
    answer questions about the lighthouse, its history and its daily routine in one or two \
    short sentences. The lighthouse was built in 1874 of granite from the nearby quarry; \
    the tower is 32 metres tall and has 148 steps. The lamp was converted from oil to \
    electricity in 1931 and automated in 1987, when the last resident keeper, Agnes Moir, \
    retired. The light flashes white twice every fifteen seconds and is visible for 22 \
    nautical miles. A fog signal sounds once every thirty seconds in poor visibility. \
    Visitors may climb the tower from April to October, between ten in the morning and \
    four in the afternoon, except in high winds. The keeper's cottage is now a small \
    museum with the original Fresnel lens, the logbooks from 1874 to 1987, and a \
    collection of ship models donated by local families.";

const QUESTIONS: [&str; 12] = [
    "When was the lighthouse built?",
    "How tall is the tower?",
    "How many steps are there?",
    "When was the lamp electrified?",
    "Who was the last keeper?",
    "How often does the light flash?",
    "How far can the light be seen?",
    "When can visitors climb the tower?",
    "What is in the cottage museum?",
    "What does the fog signal do?",
    "What was the tower built from?",
    "When was the light automated?",
];

/// Runs one turn; returns the answer and the generation's figures.
async fn turn(
    model: &LocalModel,
    system: Option<&str>,
    messages: &[Message],
    tokens: u32,
) -> (Message, GenerationStats) {
    let mut request = ModelRequest::new(messages);
    request.system = system;
    request.max_output_tokens = Some(tokens);
    let mut stream = model.stream(request);
    let mut assembler = ResponseAssembler::new();
    while let Some(event) = stream.next().await {
        assembler.push(&event.expect("generation failed"));
    }
    let stats = model.last_generation().expect("generation stats");
    (assembler.finish().message, stats)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spec = arg(&args, "--model").unwrap_or_else(|| "smollm2".into());
    let threads: u32 = arg(&args, "--threads").map_or(2, |v| v.parse().expect("--threads N"));
    let turns: usize = arg(&args, "--turns").map_or(10, |v| v.parse().expect("--turns N"));
    let answer: u32 = arg(&args, "--answer-tokens").map_or(24, |v| v.parse().expect("N"));
    let path = keel_local::resolve_model(&spec).unwrap_or_else(|e| panic!("{e}"));
    let base = LocalModelOptions::default()
        .with_threads(threads)
        .with_context_size(4096);

    // With the cache: the conversation as the model answers it.
    let cached = LocalModel::load(&path, base.clone()).unwrap_or_else(|e| panic!("{e}"));
    let warm = vec![Message::user("Hello.")];
    // Loads the weights into memory; not counted, and shares no prefix with the turns.
    let _ = turn(&cached, None, &warm, 4).await;
    let mut messages = Vec::new();
    let mut with_cache = Vec::new();
    let mut prompts = Vec::new();
    for i in 0..turns {
        let question = QUESTIONS[i % QUESTIONS.len()];
        messages.push(Message::user(question));
        prompts.push(messages.clone());
        let (answer, stats) = turn(&cached, Some(SYSTEM), &messages, answer).await;
        messages.push(answer);
        with_cache.push(stats);
    }
    drop(cached);

    // Without: the same prompts, each evaluated whole.
    let uncached =
        LocalModel::load(&path, base.with_cache_slots(0)).unwrap_or_else(|e| panic!("{e}"));
    let _ = turn(&uncached, None, &warm, 4).await;
    let mut without_cache = Vec::new();
    for prompt in &prompts {
        let (_, stats) = turn(&uncached, Some(SYSTEM), prompt, answer).await;
        without_cache.push(stats);
    }

    let rows: Vec<serde_json::Value> = with_cache
        .iter()
        .zip(&without_cache)
        .enumerate()
        .map(|(i, (on, off))| {
            serde_json::json!({
                "turn": i + 1,
                "prompt_tokens": on.prompt_tokens,
                "cached_tokens": on.cached_tokens,
                "ttft_ms_cache": on.time_to_first_token.as_secs_f64() * 1000.0,
                "ttft_ms_no_cache": off.time_to_first_token.as_secs_f64() * 1000.0,
            })
        })
        .collect();
    let first = with_cache
        .first()
        .map_or(0.0, |s| s.time_to_first_token.as_secs_f64());
    let last = with_cache
        .last()
        .map_or(0.0, |s| s.time_to_first_token.as_secs_f64());
    println!(
        "{}",
        serde_json::json!({
            "model": path.display().to_string(),
            "threads": threads,
            "turns": rows,
            "last_over_first_with_cache": if first > 0.0 { last / first } else { 0.0 },
        })
    );
}
