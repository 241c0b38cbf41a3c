//! Anthropic Messages API (`POST /v1/messages`, SSE streaming).
//!
//! The system prompt is the top-level `system` field; tool results are `tool_result`
//! blocks in a user message with `is_error` set for failed calls; thinking blocks arrive
//! as [`StreamEvent::ProviderItem`]s and are echoed back verbatim.

use std::collections::BTreeMap;

use keel_core::{
    Message, ModelError, ModelRequest, Part, Role, StopReason, StreamEvent, ToolCall, ToolChoice,
    Usage,
};
use reqwest::RequestBuilder;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

use crate::driver::{Decoder, Protocol, malformed, truncated};
use crate::errors::classify_stream_error;
use crate::framing::{Frame, Framing};

/// The API version header value.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
const PROVIDER: &str = "anthropic";

pub(crate) struct Anthropic {
    pub(crate) url: String,
    pub(crate) api_key: SecretString,
}

impl Protocol for Anthropic {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn headers(&self, builder: RequestBuilder) -> RequestBuilder {
        crate::redact::sensitive_header(builder, "x-api-key", self.api_key.expose_secret())
            .header("anthropic-version", ANTHROPIC_VERSION)
            .header(reqwest::header::ACCEPT, "text/event-stream")
    }

    fn body(&self, model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
        request_body(model, max_output, request)
    }

    fn framing(&self) -> Framing {
        Framing::Sse
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(AnthropicDecoder::default())
    }
}

/// The Messages API request body for a request.
pub fn request_body(model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
    let mut system = request.system.map(str::to_owned);
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in request.messages {
        let role = match message.role {
            Role::System => {
                let text = message.text();
                let s = system.get_or_insert_with(String::new);
                if !s.is_empty() {
                    s.push_str("\n\n");
                }
                s.push_str(&text);
                continue;
            }
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let blocks = blocks(message);
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(max_output));
    if let Some(system) = system {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match request.tool_choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
        };
        body.insert("tool_choice".into(), choice);
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

fn blocks(message: &Message) -> Vec<Value> {
    let mut out = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text } | Part::Summary { text, .. } => {
                if !text.is_empty() {
                    out.push(json!({"type": "text", "text": text}));
                }
            }
            Part::ToolCall(call) => {
                let input = match call.parse_arguments() {
                    Ok(value @ Value::Object(_)) => value,
                    _ => json!({}),
                };
                out.push(
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}),
                );
            }
            Part::ToolResult(result) => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": result.call_id,
                    "content": result.content,
                });
                if result.is_error()
                    && let Some(obj) = block.as_object_mut()
                {
                    obj.insert("is_error".into(), json!(true));
                }
                out.push(block);
            }
            Part::ProviderItem { provider, item } if provider == PROVIDER => out.push(item.clone()),
            Part::ProviderItem { .. } => {}
        }
    }
    out
}

enum Block {
    Text,
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        item: Value,
        thinking: String,
        signature: String,
    },
    Other,
}

#[derive(Default)]
struct AnthropicDecoder {
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    input_uncached: u64,
    stop_reason: Option<String>,
    response_id: Option<String>,
    tool_index: u32,
    done: bool,
}

impl AnthropicDecoder {
    fn usage_from(&mut self, usage: &Value) -> Option<Usage> {
        let get = |k: &str| usage.get(k).and_then(Value::as_u64);
        if let Some(input) = get("input_tokens") {
            self.input_uncached = input;
        }
        if let Some(read) = get("cache_read_input_tokens") {
            self.usage.cache_read_tokens = read;
        }
        if let Some(write) = get("cache_creation_input_tokens") {
            self.usage.cache_write_tokens = write;
        }
        if let Some(output) = get("output_tokens") {
            self.usage.output_tokens = output;
        }
        self.usage.input_tokens = self
            .input_uncached
            .saturating_add(self.usage.cache_read_tokens)
            .saturating_add(self.usage.cache_write_tokens);
        Some(self.usage)
    }
}

