//! OpenAI Responses API (`POST /v1/responses`, SSE).
//!
//! The system prompt is `instructions`; the conversation is a list of input items
//! (messages, `function_call`, `function_call_output`). Requests are stateless
//! (`store: false`), so reasoning items are kept as [`StreamEvent::ProviderItem`]s and
//! echoed back verbatim on the next request. The stateful mode (`store: true` and
//! `previous_response_id`) is [`crate::StoredResponses`]'s, through
//! [`stored_request_body`].

use keel_core::{
    ModelError, ModelRequest, Part, Role, StopReason, StreamEvent, ToolCall, ToolChoice, Usage,
};
use reqwest::RequestBuilder;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};

use crate::driver::{Decoder, Protocol, malformed, truncated};
use crate::errors::classify_stream_error;
use crate::framing::{Frame, Framing};

const PROVIDER: &str = "openai-responses";

pub(crate) struct OpenAiResponses {
    pub(crate) url: String,
    pub(crate) api_key: SecretString,
}

impl Protocol for OpenAiResponses {
    fn provider(&self) -> &'static str {
        PROVIDER
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn headers(&self, builder: RequestBuilder) -> RequestBuilder {
        builder
            .bearer_auth(self.api_key.expose_secret())
            .header(reqwest::header::ACCEPT, "text/event-stream")
    }

    fn body(&self, model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
        request_body(model, max_output, request)
    }

    fn framing(&self) -> Framing {
        Framing::Sse
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ResponsesDecoder::default())
    }
}

fn is_reasoning_model(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model);
    ["o1", "o3", "o4", "gpt-5", "gpt-oss"]
        .iter()
        .any(|p| name.starts_with(p))
}

fn message_item(role: &str, text_type: &str, text: &str) -> Value {
    json!({"type": "message", "role": role, "content": [{"type": text_type, "text": text}]})
}

/// The Responses API request body.
pub(crate) fn request_body(model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value {
    let mut input = Vec::new();
    for message in request.messages {
        for part in &message.parts {
            match (message.role, part) {
                (role, Part::Text { text } | Part::Summary { text, .. }) => {
                    if text.is_empty() {
                        continue;
                    }
                    input.push(match role {
                        Role::Assistant => message_item("assistant", "output_text", text),
                        Role::System => message_item("system", "input_text", text),
                        Role::User | Role::Tool => message_item("user", "input_text", text),
                    });
                }
                (_, Part::ToolCall(c)) => input.push(json!({
                    "type": "function_call", "call_id": c.id, "name": c.name,
                    "arguments": c.arguments})),
                (_, Part::ToolResult(r)) => input.push(json!({
                    "type": "function_call_output", "call_id": r.call_id, "output": r.content})),
                (_, Part::ProviderItem { provider, item }) if provider == PROVIDER => {
                    input.push(item.clone());
                }
                (_, Part::ProviderItem { .. }) => {}
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    if let Some(system) = request.system {
        body.insert("instructions".into(), json!(system));
    }
    body.insert("input".into(), Value::Array(input));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.input_schema, "strict": false})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match request.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool(name) => json!({"type": "function", "name": name}),
        };
        body.insert("tool_choice".into(), choice);
    }
    body.insert("max_output_tokens".into(), json!(max_output));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(schema) = request.response_schema {
        body.insert(
            "text".into(),
            json!({"format": {"type": "json_schema", "name": "response", "schema": schema,
                              "strict": true}}),
        );
    }
    body.insert("store".into(), json!(false));
    if is_reasoning_model(model) {
        body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    }
    body.insert("stream".into(), json!(true));
    Value::Object(body)
}

