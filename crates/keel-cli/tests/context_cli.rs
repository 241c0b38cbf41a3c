//! The context budget fits small windows: `keel run --context-window 2000` on a hosted
//! model spec whose default output limit (32k tokens) is larger than the window finishes a
//! long tool-using conversation `done`, and every request the provider received — counted
//! with the model's real tokenizer over the whole JSON body, plus the output limit sent —
//! fits the window. A window too small for the agent's fixed part fails before any model
//! call, with the numbers and the fixes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::process::{Command, Output};

use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn, WhenExhausted};
use serde_json::{Value, json};

const TOOL_TURNS: usize = 14;
const WINDOW: u64 = 2000;

fn script() -> MockScript {
    let mut turns: Vec<MockTurn> = (0..TOOL_TURNS)
        .map(|n| {
            let mut turn = MockTurn::text(format!(
                "Step {n}: I computed the previous partial sum and now add the next term of the \
                 series, checking the intermediate result carefully before going on with the \
                 remaining terms of this long calculation."
            ))
            .with_tool_call("calculator", json!({"expression": format!("{n}*{n}+1")}));
            turn.tool_calls[0].id = Some(format!("call_{n}"));
            turn
        })
        .collect();
    turns.push(MockTurn::text("The sum is 1016."));
    // One conversation at a time: turns in sequence (compaction drops old answers, so the
    // conversation's own count of answers would go back).
    MockScript::new(turns).when_exhausted(WhenExhausted::Error)
}

/// `keel run` on `openai:gpt-4.1` at the mock, with the calculator and this window, on a
/// memory store, printing JSON.
async fn run_with_window(server: &MockLlmServer, window: &str, message: &str) -> Output {
    let args: Vec<String> = [
        "run",
        "--model",
        "openai:gpt-4.1",
        "--base-url",
        &server.base_url(),
        "--tool",
        "calculator",
        "--context-window",
        window,
        "--max-turns",
        "30",
        "--store",
        "memory:",
        "--output",
        "json",
        message,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(&args)
            .env("KEEL_TEST_MODE", "1")
            .env("OPENAI_API_KEY", "test-key")
            .env_remove("KEEL_STORE")
            .env_remove("KEEL_CONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2000_token_window_keeps_every_request_of_a_long_run_within_it() {
    let server = MockLlmServer::start(script()).await.unwrap();
    let out = run_with_window(
        &server,
        "2000",
        "Add up n*n+1 for n from 0 to 13, one calculator call per term.",
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr: {stderr}"));
    assert_eq!(json["end_state"], "done", "{json}\n{stderr}");
    assert_eq!(json["final_text"], "The sum is 1016.");
    let requests = server.requests();
    assert_eq!(requests.len(), TOOL_TURNS + 1, "one request per turn");
    let bpe = keel_providers::tokens::openai_tokenizer("gpt-4.1").unwrap();
    let mut largest = 0;
    for request in &requests {
        let body = &request.body;
        let input = bpe.encode_ordinary(&body.to_string()).len() as u64;
        let output = body["max_completion_tokens"]
            .as_u64()
            .expect("the capped output limit is sent with the request");
        assert!(
            input + output <= WINDOW,
            "request #{} takes {input} input + {output} output tokens > {WINDOW}",
            request.seq
        );
        largest = largest.max(input + output);
    }
    // The history really had to be compacted: the full conversation would not fit.
    let last = requests.last().unwrap();
    let kept = last.body["messages"].as_array().unwrap().len();
    assert!(
        kept < 2 * TOOL_TURNS,
        "the last request still holds {kept} messages: nothing was compacted"
    );
    eprintln!("largest request: {largest} of {WINDOW} tokens");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_too_small_for_the_agent_fails_before_any_model_call() {
    let server = MockLlmServer::start(script()).await.unwrap();
    let out = run_with_window(&server, "300", "hello").await;
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["end_state"], "failed", "{json}");
    assert!(
        json.to_string().contains("too small for this agent"),
        "the reason names the problem: {json}"
    );
    assert!(json.to_string().contains("--context-window"), "{json}");
    assert_eq!(server.requests().len(), 0, "no model call was made");
    server.shutdown().await;
}
