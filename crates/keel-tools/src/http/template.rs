//! Templates of declarative HTTP tools: `${ENV}` / `${ENV:-default}` references resolved from
//! the environment, and `{argument}` placeholders filled from the call's arguments.

use std::collections::BTreeSet;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// Characters left as they are in a path segment: RFC 3986 unreserved characters.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One `${NAME}` or `${NAME:-default}` reference found in a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRef {
    /// The variable name.
    pub name: String,
    /// The default after `:-`, when given.
    pub default: Option<String>,
}

/// Every `${...}` reference in `text`, in order.
pub fn env_refs(text: &str) -> Vec<EnvRef> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = rest.get(start + 2..).unwrap_or_default();
        let Some(end) = after.find('}') else { break };
        let inner = after.get(..end).unwrap_or_default();
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default.to_string())),
            None => (inner, None),
        };
        out.push(EnvRef {
            name: name.trim().to_string(),
            default,
        });
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out
}

/// Replaces every `${NAME}` / `${NAME:-default}` in `text` using `env`. An empty variable
/// counts as unset when a default is given (shell semantics of `:-`). Returns the names of
/// variables that are unset and have no default as the error.
pub fn expand_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut missing = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(rest.get(..start).unwrap_or_default());
        let after = rest.get(start + 2..).unwrap_or_default();
        let Some(end) = after.find('}') else {
            // An unterminated reference is kept verbatim.
            out.push_str(rest.get(start..).unwrap_or_default());
            rest = "";
            break;
        };
        let inner = after.get(..end).unwrap_or_default();
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name.trim(), Some(default)),
            None => (inner.trim(), None),
        };
        match (env(name), default) {
            (Some(value), Some(default)) if value.is_empty() => out.push_str(default),
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => missing.push(name.to_string()),
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(missing)
    }
}

/// The `{name}` placeholders of a URL template (after `${ENV}` expansion), in order and
/// without duplicates.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = rest.get(start + 1..).unwrap_or_default();
        let Some(end) = after.find('}') else { break };
        let name = after.get(..end).unwrap_or_default().trim().to_string();
        if seen.insert(name.clone()) {
            out.push(name);
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out
}

/// A scalar argument as it appears in a URL (strings verbatim, numbers and booleans in
/// their JSON form). `None` for null, arrays and objects.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Fills the `{name}` placeholders of `template` from `args`, percent-encoding each value
/// as one path segment (`/`, `?`, `#`, `%` and everything but RFC 3986 unreserved
/// characters are encoded), so a value never adds segments, a query or a fragment. The
/// error names the argument that is missing, not a scalar, or would make a path segment
/// `.` or `..` (URL parsers resolve those even when percent-encoded as `%2e`, so no
/// encoding can keep them: they are refused).
pub fn fill_placeholders(
    template: &str,
    args: &serde_json::Map<String, Value>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    // While in the path (before a literal `?` or `#` of the template), each `/`-separated
    // piece is filled on its own so the finished segment can be checked.
    let mut in_path = true;
    for (index, piece) in template.split('/').enumerate() {
        if index > 0 {
            out.push('/');
        }
        let (filled, used) = fill_piece(piece, args)?;
        if in_path && !used.is_empty() {
            let segment = filled.split(['?', '#']).next().unwrap_or_default();
            if is_dot_segment(segment) {
                let names: Vec<String> = used.iter().map(|n| format!("`{n}`")).collect();
                return Err(format!(
                    "argument {} makes the URL path segment `{segment}`, which would change \
                     the path (`.` and `..` segments are resolved by URL rules); send the \
                     actual value, not `.` or `..`",
                    names.join(", ")
                ));
            }
        }
        if piece.contains(['?', '#']) {
            in_path = false;
        }
        out.push_str(&filled);
    }
    Ok(out)
}

