//! Keeping secrets out of the error texts of declarative HTTP tools: URLs are shown
//! without query string, fragment and userinfo, and the values of configured headers (and
//! of the URL template's own query string and userinfo) are replaced wherever they appear.
//!
//! Error texts go to the model, the run's log and traces, so they must never carry what
//! the tool's declaration keeps from the model.

/// What replaces a secret in a text.
const REDACTED: &str = "[redacted]";

/// Secrets shorter than this are not searched for: they are too short to be credentials,
/// and replacing them would garble ordinary text (ports, `true`, ...).
const MIN_SECRET_CHARS: usize = 4;

/// The URL as shown in messages (one rule for every outbound client).
pub use keel_outbound::excerpt::display_url;

/// The secret values of one tool, to be replaced in any text shown.
#[derive(Clone, Default)]
pub struct Secrets {
    values: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.values.len())
    }
}

impl Secrets {
    /// Secrets of a tool: every header value (whole, and its last word, so
    /// `Bearer TOKEN` also hides `TOKEN` alone), and the query values, user name and password
    /// written in the URL template (after `${ENV}` expansion; `{argument}` values are the
    /// model's own and are not secrets).
    pub fn of_tool<'a>(
        header_values: impl IntoIterator<Item = &'a str>,
        url_template: &str,
    ) -> Self {
        let mut values = Vec::new();
        for value in header_values {
            values.push(value.to_string());
            values.extend(value.split_whitespace().last().map(str::to_string));
        }
        if let Ok(url) = url::Url::parse(url_template) {
            values.push(url.username().to_string());
            values.extend(url.password().map(str::to_string));
            for (_, value) in url.query_pairs() {
                if !value.contains('{') {
                    values.push(value.into_owned());
                }
            }
            if let Some(query) = url.query() {
                values.extend(
                    query
                        .split('&')
                        .filter_map(|pair| pair.split_once('=').map(|(_, v)| v))
                        .filter(|v| !v.contains('{'))
                        .map(str::to_string),
                );
            }
        }
        values.retain(|v| v.chars().count() >= MIN_SECRET_CHARS);
        // Longest first, so a value containing another is replaced whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Self { values }
    }

    /// Secrets given as values (a call's credentials).
    pub fn of_values(values: impl IntoIterator<Item = String>) -> Self {
        Self::default().with(values)
    }

    /// These secrets and `values`.
    #[must_use]
    pub fn with(&self, values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = self.values.iter().cloned().chain(values).collect();
        values.retain(|v| v.chars().count() >= MIN_SECRET_CHARS);
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Self { values }
    }

    /// The secret values, longest first.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether there is no secret to look for.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REDACTED);
            }
        }
        out
    }

    /// Whether `text` contains a secret.
    pub fn appear_in(&self, text: &str) -> bool {
        self.values
            .iter()
            .any(|secret| text.contains(secret.as_str()))
    }
}

/// The text of an error and its sources (`a: b: c`), without the URL reqwest attaches
/// (which carries the query string), with secrets replaced.
pub fn error_text(error: reqwest::Error, secrets: &Secrets) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    secrets.scrub(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_query_fragment_and_credentials() {
        let url = url::Url::parse("http://user:pw@h:1/a/b?key=s3cret#frag").unwrap();
        assert_eq!(display_url(&url), "http://h:1/a/b");
    }

    #[test]
    fn header_and_template_secrets_are_scrubbed() {
        let secrets = Secrets::of_tool(
            ["Bearer tok-123456", "1"],
            "http://bob:hunter22@h/x?api_key=key-abcdef&id={id}",
        );
        let text = "auth Bearer tok-123456 then tok-123456 key-abcdef hunter22 port 1 {id}; Bearer";
        let scrubbed = secrets.scrub(text);
        assert_eq!(
            scrubbed,
            "auth [redacted] then [redacted] [redacted] [redacted] port 1 {id}; Bearer"
        );
        assert!(secrets.appear_in(text));
        assert!(!secrets.appear_in(&scrubbed));
        assert!(!format!("{secrets:?}").contains("tok-"));
    }
}
