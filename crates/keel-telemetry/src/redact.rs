//! Redaction of secrets and personal data before anything leaves the process or reaches
//! disk: logs, trace files, OTLP exports.
//!
//! Built-in rules cover API keys and tokens (OpenAI/Anthropic `sk-…`, `Bearer …`, AWS
//! access keys, GitHub, GitLab, Slack, Stripe, Google, Hugging Face, npm tokens, JWTs),
//! private key blocks (also truncated ones without their END line), credentials in URLs
//! (`user:pw@`, `:pw@`), `Authorization:` values whatever the scheme, `key=value` /
//! `"key": "value"` pairs whose key names a secret, query-string and form credentials
//! (`token=`, `sig=`, `signature=`, `key=`, …), emails, phone numbers, US social security numbers and credit-card
//! numbers (Luhn-checked, so ordinary long numbers survive). Configured regexes and field
//! names are added to them.

use std::borrow::Cow;

use regex::{Captures, Regex};
use serde_json::Value;

use crate::config::RedactionConfig;
use crate::error::TelemetryError;

/// Field names whose values are always redacted (compared case-insensitively, with `-`
/// and `_` removed).
pub const DEFAULT_SECRET_FIELDS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "client_secret",
    "api_key",
    "apikey",
    "x_api_key",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "authorization",
    "private_key",
    "aws_secret_access_key",
    "credentials",
    "cookie",
    "set_cookie",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    None,
    Luhn,
}

#[derive(Debug, Clone)]
struct Rule {
    kind: &'static str,
    re: Regex,
    check: Check,
}

/// Replaces secrets and personal data in strings and JSON values.
#[derive(Debug, Clone)]
pub struct Redactor {
    enabled: bool,
    rules: Vec<Rule>,
    fields: Vec<String>,
    replacement: String,
}

