//! The mock LLM script: a list of turns, each answered in whatever protocol the endpoint
//! called speaks. The format is documented in `docs/mock-llm.md`.

use std::path::Path;

use keel_core::{ModelErrorKind, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chaos::MockChaos;

/// A whole script.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockScript {
    /// The turns, consumed one per model request, in order.
    pub turns: Vec<MockTurn>,
    /// What happens once every turn has been used.
    pub when_exhausted: WhenExhausted,
    /// How a request picks its turn.
    pub turn_by: TurnBy,
    /// Seeded random faults injected on top of the turns (none by default).
    pub chaos: Option<MockChaos>,
}

/// How a request picks the turn that answers it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnBy {
    /// Each request takes the next turn of one server-wide sequence (default).
    #[default]
    Sequence,
    /// A request gets turn N when its conversation already holds N assistant answers:
    /// every conversation follows the script from the start on its own, whatever the
    /// interleaving, and a request repeated after a crash gets the same turn again.
    Conversation,
}

/// What the server does after the last turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenExhausted {
    /// Answer with HTTP 500 naming the problem (default: a test should script every call).
    #[default]
    Error,
    /// Replay the last turn forever.
    RepeatLast,
    /// Start again from the first turn.
    Cycle,
}

/// One scripted answer (or failure).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockTurn {
    /// Answer text, streamed in small pieces.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls, in order (several = parallel calls in one answer).
    #[serde(default)]
    pub tool_calls: Vec<MockToolCall>,
    /// A reasoning summary: an Anthropic `thinking` block or a Responses `reasoning` item.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// Usage to report (default: estimated from the request and answer sizes).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Cost to report in OpenRouter's `usage.cost`.
    #[serde(default)]
    pub cost: Option<f64>,
    /// Stop reason to report instead of the natural one: `max_tokens`.
    #[serde(default)]
    pub stop: Option<MockStop>,
    /// Answer with an HTTP error instead (each protocol's real error body shape).
    #[serde(default)]
    pub error: Option<MockError>,
    /// Wait this long before answering (alias of `faults.latency_ms`).
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Fault injection.
    #[serde(default)]
    pub faults: MockFaults,
}

/// A scripted stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MockStop {
    /// The output token limit was hit.
    MaxTokens,
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockToolCall {
    /// Call id (default: a protocol-style id such as `toolu_mock_1_0`).
    #[serde(default)]
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON object).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Arguments as raw text, sent verbatim (may be invalid JSON on purpose; Ollama, whose
    /// arguments are objects, gets `{}` when this does not parse).
    #[serde(default)]
    pub arguments_raw: Option<String>,
}

impl MockToolCall {
    /// The argument JSON text.
    pub fn arguments_text(&self) -> String {
        match (&self.arguments_raw, &self.arguments) {
            (Some(raw), _) => raw.clone(),
            (None, Some(value)) => value.to_string(),
            (None, None) => "{}".to_owned(),
        }
    }

    /// The arguments as a JSON value (an object when they do not parse).
    pub fn arguments_value(&self) -> Value {
        match (&self.arguments_raw, &self.arguments) {
            (Some(raw), _) => {
                serde_json::from_str(raw).unwrap_or_else(|_| Value::Object(Default::default()))
            }
            (None, Some(value)) => value.clone(),
            (None, None) => Value::Object(Default::default()),
        }
    }
}

/// A scripted HTTP error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockError {
    /// HTTP status (default from `kind`, else 500).
    #[serde(default)]
    pub status: Option<u16>,
    /// A Keel error class to imitate (`rate_limited`, `overloaded`, `quota_exceeded`, …),
    /// used to pick the status and the provider's error type when they are not given.
    #[serde(default)]
    pub kind: Option<ModelErrorKind>,
    /// The provider error type (default: the provider's usual type for the status).
    #[serde(default, rename = "type")]
    pub error_type: Option<String>,
    /// The error message.
    #[serde(default)]
    pub message: Option<String>,
    /// `retry-after` header, in seconds.
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// `retry-after-ms` header.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// Make it a spend/quota limit (OpenAI `insufficient_quota`, etc.).
    #[serde(default)]
    pub quota: bool,
}

impl MockError {
    /// The HTTP status to send.
    pub fn status(&self) -> u16 {
        if let Some(status) = self.status {
            return status;
        }
        match self.kind {
            Some(ModelErrorKind::Authentication) => 401,
            Some(ModelErrorKind::Permission) => 403,
            Some(ModelErrorKind::InvalidRequest | ModelErrorKind::ContextOverflow) => 400,
            Some(ModelErrorKind::NotFound) => 404,
            Some(ModelErrorKind::RateLimited | ModelErrorKind::QuotaExceeded) => 429,
            Some(ModelErrorKind::Overloaded) => 529,
            Some(ModelErrorKind::Timeout) => 408,
            _ => 500,
        }
    }

    /// Whether this is a spend/quota error.
    pub fn is_quota(&self) -> bool {
        self.quota || self.kind == Some(ModelErrorKind::QuotaExceeded)
    }

