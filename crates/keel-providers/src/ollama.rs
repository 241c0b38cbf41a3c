//! Ollama's native chat API (`POST /api/chat`, newline-delimited JSON).
//!
//! The system prompt is the first message (`role: system`); tool calls carry their
//! arguments as JSON objects (not strings) and usually arrive whole in one line; tool
//! results are `role: tool` messages naming the tool. Ollama has no `tool_choice`:
//! `None` sends no tools and `Tool(name)` sends only that tool.

use keel_core::{
    ModelError, ModelRequest, Part, Role, StopReason, StreamEvent, ToolCall, ToolChoice, Usage,
};
use reqwest::RequestBuilder;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

use crate::driver::{Decoder, Protocol, malformed, truncated};
use crate::errors::classify_stream_error;
use crate::framing::{Frame, Framing};

const PROVIDER: &str = "ollama";

pub(crate) struct Ollama {
    pub(crate) url: String,
    pub(crate) api_key: Option<SecretString>,
}

impl Protocol for Ollama {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn headers(&self, builder: RequestBuilder) -> RequestBuilder {
        match &self.api_key {
            Some(key) => builder.bearer_auth(key.expose_secret()),
            None => builder,
        }
    }

    fn body(&self, model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
        request_body(model, max_output, request)
    }

    fn framing(&self) -> Framing {
        Framing::Ndjson
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(OllamaDecoder::default())
    }
}

/// The `/api/chat` request body.
pub(crate) fn request_body(model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in request.messages {
        let text = message.text();
        match message.role {
            Role::System => messages.push(json!({"role": "system", "content": text})),
            Role::User => messages.push(json!({"role": "user", "content": text})),
            Role::Assistant => {
                let calls: Vec<Value> = message
                    .tool_calls()
                    .map(|c| {
                        let arguments = match c.parse_arguments() {
                            Ok(value @ Value::Object(_)) => value,
                            _ => json!({}),
                        };
                        json!({"function": {"name": c.name, "arguments": arguments}})
                    })
                    .collect();
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert("content".into(), json!(text));
                if !calls.is_empty() {
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(m));
            }
            Role::Tool => {
                for part in &message.parts {
                    match part {
                        Part::ToolResult(r) => messages.push(
                            json!({"role": "tool", "tool_name": r.name, "content": r.content}),
                        ),
                        Part::Text { text } | Part::Summary { text, .. } => {
                            messages.push(json!({"role": "user", "content": text}));
                        }
                        Part::ToolCall(_) | Part::ProviderItem { .. } => {}
                    }
                }
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    let tools: Vec<Value> = request
        .tools
        .iter()
        .filter(|t| match request.tool_choice {
            ToolChoice::None => false,
            ToolChoice::Tool(name) => &t.name == name,
            ToolChoice::Auto | ToolChoice::Required => true,
        })
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema}})
        })
        .collect();
    if !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools));
    }
    let mut options = Map::new();
    if let Some(t) = request.temperature {
        options.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        options.insert("top_p".into(), json!(p));
    }
    options.insert("num_predict".into(), json!(max_output));
    body.insert("options".into(), Value::Object(options));
    if let Some(schema) = request.response_schema {
        body.insert("format".into(), schema.clone());
    }
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

#[derive(Default)]
struct OllamaDecoder {
    calls: u32,
    done: bool,
}

impl Decoder for OllamaDecoder {
    fn frame(&mut self, frame: Frame, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let Frame::Line(line) = frame else {
            return Ok(());
        };
        if self.done {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(&line).map_err(|e| malformed(PROVIDER, &line, &e))?;
        if value.get("error").is_some_and(|e| !e.is_null()) {
            return Err(classify_stream_error(PROVIDER, &value));
        }
        let message = value.get("message").unwrap_or(&Value::Null);
        if let Some(text) = message.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            out.push(StreamEvent::TextDelta(text.to_owned()));
        }
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(value) if !value.is_null() => value.to_string(),
                _ => "{}".to_owned(),
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| keel_core::new_id("call"));
            out.push(StreamEvent::ToolCallDelta {
                index: self.calls,
                id: Some(id.clone()),
                name: Some(name.clone()),
                arguments_delta: arguments.clone(),
            });
            out.push(StreamEvent::ToolCall(ToolCall {
                id,
                name,
                arguments,
            }));
            self.calls = self.calls.saturating_add(1);
        }
        if value.get("done").and_then(Value::as_bool) == Some(true) {
            let get = |k: &str| value.get(k).and_then(Value::as_u64).unwrap_or(0);
            out.push(StreamEvent::Usage(Usage {
                input_tokens: get("prompt_eval_count"),
                output_tokens: get("eval_count"),
                cache_read_tokens: 0,
                cache_write_tokens: 0,
            }));
            let reason = match value.get("done_reason").and_then(Value::as_str) {
                Some("length") => StopReason::MaxTokens,
                _ if self.calls > 0 => StopReason::ToolUse,
                Some("stop") | None => StopReason::EndTurn,
                Some(_) => StopReason::Other,
            };
            self.done = true;
            out.push(StreamEvent::Stop {
                reason,
                response_id: None,
            });
        }
        Ok(())
    }

    fn end(&mut self, _out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.done {
            Ok(())
        } else {
            Err(truncated(PROVIDER))
        }
    }
}
