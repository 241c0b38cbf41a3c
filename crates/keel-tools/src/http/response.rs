//! Reading HTTP responses for declarative tools: error messages from JSON error bodies and
//! `Retry-After` hints.

use serde_json::Value;

/// A human-readable error message from a JSON error body (`{"error": "..."}`,
/// `{"error": {"message": ".."}}`, `{"message": ".."}`), with any `field`/`fix` hints.
pub(crate) fn error_message(body: &Value) -> Option<String> {
    let error = body.get("error").unwrap_or(body);
    let message = match error {
        Value::String(s) => s.clone(),
        Value::Object(map) => map
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| error.to_string()),
        _ => return None,
    };
    let hint = |key: &str| {
        error
            .get(key)
            .or_else(|| body.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let mut out = message;
    if let Some(field) = hint("field")
        && !out.contains(&field)
    {
        out.push_str(&format!(" (field `{field}`)"));
    }
    if let Some(fix) = hint("fix")
        && !out.contains(&fix)
    {
        out.push_str(&format!(" Fix: {fix}"));
    }
    Some(out)
}

/// `Retry-After` (seconds or an HTTP date) or `retry-after-ms`, in milliseconds.
pub(crate) fn retry_after_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(ms.round() as u64);
    }
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).round() as u64);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let wait = when
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}
