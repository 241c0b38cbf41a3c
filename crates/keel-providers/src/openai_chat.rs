//! OpenAI Chat Completions (`POST /v1/chat/completions`, SSE) and OpenRouter, which speaks
//! the same protocol with attribution headers, its own error format (numeric `code`,
//! `metadata`), `: OPENROUTER PROCESSING` keep-alive comments, mid-stream error chunks
//! with `finish_reason: "error"`, and the call's cost in `usage.cost`.
//!
//! The system prompt is the first message (`role: system`); tool calls arrive as
//! `tool_calls` deltas keyed by `index` and are assembled here; tool results are
//! `role: tool` messages whose `content` is what the model sees.

use std::collections::BTreeMap;

use keel_core::{
    ModelError, ModelErrorKind, ModelRequest, Part, Role, StopReason, StreamEvent, ToolCall,
    ToolChoice, Usage,
};
use reqwest::RequestBuilder;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

use crate::driver::{Decoder, Protocol, malformed, truncated};
use crate::errors::classify_stream_error;
use crate::framing::{Frame, Framing};

/// Which service speaks the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    OpenAi,
    OpenRouter,
}

pub(crate) struct OpenAiChat {
    pub(crate) flavor: Flavor,
    pub(crate) url: String,
    pub(crate) api_key: SecretString,
    /// OpenRouter attribution: `HTTP-Referer` and `X-Title`.
    pub(crate) app_url: Option<String>,
    pub(crate) app_title: Option<String>,
}

impl Protocol for OpenAiChat {
    fn provider(&self) -> &'static str {
        match self.flavor {
            Flavor::OpenAi => "openai",
            Flavor::OpenRouter => "openrouter",
        }
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn headers(&self, builder: RequestBuilder) -> RequestBuilder {
        let mut builder = builder
            .bearer_auth(self.api_key.expose_secret())
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if self.flavor == Flavor::OpenRouter {
            if let Some(url) = &self.app_url {
                builder = builder.header("HTTP-Referer", url);
            }
            if let Some(title) = &self.app_title {
                builder = builder.header("X-Title", title);
            }
        }
        builder
    }

    fn body(&self, model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
        request_body(self.flavor, model, max_output, request)
    }

    fn framing(&self) -> Framing {
        Framing::Sse
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ChatDecoder {
            provider: self.provider(),
            ..ChatDecoder::default()
        })
    }
}

/// The Chat Completions request body.
pub(crate) fn request_body(
    flavor: Flavor,
    model: &str,
    max_output: u32,
    request: &ModelRequest<'_>,
) -> Value {
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
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert(
                    "content".into(),
                    if text.is_empty() {
                        Value::Null
                    } else {
                        json!(text)
                    },
                );
                if !calls.is_empty() {
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(m));
            }
            Role::Tool => {
                for part in &message.parts {
                    match part {
                        Part::ToolResult(r) => messages.push(
                            json!({"role": "tool", "tool_call_id": r.call_id, "content": r.content}),
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
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema}})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match request.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), choice);
    }
    let max_key = match flavor {
        Flavor::OpenAi => "max_completion_tokens",
        Flavor::OpenRouter => "max_tokens",
    };
    body.insert(max_key.into(), json!(max_output));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(schema) = request.response_schema {
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema",
                   "json_schema": {"name": "response", "schema": schema, "strict": true}}),
        );
    }
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if flavor == Flavor::OpenRouter {
        body.insert("usage".into(), json!({"include": true}));
    }
    Value::Object(body)
}

#[derive(Default)]
struct PendingCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

#[derive(Default)]
struct ChatDecoder {
    provider: &'static str,
    calls: BTreeMap<u64, PendingCall>,
    finish_reason: Option<String>,
    response_id: Option<String>,
    done: bool,
}

impl ChatDecoder {
    fn flush_calls(&mut self, out: &mut Vec<StreamEvent>) {
        for (index, call) in std::mem::take(&mut self.calls) {
            let id = call.id.unwrap_or_else(|| format!("call_{index}"));
            out.push(StreamEvent::ToolCall(ToolCall {
                id,
                name: call.name,
                arguments: call.arguments,
            }));
        }
    }

    fn stop(&mut self, out: &mut Vec<StreamEvent>) {
        self.flush_calls(out);
        self.done = true;
        let reason = match self.finish_reason.as_deref() {
            Some("stop") | None => StopReason::EndTurn,
            Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
            Some("length") => StopReason::MaxTokens,
            Some("content_filter") => StopReason::ContentFilter,
            Some(_) => StopReason::Other,
        };
        out.push(StreamEvent::Stop {
            reason,
            response_id: self.response_id.clone(),
        });
    }
}

impl Decoder for ChatDecoder {
    fn frame(&mut self, frame: Frame, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let Frame::Sse(event) = frame else {
            return Ok(());
        };
        if self.done {
            return Ok(());
        }
        let data = event.data.trim();
        if data == "[DONE]" {
            self.stop(out);
            return Ok(());
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| malformed(self.provider, data, &e))?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(classify_stream_error(self.provider, &chunk));
        }
        if self.response_id.is_none() {
            self.response_id = chunk.get("id").and_then(Value::as_str).map(str::to_owned);
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                out.push(StreamEvent::TextDelta(text.to_owned()));
            }
            let deltas = delta.get("tool_calls").and_then(Value::as_array);
            for (position, call) in deltas.into_iter().flatten().enumerate() {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64);
                let id = call.get("id").and_then(Value::as_str).map(str::to_owned);
                let name = call.pointer("/function/name").and_then(Value::as_str);
                let args = call
                    .pointer("/function/arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let pending = self.calls.entry(index).or_default();
                if id.is_some() {
                    pending.id.clone_from(&id);
                }
                if let Some(name) = name {
                    pending.name.push_str(name);
                }
                pending.arguments.push_str(args);
                out.push(StreamEvent::ToolCallDelta {
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    id,
                    name: name.map(str::to_owned),
                    arguments_delta: args.to_owned(),
                });
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                if reason == "error" {
                    let mut e = ModelError::new(
                        ModelErrorKind::Server,
                        format!("{}: the stream finished with an error", self.provider),
                    );
                    e.body = Some(chunk.to_string());
                    return Err(e);
                }
                self.finish_reason = Some(reason.to_owned());
                self.flush_calls(out);
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let get = |p: &str| usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            out.push(StreamEvent::Usage(Usage {
                input_tokens: get("/prompt_tokens"),
                output_tokens: get("/completion_tokens"),
                cache_read_tokens: get("/prompt_tokens_details/cached_tokens"),
                cache_write_tokens: get("/prompt_tokens_details/cache_write_tokens"),
            }));
            if let Some(cost) = usage.get("cost").and_then(Value::as_f64) {
                out.push(StreamEvent::Cost(cost));
            }
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        // Some OpenAI-compatible servers omit `[DONE]`; a finish reason is enough.
        if self.finish_reason.is_some() {
            self.stop(out);
            return Ok(());
        }
        Err(truncated(self.provider))
    }
}
