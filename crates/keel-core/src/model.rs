//! The [`Model`] trait: a streaming-first interface every provider adapter implements, the
//! request and response shapes, and the classified [`ModelError`].

use std::fmt;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, Part, Role, ToolCall, Usage};
use crate::tool::ToolDefinition;

/// How the model may use tools on this request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "mode", content = "name")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must not call tools.
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this tool.
    Tool(String),
}

/// One request to a model. Borrowed so the runner never clones the conversation per step.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The system prompt (instructions plus the tool guidance section).
    pub system: Option<&'a str>,
    /// The conversation (no system messages).
    pub messages: &'a [Message],
    /// Tools offered.
    pub tools: &'a [ToolDefinition],
    /// Tool choice.
    pub tool_choice: &'a ToolChoice,
    /// Sampling temperature; omitted when `None` (some models reject it).
    pub temperature: Option<f32>,
    /// Nucleus sampling; omitted when `None`.
    pub top_p: Option<f32>,
    /// Maximum output tokens.
    pub max_output_tokens: Option<u32>,
    /// A JSON Schema the answer must follow (structured output), when requested.
    pub response_schema: Option<&'a Value>,
    /// Offered tools the runtime would refuse if called now (call rules whose
    /// preconditions no call meets yet, or whose limit is spent). They stay in `tools`, so
    /// the prompt (and a provider's prompt cache) does not change from turn to turn; a
    /// provider that constrains decoding with a grammar leaves them out of it, and the
    /// others may ignore this (the runtime refuses such a call with a message either way).
    pub withheld_tools: &'a [String],
    /// Offered tools the agent's call rules still expect in this run, in their declared
    /// order ([`crate::expected_tools`]: the reads a rule's tool must come after, then that
    /// tool). A provider that decides for a small model whether to call a tool
    /// (keel-local's eager tools) asks for a call among these while there are any, and
    /// for an answer after tool results once there are none; the others ignore it.
    pub expected_tools: &'a [String],
    /// Arguments of offered tools that the call rules require to cite the run's tool
    /// results (`grounded`), with what counts as a citation there
    /// ([`crate::grounded_arguments`]). The runner sends them for a tool once a call of it
    /// failed in the run (typically refused for citing nothing), so a model's own first
    /// wording stays free. A provider that constrains decoding with a grammar (keel-local)
    /// makes each string there open with one of the citations; the others ignore it (the
    /// runtime refuses a call citing nothing with a message either way).
    pub grounded_arguments: &'a [crate::GroundedArgument],
}

impl<'a> ModelRequest<'a> {
    /// A request with defaults for everything but the messages.
    pub fn new(messages: &'a [Message]) -> Self {
        static AUTO: ToolChoice = ToolChoice::Auto;
        Self {
            system: None,
            messages,
            tools: &[],
            tool_choice: &AUTO,
            temperature: None,
            top_p: None,
            max_output_tokens: None,
            response_schema: None,
            withheld_tools: &[],
            expected_tools: &[],
            grounded_arguments: &[],
        }
    }
}

/// What a model can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCapabilities {
    /// Native tool calling.
    pub tool_calling: bool,
    /// Several tool calls in one answer.
    pub parallel_tool_calls: bool,
    /// Token streaming.
    pub streaming: bool,
    /// JSON Schema constrained answers.
    pub structured_output: bool,
    /// Tool calls are guaranteed to parse (grammar-constrained decoding).
    pub grammar_constrained_tools: bool,
    /// Context window in tokens.
    pub context_window: u32,
    /// Maximum output tokens.
    pub max_output_tokens: u32,
}

impl Default for ModelCapabilities {
    fn default() -> Self {
        Self {
            tool_calling: true,
            parallel_tool_calls: true,
            streaming: true,
            structured_output: false,
            grammar_constrained_tools: false,
            context_window: 128_000,
            max_output_tokens: 4_096,
        }
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    #[default]
    EndTurn,
    /// The model wants tool results.
    ToolUse,
    /// The output token limit was hit.
    MaxTokens,
    /// A stop sequence was produced.
    StopSequence,
    /// The provider filtered the content.
    ContentFilter,
    /// Something else.
    Other,
}

/// An incremental piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// More answer text.
    TextDelta(String),
    /// A fragment of a tool call being generated (for live display).
    ToolCallDelta {
        /// Position of the call within the answer.
        index: u32,
        /// Call id, on the first fragment.
        id: Option<String>,
        /// Tool name, on the first fragment.
        name: Option<String>,
        /// More argument JSON text.
        arguments_delta: String,
    },
    /// A complete tool call. The assembled answer contains exactly these.
    ToolCall(ToolCall),
    /// An opaque provider item to echo back (e.g. a reasoning block).
    ProviderItem {
        /// Provider name.
        provider: String,
        /// The item.
        item: Value,
    },
    /// Usage so far (cumulative; the last one wins).
    Usage(Usage),
    /// Cost in US dollars reported by the provider.
    Cost(f64),
    /// The answer is complete.
    Stop {
        /// Why.
        reason: StopReason,
        /// Provider response id.
        response_id: Option<String>,
    },
    /// A retryable failure happened; the adapter waits `wait_ms` and tries again.
    Retry {
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Its class.
        error: ModelErrorKind,
        /// Wait before the next attempt.
        wait_ms: u64,
        /// What went wrong.
        message: String,
    },
    /// Output already streamed is void: the stream starts again from scratch.
    Restart,
}

