//! Classification of every provider failure into [`ModelError`], once, at the boundary.
//!
//! HTTP status, the provider's own error type or code, the request id and the server's
//! retry hint (`retry-after-ms`, `retry-after` in seconds or as an HTTP date) are kept.

use std::time::{Duration, SystemTime};

use keel_core::{ModelError, ModelErrorKind};
use reqwest::header::HeaderMap;
use serde_json::Value;

/// Longest raw body kept on an error, in bytes.
const MAX_BODY: usize = 8 * 1024;

/// The server's suggested wait, from `retry-after-ms` or `retry-after`.
pub fn retry_after_ms(headers: &HeaderMap) -> Option<u64> {
    if let Some(ms) =
        header_str(headers, "retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(ms.ceil() as u64);
    }
    let value = header_str(headers, "retry-after")?.trim().to_owned();
    if let Ok(seconds) = value.parse::<f64>() {
        if seconds.is_finite() && seconds >= 0.0 {
            return Some((seconds * 1000.0).ceil() as u64);
        }
        return None;
    }
    let when = httpdate::parse_http_date(&value).ok()?;
    let wait = when
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}

/// The provider's request id from the usual headers.
pub fn request_id(headers: &HeaderMap) -> Option<String> {
    [
        "request-id",
        "x-request-id",
        "anthropic-request-id",
        "x-generation-id",
    ]
    .iter()
    .find_map(|name| header_str(headers, name).map(str::to_owned))
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// What a provider error body says, whatever its shape.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ErrorBody {
    /// Human-readable message.
    pub message: Option<String>,
    /// The provider's error type or code (`overloaded_error`, `insufficient_quota`, `429`).
    pub error_type: Option<String>,
    /// A second code when the body has both a type and a code.
    pub code: Option<String>,
    /// A request id in the body (Anthropic puts it there).
    pub request_id: Option<String>,
}

/// Reads any of the known error body shapes: Anthropic `{"type":"error","error":{..}}`,
/// OpenAI `{"error":{"message","type","code"}}`, OpenRouter `{"error":{"code":429,..}}`,
/// Responses `{"type":"error","code","message"}` and Ollama `{"error":"text"}`.
pub fn parse_error_value(value: &Value) -> ErrorBody {
    let mut out = ErrorBody {
        request_id: value
            .get("request_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..ErrorBody::default()
    };
    let scalar = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    match value.get("error") {
        Some(Value::String(text)) => out.message = Some(text.clone()),
        Some(obj @ Value::Object(_)) => {
            out.message = scalar(obj.get("message"));
            out.error_type = scalar(obj.get("type"));
            out.code = scalar(obj.get("code"));
            if let Some(raw) = obj.pointer("/metadata/raw").and_then(Value::as_str) {
                let message = out.message.get_or_insert_with(String::new);
                message.push_str(" (");
                message.push_str(raw);
                message.push(')');
            }
        }
        _ => {
            out.message = scalar(value.get("message"));
            out.code = scalar(value.get("code"));
            if value.get("type").and_then(Value::as_str) != Some("error") {
                out.error_type = scalar(value.get("type"));
            }
        }
    }
    if out.error_type.is_none() {
        out.error_type = out.code.take();
    }
    out
}

fn parse_error_body(body: &str) -> ErrorBody {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => parse_error_value(&value),
        Err(_) => ErrorBody::default(),
    }
}

/// Classifies a provider error type or code seen without an HTTP status (mid-stream).
pub fn kind_from_type(error_type: &str, message: &str) -> ModelErrorKind {
    let t = error_type.to_ascii_lowercase();
    if is_quota_text(&t) || is_quota_text(&message.to_ascii_lowercase()) {
        return ModelErrorKind::QuotaExceeded;
    }
    if let Ok(status) = t.parse::<u16>() {
        return kind_from_status(status, message);
    }
    match t.as_str() {
        "overloaded_error" | "overloaded" | "server_is_overloaded" | "slow_down" => {
            ModelErrorKind::Overloaded
        }
        "rate_limit_error" | "rate_limit_exceeded" | "requests" | "tokens" => {
            ModelErrorKind::RateLimited
        }
        "authentication_error" | "invalid_api_key" => ModelErrorKind::Authentication,
        "permission_error" => ModelErrorKind::Permission,
        "not_found_error" | "model_not_found" => ModelErrorKind::NotFound,
        "context_length_exceeded" => ModelErrorKind::ContextOverflow,
        "invalid_request_error" | "invalid_prompt" | "request_too_large" => {
            if is_context_text(message) {
                ModelErrorKind::ContextOverflow
            } else {
                ModelErrorKind::InvalidRequest
            }
        }
        "api_error" | "server_error" | "internal_error" => ModelErrorKind::Server,
        "timeout" => ModelErrorKind::Timeout,
        _ if is_context_text(message) => ModelErrorKind::ContextOverflow,
        _ => ModelErrorKind::Server,
    }
}

