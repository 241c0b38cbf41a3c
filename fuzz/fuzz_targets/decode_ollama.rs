//! Ollama `/api/chat` stream decoder (NDJSON): see `keel_fuzz::fuzz_decoder` for the
//! invariants.
#![no_main]

use keel_providers::fuzzing::Wire;
use libfuzzer_sys::fuzz_target;

const VOCAB: &[&str] = &[
    "model",
    "created_at",
    "message",
    "role",
    "assistant",
    "content",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "id",
    "done",
    "done_reason",
    "stop",
    "length",
    "prompt_eval_count",
    "eval_count",
    "error",
    "{\"a\":",
    "1}",
];

fuzz_target!(|data: &[u8]| keel_fuzz::fuzz_decoder(Wire::Ollama, VOCAB, data));