impl StreamEvent {
    /// Whether this fragment is part of the answer itself (text, a tool call or a
    /// provider item) rather than bookkeeping (usage, cost, stop, retry, restart): the
    /// first such fragment marks the time to first token.
    pub fn is_answer_content(&self) -> bool {
        match self {
            Self::TextDelta(text) => !text.is_empty(),
            Self::ToolCallDelta { .. } | Self::ToolCall(_) | Self::ProviderItem { .. } => true,
            Self::Usage(_)
            | Self::Cost(_)
            | Self::Stop { .. }
            | Self::Retry { .. }
            | Self::Restart => false,
        }
    }
}

/// A complete answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message.
    pub message: Message,
    /// Token usage.
    pub usage: Usage,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Provider response id.
    pub response_id: Option<String>,
    /// Cost, when known.
    pub cost_usd: Option<f64>,
    /// Retries that happened while producing it.
    pub retries: u32,
}

/// Builds a [`ModelResponse`] from stream events, honouring [`StreamEvent::Restart`].
#[derive(Debug, Default)]
pub struct ResponseAssembler {
    parts: Vec<Part>,
    usage: Usage,
    stop_reason: Option<StopReason>,
    response_id: Option<String>,
    cost_usd: Option<f64>,
    retries: u32,
}

impl ResponseAssembler {
    /// A new, empty assembler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one event.
    pub fn push(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::TextDelta(delta) => {
                if let Some(Part::Text { text }) = self.parts.last_mut() {
                    text.push_str(delta);
                } else if !delta.is_empty() {
                    self.parts.push(Part::Text {
                        text: delta.clone(),
                    });
                }
            }
            StreamEvent::ToolCallDelta { .. } => {}
            StreamEvent::ToolCall(call) => self.parts.push(Part::ToolCall(call.clone())),
            StreamEvent::ProviderItem { provider, item } => self.parts.push(Part::ProviderItem {
                provider: provider.clone(),
                item: item.clone(),
            }),
            StreamEvent::Usage(usage) => self.usage = *usage,
            StreamEvent::Cost(cost) => self.cost_usd = Some(*cost),
            StreamEvent::Stop {
                reason,
                response_id,
            } => {
                self.stop_reason = Some(*reason);
                if response_id.is_some() {
                    self.response_id.clone_from(response_id);
                }
            }
            StreamEvent::Retry { .. } => self.retries = self.retries.saturating_add(1),
            StreamEvent::Restart => {
                self.parts.clear();
                self.usage = Usage::default();
                self.stop_reason = None;
                self.response_id = None;
                self.cost_usd = None;
            }
        }
    }

    /// Whether a stop event was seen.
    pub fn is_complete(&self) -> bool {
        self.stop_reason.is_some()
    }

    /// The assembled response. A missing stop event is inferred from the content.
    pub fn finish(mut self) -> ModelResponse {
        // The message lives on in the log and the conversation: drop the growth slack.
        self.parts.shrink_to_fit();
        let has_calls = self.parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
        let stop_reason = match self.stop_reason {
            Some(StopReason::EndTurn) | None if has_calls => StopReason::ToolUse,
            Some(reason) => reason,
            None => StopReason::EndTurn,
        };
        ModelResponse {
            message: Message {
                role: Role::Assistant,
                parts: self.parts,
            },
            usage: self.usage,
            stop_reason,
            response_id: self.response_id,
            cost_usd: self.cost_usd,
            retries: self.retries,
        }
    }
}

/// The class of a model failure, decided once at the provider boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// Bad or missing API key (401).
    Authentication,
    /// Key lacks permission (403).
    Permission,
    /// The request is malformed (400, 422).
    InvalidRequest,
    /// Unknown model or endpoint (404).
    NotFound,
    /// The prompt does not fit the context window.
    ContextOverflow,
    /// Too many requests (429).
    RateLimited,
    /// A spend or quota limit was reached (a 429 that will not clear by waiting).
    QuotaExceeded,
    /// The provider is overloaded (529, 503).
    Overloaded,
    /// Server error (5xx).
    Server,
    /// Connection failed or dropped.
    Network,
    /// No answer in time.
    Timeout,
    /// The stream broke off before it completed.
    StreamInterrupted,
    /// Anything else.
    Other,
}