/// Fills the placeholders of one piece of a template; returns the text and the names used.
fn fill_piece(
    piece: &str,
    args: &serde_json::Map<String, Value>,
) -> Result<(String, Vec<String>), String> {
    let mut out = String::with_capacity(piece.len());
    let mut used = Vec::new();
    let mut rest = piece;
    while let Some(start) = rest.find('{') {
        out.push_str(rest.get(..start).unwrap_or_default());
        let after = rest.get(start + 1..).unwrap_or_default();
        let Some(end) = after.find('}') else {
            out.push_str(rest.get(start..).unwrap_or_default());
            rest = "";
            break;
        };
        let name = after.get(..end).unwrap_or_default().trim();
        let Some(value) = args.get(name) else {
            return Err(format!(
                "argument `{name}` is required (it is part of the URL); add it to the call"
            ));
        };
        let Some(text) = scalar_text(value).filter(|t| !t.is_empty()) else {
            return Err(format!(
                "argument `{name}` must be a non-empty string, number or boolean (it is part \
                 of the URL), got {value}"
            ));
        };
        out.push_str(&utf8_percent_encode(&text, PATH_SEGMENT).to_string());
        used.push(name.to_string());
        rest = after.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok((out, used))
}

/// Whether a path segment is `.` or `..`, also in the percent-encoded forms (`%2e`) that
/// the WHATWG URL standard (and so the `url` crate) treats the same.
fn is_dot_segment(segment: &str) -> bool {
    let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
    decoded == "." || decoded == ".."
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("http://svc:1".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn env_expansion_with_defaults_and_missing_names() {
        assert_eq!(expand_env("${HOST}/x", &env).unwrap(), "http://svc:1/x");
        assert_eq!(
            expand_env("${NOPE:-http://d}/x", &env).unwrap(),
            "http://d/x"
        );
        assert_eq!(expand_env("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(
            expand_env("Bearer ${TOKEN}", &env).unwrap_err(),
            vec!["TOKEN"]
        );
        assert_eq!(expand_env("no refs {id}", &env).unwrap(), "no refs {id}");
        let refs = env_refs("${A:-1}/${B}");
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[1].name, "B");
    }

    #[test]
    fn placeholders_are_filled_and_encoded() {
        let args = json!({"id": "v2.1.0", "q": "a b/c", "n": 3});
        let args = args.as_object().unwrap();
        assert_eq!(
            fill_placeholders("http://h/r/{id}/{q}/{n}", args).unwrap(),
            "http://h/r/v2.1.0/a%20b%2Fc/3"
        );
        assert!(
            fill_placeholders("http://h/{missing}", args)
                .unwrap_err()
                .contains("`missing`")
        );
        assert_eq!(placeholders("http://h/{a}/{b}/{a}"), vec!["a", "b"]);
    }

    #[test]
    fn values_never_change_the_path_structure() {
        let fill = |value: &str| {
            let args = json!({ "id": value });
            fill_placeholders("http://h/releases/{id}/summary", args.as_object().unwrap())
        };
        let resolved = |value: &str| url::Url::parse(&fill(value).unwrap()).unwrap();
        assert_eq!(resolved("../admin").path(), "/releases/..%2Fadmin/summary");
        assert_eq!(
            resolved("a?b#c%d").path(),
            "/releases/a%3Fb%23c%25d/summary"
        );
        assert_eq!(resolved("a?b#c%d").query(), None);
        assert_eq!(resolved("...").path(), "/releases/.../summary");
        for dots in [".", "..", "%2e", "%2E%2e", ".%2E"] {
            // Percent-encoded dots are encoded again (`%252e`), so only real dots remain.
            if dots.contains('%') {
                assert!(fill(dots).is_ok(), "{dots}");
                continue;
            }
            let error = fill(dots).unwrap_err();
            assert!(error.contains("`id`") && error.contains("`.`"), "{error}");
        }
        // Two placeholders that together make `..` are refused, naming both.
        let args = json!({"a": ".", "b": "."});
        let error =
            fill_placeholders("http://h/x/{a}{b}/y", args.as_object().unwrap()).unwrap_err();
        assert!(error.contains("`a`, `b`"), "{error}");
        // In the query, dots are harmless.
        assert!(fill_placeholders("http://h/x?q={a}", args.as_object().unwrap()).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn templates_never_panic_and_plain_text_is_unchanged(text in ".{0,64}", value in ".{0,16}") {
            let _ = expand_env(&text, &env);
            let _ = env_refs(&text);
            let _ = placeholders(&text);
            let args = serde_json::json!({"a": value});
            let _ = fill_placeholders(&text, args.as_object().unwrap());
            if !text.contains("${") {
                proptest::prop_assert_eq!(expand_env(&text, &env).unwrap(), text.clone());
            }
            if !text.contains('{') {
                proptest::prop_assert_eq!(fill_placeholders(&text, args.as_object().unwrap()).unwrap(), text);
            }
        }
    }
}
