//! Shared rendering: the protocol enum, the per-request context, text chunking, usage
//! defaults, and how faults (noise, malformed chunks, drops, mid-stream errors) are woven
//! into a rendered stream.

use keel_core::Usage;
use serde_json::Value;

use super::script::{MockError, MockStreamError, MockTurn};
use super::{anthropic, ollama, openai, responses};

/// The wire protocol an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    OpenAi,
    /// OpenRouter's flavour of Chat Completions (path `/api/v1/...` or an `X-Title` /
    /// `HTTP-Referer` header).
    OpenRouter,
    /// OpenAI Responses (`POST /v1/responses`).
    OpenAiResponses,
    /// Ollama native chat (`POST /api/chat`).
    Ollama,
}

impl Protocol {
    /// The name used in the request log (`anthropic`, `openai`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAi => "openai",
            Self::OpenRouter => "openrouter",
            Self::OpenAiResponses => "openai-responses",
            Self::Ollama => "ollama",
        }
    }

    /// The response content type of a streamed answer.
    pub fn stream_content_type(self) -> &'static str {
        match self {
            Self::Ollama => "application/x-ndjson",
            _ => "text/event-stream",
        }
    }
}

/// Everything a renderer needs about one request.
pub struct Ctx<'a> {
    /// 1-based request number (used in ids).
    pub seq: usize,
    /// The turn being rendered.
    pub turn: &'a MockTurn,
    /// The model named in the request.
    pub model: String,
    /// Usage to report.
    pub usage: Usage,
    /// The parsed request body.
    pub body: &'a Value,
}

impl Ctx<'_> {
    /// The id of tool call `index`.
    pub fn call_id(&self, prefix: &str, index: usize) -> String {
        self.turn
            .tool_calls
            .get(index)
            .and_then(|c| c.id.clone())
            .unwrap_or_else(|| format!("{prefix}_mock_{}_{index}", self.seq))
    }
}

/// Usage to report: the script's, or an estimate from the sizes involved.
pub fn usage_for(turn: &MockTurn, raw_body_len: usize) -> Usage {
    if let Some(usage) = turn.usage {
        return usage;
    }
    let mut output = turn.text.as_deref().map_or(0, str::len);
    for call in &turn.tool_calls {
        output = output
            .saturating_add(call.name.len())
            .saturating_add(call.arguments_text().len());
    }
    Usage {
        input_tokens: (raw_body_len as u64).div_ceil(4).max(1),
        output_tokens: (output as u64).div_ceil(4).saturating_add(1),
        cache_read_tokens: 0,
        cache_write_tokens: 0,
    }
}

