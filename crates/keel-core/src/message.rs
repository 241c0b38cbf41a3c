//! Conversation messages: roles, content parts, tool calls and results, token usage.
//!
//! These are provider-neutral. Provider adapters translate them to and from each wire
//! protocol; nothing here knows about any particular API.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::outcome::ToolOutcome;

/// Who authored a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions from the application.
    System,
    /// The human (or calling program).
    User,
    /// The model.
    Assistant,
    /// Results of tool calls, fed back to the model.
    Tool,
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id that the result must echo.
    pub id: String,
    /// Tool name as the model wrote it (it may not exist).
    pub name: String,
    /// The raw JSON text of the arguments exactly as the model produced it. It may be
    /// invalid JSON; the executor reports that to the model as `invalid_input`.
    pub arguments: String,
}

impl ToolCall {
    /// Parses the arguments. An empty string counts as an empty object, which is what
    /// providers send for tools without parameters.
    pub fn parse_arguments(&self) -> Result<Value, serde_json::Error> {
        if self.arguments.trim().is_empty() {
            return Ok(Value::Object(serde_json::Map::new()));
        }
        serde_json::from_str(&self.arguments)
    }
}

/// The result of one tool call, as recorded in the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the [`ToolCall`] this answers.
    pub call_id: String,
    /// The tool name of that call.
    pub name: String,
    /// The full outcome (data or typed error, attempts, latency).
    pub outcome: ToolOutcome,
    /// The text the model sees for this result (raw data, a normalized observation, or
    /// an error object). Kept separately so what was shown is exactly reproducible.
    pub content: String,
}

impl ToolResult {
    /// True when the outcome is an error; providers flag it (e.g. Anthropic `is_error`).
    pub fn is_error(&self) -> bool {
        !self.outcome.is_ok()
    }
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call (assistant messages only).
    ToolCall(ToolCall),
    /// A tool result (tool messages only). Shared, not inline: at 272 bytes it would make
    /// every part of every message (and every event) that large, and the same result is
    /// held by its `tool_call_finished` event, the conversation and the in-memory log.
    ToolResult(Arc<ToolResult>),
    /// A provider-specific item that must be echoed back verbatim on the next request,
    /// such as a reasoning block with its signature.
    ProviderItem {
        /// The provider that produced it (e.g. `anthropic`, `openai-responses`).
        provider: String,
        /// The item exactly as received.
        item: Value,
    },
    /// A compaction marker: the summary that replaced earlier messages.
    Summary {
        /// The summary text.
        text: String,
        /// How many messages it replaced.
        replaced: u32,
    },
}

/// A message in a conversation.
///
/// ```
/// use keel_core::{Message, Role};
///
/// let question = Message::user("What is 17*23?");
/// assert_eq!(question.role, Role::User);
/// assert_eq!(question.text(), "What is 17*23?");
/// assert_eq!(Message::assistant("391").role, Role::Assistant);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The author.
    pub role: Role,
    /// The content, in order.
    pub parts: Vec<Part>,
}

impl Message {
    /// A user message with one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// A system message with one text part.
    pub fn system(text: impl Into<String>) -> Self {
        Self {
            role: Role::System,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// An assistant message with one text part.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// All text parts joined with newlines.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            if let Part::Text { text } | Part::Summary { text, .. } = part {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
        }
        out
    }

    /// The tool calls in this message, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The tool results in this message, in order.
    pub fn tool_results(&self) -> impl Iterator<Item = &ToolResult> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolResult(result) => Some(&**result),
            _ => None,
        })
    }
}

/// Token usage of one model call (or a sum of several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cached ones.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }
}