fn is_quota_text(text: &str) -> bool {
    [
        "insufficient_quota",
        "exceeded your current quota",
        "quota exceeded",
        "spend limit",
        "spending limit",
        "usage limit",
        "credit balance",
        "insufficient credits",
        "billing",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

fn is_context_text(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "context length",
        "context_length",
        "context window",
        "prompt is too long",
        "maximum context",
        "too many tokens",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

fn kind_from_status(status: u16, message: &str) -> ModelErrorKind {
    match status {
        400 | 413 | 422 if is_context_text(message) => ModelErrorKind::ContextOverflow,
        400 | 413 | 422 => ModelErrorKind::InvalidRequest,
        401 => ModelErrorKind::Authentication,
        402 => ModelErrorKind::QuotaExceeded,
        403 => ModelErrorKind::Permission,
        404 => ModelErrorKind::NotFound,
        408 => ModelErrorKind::Timeout,
        // A conflict (e.g. a concurrent request on the same resource) clears on its own.
        409 => ModelErrorKind::Server,
        429 => ModelErrorKind::RateLimited,
        503 | 529 => ModelErrorKind::Overloaded,
        500..=599 => ModelErrorKind::Server,
        _ => ModelErrorKind::Other,
    }
}

/// Classifies an HTTP error response.
pub fn classify_http(provider: &str, status: u16, headers: &HeaderMap, body: &str) -> ModelError {
    let parsed = parse_error_body(body);
    let message_text = parsed.message.clone().unwrap_or_default();
    let all_text = format!(
        "{} {} {}",
        parsed.error_type.as_deref().unwrap_or(""),
        parsed.code.as_deref().unwrap_or(""),
        message_text
    )
    .to_ascii_lowercase();
    let mut kind = kind_from_status(status, &message_text);
    if matches!(status, 400 | 403 | 429) && is_quota_text(&all_text) {
        kind = ModelErrorKind::QuotaExceeded;
    }
    if status == 400 && parsed.error_type.as_deref() == Some("context_length_exceeded") {
        kind = ModelErrorKind::ContextOverflow;
    }
    let message = if message_text.is_empty() {
        format!("{provider} returned HTTP {status}")
    } else {
        format!("{provider} returned HTTP {status}: {message_text}")
    };
    ModelError {
        kind,
        message,
        status: Some(status),
        provider_error_type: parsed.error_type,
        request_id: request_id(headers).or(parsed.request_id),
        retry_after_ms: retry_after_ms(headers),
        body: Some(truncate(body)),
    }
}

/// Classifies an error object that arrived inside a 200 stream.
pub fn classify_stream_error(provider: &str, value: &Value) -> ModelError {
    let parsed = parse_error_value(value);
    let message_text = parsed
        .message
        .clone()
        .unwrap_or_else(|| "unknown error".to_owned());
    let kind = match (&parsed.error_type, &parsed.code) {
        (Some(t), _) => kind_from_type(t, &message_text),
        (None, Some(c)) => kind_from_type(c, &message_text),
        (None, None) if is_context_text(&message_text) => ModelErrorKind::ContextOverflow,
        (None, None) => ModelErrorKind::Server,
    };
    ModelError {
        kind,
        message: format!("{provider} reported an error mid-stream: {message_text}"),
        status: None,
        provider_error_type: parsed.error_type,
        request_id: parsed.request_id,
        retry_after_ms: None,
        body: Some(truncate(&value.to_string())),
    }
}

/// Classifies a transport failure from reqwest.
///
/// reqwest's message names the full request URL, which can carry secrets (a key in the
/// query string after a redirect, userinfo); the message built here shows only
/// `scheme://host:port/path` instead.
pub fn classify_transport(provider: &str, error: reqwest::Error, during_body: bool) -> ModelError {
    let kind = if error.is_timeout() {
        ModelErrorKind::Timeout
    } else if during_body || error.is_body() || error.is_decode() {
        ModelErrorKind::StreamInterrupted
    } else {
        ModelErrorKind::Network
    };
    let full_url = error.url().map(ToString::to_string);
    let shown_url = error.url().map(crate::redact::display_url);
    let error = error.without_url();
    let mut text = error.to_string();
    if let Some(url) = &shown_url {
        text.push_str(" for ");
        text.push_str(url);
    }
    let mut source = std::error::Error::source(&error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    // A source error could quote the URL too; never let the full form through.
    if let (Some(full), Some(shown)) = (&full_url, &shown_url)
        && full != shown
    {
        text = text.replace(full.as_str(), shown);
    }
    ModelError::new(kind, format!("{provider}: {text}"))
}

fn truncate(body: &str) -> String {
    if body.len() <= MAX_BODY {
        return body.to_owned();
    }
    let mut end = MAX_BODY;
    while !body.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    body.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_variants() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after_ms(&h), Some(2000));
        h.insert("retry-after-ms", HeaderValue::from_static("1500.2"));
        assert_eq!(retry_after_ms(&h), Some(1501));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after_ms(&h), Some(0));
    }

    #[test]
    fn quota_429_is_not_rate_limit() {
        let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        let e = classify_http("openai", 429, &HeaderMap::new(), body);
        assert_eq!(e.kind, ModelErrorKind::QuotaExceeded);
        assert!(!e.is_retryable());
    }

    #[test]
    fn ollama_string_error() {
        let e = classify_http(
            "ollama",
            404,
            &HeaderMap::new(),
            r#"{"error":"model 'x' not found"}"#,
        );
        assert_eq!(e.kind, ModelErrorKind::NotFound);
        assert!(e.message.contains("model 'x' not found"));
    }
}
