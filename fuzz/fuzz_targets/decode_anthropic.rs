//! Anthropic Messages stream decoder (SSE): see `keel_fuzz::fuzz_decoder` for the invariants.
#![no_main]

use keel_providers::fuzzing::Wire;
use libfuzzer_sys::fuzz_target;

const VOCAB: &[&str] = &[
    "type",
    "index",
    "message_start",
    "message",
    "id",
    "usage",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "content_block_start",
    "content_block",
    "text",
    "tool_use",
    "name",
    "thinking",
    "signature",
    "redacted_thinking",
    "data",
    "content_block_delta",
    "delta",
    "text_delta",
    "input_json_delta",
    "partial_json",
    "thinking_delta",
    "signature_delta",
    "content_block_stop",
    "message_delta",
    "stop_reason",
    "end_turn",
    "max_tokens",
    "refusal",
    "message_stop",
    "error",
    "overloaded_error",
    "rate_limit_error",
    "ping",
    "{\"a\":",
    "1}",
];

fuzz_target!(|data: &[u8]| keel_fuzz::fuzz_decoder(Wire::Anthropic, VOCAB, data));
