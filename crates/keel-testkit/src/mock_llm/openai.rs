//! Renders turns as OpenAI Chat Completions chunks (streamed and not) and errors, and as
//! OpenRouter's flavour of them (`usage.cost`, numeric error codes, error chunks).

use serde_json::{Value, json};

use super::render::{Ctx, Protocol, Rendered, chunk_text, halves, sse};
use super::script::{MockError, MockStop, MockStreamError};

fn chunk(ctx: &Ctx<'_>, protocol: Protocol, choices: Value) -> Value {
    let mut value = json!({"id": format!("chatcmpl-mock-{}", ctx.seq),
        "object": "chat.completion.chunk", "created": 1_700_000_000, "model": ctx.model,
        "system_fingerprint": "fp_mock", "choices": choices});
    if protocol == Protocol::OpenRouter
        && let Some(obj) = value.as_object_mut()
    {
        obj.insert("provider".into(), json!("MockProvider"));
    }
    value
}

fn finish_reason(ctx: &Ctx<'_>) -> &'static str {
    match (ctx.turn.stop, ctx.turn.tool_calls.is_empty()) {
        (Some(MockStop::MaxTokens), _) => "length",
        (None, false) => "tool_calls",
        (None, true) => "stop",
    }
}

fn usage(ctx: &Ctx<'_>, protocol: Protocol) -> Value {
    let u = ctx.usage;
    let mut value = json!({"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens),
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0}});
    if protocol == Protocol::OpenRouter
        && let Some(obj) = value.as_object_mut()
    {
        obj.insert("cost".into(), json!(ctx.turn.cost.unwrap_or(0.0)));
        obj.insert("is_byok".into(), json!(false));
    }
    value
}

/// A streamed answer. Parallel tool calls are interleaved by `index` (first halves of
/// every call, then second halves), which a correct client must reassemble.
pub fn stream(ctx: &Ctx<'_>, protocol: Protocol) -> Rendered {
    let turn = ctx.turn;
    let mut head = vec![sse(
        None,
        &chunk(
            ctx,
            protocol,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": null, "finish_reason": null}]),
        ),
    )];
    for piece in turn.text.as_deref().map(chunk_text).unwrap_or_default() {
        head.push(sse(
            None,
            &chunk(
                ctx,
                protocol,
                json!([{"index": 0, "delta": {"content": piece},
                                          "logprobs": null, "finish_reason": null}]),
            ),
        ));
    }
    let mut second_halves = Vec::new();
    for (i, call) in turn.tool_calls.iter().enumerate() {
        let (a, b) = halves(&call.arguments_text());
        let delta = json!({"tool_calls": [{"index": i, "id": ctx.call_id("call", i),
            "type": "function", "function": {"name": call.name, "arguments": a}}]});
        head.push(sse(
            None,
            &chunk(
                ctx,
                protocol,
                json!([{"index": 0, "delta": delta, "logprobs": null,
                                          "finish_reason": null}]),
            ),
        ));
        second_halves.push((i, b));
    }
    for (i, b) in second_halves {
        let delta = json!({"tool_calls": [{"index": i, "function": {"arguments": b}}]});
        head.push(sse(
            None,
            &chunk(
                ctx,
                protocol,
                json!([{"index": 0, "delta": delta, "logprobs": null,
                                          "finish_reason": null}]),
            ),
        ));
    }
    let mut tail = vec![sse(
        None,
        &chunk(
            ctx,
            protocol,
            json!([{"index": 0, "delta": {}, "logprobs": null,
                                      "finish_reason": finish_reason(ctx)}]),
        ),
    )];
    let wants_usage = ctx
        .body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    if wants_usage || protocol == Protocol::OpenRouter {
        let mut last = chunk(ctx, protocol, json!([]));
        if let Some(obj) = last.as_object_mut() {
            obj.insert("usage".into(), usage(ctx, protocol));
        }
        tail.push(sse(None, &last));
    }
    tail.push("data: [DONE]\n\n".to_owned());
    Rendered { head, tail }
}

/// The non-streamed `chat.completion` object.
pub fn completion(ctx: &Ctx<'_>, protocol: Protocol) -> Value {
    let turn = ctx.turn;
    let mut message = json!({"role": "assistant", "content": turn.text, "refusal": null});
    if !turn.tool_calls.is_empty()
        && let Some(obj) = message.as_object_mut()
    {
        let calls: Vec<Value> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": ctx.call_id("call", i), "type": "function",
                                 "function": {"name": c.name, "arguments": c.arguments_text()}})
            })
            .collect();
        obj.insert("tool_calls".into(), Value::Array(calls));
    }
    json!({"id": format!("chatcmpl-mock-{}", ctx.seq), "object": "chat.completion",
           "created": 1_700_000_000, "model": ctx.model,
           "choices": [{"index": 0, "message": message, "logprobs": null,
                        "finish_reason": finish_reason(ctx)}],
           "usage": usage(ctx, protocol)})
}

fn default_type(status: u16) -> (&'static str, Option<&'static str>) {
    match status {
        401 => ("invalid_request_error", Some("invalid_api_key")),
        403 => (
            "invalid_request_error",
            Some("unsupported_country_region_territory"),
        ),
        404 => ("invalid_request_error", Some("model_not_found")),
        400 | 422 => ("invalid_request_error", None),
        429 => ("requests", Some("rate_limit_exceeded")),
        503 => ("server_error", Some("server_is_overloaded")),
        _ => ("server_error", None),
    }
}

/// An OpenAI HTTP error body: `{"error":{"message","type","param","code"}}`.
pub fn error_body(error: &MockError) -> Value {
    let (default_type, default_code) = default_type(error.status());
    let (error_type, code) = if error.is_quota() {
        (
            "insufficient_quota".to_owned(),
            Some("insufficient_quota".to_owned()),
        )
    } else if let Some(t) = &error.error_type {
        (t.clone(), Some(t.clone()))
    } else {
        (default_type.to_owned(), default_code.map(str::to_owned))
    };
    json!({"error": {"message": error.message(), "type": error_type, "param": null, "code": code}})
}

/// An OpenRouter HTTP error body: `{"error":{"code":429,"message","metadata"},"user_id"}`.
pub fn openrouter_error_body(error: &MockError) -> Value {
    let mut metadata = json!({"provider_name": "MockProvider"});
    if let (Some(t), Some(obj)) = (&error.error_type, metadata.as_object_mut()) {
        obj.insert("raw".into(), json!(t));
    }
    json!({"error": {"code": error.status(), "message": error.message(), "metadata": metadata},
           "user_id": "user_mock"})
}

/// A mid-stream error: OpenAI sends `data: {"error": {...}}`; OpenRouter sends a chunk
/// with `error` and `finish_reason: "error"`.
pub fn stream_error(ctx: &Ctx<'_>, protocol: Protocol, error: &MockStreamError) -> String {
    let error_type = error.error_type.as_deref().unwrap_or("server_error");
    let message = error
        .message
        .as_deref()
        .unwrap_or("The server had an error while processing your request.");
    match protocol {
        Protocol::OpenRouter => {
            let mut value = chunk(
                ctx,
                protocol,
                json!([{"index": 0, "delta": {"content": ""},
                                                         "finish_reason": "error"}]),
            );
            if let Some(obj) = value.as_object_mut() {
                obj.insert(
                    "error".into(),
                    json!({"code": error_type, "message": message}),
                );
            }
            sse(None, &value)
        }
        _ => sse(
            None,
            &json!({"error": {"message": message, "type": error_type, "param": null,
                                         "code": null}}),
        ),
    }
}
