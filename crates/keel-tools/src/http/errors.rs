//! The errors of declarative HTTP tools: a non-2xx answer (code from the status, the
//! service's message and a body excerpt, both capped and redacted by
//! [`keel_outbound::excerpt`]), a refused redirect or address, a timeout and a failed
//! request — every text with the tool's secrets kept out ([`super::redact`]).

use keel_core::{ToolError, ToolErrorCode};
use keel_outbound::Refused;
use keel_outbound::excerpt::{self, ERROR_BODY_CAP};
use serde_json::{Value, json};

use super::redact::{self, display_url};
use super::response::error_message;
use super::{HttpTool, MAX_BODY_BYTES, redirect};

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
        let known = secrets.values();
        let raw = String::from_utf8_lossy(body);
        let mut excerpt = excerpt::error_excerpt(body, known);
        if cut {
            excerpt.push_str(&format!(
                " [the body exceeds {MAX_BODY_BYTES} bytes; only that much was read]"
            ));
        }
        let reason = parsed
            .as_ref()
            .and_then(error_message)
            .map(|message| excerpt::error_text(message.trim(), known))
            .unwrap_or_else(|| excerpt::error_text(raw.trim(), known));
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
        // The parsed body only when it is within the cap and nothing in it was redacted
        // (else `body` has the capped, redacted excerpt).
        let small = !cut && body.len() <= ERROR_BODY_CAP;
        if let (Some(parsed), Value::Object(map)) = (parsed, &mut details)
            && small
            && excerpt::redact(&raw, known) == raw
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

    /// A request refused by the outbound policy (`forbidden`, `details.error =
    /// "outbound_refused"`).
    pub(super) fn refused_address(&self, url: &url::Url, refused: &Refused) -> ToolError {
        ToolError::new(
            ToolErrorCode::Forbidden,
            format!(
                "`{}`: the request to {} was not sent: {refused}",
                self.spec.name,
                display_url(url)
            ),
        )
        .with_details(refused.details())
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
        if let Some(refused) = keel_outbound::refusal_of(&error) {
            return self.refused_address(url, &refused);
        }
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
