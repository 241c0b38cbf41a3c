//! Renders turns as Ollama `/api/chat` newline-delimited JSON and errors.

use serde_json::{Value, json};

use super::render::{Ctx, Rendered, chunk_text};
use super::script::{MockError, MockStop, MockStreamError};

const CREATED: &str = "2025-01-01T00:00:00.000000Z";

fn line(value: &Value) -> String {
    format!("{value}\n")
}

/// A streamed answer.
pub fn stream(ctx: &Ctx<'_>) -> Rendered {
    let turn = ctx.turn;
    let mut head = Vec::new();
    if let Some(reasoning) = &turn.reasoning {
        head.push(line(&json!({"model": ctx.model, "created_at": CREATED,
            "message": {"role": "assistant", "content": "", "thinking": reasoning}, "done": false})));
    }
    for piece in turn.text.as_deref().map(chunk_text).unwrap_or_default() {
        head.push(line(&json!({"model": ctx.model, "created_at": CREATED,
            "message": {"role": "assistant", "content": piece}, "done": false})));
    }
    if !turn.tool_calls.is_empty() {
        head.push(line(&json!({"model": ctx.model, "created_at": CREATED,
            "message": {"role": "assistant", "content": "", "tool_calls": tool_calls(ctx)},
            "done": false})));
    }
    let tail = vec![line(&final_object(
        ctx,
        json!({"role": "assistant", "content": ""}),
    ))];
    Rendered { head, tail }
}

fn tool_calls(ctx: &Ctx<'_>) -> Vec<Value> {
    ctx.turn
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let mut value = json!({"function": {"index": i, "name": call.name,
                                                "arguments": call.arguments_value()}});
            if let (Some(id), Some(obj)) = (&call.id, value.as_object_mut()) {
                obj.insert("id".into(), json!(id));
            }
            value
        })
        .collect()
}

fn final_object(ctx: &Ctx<'_>, message: Value) -> Value {
    let done_reason = match ctx.turn.stop {
        Some(MockStop::MaxTokens) => "length",
        None => "stop",
    };
    json!({"model": ctx.model, "created_at": CREATED, "message": message, "done": true,
           "done_reason": done_reason, "total_duration": 1_000_000, "load_duration": 1000,
           "prompt_eval_count": ctx.usage.input_tokens, "prompt_eval_duration": 1000,
           "eval_count": ctx.usage.output_tokens, "eval_duration": 1000})
}

/// The non-streamed answer (`"stream": false`).
pub fn message(ctx: &Ctx<'_>) -> Value {
    let mut message =
        json!({"role": "assistant", "content": ctx.turn.text.clone().unwrap_or_default()});
    if !ctx.turn.tool_calls.is_empty()
        && let Some(obj) = message.as_object_mut()
    {
        obj.insert("tool_calls".into(), Value::Array(tool_calls(ctx)));
    }
    final_object(ctx, message)
}

/// An HTTP error body: `{"error": "text"}`.
pub fn error_body(error: &MockError) -> Value {
    json!({"error": error.message()})
}

/// A mid-stream `{"error": "text"}` line.
pub fn stream_error(error: &MockStreamError) -> String {
    let message = error
        .message
        .as_deref()
        .unwrap_or("an error was encountered while running the model");
    line(&json!({"error": message}))
}