fn stop_reason(reason: Option<&str>) -> StopReason {
    match reason {
        Some("end_turn") | None => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") | Some("model_context_window_exceeded") => StopReason::MaxTokens,
        Some("stop_sequence") => StopReason::StopSequence,
        Some("refusal") => StopReason::ContentFilter,
        Some(_) => StopReason::Other,
    }
}

impl Decoder for AnthropicDecoder {
    fn frame(&mut self, frame: Frame, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let Frame::Sse(event) = frame else {
            return Ok(());
        };
        if self.done {
            return Ok(());
        }
        let data: Value =
            serde_json::from_str(&event.data).map_err(|e| malformed(PROVIDER, &event.data, &e))?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                let message = data.get("message").unwrap_or(&Value::Null);
                self.response_id = message.get("id").and_then(Value::as_str).map(str::to_owned);
                if let Some(usage) = message.get("usage").and_then(|u| self.usage_from(u)) {
                    out.push(StreamEvent::Usage(usage));
                }
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let entry = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(text) = block.get("text").and_then(Value::as_str)
                            && !text.is_empty()
                        {
                            out.push(StreamEvent::TextDelta(text.to_owned()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => {
                        let id = block
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        let name = block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        out.push(StreamEvent::ToolCallDelta {
                            index: self.tool_index,
                            id: Some(id.clone()),
                            name: Some(name.clone()),
                            arguments_delta: String::new(),
                        });
                        Block::Tool {
                            id,
                            name,
                            json: String::new(),
                        }
                    }
                    Some("thinking") => Block::Thinking {
                        item: block.clone(),
                        thinking: block
                            .get("thinking")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        signature: block
                            .get("signature")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    },
                    Some("redacted_thinking") => {
                        out.push(StreamEvent::ProviderItem {
                            provider: PROVIDER.into(),
                            item: block.clone(),
                        });
                        Block::Other
                    }
                    _ => Block::Other,
                };
                self.blocks.insert(index, entry);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let text = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or_default();
                match (
                    delta.get("type").and_then(Value::as_str),
                    self.blocks.get_mut(&index),
                ) {
                    (Some("text_delta"), _) => {
                        out.push(StreamEvent::TextDelta(text("text").to_owned()));
                    }
                    (Some("input_json_delta"), Some(Block::Tool { json, .. })) => {
                        let piece = text("partial_json");
                        json.push_str(piece);
                        out.push(StreamEvent::ToolCallDelta {
                            index: self.tool_index,
                            id: None,
                            name: None,
                            arguments_delta: piece.to_owned(),
                        });
                    }
                    (Some("thinking_delta"), Some(Block::Thinking { thinking, .. })) => {
                        thinking.push_str(text("thinking"));
                    }
                    (Some("signature_delta"), Some(Block::Thinking { signature, .. })) => {
                        signature.push_str(text("signature"));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => match self.blocks.remove(&index) {
                Some(Block::Tool { id, name, json }) => {
                    let arguments = if json.trim().is_empty() {
                        "{}".to_owned()
                    } else {
                        json
                    };
                    out.push(StreamEvent::ToolCall(ToolCall {
                        id,
                        name,
                        arguments,
                    }));
                    self.tool_index = self.tool_index.saturating_add(1);
                }
                Some(Block::Thinking {
                    mut item,
                    thinking,
                    signature,
                }) => {
                    if let Some(obj) = item.as_object_mut() {
                        obj.insert("thinking".into(), json!(thinking));
                        obj.insert("signature".into(), json!(signature));
                    }
                    out.push(StreamEvent::ProviderItem {
                        provider: PROVIDER.into(),
                        item,
                    });
                }
                _ => {}
            },
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = data.get("usage").and_then(|u| self.usage_from(u)) {
                    out.push(StreamEvent::Usage(usage));
                }
            }
            "message_stop" => {
                self.done = true;
                out.push(StreamEvent::Stop {
                    reason: stop_reason(self.stop_reason.as_deref()),
                    response_id: self.response_id.clone(),
                });
            }
            "error" => return Err(classify_stream_error(PROVIDER, &data)),
            _ => {} // `ping` and event types added later are ignored
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
