//! Error bodies as a model or a tenant may see them: capped at [`ERROR_BODY_CAP`] bytes and
//! redacted.
//!
//! A remote service's error body goes into a tool error, which reaches the model's next
//! prompt, the run's log and — in `keel serve` — the tenant. Services echo requests, print
//! stack traces and dump their configuration into error pages, so before a body is shown:
//! every configured secret the request carried (header values, credentials) is replaced,
//! then anything that looks like a credential ([`redact`]: bearer tokens, `key=value`
//! pairs whose key names a secret, well-known API key formats, JWTs, private key blocks,
//! URL passwords, long opaque tokens), then the text is cut to the cap with a note of how
//! much was left out. Redaction happens before the cut, so a secret is never shown in part.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Most bytes of an error body shown (before the note of what was cut).
pub const ERROR_BODY_CAP: usize = 512;

/// Bytes of a body redaction looks at: the cap plus room for a secret that starts inside
/// the cap and ends after it.
const REDACT_WINDOW: usize = ERROR_BODY_CAP + 4096;

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// Configured secrets shorter than this are not searched for: too short to be
/// credentials, and replacing them would garble ordinary text.
const MIN_SECRET_CHARS: usize = 4;

/// One redaction rule: a pattern and whether the match is kept in part (`$1`).
struct Rule {
    re: Regex,
    /// The replacement (`$1` keeps the key or scheme before the secret).
    with: &'static str,
    /// Only matches with a digit and a letter are secrets (opaque tokens).
    mixed_only: bool,
}

fn rules() -> &'static [Rule] {
    static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
        let specs: [(&str, &str, bool); 8] = [
            // Private key blocks, also cut ones without their END line.
            (
                r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z ]*PRIVATE KEY-----|\z)",
                REDACTED,
                false,
            ),
            // Credentials in URLs: scheme://user:password@host.
            (r"(://[^/\s:@]*:)[^/\s@]+@", "${1}[redacted]@", false),
            // key=value / "key": "value" whose key names a secret.
            (
                r#"(?i)\b([A-Za-z0-9_\-]*?(?:api[_-]?key|apikey|access[_-]?key|secret[_-]?key|client[_-]?secret|access[_-]?token|refresh[_-]?token|id[_-]?token|auth[_-]?token|session[_-]?(?:id|token)|private[_-]?key|x-api-key|password|passwd|pwd|secret|token|authorization|cookie|signature|sig|credentials?)["']?\s*[:=]\s*["']?)(?:(?:bearer|basic|token)\s+)?[^\s"'&,;<>{}]+"#,
                "${1}[redacted]",
                false,
            ),
            // Authorization schemes followed by a credential.
            (
                r"(?i)\b((?:bearer|basic|digest)\s+)[A-Za-z0-9\-._~+/]{8,}=*",
                "${1}[redacted]",
                false,
            ),
            // Well-known API key formats.
            (
                r"\b(?:sk-[A-Za-z0-9_\-]{16,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}|xox[abprs]-[A-Za-z0-9\-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[0-9A-Za-z_\-]{35}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36})",
                REDACTED,
                false,
            ),
            // JSON Web Tokens.
            (
                r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
                REDACTED,
                false,
            ),
            // Long hexadecimal strings (keys, signatures).
            (r"\b[0-9a-fA-F]{32,}\b", REDACTED, false),
            // Long opaque tokens mixing letters and digits.
            (r"[A-Za-z0-9_\-+/]{32,}={0,2}", REDACTED, true),
        ];
        specs
            .into_iter()
            .filter_map(|(pattern, with, mixed_only)| {
                Regex::new(pattern).ok().map(|re| Rule {
                    re,
                    with,
                    mixed_only,
                })
            })
            .collect()
    });
    &RULES
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.chars().all(|c| c.is_ascii_hexdigit()))
}

/// `text` with each of `secrets` (the configured values a request carried) and anything
/// that looks like a credential replaced by `[redacted]`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    let mut known: Vec<&String> = secrets
        .iter()
        .filter(|secret| secret.chars().count() >= MIN_SECRET_CHARS)
        .collect();
    // Longest first, so a value containing another is replaced whole.
    known.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    for secret in known {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), REDACTED);
        }
    }
    for rule in rules() {
        let replaced = if rule.mixed_only {
            rule.re.replace_all(&out, |caps: &Captures<'_>| {
                let found = caps.get(0).map_or("", |m| m.as_str());
                let mixed = found.chars().any(|c| c.is_ascii_digit())
                    && found.chars().any(|c| c.is_ascii_alphabetic());
                if mixed && !is_uuid(found) {
                    REDACTED.to_string()
                } else {
                    found.to_string()
                }
            })
        } else {
            rule.re.replace_all(&out, rule.with)
        };
        if let Cow::Owned(replaced) = replaced {
            out = replaced;
        }
    }
    out
}