    /// The message to send.
    pub fn message(&self) -> String {
        if let Some(message) = &self.message {
            return message.clone();
        }
        if self.is_quota() {
            return "You exceeded your current quota: the spend limit was reached.".to_owned();
        }
        if self.kind == Some(ModelErrorKind::ContextOverflow) {
            return "prompt is too long: the maximum context length was exceeded".to_owned();
        }
        match self.status() {
            400 => "invalid request (mock)",
            401 => "invalid x-api-key (mock)",
            403 => "your API key does not have permission to use this resource (mock)",
            404 => "model not found (mock)",
            408 => "request timed out (mock)",
            429 => "rate limit exceeded (mock)",
            503 | 529 => "overloaded (mock)",
            _ => "internal server error (mock)",
        }
        .to_owned()
    }
}

/// A scripted mid-stream error (sent after the answer's content, instead of its end).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockStreamError {
    /// Provider error type (default `overloaded_error` / `server_error`).
    #[serde(default, rename = "type")]
    pub error_type: Option<String>,
    /// Message.
    #[serde(default)]
    pub message: Option<String>,
}

/// Faults injected into a streamed answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockFaults {
    /// Wait before sending the response headers.
    #[serde(default)]
    pub latency_ms: u64,
    /// Wait between stream frames.
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Drop the connection after this many frames.
    #[serde(default)]
    pub drop_after: Option<usize>,
    /// Insert a chunk that is not valid JSON after this many frames.
    #[serde(default)]
    pub malformed_after: Option<usize>,
    /// Send a protocol-level error after the content instead of finishing.
    #[serde(default)]
    pub stream_error: Option<MockStreamError>,
    /// Interleave keep-alive comments (`: keep-alive`, `: OPENROUTER PROCESSING`).
    #[serde(default)]
    pub keepalive: bool,
    /// Interleave `ping` events (Anthropic; keep-alive comments elsewhere).
    #[serde(default)]
    pub pings: bool,
    /// Interleave event types the client does not know.
    #[serde(default)]
    pub unknown_events: bool,
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum MockScriptError {
    /// The file could not be read.
    #[error("cannot read mock script {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid script.
    #[error("mock script {path} is invalid: {source} (see docs/mock-llm.md for the format)")]
    Parse {
        /// The path.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Turns(Vec<MockTurn>),
    Object {
        #[serde(alias = "steps")]
        turns: Vec<MockTurn>,
        #[serde(default)]
        when_exhausted: WhenExhausted,
        #[serde(default)]
        turn_by: TurnBy,
        #[serde(default)]
        chaos: Option<MockChaos>,
    },
}

impl<'de> Deserialize<'de> for MockScript {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match ScriptFile::deserialize(d)? {
            ScriptFile::Turns(turns) => Self::new(turns),
            ScriptFile::Object {
                turns,
                when_exhausted,
                turn_by,
                chaos,
            } => Self {
                turns,
                when_exhausted,
                turn_by,
                chaos,
            },
        })
    }
}

impl MockScript {
    /// A script of these turns.
    pub fn new(turns: Vec<MockTurn>) -> Self {
        Self {
            turns,
            when_exhausted: WhenExhausted::Error,
            turn_by: TurnBy::Sequence,
            chaos: None,
        }
    }

    /// Parses a script from JSON text: a list of turns, or `{"turns": [...]}`.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Loads a script file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, MockScriptError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| MockScriptError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_json(&text).map_err(|source| MockScriptError::Parse {
            path: shown,
            source,
        })
    }

    /// Sets how a request picks its turn.
    pub fn turn_by(mut self, mode: TurnBy) -> Self {
        self.turn_by = mode;
        self
    }

    /// Sets what happens after the last turn.
    pub fn when_exhausted(mut self, mode: WhenExhausted) -> Self {
        self.when_exhausted = mode;
        self
    }

    /// Injects seeded random faults on top of the turns.
    pub fn with_chaos(mut self, chaos: MockChaos) -> Self {
        self.chaos = Some(chaos);
        self
    }
}

impl MockTurn {
    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// One tool call.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Self::default().with_tool_call(name, arguments)
    }

    /// Adds a tool call.
    pub fn with_tool_call(mut self, name: impl Into<String>, arguments: Value) -> Self {
        self.tool_calls.push(MockToolCall {
            id: None,
            name: name.into(),
            arguments: Some(arguments),
            arguments_raw: None,
        });
        self
    }

    /// An HTTP error with this status.
    pub fn http_error(status: u16) -> Self {
        Self {
            error: Some(MockError {
                status: Some(status),
                ..MockError::default()
            }),
            ..Self::default()
        }
    }

    /// Sets the reported usage.
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.usage = Some(Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        });
        self
    }

    /// Sets the faults.
    pub fn with_faults(mut self, faults: MockFaults) -> Self {
        self.faults = faults;
        self
    }
}

/// How many assistant answers a request's conversation already holds, in any protocol:
/// `messages[].role == "assistant"` (Anthropic, OpenAI Chat, OpenRouter, Ollama), or for
/// Responses each run of consecutive output items (assistant messages, function calls,
/// reasoning) in `input`.
pub fn assistant_answers(body: &Value) -> usize {
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        return messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .count();
    }
    let Some(items) = body.get("input").and_then(Value::as_array) else {
        return 0;
    };
    let is_output = |item: &Value| {
        item.get("role").and_then(Value::as_str) == Some("assistant")
            || matches!(
                item.get("type").and_then(Value::as_str),
                Some("function_call" | "reasoning")
            )
    };
    let mut answers = 0;
    let mut in_answer = false;
    for item in items {
        let output = is_output(item);
        if output && !in_answer {
            answers += 1;
        }
        in_answer = output;
    }
    answers
}
