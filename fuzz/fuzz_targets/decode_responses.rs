//! OpenAI Responses stream decoder (SSE): see `keel_fuzz::fuzz_decoder` for the invariants.
#![no_main]

use keel_providers::fuzzing::Wire;
use libfuzzer_sys::fuzz_target;

const VOCAB: &[&str] = &[
    "type",
    "response.created",
    "response.in_progress",
    "response",
    "id",
    "response.output_text.delta",
    "delta",
    "response.output_item.added",
    "item",
    "function_call",
    "call_id",
    "name",
    "arguments",
    "output_index",
    "response.function_call_arguments.delta",
    "response.output_item.done",
    "reasoning",
    "response.completed",
    "response.incomplete",
    "incomplete_details",
    "reason",
    "max_output_tokens",
    "content_filter",
    "usage",
    "input_tokens",
    "output_tokens",
    "input_tokens_details",
    "cached_tokens",
    "response.failed",
    "error",
    "code",
    "message",
    "{\"a\":",
    "1}",
];

fuzz_target!(|data: &[u8]| keel_fuzz::fuzz_decoder(Wire::OpenAiResponses, VOCAB, data));
