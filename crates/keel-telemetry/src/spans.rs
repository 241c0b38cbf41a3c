//! Span records: what a finished OpenTelemetry GenAI span looks like in Keel (ids, parent,
//! explicit start and end times, attributes, status), plus the naming helpers shared by the
//! span fold, the metrics and the timeline. The fold itself is in [`crate::assembler`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use keel_core::StopReason;
use serde::{Deserialize, Serialize};

use crate::turns::TurnRecord;

pub use crate::assembler::{SpanAssembler, spans_for_events};

/// An attribute value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttrValue {
    /// Boolean.
    Bool(bool),
    /// Integer.
    Int(i64),
    /// Floating point.
    Float(f64),
    /// Text.
    Str(String),
    /// List of texts.
    StrArray(Vec<String>),
}

impl AttrValue {
    /// The text, for string values.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, for integer values.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// OpenTelemetry span kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// In-process work.
    Internal,
    /// A call to a remote service (model provider).
    Client,
}

/// Span status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum SpanStatus {
    /// Not set.
    Unset,
    /// Succeeded.
    Ok,
    /// Failed.
    Error {
        /// Why.
        message: String,
    },
}

/// A timestamped annotation on a span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanEventRecord {
    /// Event name.
    pub name: String,
    /// When.
    pub ts: DateTime<Utc>,
    /// Attributes.
    #[serde(default)]
    pub attributes: BTreeMap<String, AttrValue>,
}

/// A finished span, ready to be written to a trace file or exported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    /// W3C trace id (32 hex digits).
    pub trace_id: String,
    /// Span id (16 hex digits).
    pub span_id: String,
    /// Parent span id; `None` for the run's root span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// Span name, e.g. `chat claude-sonnet-4`.
    pub name: String,
    /// Span kind.
    pub kind: SpanKind,
    /// Start time.
    pub start: DateTime<Utc>,
    /// End time.
    pub end: DateTime<Utc>,
    /// Status.
    pub status: SpanStatus,
    /// Attributes (GenAI semantic conventions plus `keel.*`).
    pub attributes: BTreeMap<String, AttrValue>,
    /// Span events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<SpanEventRecord>,
}

impl SpanRecord {
    /// Duration in milliseconds.
    pub fn duration_ms(&self) -> i64 {
        (self.end - self.start).num_milliseconds()
    }

    /// An attribute by name.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes.get(key)
    }
}

/// What an event completed.
#[derive(Debug, Clone, PartialEq)]
pub enum Completed {
    /// A span ended.
    Span(SpanRecord),
    /// A per-turn telemetry record (seed 000 §8).
    Turn(TurnRecord),
}

/// Options of the span fold.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanOptions {
    /// Attach message text, tool arguments and results.
    pub capture_content: bool,
}

/// Longest content attribute, in bytes; longer values are cut with a marker.
pub const MAX_CONTENT_ATTR: usize = 32 * 1024;

/// Splits `provider:model` into its parts.
pub fn split_model(id: &str) -> (Option<&str>, &str) {
    match id.split_once(':') {
        Some((p, m)) if !p.is_empty() && !m.is_empty() && !p.contains('/') => (Some(p), m),
        _ => (None, id),
    }
}

/// GenAI `finish_reasons` value for a stop reason.
pub fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::ToolUse => "tool_calls",
        StopReason::MaxTokens => "length",
        StopReason::ContentFilter => "content_filter",
        StopReason::Other => "other",
    }
}
