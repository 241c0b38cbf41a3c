//! What `/openapi.json` says beyond the handlers' derives: the answers every route can
//! give whatever its handler does (401/429/503 from the key check, 400/413 for bodies,
//! 408 from the request timeout, 421 from the Host check), the agents this server offers,
//! and the rules the handlers enforce on ids and texts. Each rule is written once, here,
//! as the pattern the document shows *and* the function the handler calls, so the two
//! cannot drift; the property-based contract test (tests/contract.rs, Schemathesis over
//! this document) fails on any difference.

use serde_json::{Map, Value, json};

use crate::tenancy::MAX_CLIENT_ID_CHARS;

/// A client thread id: letters, digits, `_` and `-`, 1 to [`MAX_CLIENT_ID_CHARS`].
pub const CLIENT_ID_PATTERN: &str = "^[A-Za-z0-9_-]{1,128}$";

/// A text with something in it: at least one character other than a space, tab or line
/// break. (Spelled out rather than `\S`: "whitespace" differs between regex engines and
/// Rust's `char::is_whitespace`, and the server must agree with every client's reading.)
pub const TEXT_PATTERN: &str = "[^ \\t\\r\\n]";

/// An age for `since`: an optional sign, 1 to 6 digits and a unit (`30s`, `15m`, `2h`,
/// `7d`); six digits of days stay well inside the representable range of times.
pub const AGE_PATTERN: &str = "^[+-]?[0-9]{1,6}[smhd]$";

/// `Last-Event-ID`: a sequence number.
pub const SEQ_PATTERN: &str = "^[0-9]{1,19}$";

/// Whether `text` has something in it ([`TEXT_PATTERN`]).
pub fn has_text(text: &str) -> bool {
    text.chars().any(|c| !matches!(c, ' ' | '\t' | '\r' | '\n'))
}

/// Whether `text` is an age ([`AGE_PATTERN`]).
pub fn is_age(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let Some(digits) = unsigned.strip_suffix(['s', 'm', 'h', 'd']) else {
        return false;
    };
    (1..=6).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `text` is a sequence number ([`SEQ_PATTERN`]).
pub fn is_seq(text: &str) -> bool {
    (1..=19).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
}

/// Sets `value` at `path` under `target`, making the objects on the way; a step through
/// something that is not an object leaves the document as it is (never panics).
fn set(target: &mut Value, path: &[&str], value: Value) {
    let Some((last, steps)) = path.split_last() else {
        return;
    };
    let mut at = target;
    for step in steps {
        let Some(object) = at.as_object_mut() else {
            return;
        };
        at = object
            .entry((*step).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(object) = at.as_object_mut() {
        object.insert((*last).to_string(), value);
    }
}

/// The error body, by reference.
fn error_body(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

/// [`error_body`] with a `Retry-After` header.
fn retry_body(description: &str) -> Value {
    let mut body = error_body(description);
    set(
        &mut body,
        &["headers"],
        json!({"Retry-After": {
            "description": "Seconds to wait before retrying",
            "schema": {"type": "integer", "minimum": 1}
        }}),
    );
    body
}

/// Adds `status` to `responses` unless the handler documented it.
fn ensure(responses: &mut Map<String, Value>, status: &str, body: Value) {
    responses.entry(status.to_string()).or_insert(body);
}

/// Completes the document the router generated; `agents` are the agents this server
/// offers (`agent` of a chat must be one).
pub fn complete(doc: &mut Value, agents: &[String]) {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (_, operation) in item.iter_mut() {
                complete_operation(path, operation);
            }
        }
    }
    // A chat answers 200 with the run as JSON, or (`stream: true`) with its events: the
    // derive keeps only the last of two 200 entries.
    if let Some(ok) = doc.pointer_mut("/paths/~1v1~1chat/post/responses/200") {
        set(
            ok,
            &["content"],
            json!({
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}}
            }),
        );
        set(
            ok,
            &["description"],
            json!(
                "The run ended or paused: the `keel run --output json` object; with \
                   `stream: true`, text/event-stream of the run's events (`id:` = sequence \
                   number), `text_delta`s, then `outcome`"
            ),
        );
    }
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if let Some(chat) = schemas.get_mut("ChatRequest") {
        set(chat, &["properties", "agent", "enum"], json!(agents));
        set(
            chat,
            &["properties", "message", "pattern"],
            json!(TEXT_PATTERN),
        );
        set(chat, &["properties", "messages", "minItems"], json!(1));
        set(
            chat,
            &["properties", "thread_id", "pattern"],
            json!(CLIENT_ID_PATTERN),
        );
        // Exactly one of `message` (a string) and `messages` (an array).
        set(
            chat,
            &["oneOf"],
            json!([
                {"required": ["message"], "properties": {"message": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}}
            ]),
        );
    }
    if let Some(message) = schemas.get_mut("ChatMessage") {
        set(message, &["properties", "role", "enum"], json!(["user"]));
        set(
            message,
            &["properties", "content", "pattern"],
            json!(TEXT_PATTERN),
        );
    }
    if let Some(decision) = schemas.get_mut("DecisionRequest") {
        set(
            decision,
            &["properties", "decision", "enum"],
            json!(["approve", "deny"]),
        );
    }
    if let Some(reply) = schemas.get_mut("ReplyRequest") {
        set(
            reply,
            &["properties", "answer", "pattern"],
            json!(TEXT_PATTERN),
        );
    }
}