fn normalize_field(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn compile(kind: &'static str, pattern: &str, check: Check) -> Result<Rule, regex::Error> {
    Ok(Rule {
        kind,
        re: Regex::new(pattern)?,
        check,
    })
}

/// The built-in rules for the default field names, compiled once per process: compiling
/// them takes about a millisecond, and every redactor (each `keel config check`, each
/// loaded keel.toml) would otherwise pay it again; a configuration with extra fields
/// recompiles only the field rule. `Regex` clones share the compiled program.
fn default_rules() -> Result<Vec<Rule>, TelemetryError> {
    static DEFAULT: std::sync::LazyLock<Result<Vec<Rule>, String>> =
        std::sync::LazyLock::new(|| {
            let names: Vec<String> = DEFAULT_SECRET_FIELDS
                .iter()
                .map(|s| (*s).to_string())
                .collect();
            builtin_rules(&names).map_err(|e| e.to_string())
        });
    DEFAULT.clone().map_err(|message| TelemetryError::Config {
        field: "telemetry.redaction".into(),
        message: format!("a built-in pattern does not compile: {message}"),
    })
}

/// The rule redacting `key=value`, `key: value` and `"key": "value"` where the key names a
/// secret: the only built-in rule that depends on the configured field names.
fn secret_field_rule(field_names: &[String]) -> Result<Rule, regex::Error> {
    let names: Vec<String> = field_names
        .iter()
        .map(|f| {
            // `api_key` matches api_key, api-key, apikey, API_KEY.
            f.split(['_', '-'])
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join("[_-]?")
        })
        .collect();
    let key_alt = names.join("|");
    compile(
        "secret_field",
        &format!(
            r#"(?i)(?:\\?["'])?\b(?:{key_alt})\b(?:\\?["'])?\s*[:=]\s*(?:"(?P<s>(?:[^"\\]|\\.)*)"|'(?P<s2>[^']*)'|\\"(?P<s3>(?:[^"\\]|\\[^"])*)\\"|(?P<s4>[^\s"',;&}}\]]+))"#
        ),
        Check::None,
    )
}

fn builtin_rules(field_names: &[String]) -> Result<Vec<Rule>, regex::Error> {
    Ok(vec![
        // A whole key block; or, when the END line is missing (truncated output), the
        // base64 body and PEM headers after BEGIN, also when newlines are JSON-escaped.
        compile(
            "private_key",
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|(?:[A-Za-z0-9+/=:,.\\-]|\s)*)",
            Check::None,
        )?,
        // user:password@host in URLs (also `:password@` with no user, as in
        // `redis://:pw@host`): only the password goes.
        compile(
            "url_credentials",
            r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]*:(?P<s>[^/\s@]+)@",
            Check::None,
        )?,
        // `Authorization: <scheme> <credentials>` whatever the scheme (Token, ApiKey,
        // Digest, …; Bearer and Basic too); also `Proxy-Authorization`. The credentials
        // run to the end of the line or quoted string (Digest has several `k=v` pairs).
        // Runs before the generic field rule, which would take the scheme for the value.
        compile(
            "authorization",
            r#"(?i)\b(?:proxy[_-]?)?authorization\\?["']?\s*[:=]\s*\\?["']?(?:[A-Za-z][A-Za-z0-9_.-]*[ \t]+)?(?P<s>[^\s"'\\][^\r\n"'\\]*)"#,
            Check::None,
        )?,
        compile(
            "bearer_token",
            r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]{12,})",
            Check::None,
        )?,
        compile(
            "basic_auth",
            r"(?i)\bbasic\s+(?P<s>[A-Za-z0-9+/]{12,}={0,2})",
            Check::None,
        )?,
        compile(
            "jwt",
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
            Check::None,
        )?,
        // key=value, key: value, "key": "value" where key names a secret.
        secret_field_rule(field_names)?,
        // Credentials in URL query strings and form bodies: `?token=`, `&sig=`,
        // `signature=`, `key=`, `access_token=`, `X-Amz-Signature=`, `client_secret=`, …
        // (a value already replaced by an earlier rule, `[REDACTED…`, is left alone).
        compile(
            "query_secret",
            r#"(?i)(?:^|[?&;\s])(?:[a-z0-9_.-]*[_.-])?(?:token|sig|signature|key|apikey|secret|password|passwd|credential|auth)=(?P<s>[^\[&\s#"'<>;\\][^&\s#"'<>;\\]*)"#,
            Check::None,
        )?,
        compile(
            "api_key",
            r"\bsk-(?:ant-|proj-|live-|or-v1-)?[A-Za-z0-9_-]{20,}",
            Check::None,
        )?,
        compile(
            "aws_access_key",
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|ABIA|ACCA)[A-Z0-9]{16}\b",
            Check::None,
        )?,
        compile(
            "github_token",
            r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b",
            Check::None,
        )?,
        compile("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,}", Check::None)?,
        compile(
            "slack_token",
            r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
            Check::None,
        )?,
        compile(
            "slack_webhook",
            r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+",
            Check::None,
        )?,
        compile(
            "stripe_key",
            r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}",
            Check::None,
        )?,
        compile("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}", Check::None)?,
        compile("huggingface_token", r"\bhf_[A-Za-z0-9]{30,}", Check::None)?,
        compile("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", Check::None)?,
        compile(
            "email",
            r"(?i)\b[a-z0-9._%+-]+@[a-z0-9-]+(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b",
            Check::None,
        )?,
        compile(
            "credit_card",
            r"\b[2-6](?:[ -]?[0-9]){12,18}\b",
            Check::Luhn,
        )?,
        compile("ssn", r"\b[0-9]{3}-[0-9]{2}-[0-9]{4}\b", Check::None)?,
        // +44 20 7946 0958, +1-202-555-0143, +49 (0)30 901820
        compile(
            "phone",
            r"\+[1-9][0-9]{0,2}[ .-]?(?:\(0\)[ .-]?)?\(?[0-9]{1,4}\)?(?:[ .-]?[0-9]{2,4}){2,4}\b",
            Check::None,
        )?,
        // (202) 555-0143, 202-555-0143, 202.555.0143
        compile(
            "phone",
            r"(?:\([0-9]{3}\)\s?|\b[0-9]{3}[.-])[0-9]{3}[.-][0-9]{4}\b",
            Check::None,
        )?,
    ])
}

/// Luhn checksum over the digits of `s` (other characters ignored).
pub fn luhn_valid(s: &str) -> bool {
    let digits: Vec<u32> = s.chars().filter_map(|c| c.to_digit(10)).collect();
    if digits.len() < 13 || digits.len() > 19 {
        return false;
    }
    let mut sum = 0;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = *d;
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum % 10 == 0
}

