//! The local model end to end on SmolLM2-135M-Instruct: a schema-valid calculator call
//! for an arithmetic question, then a final answer once the result is fed back; streaming,
//! structured output, cancellation, not blocking the runtime, and load errors.
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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use keel_core::outcome::ToolResultKind;
use keel_core::{
    Message, Model, ModelRequest, Part, Role, StopReason, StreamEvent, ToolChoice, ToolDefinition,
    ToolOutcome, ToolResult,
};
use keel_local::{LocalModel, LocalModelOptions};
use serde_json::{Value, json};

fn calculator() -> ToolDefinition {
    ToolDefinition {
        name: "calculator".into(),
        description: "Evaluates an arithmetic expression such as `2 * (3 + 4)` and returns \
                      the number."
            .into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The arithmetic expression to evaluate, e.g. 17*23"
                }
            },
            "required": ["expression"],
            "additionalProperties": false
        }),
    }
}

fn validate(schema: &Value, instance: &Value) {
    let validator = jsonschema::validator_for(schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{instance} does not validate against {schema}: {errors:?}"
    );
}

/// The arguments of the response's first tool call, validated against `schema`.
fn first_call_arguments(response: &keel_core::ModelResponse, schema: &Value) -> Value {
    let call = response.message.tool_calls().next().expect("a tool call");
    let arguments = call.parse_arguments().expect("arguments are JSON");
    validate(schema, &arguments);
    arguments
}

