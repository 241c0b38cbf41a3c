//! Tool outcomes and the tool error taxonomy.
//!
//! A tool never aborts a run by failing: every call ends in a [`ToolOutcome`], either data
//! or a typed error with a [`ToolErrorCode`]. The policy engine and the model read it.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The error taxonomy of tool calls (seed 000 §2.2 and §18, plus `cancelled` and `denied`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolErrorCode {
    /// Arguments missing, malformed or failing the input schema (HTTP 400/422).
    InvalidInput,
    /// The tool did not answer within its timeout (or HTTP 504).
    Timeout,
    /// A transient server failure (HTTP 5xx).
    RetryableServer,
    /// The service is rate limiting us (HTTP 429).
    RateLimited,
    /// The tool's output does not match its declared output schema.
    OutputSchemaMismatch,
    /// The tool ran fine but found nothing.
    NoResults,
    /// The tool crashed (panic or unexpected exception).
    ToolBug,
    /// Missing or invalid credentials (HTTP 401).
    Unauthorized,
    /// Credentials lack permission (HTTP 403).
    Forbidden,
    /// The tool, or the resource it was asked about, does not exist (HTTP 404).
    NotFound,
    /// The call was cancelled before it finished.
    Cancelled,
    /// A human denied the call at an approval prompt.
    Denied,
}

impl ToolErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ToolErrorCode; 12] = [
        Self::InvalidInput,
        Self::Timeout,
        Self::RetryableServer,
        Self::RateLimited,
        Self::OutputSchemaMismatch,
        Self::NoResults,
        Self::ToolBug,
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::Cancelled,
        Self::Denied,
    ];

    /// The snake_case name used on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::Timeout => "timeout",
            Self::RetryableServer => "retryable_server",
            Self::RateLimited => "rate_limited",
            Self::OutputSchemaMismatch => "output_schema_mismatch",
            Self::NoResults => "no_results",
            Self::ToolBug => "tool_bug",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::Cancelled => "cancelled",
            Self::Denied => "denied",
        }
    }

    /// Parses a snake_case name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// Whether the executor may retry a call that failed with this code.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::Timeout | Self::RetryableServer | Self::RateLimited
        )
    }

    /// Maps an HTTP status code to the taxonomy (seed 000 §18).
    pub fn from_http_status(status: u16) -> Option<Self> {
        Some(match status {
            400 | 422 => Self::InvalidInput,
            401 => Self::Unauthorized,
            403 => Self::Forbidden,
            404 => Self::NotFound,
            408 | 504 => Self::Timeout,
            429 => Self::RateLimited,
            500..=599 => Self::RetryableServer,
            _ => return None,
        })
    }
}

impl fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error a tool implementation returns. The executor turns it into a [`ToolOutcome`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// The taxonomy code.
    pub code: ToolErrorCode,
    /// A message for the model: what went wrong and, where possible, how to fix the call.
    pub message: String,
    /// Structured details (failing field, HTTP status, provider body...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// A server-suggested wait before retrying, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ToolError {
    /// A new error with a code and message.
    pub fn new(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
            retry_after_ms: None,
        }
    }

    /// Shorthand for an `invalid_input` error.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ToolErrorCode::InvalidInput, message)
    }

    /// Attaches structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Attaches a retry-after hint.
    pub fn with_retry_after_ms(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }
}

/// Success data or a typed error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolResultKind {
    /// The tool succeeded.
    Ok {
        /// The tool's output.
        data: Value,
        /// Whether `data` was validated against the tool's output schema.
        schema_validated: bool,
        /// Whether `data` was truncated to the tool's payload cap.
        truncated: bool,
    },
    /// The tool failed.
    Error {
        /// The taxonomy code.
        code: ToolErrorCode,
        /// What went wrong, for the model.
        message: String,
        /// Structured details.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<Value>,
    },
}

/// The complete outcome of one tool call, with provenance (seed 002 §5: results carry the
/// thread and run ids).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// The tool that ran (or was asked for).
    pub tool: String,
    /// The call id.
    pub call_id: String,
    /// The thread the call belongs to.
    pub thread_id: String,
    /// The run the call belongs to.
    pub run_id: String,
    /// How many times the tool was invoked (1 without retries).
    pub attempts: u32,
    /// Wall time from first attempt to final result, in milliseconds.
    pub latency_ms: u64,
    /// Bounded repairs applied to the tool's output to make it match its output schema
    /// (e.g. `coerced /count from "3" to 3`). Empty when none were needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<String>,
    /// Data or error.
    #[serde(flatten)]
    pub result: ToolResultKind,
}

impl ToolOutcome {
    /// True on success.
    pub fn is_ok(&self) -> bool {
        matches!(self.result, ToolResultKind::Ok { .. })
    }

    /// The error code, if the call failed.
    pub fn error_code(&self) -> Option<ToolErrorCode> {
        match &self.result {
            ToolResultKind::Error { code, .. } => Some(*code),
            ToolResultKind::Ok { .. } => None,
        }
    }

    /// The text the model sees by default: the data as JSON, or an error object
    /// `{"error":{"code":..,"message":..,"details":..}}` so the model can correct itself.
    pub fn render_for_model(&self) -> String {
        match &self.result {
            ToolResultKind::Ok { data, .. } => match data {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            },
            ToolResultKind::Error {
                code,
                message,
                details,
            } => {
                let mut error = serde_json::Map::new();
                error.insert("code".into(), Value::String(code.as_str().into()));
                error.insert("message".into(), Value::String(message.clone()));
                if let Some(details) = details {
                    error.insert("details".into(), details.clone());
                }
                serde_json::json!({ "error": error }).to_string()
            }
        }
    }
}
