//! Renders turns as OpenAI Responses API server-sent events.

use serde_json::{Value, json};

use super::render::{Ctx, Rendered, chunk_text, halves, sse};
use super::script::{MockStop, MockStreamError};

/// A streamed answer.
pub fn stream(ctx: &Ctx<'_>) -> Rendered {
    let turn = ctx.turn;
    let response_id = format!("resp_mock_{}", ctx.seq);
    let mut seq = 0u64;
    let mut event = |name: &str, mut data: Value| {
        if let Some(obj) = data.as_object_mut() {
            obj.insert("type".into(), json!(name));
            obj.insert("sequence_number".into(), json!(seq));
        }
        seq += 1;
        sse(Some(name), &data)
    };
    let shell = |status: &str, output: Vec<Value>| {
        json!({"id": response_id, "object": "response", "created_at": 1_700_000_000,
               "status": status, "model": ctx.model, "output": output})
    };
    let mut head = vec![
        event(
            "response.created",
            json!({"response": shell("in_progress", vec![])}),
        ),
        event(
            "response.in_progress",
            json!({"response": shell("in_progress", vec![])}),
        ),
    ];
    let mut output = Vec::new();
    if let Some(reasoning) = &turn.reasoning {
        let id = format!("rs_mock_{}", ctx.seq);
        let index = output.len();
        head.push(event(
            "response.output_item.added",
            json!({"output_index": index,
            "item": {"type": "reasoning", "id": id, "summary": []}}),
        ));
        let item = json!({"type": "reasoning", "id": id,
            "summary": [{"type": "summary_text", "text": reasoning}],
            "encrypted_content": format!("mock-encrypted-{}", ctx.seq)});
        head.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
    }
    if let Some(text) = turn.text.as_deref().filter(|t| !t.is_empty()) {
        let id = format!("msg_mock_{}", ctx.seq);
        let index = output.len();
        head.push(event(
            "response.output_item.added",
            json!({"output_index": index,
            "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant",
                     "content": []}}),
        ));
        head.push(event(
            "response.content_part.added",
            json!({"item_id": id,
            "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}),
        ));
        for piece in chunk_text(text) {
            head.push(event(
                "response.output_text.delta",
                json!({"item_id": id,
                "output_index": index, "content_index": 0, "delta": piece}),
            ));
        }
        head.push(event(
            "response.output_text.done",
            json!({"item_id": id,
            "output_index": index, "content_index": 0, "text": text}),
        ));
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        head.push(event(
            "response.content_part.done",
            json!({"item_id": id,
            "output_index": index, "content_index": 0, "part": part}),
        ));
        let item = json!({"type": "message", "id": id, "status": "completed",
                          "role": "assistant", "content": [part]});
        head.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
    }
    for (i, call) in turn.tool_calls.iter().enumerate() {
        let id = format!("fc_mock_{}_{i}", ctx.seq);
        let call_id = ctx.call_id("call", i);
        let index = output.len();
        let arguments = call.arguments_text();
        head.push(event(
            "response.output_item.added",
            json!({"output_index": index,
            "item": {"type": "function_call", "id": id, "call_id": call_id, "name": call.name,
                     "arguments": "", "status": "in_progress"}}),
        ));
        let (a, b) = halves(&arguments);
        for piece in [a, b] {
            head.push(event(
                "response.function_call_arguments.delta",
                json!({"item_id": id,
                "output_index": index, "delta": piece}),
            ));
        }
        head.push(event(
            "response.function_call_arguments.done",
            json!({"item_id": id,
            "output_index": index, "arguments": arguments}),
        ));
        let item = json!({"type": "function_call", "id": id, "call_id": call_id,
                          "name": call.name, "arguments": arguments, "status": "completed"});
        head.push(event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        output.push(item);
    }
    let u = ctx.usage;
    let usage = json!({"input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.input_tokens.saturating_add(u.output_tokens)});
    let tail = match turn.stop {
        Some(MockStop::MaxTokens) => {
            let mut response = shell("incomplete", output);
            if let Some(obj) = response.as_object_mut() {
                obj.insert("usage".into(), usage);
                obj.insert(
                    "incomplete_details".into(),
                    json!({"reason": "max_output_tokens"}),
                );
            }
            vec![event("response.incomplete", json!({"response": response}))]
        }
        None => {
            let mut response = shell("completed", output);
            if let Some(obj) = response.as_object_mut() {
                obj.insert("usage".into(), usage);
            }
            vec![event("response.completed", json!({"response": response}))]
        }
    };
    Rendered { head, tail }
}

/// A mid-stream `response.failed` event.
pub fn stream_error(ctx: &Ctx<'_>, error: &MockStreamError) -> String {
    let code = error.error_type.as_deref().unwrap_or("server_error");
    let message = error
        .message
        .as_deref()
        .unwrap_or("The model failed to generate a response.");
    sse(
        Some("response.failed"),
        &json!({"type": "response.failed", "sequence_number": 999,
                "response": {"id": format!("resp_mock_{}", ctx.seq), "object": "response",
                             "status": "failed", "model": ctx.model, "output": [],
                             "error": {"code": code, "message": message}}}),
    )
}
