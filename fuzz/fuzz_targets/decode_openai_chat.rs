//! OpenAI Chat Completions stream decoder (SSE; OpenRouter shares it): see
//! `keel_fuzz::fuzz_decoder` for the invariants.
#![no_main]

use keel_providers::fuzzing::Wire;
use libfuzzer_sys::fuzz_target;

const VOCAB: &[&str] = &[
    "id",
    "object",
    "chat.completion.chunk",
    "choices",
    "index",
    "delta",
    "role",
    "assistant",
    "content",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "type",
    "finish_reason",
    "stop",
    "tool_calls",
    "length",
    "content_filter",
    "error",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "cache_write_tokens",
    "cost",
    "message",
    "code",
    "{\"a\":",
    "1}",
];

fuzz_target!(|data: &[u8]| {
    // The first byte's top bit picks the flavour (provider name in messages).
    let wire = if data.first().is_some_and(|b| b & 0x80 != 0) {
        Wire::OpenRouter
    } else {
        Wire::OpenAiChat
    };
    keel_fuzz::fuzz_decoder(wire, VOCAB, data);
});
