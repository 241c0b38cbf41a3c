//! The errors of declarative HTTP tools: a non-2xx answer (code from the status, the
//! service's message and a bounded body excerpt), a refused redirect, a timeout and a
//! failed request — every text with the tool's secrets kept out ([`super::redact`]).

use keel_core::context::truncate_tool_output;
use keel_core::{ToolError, ToolErrorCode};
use serde_json::{Value, json};

use super::redact::{self, display_url};
use super::response::error_message;
use super::{HttpTool, MAX_BODY_BYTES, redirect};

/// Longest excerpt of an error body kept in the error's `details.body`, in characters
/// (the rest is cut with a notice: error bodies go to the log and the next prompt).
const ERROR_BODY_CHARS: usize = 4_096;
/// Longest service message kept in an error's message, in characters.
const ERROR_REASON_CHARS: usize = 1_000;

impl HttpTool {
    /// The error for a non-2xx answer: the code from the status, the service's own message
    /// and a bounded excerpt of the body (secrets replaced). The caller adds `Retry-After`.
    pub(super) fn status_error(
        &self,
        status: reqwest::StatusCode,
        url: &url::Url,
        body: &[u8],
        cut: bool,
        parsed: Option<Value>,
        secrets: &redact::Secrets,
    ) -> ToolError {
        let name = &self.spec.name;
        let code = ToolErrorCode::from_http_status(status.as_u16()).unwrap_or(
            if status.is_client_error() {
                ToolErrorCode::InvalidInput
            } else {
                ToolErrorCode::ToolBug
            },
        );
        let raw = String::from_utf8_lossy(body);
        let text = secrets.scrub(&raw);
        let excerpt = capped(&text, ERROR_BODY_CHARS, name, cut);
        let reason = parsed
            .as_ref()
            .and_then(error_message)
            .map(|message| secrets.scrub(&message))
            .map(|message| capped(message.trim(), ERROR_REASON_CHARS, name, false))
            .unwrap_or_else(|| capped(text.trim(), ERROR_REASON_CHARS, name, cut));
        let mut message = format!(
            "`{name}` got HTTP {} from {} {}",
            status.as_u16(),
            self.method.as_reqwest(),
            display_url(url)
        );
        if !reason.trim().is_empty() {
            message.push_str(": ");
            message.push_str(reason.trim());
        }
        let mut details = json!({"status": status.as_u16(), "body": excerpt});
        // The parsed body only when it is small and holds no secret (else `body` has the
        // bounded, scrubbed excerpt).
        let small = !cut && text.chars().count() <= ERROR_BODY_CHARS;
        if let (Some(parsed), Value::Object(map)) = (parsed, &mut details)
            && small
            && !secrets.appear_in(&raw)
        {
            map.insert("body_json".into(), parsed);
        }
        ToolError::new(code, message).with_details(details)
    }

    pub(super) fn refused_redirect(
        &self,
        from: &url::Url,
        response: &reqwest::Response,
        refusal: redirect::Refusal,
        secrets: &redact::Secrets,
    ) -> ToolError {
        let name = &self.spec.name;
        let status = response.status().as_u16();
        let from = display_url(from);
        let (message, target) = match refusal {
            redirect::Refusal::NotAllowed => (
                format!(
                    "`{name}`: {from} answered HTTP {status} (a redirect), and this tool \
                     follows no redirects (redirects = \"none\"); point `url` at the final \
                     address, or set redirects = \"same_origin\""
                ),
                None,
            ),
            redirect::Refusal::OtherOrigin(to) => {
                let to = display_url(&to);
                (
                    format!(
                        "`{name}`: {from} redirected (HTTP {status}) to {to}, another origin; \
                         redirects to other origins are refused (redirects = \"same_origin\", \
                         the default) so the tool's headers cannot leak; point `url` at the \
                         final address, or set redirects = \"any\" to follow such redirects \
                         without the configured headers"
                    ),
                    Some(to),
                )
            }
            redirect::Refusal::BadLocation(location) => (
                format!(
                    "`{name}`: {from} redirected (HTTP {status}) to a location that is not an \
                     http(s) URL; it was not followed"
                ),
                Some(secrets.scrub(&location)),
            ),
        };
        let mut details = json!({"status": status, "redirects": self.redirects.as_str()});
        if let (Some(target), Value::Object(map)) = (target, &mut details) {
            map.insert("location".into(), json!(target));
        }
        ToolError::new(ToolErrorCode::ToolBug, message).with_details(details)
    }

    pub(super) fn timeout_error(&self, url: &url::Url) -> ToolError {
        ToolError::new(
            ToolErrorCode::Timeout,
            format!(
                "`{}`: {} did not answer within {} ms",
                self.spec.name,
                display_url(url),
                self.spec.timeout_ms
            ),
        )
    }

    /// A failed request as a tool error. Its text never holds the query string, userinfo
    /// or a configured header value ([`redact`]).
    pub(super) fn transport_error(
        &self,
        error: reqwest::Error,
        url: &url::Url,
        secrets: &redact::Secrets,
    ) -> ToolError {
        let name = &self.spec.name;
        let target = display_url(url);
        if error.is_timeout() {
            return self.timeout_error(url);
        }
        let connect = error.is_connect();
        let text = redact::error_text(error, secrets);
        if connect {
            ToolError::new(
                ToolErrorCode::RetryableServer,
                format!("`{name}`: cannot connect to {target}; is the service running? ({text})"),
            )
        } else {
            ToolError::new(
                ToolErrorCode::RetryableServer,
                format!("`{name}`: request to {target} failed: {text}"),
            )
        }
    }
}

/// `text` cut to `max_chars` with keel-core's `[OUTPUT TRUNCATED: Showing X of Y
/// characters from TOOL]` notice; `read_cut` adds that the body itself was not read whole.
fn capped(text: &str, max_chars: usize, tool: &str, read_cut: bool) -> String {
    let mut out = truncate_tool_output(text, max_chars, tool)
        .map(|(cut, _, _)| cut)
        .unwrap_or_else(|| text.to_string());
    if read_cut {
        out.push_str(&format!(
            "\n[the body exceeds {MAX_BODY_BYTES} bytes; only that much was read]"
        ));
    }
    out
}