/// Multiplies `a*b` style expressions (all the test needs), else evaluates nothing.
fn evaluate(expression: &str) -> Option<i64> {
    let cleaned: String = expression.chars().filter(|c| !c.is_whitespace()).collect();
    let (a, b) = cleaned.split_once(['*', 'x', '×'])?;
    Some(a.parse::<i64>().ok()? * b.parse::<i64>().ok()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calculator_question_makes_a_schema_valid_call_then_answers() {
    let model = common::model(common::options());
    let tools = vec![calculator()];
    let mut messages = vec![Message::user("What is 17*23?")];
    let system = "You are a helpful assistant. Use the calculator tool for arithmetic.";

    let mut request = ModelRequest::new(&messages);
    request.system = Some(system);
    request.tools = &tools;
    request.max_output_tokens = Some(128);
    let (response, _) = common::collect(&model, request).await;

    let calls: Vec<_> = response.message.tool_calls().cloned().collect();
    assert!(
        !calls.is_empty(),
        "expected a calculator call, got {:?}",
        response.message
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let call = &calls[0];
    assert_eq!(call.name, "calculator");
    assert!(call.id.starts_with("call_"), "{}", call.id);
    let args = call.parse_arguments().expect("arguments are JSON");
    validate(&tools[0].input_schema, &args);
    let expression = args["expression"].as_str().unwrap().to_string();
    assert!(
        expression.contains("17") && expression.contains("23"),
        "{expression}"
    );

    // Feed the result back, as the runner does: the run must end with a text answer.
    let value = evaluate(&expression).unwrap_or(391);
    messages.push(response.message.clone());
    messages.push(Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult(std::sync::Arc::new(ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            outcome: ToolOutcome {
                tool: call.name.clone(),
                call_id: call.id.clone(),
                thread_id: "thr_test".into(),
                run_id: "run_test".into(),
                attempts: 1,
                latency_ms: 1,
                repairs: Vec::new(),
                result: ToolResultKind::Ok {
                    data: json!(value),
                    schema_validated: true,
                    truncated: false,
                },
            },
            content: value.to_string(),
        }))],
    });
    let mut request = ModelRequest::new(&messages);
    request.system = Some(system);
    request.tools = &tools;
    request.max_output_tokens = Some(128);
    let (answer, _) = common::collect(&model, request).await;
    eprintln!(
        "call: {} -> {value}; answer: {:?}",
        call.arguments,
        answer.message.text()
    );
    assert_eq!(
        answer.message.tool_calls().count(),
        0,
        "{:?}",
        answer.message
    );
    assert_eq!(
        answer.stop_reason,
        StopReason::EndTurn,
        "{:?}",
        answer.message
    );
    assert!(!answer.message.text().trim().is_empty());
    assert!(answer.usage.input_tokens > 0 && answer.usage.output_tokens > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_text_deltas_that_assemble_to_the_answer() {
    let model = common::model(common::options());
    let messages = vec![Message::user("Name three colors.")];
    let mut request = ModelRequest::new(&messages);
    request.max_output_tokens = Some(40);
    let (response, events) = common::collect(&model, request).await;
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        deltas.len() > 3,
        "expected token-by-token streaming, got {deltas:?}"
    );
    assert_eq!(deltas.concat(), response.message.text());
    assert!(matches!(events.last(), Some(StreamEvent::Stop { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_follows_the_response_schema() {
    let model = common::model(common::options());
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer", "minimum": 0},
            "size": {"enum": ["small", "medium", "large"]}
        },
        "required": ["city", "population", "size"]
    });
    let messages = vec![Message::user("Describe Paris as JSON.")];
    let mut request = ModelRequest::new(&messages);
    request.response_schema = Some(&schema);
    request.max_output_tokens = Some(200);
    let (response, _) = common::collect(&model, request).await;
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    let value: Value = serde_json::from_str(&response.message.text()).expect("answer is JSON");
    validate(&schema, &value);
}

/// A call rule's grounded argument (`ModelRequest::grounded_arguments`) is in the grammar:
/// asked for a note on a release, SmolLM2 writes prose that quotes none of the citations;
/// with them in the request, every note it writes quotes one, as a whole token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grounded_arguments_quote_a_citation() {
    let model = common::model(common::options());
    let tools = vec![ToolDefinition {
        name: "file_note".into(),
        description: "Files notes about a software release.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "notes": {"type": "array", "items": {"type": "string", "maxLength": 80},
                          "minItems": 1, "maxItems": 2}
            },
            "required": ["notes"],
            "additionalProperties": false
        }),
    }];
    let citations: Vec<String> = ["quokka_gateway", "zanzibar", "0.0173"]
        .iter()
        .map(|c| c.to_string())
        .collect();
    let grounded = vec![keel_core::GroundedArgument {
        tool: "file_note".into(),
        pointer: "/notes".into(),
        citations: citations.clone(),
    }];
    let cites =
        regex::Regex::new(&keel_local::grounding::citation_pattern(&citations).unwrap()).unwrap();
    let messages = vec![Message::user(
        "Release v3.2.0 is ready. File a note saying how the release looks.",
    )];
    let choice = ToolChoice::Tool("file_note".into());
    let notes = |response: &keel_core::ModelResponse| -> Vec<String> {
        first_call_arguments(response, &tools[0].input_schema)["notes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    for constrained in [false, true] {
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.tool_choice = &choice;
        request.max_output_tokens = Some(160);
        if constrained {
            request.grounded_arguments = &grounded;
        }
        let (response, _) = common::collect(&model, request).await;
        let notes = notes(&response);
        eprintln!("constrained: {constrained}: {notes:?}");
        assert!(!notes.is_empty());
        for note in &notes {
            assert_eq!(cites.is_match(note), constrained, "{note:?}");
        }
    }
}

