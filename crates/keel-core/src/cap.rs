//! Caps on what failures put into a run: error messages and details — an HTTP error body,
//! an MCP server's `error.data`, the raw arguments of a malformed call — go into the event
//! log and the next prompt, so each is cut to a bounded size with Keel's truncation notice
//! (`[OUTPUT TRUNCATED: Showing X of Y characters from SOURCE]`).

use serde_json::{Map, Value};

use crate::outcome::ToolError;

/// Most characters of an error message kept in a [`ToolError`] (it goes into the event log
/// and the next prompt).
pub const MAX_ERROR_MESSAGE_CHARS: usize = 8 * 1024;
/// Most characters of an error's `details` (serialized JSON) kept.
pub const MAX_ERROR_DETAILS_CHARS: usize = 8 * 1024;
/// Fields of an oversized details object at most this long (serialized) are kept as they
/// are; only the larger ones are cut.
const SMALL_FIELD_CHARS: usize = 256;

/// `text` cut to `max_chars` characters with Keel's truncation notice
/// (`[OUTPUT TRUNCATED: Showing X of Y characters from SOURCE]`, the notice of
/// [`crate::context::truncate_tool_output`]), or unchanged when it fits.
pub fn cap_text(text: String, max_chars: usize, source: &str) -> String {
    if text.len() <= max_chars {
        return text;
    }
    match crate::context::truncate_tool_output(&text, max_chars, source) {
        Some((cut, _, _)) => cut,
        None => text,
    }
}

/// A JSON value whose serialization is at most about `max_chars` characters: unchanged
/// when it fits; an object keeps its small fields and has each large one replaced by its
/// serialization cut to a share of the budget (with the truncation notice); anything else
/// becomes its serialization, cut.
pub fn cap_value(value: Value, max_chars: usize, source: &str) -> Value {
    let serialized = match &value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if serialized.len() <= max_chars {
        return value;
    }
    let Value::Object(map) = value else {
        return Value::String(cap_text(serialized, max_chars, source));
    };
    let sizes: Vec<(String, Value, usize)> = map
        .into_iter()
        .map(|(key, field)| {
            let size = key.len() + field.to_string().len();
            (key, field, size)
        })
        .collect();
    let small_total: usize = sizes
        .iter()
        .filter(|(_, _, size)| *size <= SMALL_FIELD_CHARS)
        .map(|(_, _, size)| size)
        .sum();
    let large = sizes
        .iter()
        .filter(|(_, _, size)| *size > SMALL_FIELD_CHARS)
        .count()
        .max(1);
    let share = (max_chars.saturating_sub(small_total) / large).max(SMALL_FIELD_CHARS);
    let mut out = Map::new();
    for (key, field, size) in sizes {
        if size <= SMALL_FIELD_CHARS {
            out.insert(key, field);
        } else {
            let text = match field {
                Value::String(text) => text,
                other => other.to_string(),
            };
            let label = format!("{source} ({key})");
            out.insert(key, Value::String(cap_text(text, share, &label)));
        }
    }
    Value::Object(out)
}

/// `error` with its message and details capped ([`MAX_ERROR_MESSAGE_CHARS`],
/// [`MAX_ERROR_DETAILS_CHARS`]), so nothing a tool or server sends grows the log or the prompt
/// without bound. `source` names where it came from (a tool, a server) in the notice.
pub fn cap_tool_error(mut error: ToolError, source: &str) -> ToolError {
    error.message = cap_text(error.message, MAX_ERROR_MESSAGE_CHARS, source);
    error.details = error
        .details
        .map(|details| cap_value(details, MAX_ERROR_DETAILS_CHARS, source));
    error
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::outcome::ToolErrorCode;
    use serde_json::json;

    #[test]
    fn large_messages_and_details_are_cut_with_the_notice_small_ones_kept() {
        let small = ToolError::new(ToolErrorCode::RetryableServer, "503")
            .with_details(json!({"status": 503}));
        assert_eq!(cap_tool_error(small.clone(), "t"), small);
        let huge = "x".repeat(100_000);
        let error = ToolError::invalid_input(huge.clone())
            .with_details(json!({"status": 500, "body": huge}));
        let capped = cap_tool_error(error, "http_tool");
        assert!(capped.message.len() < MAX_ERROR_MESSAGE_CHARS + 200);
        assert!(capped.message.contains("[OUTPUT TRUNCATED: Showing"));
        let details = capped.details.unwrap();
        assert_eq!(details["status"], 500, "small fields are kept as they are");
        assert!(details.to_string().len() < MAX_ERROR_DETAILS_CHARS + 400);
        assert!(
            details["body"]
                .as_str()
                .unwrap()
                .contains("from http_tool (body)")
        );
    }
}
