//! Grammar-constrained generations against seeded random tool catalogues (see
//! `common/catalogs.rs`): every generation must end on its own (not at the token cap) with
//! tool calls that parse and validate against the schema of the tool each call names —
//! 100% validity, no tolerance.
//!
//! The suite runs the first [`GENERATIONS`] catalogues; the long sweep (100 and more, with
//! timings) is a benchmark: `./scripts/bench-local` runs `examples/constrained_sweep.rs`
//! on the same sequence. `KEEL_LOCAL_GENERATIONS=N` runs N here when debugging.
//!
//! Needs the model file: run `./scripts/fetch-model` first (the test fails otherwise).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use common::catalogs;

/// How many generations the test makes (each takes seconds on one CPU thread).
const GENERATIONS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_catalogues_all_calls_validate_and_terminate() {
    let model = common::model(catalogs::sweep_options(common::options()));
    let generations = std::env::var("KEEL_LOCAL_GENERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(GENERATIONS);
    let report = catalogs::sweep(&model, generations).await;
    eprintln!(
        "{} constrained generations, {} calls validated, {} tokens, {:.1} s",
        report.generations, report.calls_validated, report.output_tokens, report.seconds
    );
    assert_eq!(report.generations, generations);
    assert!(
        report.failures.is_empty(),
        "{} of {} generations invalid:\n{}",
        report.failures.len(),
        report.generations,
        report.failures.join("\n")
    );
    assert_eq!(report.valid_generations, generations);
    assert!(report.calls_validated >= generations);
}

/// The checker itself: a response that a broken grammar could produce must be rejected,
/// so the sweep above cannot pass vacuously.
#[test]
fn the_check_rejects_invalid_responses() {
    use keel_core::{Message, ModelResponse, Part, StopReason, ToolCall, Usage};

    let case = catalogs::Cases::new().next().unwrap();
    let keel_core::ToolChoice::Tool(target) = case.choice.clone() else {
        panic!("case 0 forces a tool");
    };
    let response = |calls: Vec<ToolCall>, stop: StopReason| ModelResponse {
        message: Message {
            role: keel_core::Role::Assistant,
            parts: calls.into_iter().map(Part::ToolCall).collect(),
        },
        stop_reason: stop,
        usage: Usage {
            output_tokens: 10,
            ..Usage::default()
        },
        response_id: None,
        cost_usd: None,
        retries: 0,
    };
    let call = |name: &str, arguments: &str| ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    // No call at all.
    assert!(case.check(&response(vec![], StopReason::EndTurn)).is_err());
    // Stopped at the token cap.
    assert!(
        case.check(&response(vec![call(&target, "{}")], StopReason::MaxTokens))
            .is_err()
    );
    // Arguments that are not JSON.
    assert!(
        case.check(&response(vec![call(&target, "{nope")], StopReason::ToolUse))
            .is_err()
    );
    // A tool that is not in the catalogue.
    assert!(
        case.check(&response(
            vec![call("no_such_tool", "{}")],
            StopReason::ToolUse
        ))
        .is_err()
    );
    // JSON that breaks the schema (not an object).
    assert!(
        case.check(&response(vec![call(&target, "42")], StopReason::ToolUse))
            .is_err()
    );
}