/// The longest run of whole digit groups (separated by one space or `-`; a run without
/// separators is one group) inside `text` that holds 13 to 19 digits and passes the Luhn
/// check, as a byte range. Only group boundaries are tried, so the digits of an ordinary
/// number are never split mid-group.
fn luhn_window(text: &str) -> Option<(usize, usize)> {
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                groups.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        groups.push((s, text.len()));
    }
    let mut best: Option<(usize, usize)> = None;
    for (first, &(window_start, _)) in groups.iter().enumerate() {
        let mut digits = 0;
        for &(group_start, group_end) in groups.iter().skip(first) {
            digits += group_end - group_start;
            if digits > 19 {
                break;
            }
            let candidate = (window_start, group_end);
            let longer = best.is_none_or(|(s, e)| e - s < group_end - window_start);
            if digits >= 13 && longer && text.get(window_start..group_end).is_some_and(luhn_valid) {
                best = Some(candidate);
            }
        }
    }
    best
}

impl Default for Redactor {
    fn default() -> Self {
        // The built-in patterns are constants tested below; failing to compile them is a bug
        // caught by the test suite, and the fallback still redacts nothing silently wrong.
        Self::from_config(&RedactionConfig::default()).unwrap_or_else(|_| Self::disabled())
    }
}

/// Checks a redaction section without compiling it: field names must not be empty and
/// every custom pattern must parse as a regular expression (with the parser and limits
/// `regex` itself uses). Compiling is what [`Redactor::from_config`] does; checking a
/// configuration (`keel config check`, every load) needs only this, at a fraction of the
/// cost. A pattern that parses but compiles past `regex`'s size limit is still reported,
/// by `from_config`, with the same field name.
pub fn check_config(config: &RedactionConfig) -> Result<(), TelemetryError> {
    if !config.enabled {
        return Ok(());
    }
    for (i, f) in config.fields.iter().enumerate() {
        if f.trim().is_empty() {
            return Err(TelemetryError::Config {
                field: format!("telemetry.redaction.fields[{i}]"),
                message: "empty field name".into(),
            });
        }
    }
    for (i, p) in config.patterns.iter().enumerate() {
        regex_syntax::Parser::new()
            .parse(p)
            .map_err(|e| TelemetryError::Config {
                field: format!("telemetry.redaction.patterns[{i}]"),
                message: format!("invalid regular expression: {e}"),
            })?;
    }
    Ok(())
}