impl ModelErrorKind {
    /// Whether waiting and trying again can help.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::RateLimited
                | Self::Overloaded
                | Self::Server
                | Self::Network
                | Self::Timeout
                | Self::StreamInterrupted
        )
    }

    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authentication => "authentication",
            Self::Permission => "permission",
            Self::InvalidRequest => "invalid_request",
            Self::NotFound => "not_found",
            Self::ContextOverflow => "context_overflow",
            Self::RateLimited => "rate_limited",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Overloaded => "overloaded",
            Self::Server => "server",
            Self::Network => "network",
            Self::Timeout => "timeout",
            Self::StreamInterrupted => "stream_interrupted",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified model failure, with everything the provider told us.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ModelError {
    /// The class.
    pub kind: ModelErrorKind,
    /// What went wrong.
    pub message: String,
    /// HTTP status.
    pub status: Option<u16>,
    /// The provider's own error type (e.g. `overloaded_error`).
    pub provider_error_type: Option<String>,
    /// The provider's request id, for support tickets.
    pub request_id: Option<String>,
    /// Server-suggested wait, in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// The raw response body, when there was one.
    pub body: Option<String>,
}

impl ModelError {
    /// A new error of a kind.
    pub fn new(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            status: None,
            provider_error_type: None,
            request_id: None,
            retry_after_ms: None,
            body: None,
        }
    }

    /// Whether a retry may help.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the retry-after hint.
    pub fn with_retry_after_ms(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }
}

/// A language model. Streaming first: [`Model::stream`] is the one required call;
/// [`complete`] collects a stream into a [`ModelResponse`].
pub trait Model: Send + Sync {
    /// `provider:model`, e.g. `anthropic:claude-sonnet-4-5`.
    fn id(&self) -> String;

    /// What this model can do.
    fn capabilities(&self) -> ModelCapabilities;

    /// Starts generating an answer. Retries of retryable failures happen inside and are
    /// reported as [`StreamEvent::Retry`]; the stream ends with `Stop` or an error.
    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>>;

    /// Estimated input tokens of a request. The default is the heuristic in
    /// [`estimate_request_tokens`]; adapters with a real tokenizer override it.
    fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        estimate_request_tokens(request)
    }

    /// [`Model::estimate_tokens`] for a caller whose decisions only depend on the exact
    /// figure once a request could reach `precise_from` tokens (the runtime passes a
    /// tenth of the request limit). Below that an adapter may answer with the cheap
    /// heuristic instead of running — and first loading — its tokenizer; provider-reported
    /// usage corrects either. The default is [`Model::estimate_tokens`].
    fn estimate_tokens_near(&self, request: &ModelRequest<'_>, precise_from: u64) -> u64 {
        let _ = precise_from;
        self.estimate_tokens(request)
    }
}

/// Collects a model's stream into one response.
pub async fn complete(
    model: &dyn Model,
    request: ModelRequest<'_>,
) -> Result<ModelResponse, ModelError> {
    use futures::StreamExt;
    let mut stream = model.stream(request);
    let mut assembler = ResponseAssembler::new();
    while let Some(event) = stream.next().await {
        assembler.push(&event?);
    }
    Ok(assembler.finish())
}

/// Heuristic token count of a text: one token per 4 bytes, rounded up, plus one. It
/// over-estimates English prose slightly, which is the safe direction for budgets.
pub fn estimate_text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).saturating_add(1)
}

/// Heuristic token count of a whole request (system, messages, tool schemas), with a small
/// per-message overhead for role markers.
pub fn estimate_request_tokens(request: &ModelRequest<'_>) -> u64 {
    let mut total = request.system.map(estimate_text_tokens).unwrap_or(0);
    for message in request.messages {
        total = total.saturating_add(estimate_message_tokens(message));
    }
    for tool in request.tools {
        total = total
            .saturating_add(estimate_text_tokens(&tool.name))
            .saturating_add(estimate_text_tokens(&tool.description))
            .saturating_add(estimate_text_tokens(&tool.input_schema.to_string()));
    }
    total
}

/// Heuristic token count of one message.
pub fn estimate_message_tokens(message: &Message) -> u64 {
    let mut total: u64 = 4;
    for part in &message.parts {
        let tokens = match part {
            Part::Text { text } | Part::Summary { text, .. } => estimate_text_tokens(text),
            Part::ToolCall(call) => estimate_text_tokens(&call.name)
                .saturating_add(estimate_text_tokens(&call.arguments))
                .saturating_add(8),
            Part::ToolResult(result) => estimate_text_tokens(&result.content).saturating_add(8),
            Part::ProviderItem { item, .. } => estimate_text_tokens(&item.to_string()),
        };
        total = total.saturating_add(tokens);
    }
    total
}
