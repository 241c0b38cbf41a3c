//! Request bodies, captured by the mock server as they went over the wire, snapshot-tested
//! per provider: system prompt placement, tool schema format, tool calls and results
//! (including the error flag), tool_choice, sampling parameters.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use common::*;
use keel_core::model::complete;
use keel_core::{Message, ModelRequest, Part, ToolChoice};
use keel_testkit::mock_llm::MockTurn;
use serde_json::{Value, json};

async fn captured_body(
    provider: &str,
    model: &str,
    messages: &[Message],
    choice: &ToolChoice,
    sampling: bool,
) -> Value {
    let h = harness(provider, model, vec![MockTurn::text("ok")]).await;
    let tools = [calculator(), clock_tool()];
    let mut request = ModelRequest::new(messages);
    request.system = Some("You are a careful calculator assistant.");
    request.tools = &tools;
    request.tool_choice = choice;
    request.max_output_tokens = Some(1024);
    if sampling {
        request.temperature = Some(0.25);
        request.top_p = Some(0.5);
    }
    complete(h.model.as_ref(), request)
        .await
        .expect("completes");
    let requests = h.server.requests();
    assert_eq!(requests.len(), 1);
    canonical(requests[0].body.clone())
}

/// Sorts object keys, so snapshots do not depend on whether some crate in the build enables
/// serde_json's `preserve_order` feature (feature unification differs between
/// `cargo test -p keel-providers` and a whole-workspace run).
fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: std::collections::BTreeMap<String, Value> =
                map.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

async fn snapshot(provider: &str, model: &str) {
    let body = captured_body(provider, model, &conversation(), &FORCE_CALCULATOR, true).await;
    insta::assert_json_snapshot!(format!("{}_conversation", provider.replace('-', "_")), body);
    let auto = captured_body(provider, model, &user("hi"), &ToolChoice::Auto, false).await;
    insta::assert_json_snapshot!(
        format!("{}_auto_no_sampling", provider.replace('-', "_")),
        auto
    );
}

#[tokio::test]
async fn anthropic_request_body() {
    snapshot("anthropic", "claude-sonnet-4-5").await;
    let body = captured_body(
        "anthropic",
        "claude-sonnet-4-5",
        &conversation(),
        &ToolChoice::Auto,
        false,
    )
    .await;
    // System prompt is top-level; tool results sit in one user message, errors flagged.
    assert_eq!(body["system"], "You are a careful calculator assistant.");
    let results = &body["messages"][2]["content"];
    assert_eq!(results[0]["type"], "tool_result");
    assert!(results[0].get("is_error").is_none());
    assert_eq!(results[1]["is_error"], true);
}

#[tokio::test]
async fn openai_request_body() {
    snapshot("openai", "gpt-4o-mini").await;
}

#[tokio::test]
async fn openai_responses_request_body() {
    snapshot("openai-responses", "gpt-4o-mini").await;
}

#[tokio::test]
async fn openrouter_request_body() {
    snapshot("openrouter", "openai/gpt-4o-mini").await;
}

#[tokio::test]
async fn ollama_request_body() {
    snapshot("ollama", "llama3.1").await;
}

#[tokio::test]
async fn tool_choice_variants() {
    let cases = [
        ("anthropic", "claude-sonnet-4-5", "/tool_choice"),
        ("openai", "gpt-4o-mini", "/tool_choice"),
        ("openai-responses", "gpt-4o-mini", "/tool_choice"),
        ("openrouter", "openai/gpt-4o-mini", "/tool_choice"),
    ];
    let mut seen = serde_json::Map::new();
    for (provider, model, pointer) in cases {
        let mut row = Vec::new();
        for choice in [
            ToolChoice::Auto,
            ToolChoice::None,
            ToolChoice::Required,
            ToolChoice::Tool("clock".into()),
        ] {
            let body = captured_body(provider, model, &user("hi"), &choice, false).await;
            row.push(body.pointer(pointer).cloned().unwrap_or(Value::Null));
        }
        seen.insert(provider.to_owned(), Value::Array(row));
    }
    insta::assert_json_snapshot!(
        "tool_choice_variants",
        canonical(serde_json::to_value(&seen).unwrap())
    );
    // Ollama has no tool_choice: None sends no tools, Tool(name) sends only that tool.
    let none = captured_body("ollama", "llama3.1", &user("hi"), &ToolChoice::None, false).await;
    assert!(none.get("tools").is_none());
    let one = captured_body(
        "ollama",
        "llama3.1",
        &user("hi"),
        &ToolChoice::Tool("clock".into()),
        false,
    )
    .await;
    assert_eq!(one["tools"].as_array().unwrap().len(), 1);
    assert_eq!(one["tools"][0]["function"]["name"], "clock");
}

#[tokio::test]
async fn reasoning_items_are_echoed_back() {
    // Responses: a reasoning item comes back as a provider item and is sent on the next turn.
    let mut turn = MockTurn::tool_call("calculator", json!({"expression": "1"}));
    turn.reasoning = Some("think first".into());
    for (provider, model) in [
        ("openai-responses", "o4-mini"),
        ("anthropic", "claude-sonnet-4-5"),
    ] {
        let h = harness(provider, model, vec![turn.clone(), MockTurn::text("done")]).await;
        let messages = user("hi");
        let first = complete(h.model.as_ref(), ModelRequest::new(&messages))
            .await
            .unwrap();
        let item = first
            .message
            .parts
            .iter()
            .find_map(|p| match p {
                Part::ProviderItem {
                    provider: who,
                    item,
                } if who == provider => Some(item.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{provider}: reasoning kept as a provider item: {first:?}"));
        let conversation = vec![Message::user("hi"), first.message.clone()];
        complete(h.model.as_ref(), ModelRequest::new(&conversation))
            .await
            .unwrap();
        let second = h.server.requests()[1].body.to_string();
        assert!(
            second.contains(&item.to_string()),
            "{provider}: {item} not echoed in {second}"
        );
        if provider == "openai-responses" {
            assert!(second.contains("mock-encrypted-1"));
            assert_eq!(
                h.server.requests()[0].body["include"],
                json!(["reasoning.encrypted_content"])
            );
        } else {
            assert!(second.contains("mock-signature-1"));
        }
    }
}