/// Splits text into small pieces (about two words each) the way models stream it.
pub fn chunk_text(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut words = 0;
    for ch in text.chars() {
        current.push(ch);
        if ch.is_whitespace() {
            words += 1;
            if words == 2 {
                pieces.push(std::mem::take(&mut current));
                words = 0;
            }
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// Splits a string in two at a char boundary near the middle (for argument deltas).
pub fn halves(text: &str) -> (String, String) {
    let mut mid = text.len() / 2;
    while mid > 0 && !text.is_char_boundary(mid) {
        mid -= 1;
    }
    let (a, b) = text.split_at(mid);
    (a.to_owned(), b.to_owned())
}

/// One SSE frame.
pub fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// A rendered streamed answer: the content frames and the frames that finish it.
pub struct Rendered {
    /// Start and content frames.
    pub head: Vec<String>,
    /// Stop, usage and end-of-stream frames.
    pub tail: Vec<String>,
}

/// Renders a turn as stream frames in a protocol.
pub fn render_stream(protocol: Protocol, ctx: &Ctx<'_>) -> Rendered {
    match protocol {
        Protocol::Anthropic => anthropic::stream(ctx),
        Protocol::OpenAi | Protocol::OpenRouter => openai::stream(ctx, protocol),
        Protocol::OpenAiResponses => responses::stream(ctx),
        Protocol::Ollama => ollama::stream(ctx),
    }
}

/// The frame of a mid-stream error.
pub fn render_stream_error(protocol: Protocol, ctx: &Ctx<'_>, error: &MockStreamError) -> String {
    match protocol {
        Protocol::Anthropic => anthropic::stream_error(error),
        Protocol::OpenAi | Protocol::OpenRouter => openai::stream_error(ctx, protocol, error),
        Protocol::OpenAiResponses => responses::stream_error(ctx, error),
        Protocol::Ollama => ollama::stream_error(error),
    }
}

/// The body of an HTTP error, in the protocol's real shape.
pub fn render_error_body(protocol: Protocol, seq: usize, error: &MockError) -> Value {
    match protocol {
        Protocol::Anthropic => anthropic::error_body(seq, error),
        Protocol::OpenAi | Protocol::OpenAiResponses => openai::error_body(error),
        Protocol::OpenRouter => openai::openrouter_error_body(error),
        Protocol::Ollama => ollama::error_body(error),
    }
}

/// A frame that is not valid JSON.
pub fn malformed_frame(protocol: Protocol) -> String {
    match protocol {
        Protocol::Ollama => "{\"model\": \"mock\", \"message\": {\"content\": \"trunc\n".to_owned(),
        _ => "data: {\"malformed\": tru\n\n".to_owned(),
    }
}

/// Frames a client must ignore: keep-alive comments, pings, unknown event types.
pub fn noise(protocol: Protocol, keepalive: bool, pings: bool, unknown: bool) -> Vec<String> {
    let mut out = Vec::new();
    if keepalive || (pings && protocol != Protocol::Anthropic) {
        out.push(match protocol {
            Protocol::OpenRouter => ": OPENROUTER PROCESSING\n\n".to_owned(),
            Protocol::Ollama => "\n".to_owned(),
            _ => ": keep-alive\n\n".to_owned(),
        });
    }
    if pings && protocol == Protocol::Anthropic {
        out.push("event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned());
    }
    if unknown {
        out.push(match protocol {
            Protocol::Anthropic => {
                "event: future_event\ndata: {\"type\": \"future_event\", \"x\": 1}\n\n".to_owned()
            }
            Protocol::OpenAiResponses => {
                "event: response.future_event\ndata: {\"type\": \"response.future_event\"}\n\n"
                    .to_owned()
            }
            Protocol::OpenAi | Protocol::OpenRouter => {
                "event: future_event\ndata: {\"object\": \"chat.completion.chunk\", \"choices\": [], \"future_field\": true}\n\n".to_owned()
            }
            Protocol::Ollama => {
                "{\"model\": \"mock\", \"message\": {\"role\": \"assistant\", \"content\": \"\"}, \"future_field\": 1, \"done\": false}\n".to_owned()
            }
        });
    }
    out
}

/// The frames to send, with every fault of the turn applied, and whether to drop the
/// connection after them.
pub fn frames_with_faults(protocol: Protocol, ctx: &Ctx<'_>) -> (Vec<String>, bool) {
    let faults = &ctx.turn.faults;
    let rendered = render_stream(protocol, ctx);
    let noise = noise(
        protocol,
        faults.keepalive,
        faults.pings,
        faults.unknown_events,
    );
    let mut frames = Vec::new();
    if protocol == Protocol::OpenRouter {
        // OpenRouter always opens with a processing comment while it picks a provider.
        frames.push(": OPENROUTER PROCESSING\n\n".to_owned());
    }
    let middle = rendered.head.len() / 2;
    for (i, frame) in rendered.head.into_iter().enumerate() {
        if i == 1 || (i == middle && middle > 1) {
            frames.extend(noise.iter().cloned());
        }
        frames.push(frame);
    }
    match &faults.stream_error {
        Some(error) => frames.push(render_stream_error(protocol, ctx, error)),
        None => {
            frames.extend(noise.iter().cloned());
            frames.extend(rendered.tail);
        }
    }
    if let Some(after) = faults.malformed_after {
        let at = after.min(frames.len());
        frames.insert(at, malformed_frame(protocol));
    }
    let mut drop = false;
    if let Some(after) = faults.drop_after {
        frames.truncate(after);
        drop = true;
    }
    (frames, drop)
}
