//! 100 grammar-constrained generations against random tool catalogues (2–6 tools each;
//! schemas with enums, nested objects, arrays, bounded integers, unbounded numbers and
//! strings), made with a seeded RNG so failures reproduce. Every generation must end on
//! its own (not at the token cap) with tool calls that parse and validate against the
//! schema of the tool each call names.
//!
//! Needs the model file: run `./scripts/fetch-model` first (the test fails otherwise).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::time::Instant;

use keel_core::{Message, ModelRequest, StopReason, ToolChoice, ToolDefinition};
use keel_local::LocalModelOptions;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

/// How many generations (override with `KEEL_LOCAL_GENERATIONS` when debugging).
const GENERATIONS: usize = 100;
const TOKEN_CAP: u32 = 320;

const VERBS: &[&str] = &[
    "get", "set", "find", "create", "delete", "list", "update", "send",
];
const NOUNS: &[&str] = &[
    "weather", "user", "order", "invoice", "ticket", "flight", "recipe", "song", "file", "meeting",
    "stock", "route",
];
const FIELDS: &[&str] = &[
    "name", "city", "count", "limit", "query", "email", "priority", "tags", "date", "amount",
    "unit", "owner", "status", "title", "level", "items", "address", "notes",
];
const WORDS: &[&str] = &[
    "low", "high", "red", "green", "open", "closed", "metric", "imperial", "asc", "desc",
];

fn leaf(rng: &mut StdRng) -> Value {
    match rng.random_range(0..7) {
        0 => json!({"type": "string", "description": "free text"}),
        1 => json!({"type": "string", "maxLength": rng.random_range(3..30)}),
        2 => {
            let mut words: Vec<&str> = WORDS.to_vec();
            words.shuffle(rng);
            json!({"type": "string", "enum": words[..rng.random_range(2..5)]})
        }
        3 => {
            let min = rng.random_range(-100..50);
            json!({"type": "integer", "minimum": min, "maximum": min + rng.random_range(1..1000)})
        }
        4 => json!({"type": "integer"}),
        5 => json!({"type": "number"}),
        _ => json!({"type": "boolean"}),
    }
}

fn value_schema(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..10) {
        0 | 1 if depth < 2 => object_schema(rng, depth + 1, 1, 3),
        2 | 3 => {
            let mut schema = json!({"type": "array", "items": leaf(rng)});
            if rng.random_bool(0.5) {
                schema["maxItems"] = json!(rng.random_range(1..5));
            }
            if rng.random_bool(0.3) {
                schema["minItems"] = json!(1);
            }
            schema
        }
        _ => leaf(rng),
    }
}

fn object_schema(rng: &mut StdRng, depth: u32, min: usize, max: usize) -> Value {
    let mut fields: Vec<&str> = FIELDS.to_vec();
    fields.shuffle(rng);
    let n = rng.random_range(min..=max);
    let mut properties = Map::new();
    let mut required = Vec::new();
    for field in &fields[..n] {
        properties.insert((*field).to_string(), value_schema(rng, depth));
        if rng.random_bool(0.6) {
            required.push(json!(field));
        }
    }
    let mut schema = json!({"type": "object", "properties": properties, "required": required});
    if rng.random_bool(0.5) {
        schema["additionalProperties"] = json!(false);
    }
    schema
}

fn catalogue(rng: &mut StdRng) -> Vec<ToolDefinition> {
    let n = rng.random_range(2..=6);
    let mut names = Vec::new();
    while names.len() < n {
        let name = format!(
            "{}_{}",
            VERBS.choose(rng).unwrap(),
            NOUNS.choose(rng).unwrap()
        );
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
        .into_iter()
        .map(|name| ToolDefinition {
            description: format!("Does {} for the user.", name.replace('_', " ")),
            input_schema: object_schema(rng, 0, 1, 4),
            name,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_random_catalogues_all_calls_validate_and_terminate() {
    let options = LocalModelOptions {
        max_string_length: 48,
        max_array_items: 4,
        max_tool_calls: 2,
        ..common::options()
    };
    let model = common::model(options);
    let mut rng = StdRng::seed_from_u64(0x6b65656c);
    let started = Instant::now();
    let mut calls_checked = 0usize;
    let mut output_tokens = 0u64;
    let generations = std::env::var("KEEL_LOCAL_GENERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(GENERATIONS);
    for i in 0..generations {
        let tools = catalogue(&mut rng);
        let target = tools.choose(&mut rng).unwrap().name.clone();
        // Alternate: force the named tool, or require some tool and let the model pick.
        let choice = if i % 2 == 0 {
            ToolChoice::Tool(target.clone())
        } else {
            ToolChoice::Required
        };
        let messages = vec![Message::user(format!(
            "Please use {target} with sensible example values."
        ))];
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.tool_choice = &choice;
        request.max_output_tokens = Some(TOKEN_CAP);
        let (response, _) = common::collect(&model, request).await;
        output_tokens += response.usage.output_tokens;
        assert_ne!(
            response.stop_reason,
            StopReason::MaxTokens,
            "generation {i} hit the {TOKEN_CAP}-token cap: {:?}",
            response.message
        );
        assert!(response.usage.output_tokens <= u64::from(TOKEN_CAP));
        let calls: Vec<_> = response.message.tool_calls().cloned().collect();
        assert!(
            !calls.is_empty(),
            "generation {i} made no call: {:?}",
            response.message
        );
        for call in &calls {
            let tool = tools
                .iter()
                .find(|t| t.name == call.name)
                .unwrap_or_else(|| panic!("generation {i} called unknown tool {}", call.name));
            if let ToolChoice::Tool(name) = &choice {
                assert_eq!(&call.name, name, "generation {i} ignored tool_choice");
            }
            let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| {
                panic!(
                    "generation {i}: arguments {} are not JSON: {e}",
                    call.arguments
                )
            });
            let validator = jsonschema::validator_for(&tool.input_schema).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&args)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "generation {i}: {} does not validate against {}: {errors:?}",
                call.arguments,
                tool.input_schema
            );
            calls_checked += 1;
        }
        if (i + 1) % 10 == 0 {
            eprintln!(
                "{} generations, {calls_checked} calls valid, {output_tokens} tokens, {:.1} s",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!(
        "{generations} constrained generations, {calls_checked} calls validated, \
         {output_tokens} tokens, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