impl Redactor {
    /// A redactor that changes nothing.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            rules: Vec::new(),
            fields: Vec::new(),
            replacement: String::new(),
        }
    }

    /// Builds the built-in rules plus the configured patterns and fields.
    pub fn from_config(config: &RedactionConfig) -> Result<Self, TelemetryError> {
        if !config.enabled {
            return Ok(Self::disabled());
        }
        check_config(config)?;
        let mut field_names: Vec<String> = DEFAULT_SECRET_FIELDS
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        field_names.extend(config.fields.iter().map(|f| f.trim().to_string()));
        let mut rules = default_rules()?;
        if !config.fields.is_empty() {
            // Only the field rule depends on the names; the other rules stay shared.
            let field_rule =
                secret_field_rule(&field_names).map_err(|e| TelemetryError::Config {
                    field: "telemetry.redaction.fields".into(),
                    message: format!("a field name produced an invalid pattern: {e}"),
                })?;
            for rule in rules.iter_mut().filter(|rule| rule.kind == "secret_field") {
                *rule = field_rule.clone();
            }
        }
        for (i, p) in config.patterns.iter().enumerate() {
            let re = Regex::new(p).map_err(|e| TelemetryError::Config {
                field: format!("telemetry.redaction.patterns[{i}]"),
                message: format!("invalid regular expression: {e}"),
            })?;
            // Custom rules run first so they see the original text.
            rules.insert(
                i,
                Rule {
                    kind: "custom",
                    re,
                    check: Check::None,
                },
            );
        }
        Ok(Self {
            enabled: true,
            rules,
            fields: field_names.iter().map(|f| normalize_field(f)).collect(),
            replacement: config.replacement.clone(),
        })
    }

    /// Whether this redactor changes anything.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Whether a JSON field of this name is always redacted.
    pub fn is_secret_field(&self, name: &str) -> bool {
        self.enabled && self.fields.contains(&normalize_field(name))
    }

    /// Redacts a string. Borrowed when nothing matched.
    pub fn redact_str<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !self.enabled {
            return Cow::Borrowed(text);
        }
        let mut current: Cow<'a, str> = Cow::Borrowed(text);
        for rule in &self.rules {
            if !rule.re.is_match(&current) {
                continue;
            }
            let replaced = rule
                .re
                .replace_all(&current, |caps: &Captures<'_>| self.replace(rule, caps));
            if let Cow::Owned(s) = replaced {
                current = Cow::Owned(s);
            }
        }
        current
    }

    fn replace(&self, rule: &Rule, caps: &Captures<'_>) -> String {
        let Some(whole) = caps.get(0) else {
            return String::new();
        };
        if rule.check == Check::Luhn && !luhn_valid(whole.as_str()) {
            // The digits may run on into an expiry or another number
            // (`4111 1111 1111 1111 12/29`): redact the card inside, keep the rest.
            let text = whole.as_str();
            return match luhn_window(text) {
                Some((start, end)) => format!(
                    "{}{}{}",
                    text.get(..start).unwrap_or_default(),
                    self.marker(rule.kind),
                    text.get(end..).unwrap_or_default()
                ),
                None => text.to_string(),
            };
        }
        let secret = ["s", "s2", "s3", "s4"]
            .iter()
            .find_map(|name| caps.name(name));
        match secret {
            Some(m) => {
                // Keep the text around the secret group (e.g. the key name).
                let start = m.start().saturating_sub(whole.start());
                let end = m.end().saturating_sub(whole.start());
                let text = whole.as_str();
                let (Some(before), Some(after)) = (text.get(..start), text.get(end..)) else {
                    return self.marker(rule.kind);
                };
                format!("{before}{}{after}", self.marker(rule.kind))
            }
            None => self.marker(rule.kind),
        }
    }

    fn marker(&self, kind: &str) -> String {
        let base = self.replacement.trim_end_matches(']');
        if self.replacement.ends_with(']') {
            format!("{base}:{kind}]")
        } else {
            self.replacement.clone()
        }
    }

    /// Redacts a JSON value in place: string values (and object keys are checked against
    /// the secret field names, whose values are replaced whatever their type).
    pub fn redact_value(&self, value: &mut Value) {
        if !self.enabled {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(new) = self.redact_str(s) {
                    *s = new;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if self.is_secret_field(key) && !v.is_null() {
                        *v = Value::String(self.marker("secret_field"));
                    } else {
                        self.redact_value(v);
                    }
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// A redacted copy of a JSON value.
    pub fn redacted_value(&self, value: &Value) -> Value {
        let mut copy = value.clone();
        self.redact_value(&mut copy);
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_compile() {
        let r = Redactor::from_config(&RedactionConfig::default()).unwrap();
        assert!(r.is_enabled());
    }

    #[test]
    fn luhn() {
        assert!(luhn_valid("4111 1111 1111 1111"));
        assert!(!luhn_valid("4111 1111 1111 1112"));
    }

    #[test]
    fn a_card_followed_by_more_digits_is_still_found() {
        assert_eq!(luhn_window("4111 1111 1111 1111 12"), Some((0, 19)));
        assert_eq!(luhn_window("4111111111111111 12"), Some((0, 16)));
        assert_eq!(luhn_window("52 4111 1111 1111 1111"), Some((3, 22)));
        assert_eq!(luhn_window("4111 1111 1111 1112 12"), None);
        let r = Redactor::default();
        assert_eq!(
            r.redact_str("card 4111 1111 1111 1111 12/29"),
            "card [REDACTED:credit_card] 12/29"
        );
    }

    #[test]
    fn keeps_key_name() {
        let r = Redactor::default();
        assert_eq!(
            r.redact_str("password=hunter2 ok"),
            "password=[REDACTED:secret_field] ok"
        );
        assert_eq!(
            r.redact_str(r#"{"api_key": "abc def"}"#),
            r#"{"api_key": "[REDACTED:secret_field]"}"#
        );
    }
}