/// The prefix of `text` of at most `max` bytes, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// An error body as it may be shown: redacted ([`redact`], with `secrets`), then cut to
/// [`ERROR_BODY_CAP`] bytes with a note of how many bytes of the body were left out.
pub fn error_excerpt(body: &[u8], secrets: &[String]) -> String {
    capped_text(&String::from_utf8_lossy(body), body.len(), secrets)
}

/// [`error_excerpt`] of a text (a service's error message), cut to [`ERROR_BODY_CAP`].
pub fn error_text(text: &str, secrets: &[String]) -> String {
    capped_text(text, text.len(), secrets)
}

fn capped_text(text: &str, total_bytes: usize, secrets: &[String]) -> String {
    let window = cut(text, REDACT_WINDOW);
    let redacted = redact(window, secrets);
    let shown = cut(&redacted, ERROR_BODY_CAP);
    if shown.len() == redacted.len() && window.len() == text.len() {
        return shown.to_string();
    }
    let shown_of_body = shown.len().min(total_bytes);
    format!(
        "{shown}… [{} more bytes not shown]",
        total_bytes.saturating_sub(shown_of_body)
    )
}

/// The URL as shown in messages: no query string, fragment, user name or password (the
/// path stays, so the message says which endpoint failed).
pub fn display_url(url: &url::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    // Both only fail for URLs that cannot have credentials, which then have none.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_and_ordinary_text_kept() {
        let secrets = vec!["hunter2-configured".to_string()];
        let cases = [
            (
                "Authorization: Bearer abcdefgh12345678",
                "Authorization: [redacted]",
            ),
            (
                "bad token Bearer abcdefgh12345678 sent",
                "bad token Bearer [redacted] sent",
            ),
            (
                r#"{"api_key": "k-1234567890"}"#,
                r#"{"api_key": "[redacted]"}"#,
            ),
            (
                "password=swordfish&user=bob",
                "password=[redacted]&user=bob",
            ),
            (
                "key sk-proj-ABCDEFGHIJKLMNOPQRST1234 leaked",
                "key [redacted] leaked",
            ),
            ("aws AKIAABCDEFGHIJKLMNOP", "aws [redacted]"),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[redacted]"),
            (
                "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig-abcdefgh",
                "jwt [redacted]",
            ),
            (
                "db postgres://app:s3cr3t@db:5432/x",
                "db postgres://app:[redacted]@db:5432/x",
            ),
            ("echo hunter2-configured back", "echo [redacted] back"),
            ("hash 0123456789abcdef0123456789abcdef", "hash [redacted]"),
            (
                "opaque Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg== end",
                "opaque [redacted] end",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----!",
                "[redacted]!",
            ),
            // Kept: ordinary words, ids, paths.
            (
                "request 123e4567-e89b-12d3-a456-426614174000 failed",
                "request 123e4567-e89b-12d3-a456-426614174000 failed",
            ),
            (
                "no such release: r-42 (field `release_id`)",
                "no such release: r-42 (field `release_id`)",
            ),
            (
                "/usr/local/lib/python/site-packages/app/views.py",
                "/usr/local/lib/python/site-packages/app/views.py",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(redact(text, &secrets), expected, "{text}");
        }
    }

    #[test]
    fn bodies_are_cut_after_redaction_with_a_note() {
        let mut body = "x".repeat(500);
        body.push_str(" token=abcdefghijklmnopqrstuvwxyz0123456789 ");
        body.push_str(&"y".repeat(1500));
        let shown = error_excerpt(body.as_bytes(), &[]);
        assert!(shown.len() < ERROR_BODY_CAP + 40, "{}", shown.len());
        assert!(!shown.contains("abcdefghij"), "{shown}");
        assert!(shown.ends_with("more bytes not shown]"), "{shown}");
        assert_eq!(error_excerpt(b"short", &[]), "short");
        // A multi-byte character at the cut is not split.
        let wide = "é".repeat(400);
        assert!(error_excerpt(wide.as_bytes(), &[]).starts_with('é'));
    }
}
