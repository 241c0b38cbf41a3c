//! The prompt (KV) cache on SmolLM2-135M-Instruct: a thread's next turn evaluates only
//! its new tokens and answers exactly as a cold evaluation does (greedy decoding);
//! interleaved threads keep their own slots; a cancelled generation leaves a slot the next
//! request reuses correctly. Tokens are counted with the engine's counter and the
//! responses' `cache_read_tokens`, never with timings.
//!
//! Needs the model file: run `./scripts/fetch-model` first (the tests fail otherwise).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use keel_core::{Message, Model, ModelRequest, ModelResponse, StreamEvent};
use keel_local::LocalModel;

/// Runs a request and returns the response with the prompt tokens it evaluated (by the
/// engine's counter).
async fn run(
    model: &LocalModel,
    system: &str,
    messages: &[Message],
    max_tokens: u32,
) -> (ModelResponse, u64) {
    let before = model.evaluated_prompt_tokens();
    let mut request = ModelRequest::new(messages);
    request.system = Some(system);
    request.max_output_tokens = Some(max_tokens);
    let (response, _) = common::collect(model, request).await;
    (response, model.evaluated_prompt_tokens() - before)
}

fn text(response: &ModelResponse) -> String {
    response.message.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_turn_evaluates_only_new_tokens_and_matches_a_cold_run() {
    let model = common::model(common::options());
    let system = "You are a geography tutor. Answer in one short sentence.";
    let mut messages = vec![Message::user("What is the capital of France?")];
    let (first, evaluated_first) = run(&model, system, &messages, 12).await;
    assert_eq!(
        evaluated_first,
        first.usage.input_tokens - first.usage.cache_read_tokens
    );

    messages.push(first.message.clone());
    messages.push(Message::user("And the capital of Italy?"));
    let (second, evaluated_second) = run(&model, system, &messages, 12).await;
    let usage = second.usage;
    // The whole first prompt (at least) came from the cache; only the rest was evaluated.
    assert!(
        usage.cache_read_tokens >= first.usage.input_tokens,
        "{usage:?} after a first prompt of {} tokens",
        first.usage.input_tokens
    );
    assert_eq!(
        evaluated_second,
        usage.input_tokens - usage.cache_read_tokens
    );
    assert!(evaluated_second < usage.input_tokens - first.usage.input_tokens + 1);
    let stats = model
        .last_generation()
        .expect("stats of the last generation");
    assert_eq!(u64::from(stats.cached_tokens), usage.cache_read_tokens);
    assert_eq!(u64::from(stats.evaluated_tokens), evaluated_second);

    // The same request with the cache off evaluates everything and answers the same.
    let cold_model = common::model(common::options().with_cache_slots(0));
    let (cold, evaluated_cold) = run(&cold_model, system, &messages, 12).await;
    assert_eq!(cold.usage.cache_read_tokens, 0);
    assert_eq!(evaluated_cold, cold.usage.input_tokens);
    assert_eq!(cold.usage.input_tokens, usage.input_tokens);
    assert_eq!(text(&cold), text(&second));
    assert_eq!(cold.usage.output_tokens, usage.output_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_and_concurrent_threads_keep_their_prefixes() {
    let model = common::model(common::options());
    let system_a = "You are a poet. Answer in one short line.";
    let system_b = "You are a chemist. Answer in one short line.";
    let mut thread_a = vec![Message::user("Describe the sea.")];
    let mut thread_b = vec![Message::user("What is water made of?")];
    let (a1, _) = run(&model, system_a, &thread_a, 8).await;
    let (b1, _) = run(&model, system_b, &thread_b, 8).await;
    thread_a.push(a1.message.clone());
    thread_a.push(Message::user("And the sky?"));
    thread_b.push(b1.message.clone());
    thread_b.push(Message::user("And salt?"));

    // Both second turns at once: they queue on the model's thread, each in its own slot.
    let before = model.evaluated_prompt_tokens();
    let (a2, b2) = tokio::join!(
        run(&model, system_a, &thread_a, 8),
        run(&model, system_b, &thread_b, 8)
    );
    assert!(
        a2.0.usage.cache_read_tokens >= a1.usage.input_tokens,
        "{:?}",
        a2.0.usage
    );
    assert!(
        b2.0.usage.cache_read_tokens >= b1.usage.input_tokens,
        "{:?}",
        b2.0.usage
    );
    assert_eq!(
        model.evaluated_prompt_tokens() - before,
        a2.0.usage.input_tokens - a2.0.usage.cache_read_tokens + b2.0.usage.input_tokens
            - b2.0.usage.cache_read_tokens
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_generation_leaves_a_consistent_cache() {
    let mut options = common::options().with_max_tokens(4000);
    options.ignore_eos = true;
    let model = common::model(options);
    let system = "You are a storyteller.";
    let messages = vec![Message::user(
        "Tell me a very long story about a lighthouse.",
    )];
    let mut request = ModelRequest::new(&messages);
    request.system = Some(system);
    let mut stream = model.stream(request);
    // Let it generate a few tokens (each one is evaluated into the slot), then cancel.
    let mut deltas = 0;
    while deltas < 5 {
        match stream.next().await.expect("an event").expect("no error") {
            StreamEvent::TextDelta(_) => deltas += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(30);
    while model.active_generations() > 0 {
        assert!(Instant::now() < deadline, "the generation did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same prompt again reuses the slot and answers exactly as a cold model does.
    let warm = common::model(common::options());
    let (again, evaluated) = run(&warm, system, &messages, 10).await;
    assert!(again.usage.cache_read_tokens > 0, "{:?}", again.usage);
    assert_eq!(
        evaluated, 1,
        "only the prompt's last token is evaluated again"
    );
    let cold_model = common::model(common::options().with_cache_slots(0));
    let (cold, _) = run(&cold_model, system, &messages, 10).await;
    assert_eq!(text(&cold), text(&again));
}
