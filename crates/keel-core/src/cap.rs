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

/// Room for the notice a cut field ends with (`[OUTPUT TRUNCATED: Showing X of Y characters
/// from SOURCE (KEY)]`), besides the label itself.
const NOTICE_CHARS: usize = 64;
/// The least share of the budget a large field is cut to; large fields that cannot get this
/// much are left out (and counted in the [`OMITTED_FIELDS_KEY`] notice).
const MIN_FIELD_SHARE: usize = 128;
/// The key under which a capped object says how many of its fields were left out.
pub const OMITTED_FIELDS_KEY: &str = "_truncated";

/// Characters of `value`'s JSON serialization.
fn json_chars(value: &Value) -> usize {
    value.to_string().chars().count()
}

/// `text` cut, with the truncation notice, so that its JSON serialization — quotes and
/// escapes included, which can make a string of control characters six times longer — is
/// at most about `max_chars` characters (a budget smaller than the notice itself still gets
/// the notice).
fn cap_string_serialized(text: String, max_chars: usize, label: &str) -> String {
    let mut limit = max_chars
        .saturating_sub(NOTICE_CHARS + label.chars().count())
        .max(1);
    // Each pass shrinks the limit in proportion to how far escapes overshot; a few passes
    // converge, and the loop is bounded whatever the text.
    for _ in 0..8 {
        let cut = cap_text(text.clone(), limit, label);
        let size = json_chars(&Value::String(cut.clone()));
        if size <= max_chars || limit == 1 {
            return cut;
        }
        limit = (limit.saturating_mul(max_chars) / size)
            .min(limit - 1)
            .max(1);
    }
    cap_text(text, 1, label)
}

/// A JSON value whose serialization is at most about `max_chars` characters: unchanged
/// when it fits. An object keeps its small fields as they are (within half the budget when
/// large fields need room too), has each large one replaced by its serialization cut to an
/// equal share of the rest (with the truncation notice), and — when even that cannot hold
/// every field — leaves the remaining fields out, saying how many under
/// [`OMITTED_FIELDS_KEY`]. Anything else becomes its serialization, cut.
pub fn cap_value(value: Value, max_chars: usize, source: &str) -> Value {
    if json_chars(&value) <= max_chars {
        return value;
    }
    let map = match value {
        Value::Object(map) => map,
        Value::String(text) => {
            return Value::String(cap_string_serialized(text, max_chars, source));
        }
        other => {
            return Value::String(cap_string_serialized(other.to_string(), max_chars, source));
        }
    };
    let total_fields = map.len();
    // A field's cost: its key, its value, quotes, colon and comma.
    let fields: Vec<(String, Value, usize)> = map
        .into_iter()
        .map(|(key, field)| {
            let size = key.chars().count() + json_chars(&field) + 4;
            (key, field, size)
        })
        .collect();
    let has_large = fields.iter().any(|(_, _, size)| *size > SMALL_FIELD_CHARS);
    let small_budget = if has_large { max_chars / 2 } else { max_chars };
    let mut out = Map::new();
    let mut used = 2;
    let mut omitted = 0usize;
    let mut omitted_chars = 0usize;
    let mut large = Vec::new();
    for (key, field, size) in fields {
        if size > SMALL_FIELD_CHARS {
            large.push((key, field, size));
        } else if used + size <= small_budget {
            used += size;
            out.insert(key, field);
        } else {
            omitted += 1;
            omitted_chars += size;
        }
    }
    let remaining = max_chars.saturating_sub(used);
    let fitting = (remaining / MIN_FIELD_SHARE).min(large.len());
    let share = remaining.checked_div(fitting).unwrap_or(0);
    for (index, (key, field, size)) in large.into_iter().enumerate() {
        let key_chars = key.chars().count();
        if index >= fitting || 2 * key_chars + 4 + NOTICE_CHARS >= share {
            omitted += 1;
            omitted_chars += size;
            continue;
        }
        let text = match field {
            Value::String(text) => text,
            other => other.to_string(),
        };
        let label = format!("{source} ({key})");
        let budget = share - key_chars - 4;
        out.insert(
            key,
            Value::String(cap_string_serialized(text, budget, &label)),
        );
    }
    if omitted > 0 {
        out.insert(
            OMITTED_FIELDS_KEY.into(),
            Value::String(format!(
                "[OUTPUT TRUNCATED: {omitted} of {total_fields} fields ({omitted_chars} characters) \
                 left out from {source}]"
            )),
        );
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

    fn chars(value: &Value) -> usize {
        value.to_string().chars().count()
    }

    #[test]
    fn many_small_fields_are_bounded_and_counted() {
        // Found by the mcp_convert fuzz target: small fields were all kept, so an object of
        // many small fields was not capped at all.
        let map: Map<String, Value> = (0..500)
            .map(|i| (format!("field{i:03}"), json!("y".repeat(100))))
            .collect();
        let capped = cap_value(Value::Object(map), 2_000, "server");
        assert!(chars(&capped) <= 2_000 + 200, "{}", chars(&capped));
        let notice = capped[OMITTED_FIELDS_KEY].as_str().unwrap();
        assert!(notice.contains("of 500 fields"), "{notice}");
        assert!(notice.contains("from server"), "{notice}");
        assert_eq!(
            capped["field000"],
            json!("y".repeat(100)),
            "the first fields stay whole"
        );
    }

    #[test]
    fn many_large_fields_share_the_budget_or_are_left_out() {
        let map: Map<String, Value> = (0..300)
            .map(|i| (format!("f{i}"), json!("z".repeat(5_000))))
            .collect();
        let capped = cap_value(Value::Object(map), 4_000, "t");
        assert!(chars(&capped) <= 4_000 + 200, "{}", chars(&capped));
        assert!(
            capped[OMITTED_FIELDS_KEY]
                .as_str()
                .unwrap()
                .contains("of 300 fields")
        );
        assert!(
            capped["f0"]
                .as_str()
                .unwrap()
                .contains("[OUTPUT TRUNCATED: Showing")
        );
    }

    #[test]
    fn escapes_count_towards_the_cap() {
        let control = "\u{1}".repeat(10_000);
        let capped = cap_value(json!(control), 1_000, "t");
        assert!(chars(&capped) <= 1_000 + 100, "{}", chars(&capped));
        let capped = cap_value(json!({ "body": control, "status": 500 }), 1_000, "t");
        assert!(chars(&capped) <= 1_000 + 100, "{}", chars(&capped));
        assert_eq!(capped["status"], 500);
    }

    #[test]
    fn tiny_caps_stay_near_the_notice_size() {
        let value =
            json!({ "a": "x".repeat(1_000), "b": [1, 2, 3], "c": { "d": "e".repeat(400) } });
        for max in [0, 1, 16, 100, 271] {
            let capped = cap_value(value.clone(), max, "fuzz");
            assert!(chars(&capped) <= max + 8 * 100, "{max}: {}", chars(&capped));
        }
    }
}
