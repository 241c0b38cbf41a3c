//! `keel run --model PROVIDER:MODEL --base-url …` against `keel mock-llm`, for every
//! provider: the real binary, the real wire protocols over loopback, a tool-using
//! conversation that ends `done`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::process::Command;

use common::{MockLlm, workspace_root};
use serde_json::Value;

fn start_mock() -> MockLlm {
    MockLlm::start(&workspace_root(), "examples/mock/calculator.json")
}

#[test]
fn every_provider_completes_a_tool_using_conversation_against_the_mock() {
    let mock = start_mock();
    for model in [
        "anthropic:claude-sonnet-4-5",
        "openai:gpt-4o-mini",
        "openai-responses:gpt-4o-mini",
        "openrouter:openai/gpt-4o-mini",
        "ollama:llama3.1",
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args([
                "run",
                "--model",
                model,
                "--base-url",
                &mock.base_url,
                "--tool",
                "calculator",
                "--store",
                "memory:",
                "--output",
                "json",
                "what is 2*(3+4)?",
            ])
            .current_dir(workspace_root())
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("OPENAI_API_KEY", "test-key")
            .env("OPENROUTER_API_KEY", "test-key")
            .env("KEEL_TEST_MODE", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let json: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "{model}: stdout is not JSON ({e}): {stdout}\nstderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        assert_eq!(json["end_state"], "done", "{model}: {json}");
        assert_eq!(output.status.code(), Some(0), "{model}");
        assert_eq!(json["tool_calls"][0]["name"], "calculator", "{model}");
        assert_eq!(json["tool_calls"][0]["ok"], true, "{model}");
        assert_eq!(json["final_text"], "2*(3+4) = 14", "{model}");
        assert_eq!(
            json["usage"]["input_tokens"], 280,
            "{model}: usage is mapped"
        );
        assert_eq!(json["usage"]["output_tokens"], 29, "{model}");
    }
}

#[test]
fn a_missing_api_key_fails_fast_naming_the_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "run",
            "--model",
            "anthropic:claude-sonnet-4-5",
            "--store",
            "memory:",
            "hi",
        ])
        .current_dir(workspace_root())
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("ANTHROPIC_API_KEY"));
}