fn complete_operation(path: &str, operation: &mut Value) {
    let secured = operation
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    let has_body = operation.get("requestBody").is_some();
    let mut has_path_id = false;
    if let Some(parameters) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    {
        for parameter in parameters {
            let field = |key: &str| {
                parameter
                    .get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let name = field("name");
            let place = field("in");
            match (place.as_str(), name.as_str()) {
                ("path", "thread_id") => {
                    has_path_id = true;
                    set(
                        parameter,
                        &["schema"],
                        json!({
                            "type": "string", "pattern": CLIENT_ID_PATTERN,
                            "minLength": 1, "maxLength": MAX_CLIENT_ID_CHARS
                        }),
                    );
                }
                ("path", "job_id") => {
                    has_path_id = true;
                    set(
                        parameter,
                        &["schema"],
                        json!({"type": "integer", "format": "int64"}),
                    );
                }
                ("header", "Last-Event-ID") => {
                    set(
                        parameter,
                        &["schema"],
                        json!({"type": "string", "pattern": SEQ_PATTERN}),
                    );
                }
                ("query", "status") => {
                    set(
                        parameter,
                        &["schema"],
                        json!({"type": "string", "enum": status_names()}),
                    );
                }
                ("query", "since") => {
                    set(
                        parameter,
                        &["schema"],
                        json!({"anyOf": [
                            {"type": "string", "format": "date-time"},
                            {"type": "string", "pattern": AGE_PATTERN}
                        ]}),
                    );
                }
                ("query", "limit") => {
                    set(
                        parameter,
                        &["schema"],
                        json!({
                            "type": "integer", "minimum": 1,
                            "maximum": crate::api::threads::MAX_LIMIT
                        }),
                    );
                }
                ("query", "after") => {
                    set(
                        parameter,
                        &["schema"],
                        json!({
                            "type": "integer", "minimum": 0, "maximum": i64::MAX
                        }),
                    );
                }
                _ => {}
            }
        }
    }
    let Some(responses) = operation
        .get_mut("responses")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if secured {
        ensure(
            responses,
            "401",
            error_body(
                "`unauthorized`: no `Authorization: Bearer <key>`, or a key that is unknown \
                 or revoked",
            ),
        );
        ensure(
            responses,
            "429",
            retry_body("`rate_limited` or another per-tenant limit (`Retry-After`)"),
        );
        ensure(
            responses,
            "503",
            retry_body("`unavailable`: the key store or the server cannot answer now"),
        );
    }
    if has_body || has_path_id || path == "/v1/threads" {
        ensure(
            responses,
            "400",
            error_body("`invalid_request`: a malformed path, query or body (names the field)"),
        );
    }
    if has_body {
        ensure(
            responses,
            "413",
            error_body("`body_too_large`: larger than `[server] max_body_bytes`"),
        );
    }
    ensure(
        responses,
        "408",
        error_body("The request outlasted `[server] request_timeout_ms`"),
    );
    ensure(
        responses,
        "421",
        error_body(
            "`misdirected_request`: the Host is not one this server answers \
             (`[server] public_url` / `allowed_hosts`)",
        ),
    );
}

/// Every status `GET /v1/threads?status=` accepts.
fn status_names() -> Vec<&'static str> {
    let mut names = vec!["running", "awaiting_approval", "awaiting_user"];
    names.extend(
        [
            keel_core::EndState::Done,
            keel_core::EndState::ClarifyNeeded,
            keel_core::EndState::BudgetExceeded,
            keel_core::EndState::UnrecoverableToolContract,
            keel_core::EndState::Cancelled,
            keel_core::EndState::Failed,
        ]
        .map(keel_core::EndState::as_str),
    );
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_rules_agree_with_their_patterns() {
        for age in ["30s", "15m", "+2h", "-7d", "999999d"] {
            assert!(is_age(age), "{age}");
        }
        for bad in ["", "s", "1234567s", "5w", "5", "++5s", "5 s", "١s"] {
            assert!(!is_age(bad), "{bad}");
        }
        assert!(has_text(" x ") && has_text("\u{1c}") && !has_text(" \t\r\n"));
        assert!(is_seq("0") && is_seq("9223372036854775807") && !is_seq("") && !is_seq("-1"));
        for id in ["a", "thr_1-x", &"x".repeat(128)] {
            assert!(crate::tenancy::check_client_id(id).is_ok(), "{id}");
        }
        for bad in ["", "a.b", "ü", &"x".repeat(129)] {
            assert!(crate::tenancy::check_client_id(bad).is_err(), "{bad}");
        }
    }
}
