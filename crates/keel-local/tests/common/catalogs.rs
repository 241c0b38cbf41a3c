//! Seeded random tool catalogues (2–6 tools each; schemas with enums, nested objects,
//! arrays, bounded integers, unbounded numbers and strings) and the check that one
//! grammar-constrained generation against them is valid: it ends on its own (not at the
//! token cap) with tool calls that parse and validate against the schema of the tool each
//! call names.
//!
//! Shared by `tests/random_catalogs.rs` (a short run, part of the test suite) and
//! `examples/constrained_sweep.rs` (the long sweep `scripts/bench-local` runs), so both
//! check exactly the same thing on the same sequence of catalogues.

#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Instant;

use keel_core::{Message, ModelRequest, ModelResponse, StopReason, ToolChoice, ToolDefinition};
use keel_local::{LocalModel, LocalModelOptions};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

/// The seed of the catalogue sequence (generation `i` is the same in the test and the sweep).
pub const SEED: u64 = 0x6b65656c;
/// Output cap of one generation; reaching it is a failure.
pub const TOKEN_CAP: u32 = 320;

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

/// The model options of the sweep: `base` with grammar caps small enough for a 135M model.
pub fn sweep_options(base: LocalModelOptions) -> LocalModelOptions {
    LocalModelOptions {
        max_string_length: 48,
        max_array_items: 4,
        max_tool_calls: 2,
        ..base
    }
}

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

/// One generation to make: a catalogue, the tool choice and the user's message.
pub struct Case {
    /// Which generation of the sequence this is.
    pub index: usize,
    pub tools: Vec<ToolDefinition>,
    pub choice: ToolChoice,
    pub messages: Vec<Message>,
}

/// The seeded sequence of cases.
pub struct Cases {
    rng: StdRng,
    next: usize,
}

impl Cases {
    /// The sequence from [`SEED`].
    pub fn new() -> Self {
        Self {
            rng: StdRng::seed_from_u64(SEED),
            next: 0,
        }
    }
}

impl Default for Cases {
    fn default() -> Self {
        Self::new()
    }
}

impl Iterator for Cases {
    type Item = Case;

    fn next(&mut self) -> Option<Case> {
        let index = self.next;
        self.next += 1;
        let tools = catalogue(&mut self.rng);
        let target = tools.choose(&mut self.rng).unwrap().name.clone();
        // Alternate: force the named tool, or require some tool and let the model pick.
        let choice = if index.is_multiple_of(2) {
            ToolChoice::Tool(target.clone())
        } else {
            ToolChoice::Required
        };
        let messages = vec![Message::user(format!(
            "Please use {target} with sensible example values."
        ))];
        Some(Case {
            index,
            tools,
            choice,
            messages,
        })
    }
}

impl Case {
    /// The request of this case.
    pub fn request(&self) -> ModelRequest<'_> {
        let mut request = ModelRequest::new(&self.messages);
        request.tools = &self.tools;
        request.tool_choice = &self.choice;
        request.max_output_tokens = Some(TOKEN_CAP);
        request
    }

    /// Checks one response: `Ok(number of valid calls)`, or what is wrong with it.
    pub fn check(&self, response: &ModelResponse) -> Result<usize, String> {
        let i = self.index;
        if response.stop_reason == StopReason::MaxTokens {
            return Err(format!(
                "generation {i} hit the {TOKEN_CAP}-token cap: {:?}",
                response.message
            ));
        }
        if response.usage.output_tokens > u64::from(TOKEN_CAP) {
            return Err(format!(
                "generation {i} produced {} tokens, over the {TOKEN_CAP}-token cap",
                response.usage.output_tokens
            ));
        }
        let calls: Vec<_> = response.message.tool_calls().cloned().collect();
        if calls.is_empty() {
            return Err(format!(
                "generation {i} made no call: {:?}",
                response.message
            ));
        }
        for call in &calls {
            let Some(tool) = self.tools.iter().find(|t| t.name == call.name) else {
                return Err(format!("generation {i} called unknown tool {}", call.name));
            };
            if let ToolChoice::Tool(name) = &self.choice
                && &call.name != name
            {
                return Err(format!(
                    "generation {i} ignored tool_choice {name} and called {}",
                    call.name
                ));
            }
            let args: Value = serde_json::from_str(&call.arguments).map_err(|e| {
                format!(
                    "generation {i}: arguments {} are not JSON: {e}",
                    call.arguments
                )
            })?;
            let validator = jsonschema::validator_for(&tool.input_schema)
                .map_err(|e| format!("generation {i}: the schema does not compile: {e}"))?;
            let errors: Vec<String> = validator
                .iter_errors(&args)
                .map(|e| e.to_string())
                .collect();
            if !errors.is_empty() {
                return Err(format!(
                    "generation {i}: {} does not validate against {}: {errors:?}",
                    call.arguments, tool.input_schema
                ));
            }
        }
        Ok(calls.len())
    }
}

/// What a sweep found.
#[derive(Debug, Default)]
pub struct SweepReport {
    pub generations: usize,
    pub valid_generations: usize,
    pub calls_validated: usize,
    pub output_tokens: u64,
    pub seconds: f64,
    /// One line per invalid generation (empty when all were valid).
    pub failures: Vec<String>,
}

impl SweepReport {
    /// Valid generations / generations (1.0 for an empty sweep).
    pub fn validity(&self) -> f64 {
        if self.generations == 0 {
            1.0
        } else {
            self.valid_generations as f64 / self.generations as f64
        }
    }
}

/// Runs the first `generations` cases on `model`, printing progress on stderr every ten.
pub async fn sweep(model: &LocalModel, generations: usize) -> SweepReport {
    let started = Instant::now();
    let mut report = SweepReport::default();
    for case in Cases::new().take(generations) {
        report.generations += 1;
        match keel_core::model::complete(model, case.request()).await {
            Ok(response) => {
                report.output_tokens += response.usage.output_tokens;
                match case.check(&response) {
                    Ok(calls) => {
                        report.valid_generations += 1;
                        report.calls_validated += calls;
                    }
                    Err(failure) => report.failures.push(failure),
                }
            }
            Err(error) => report
                .failures
                .push(format!("generation {} failed: {error}", case.index)),
        }
        if report.generations.is_multiple_of(10) {
            eprintln!(
                "{} generations, {} valid, {} calls valid, {} tokens, {:.1} s",
                report.generations,
                report.valid_generations,
                report.calls_validated,
                report.output_tokens,
                started.elapsed().as_secs_f64()
            );
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}
