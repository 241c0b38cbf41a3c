//! Renders turns as Anthropic Messages API server-sent events and errors.

use serde_json::{Value, json};

use super::render::{Ctx, Rendered, chunk_text, halves, sse};
use super::script::{MockError, MockStop, MockStreamError};

/// A streamed answer.
pub fn stream(ctx: &Ctx<'_>) -> Rendered {
    let turn = ctx.turn;
    let usage = ctx.usage;
    let uncached = usage
        .input_tokens
        .saturating_sub(usage.cache_read_tokens)
        .saturating_sub(usage.cache_write_tokens);
    let mut head = vec![sse(
        Some("message_start"),
        &json!({"type": "message_start", "message": {
            "id": format!("msg_mock_{}", ctx.seq), "type": "message", "role": "assistant",
            "model": ctx.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": uncached, "output_tokens": 1,
                      "cache_read_input_tokens": usage.cache_read_tokens,
                      "cache_creation_input_tokens": usage.cache_write_tokens}}}),
    )];
    let mut index = 0;
    let block_stop = |index: usize| {
        sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        )
    };
    if let Some(reasoning) = &turn.reasoning {
        head.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ));
        head.push(sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "thinking_delta", "thinking": reasoning}}),
        ));
        head.push(sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "signature_delta", "signature": format!("mock-signature-{}", ctx.seq)}}),
        ));
        head.push(block_stop(index));
        index += 1;
    }
    if let Some(text) = turn.text.as_deref().filter(|t| !t.is_empty()) {
        head.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in chunk_text(text) {
            head.push(sse(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        head.push(block_stop(index));
        index += 1;
    }
    for (i, call) in turn.tool_calls.iter().enumerate() {
        head.push(sse(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": ctx.call_id("toolu", i),
                                      "name": call.name, "input": {}}}),
        ));
        let (a, b) = halves(&call.arguments_text());
        for piece in [a, b] {
            head.push(sse(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        head.push(block_stop(index));
        index += 1;
    }
    let stop_reason = match (turn.stop, turn.tool_calls.is_empty()) {
        (Some(MockStop::MaxTokens), _) => "max_tokens",
        (None, false) => "tool_use",
        (None, true) => "end_turn",
    };
    let tail = vec![
        sse(
            Some("message_delta"),
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": usage.output_tokens}}),
        ),
        sse(Some("message_stop"), &json!({"type": "message_stop"})),
    ];
    Rendered { head, tail }
}

/// The non-streamed answer.
pub fn message(ctx: &Ctx<'_>) -> Value {
    let turn = ctx.turn;
    let mut content = Vec::new();
    if let Some(reasoning) = &turn.reasoning {
        content.push(json!({"type": "thinking", "thinking": reasoning,
                            "signature": format!("mock-signature-{}", ctx.seq)}));
    }
    if let Some(text) = turn.text.as_deref().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for (i, call) in turn.tool_calls.iter().enumerate() {
        content.push(
            json!({"type": "tool_use", "id": ctx.call_id("toolu", i), "name": call.name,
                            "input": call.arguments_value()}),
        );
    }
    let stop_reason = match (turn.stop, turn.tool_calls.is_empty()) {
        (Some(MockStop::MaxTokens), _) => "max_tokens",
        (None, false) => "tool_use",
        (None, true) => "end_turn",
    };
    let usage = ctx.usage;
    json!({"id": format!("msg_mock_{}", ctx.seq), "type": "message", "role": "assistant",
           "model": ctx.model, "content": content, "stop_reason": stop_reason,
           "stop_sequence": null,
           "usage": {"input_tokens": usage.input_tokens.saturating_sub(usage.cache_read_tokens).saturating_sub(usage.cache_write_tokens),
                     "output_tokens": usage.output_tokens,
                     "cache_read_input_tokens": usage.cache_read_tokens,
                     "cache_creation_input_tokens": usage.cache_write_tokens}})
}

fn default_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        408 | 504 => "timeout_error",
        _ => "api_error",
    }
}

/// An HTTP error body: `{"type":"error","error":{"type","message"},"request_id"}`.
pub fn error_body(seq: usize, error: &MockError) -> Value {
    let status = error.status();
    let error_type = error
        .error_type
        .clone()
        .unwrap_or_else(|| default_type(status).to_owned());
    json!({"type": "error", "error": {"type": error_type, "message": error.message()},
           "request_id": format!("req_mock_{seq}")})
}

/// A mid-stream `event: error`.
pub fn stream_error(error: &MockStreamError) -> String {
    let error_type = error.error_type.as_deref().unwrap_or("overloaded_error");
    let message = error.message.as_deref().unwrap_or("Overloaded");
    sse(
        Some("error"),
        &json!({"type": "error", "error": {"type": error_type, "message": message}}),
    )
}