/// The citations of a real release (the Detective's v2.1.0 fixture: a few hundred words
/// and figures) stay within the grammar engine's limits: the report's call is written,
/// every finding quotes one of them, and none is refused for citing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grounded_findings_over_a_real_release_fit_the_grammar() {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../agents/detective/fixtures/releases/v2.1.0.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let args = json!({"release_id": "v2.1.0"});
    let past = [
        keel_core::PastCall {
            tool: "get_release_summary",
            arguments: &args,
            result: &fixture["summary"],
        },
        keel_core::PastCall {
            tool: "get_test_details",
            arguments: &args,
            result: &fixture["test_details"],
        },
    ];
    let rule = keel_core::CallRule {
        tool: "file_risk_report".into(),
        after: vec!["get_release_summary".into(), "get_test_details".into()],
        same: vec!["release_id".into()],
        max_successes: Some(1),
        grounded: vec!["/findings".into()],
    };
    let grounded = keel_core::grounded_arguments(std::slice::from_ref(&rule), &past, &[]);
    assert_eq!(grounded.len(), 1, "{grounded:?}");
    eprintln!("{} citations", grounded[0].citations.len());
    let tools = vec![ToolDefinition {
        name: "file_risk_report".into(),
        description: "Files a risk report for a release.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "release_id": {"type": "string"},
                "severity": {"enum": ["high", "medium", "low"]},
                "findings": {"type": "array", "items": {"type": "string"}, "minItems": 1}
            },
            "required": ["release_id", "severity", "findings"],
            "additionalProperties": false
        }),
    }];
    let messages = vec![Message::user(format!(
        "Release v2.1.0: {}\nTests: {}\nFile a risk report for v2.1.0.",
        fixture["summary"], fixture["test_details"]
    ))];
    let choice = ToolChoice::Tool("file_risk_report".into());
    let mut options = common::options();
    options.max_tool_calls = 1;
    let model = common::model(options);
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    request.tool_choice = &choice;
    request.max_output_tokens = Some(600);
    request.grounded_arguments = &grounded;
    let (response, _) = common::collect(&model, request).await;
    assert_eq!(
        response.stop_reason,
        StopReason::ToolUse,
        "{:?}",
        response.message
    );
    let arguments = first_call_arguments(&response, &tools[0].input_schema);
    eprintln!("{arguments}");
    let cites = regex::Regex::new(
        &keel_local::grounding::citation_pattern(&grounded[0].citations).unwrap(),
    )
    .unwrap();
    for finding in arguments["findings"].as_array().unwrap() {
        assert!(cites.is_match(finding.as_str().unwrap()), "{finding}");
    }
    if let Err(refusal) = keel_core::check_call(&[rule], "file_risk_report", &arguments, &past, &[])
    {
        assert!(!refusal.contains("cites nothing"), "{refusal}");
    }
}

#[test]
fn generation_does_not_block_the_async_runtime() {
    // A single-threaded runtime: if generation ran on it, the ticker could not tick.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let model = common::model(common::options().with_max_tokens(48));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let messages = vec![Message::user("Write a short poem about the sea.")];
        let (response, _) = common::collect(&model, ModelRequest::new(&messages)).await;
        ticker.abort();
        assert!(response.usage.output_tokens > 0);
        assert!(
            ticks.load(Ordering::SeqCst) > 0,
            "the runtime was blocked during generation"
        );
    });
}

#[test]
fn capabilities_report_the_real_context_and_grammar_enforcement() {
    let model = common::model(common::options());
    let caps = model.capabilities();
    assert_eq!(caps.context_window, 2048);
    assert!(caps.grammar_constrained_tools && caps.structured_output && caps.tool_calling);
    assert_eq!(model.id(), "local:smollm2");
    assert!(model.has_own_chat_template());
    let tools = vec![calculator()];
    let messages = vec![Message::user("hello")];
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    let prompt = model.render_prompt(&request).unwrap();
    assert!(prompt.contains("<|im_start|>system") && prompt.ends_with("<|im_start|>assistant\n"));
    let tokens = model.estimate_tokens(&request);
    assert!(tokens > 50 && tokens < 1000, "{tokens}");
}

#[test]
fn tool_choice_naming_a_missing_tool_is_an_invalid_request() {
    let model = common::model(common::options());
    let tools = vec![calculator()];
    let messages = vec![Message::user("hi")];
    let choice = ToolChoice::Tool("nope".into());
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    request.tool_choice = &choice;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let error = runtime
        .block_on(keel_core::model::complete(&model, request))
        .unwrap_err();
    assert_eq!(error.kind, keel_core::ModelErrorKind::InvalidRequest);
    assert!(error.message.contains("nope"), "{}", error.message);
}

#[test]
fn load_errors_name_the_path_and_the_fix() {
    let error =
        LocalModel::load("/nonexistent/model.gguf", LocalModelOptions::default()).unwrap_err();
    assert_eq!(error.kind, keel_core::ModelErrorKind::NotFound);
    assert!(
        error.message.contains("/nonexistent/model.gguf"),
        "{}",
        error.message
    );
    assert!(error.message.contains("fetch-model"), "{}", error.message);

    let dir = std::env::temp_dir().join(format!("keel-local-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("bogus.gguf");
    std::fs::write(&bogus, b"this is not a gguf file").unwrap();
    let error = LocalModel::load(&bogus, LocalModelOptions::default()).unwrap_err();
    assert!(error.message.contains("bogus.gguf"), "{}", error.message);
    assert!(
        error.message.contains("not a GGUF file"),
        "{}",
        error.message
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