/// The request body of the API's stateful mode ([`crate::StoredResponses`]): the
/// provider stores the response (`store: true`) and `request.messages` are only what
/// follows `previous_response_id`, the conversation the provider already holds.
/// Reasoning is kept by the provider, so no encrypted reasoning is asked for.
pub(crate) fn stored_request_body(
    model: &str,
    max_output: u32,
    request: &ModelRequest<'_>,
    previous_response_id: Option<&str>,
) -> Value {
    let mut body = request_body(model, max_output, request);
    if let Some(fields) = body.as_object_mut() {
        fields.insert("store".into(), json!(true));
        fields.remove("include");
        if let Some(previous) = previous_response_id {
            fields.insert("previous_response_id".into(), json!(previous));
        }
    }
    body
}

#[derive(Default)]
struct ResponsesDecoder {
    response_id: Option<String>,
    calls: u32,
    done: bool,
}

fn usage_of(response: &Value) -> Option<Usage> {
    let usage = response.get("usage").filter(|u| u.is_object())?;
    let get = |p: &str| usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: get("/input_tokens"),
        output_tokens: get("/output_tokens"),
        cache_read_tokens: get("/input_tokens_details/cached_tokens"),
        cache_write_tokens: 0,
    })
}

impl Decoder for ResponsesDecoder {
    fn frame(&mut self, frame: Frame, out: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        let Frame::Sse(event) = frame else {
            return Ok(());
        };
        let data = event.data.trim();
        if self.done || data == "[DONE]" {
            return Ok(());
        }
        let value: Value = serde_json::from_str(data).map_err(|e| malformed(PROVIDER, data, &e))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        let index = value
            .get("output_index")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let text = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match kind {
            "response.created" | "response.in_progress" => {
                if let Some(id) = value.pointer("/response/id").and_then(Value::as_str) {
                    self.response_id = Some(id.to_owned());
                }
            }
            "response.output_text.delta" => out.push(StreamEvent::TextDelta(text("delta"))),
            "response.output_item.added" => {
                let item = value.get("item").unwrap_or(&Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    out.push(StreamEvent::ToolCallDelta {
                        index,
                        id: item
                            .get("call_id")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        name: item.get("name").and_then(Value::as_str).map(str::to_owned),
                        arguments_delta: String::new(),
                    });
                }
            }
            "response.function_call_arguments.delta" => out.push(StreamEvent::ToolCallDelta {
                index,
                id: None,
                name: None,
                arguments_delta: text("delta"),
            }),
            "response.output_item.done" => {
                let item = value.get("item").unwrap_or(&Value::Null);
                let field = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => {
                        self.calls = self.calls.saturating_add(1);
                        let arguments = field("arguments");
                        out.push(StreamEvent::ToolCall(ToolCall {
                            id: field("call_id"),
                            name: field("name"),
                            arguments: if arguments.trim().is_empty() {
                                "{}".into()
                            } else {
                                arguments
                            },
                        }));
                    }
                    Some("reasoning") => out.push(StreamEvent::ProviderItem {
                        provider: PROVIDER.into(),
                        item: item.clone(),
                    }),
                    _ => {}
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = value.get("response").unwrap_or(&Value::Null);
                if let Some(usage) = usage_of(response) {
                    out.push(StreamEvent::Usage(usage));
                }
                let reason = if kind == "response.incomplete" {
                    match response
                        .pointer("/incomplete_details/reason")
                        .and_then(Value::as_str)
                    {
                        Some("max_output_tokens") => StopReason::MaxTokens,
                        Some("content_filter") => StopReason::ContentFilter,
                        _ => StopReason::Other,
                    }
                } else if self.calls > 0 {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                };
                let id = response
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.done = true;
                out.push(StreamEvent::Stop {
                    reason,
                    response_id: id.or(self.response_id.clone()),
                });
            }
            "response.failed" => {
                let error = value
                    .pointer("/response/error")
                    .cloned()
                    .unwrap_or(Value::Null);
                return Err(classify_stream_error(PROVIDER, &json!({"error": error})));
            }
            "error" => return Err(classify_stream_error(PROVIDER, &value)),
            _ => {}
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
