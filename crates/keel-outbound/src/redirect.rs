//! Redirects of outbound calls: which ones are followed ([`RedirectPolicy`], same origin
//! by default) and what the next hop looks like ([`next_hop`]).
//!
//! Clients that send configured secret headers (HTTP tools, the A2A client) follow
//! redirects themselves, one hop at a time, instead of using reqwest's redirect policy:
//! reqwest forwards every header except a fixed list (Authorization, Cookie, ...) to the
//! next host, and a policy callback cannot remove headers. So a hop is followed by a new
//! request the caller builds: on a hop to another origin (only with [`RedirectPolicy::Any`])
//! it leaves every configured header behind, and it checks the target against the
//! [`OutboundPolicy`](crate::OutboundPolicy) before sending. A client whose requests
//! reqwest (or a library over it) sends — MCP over HTTP through rmcp — uses
//! [`same_origin_policy`] instead, which follows no hop to another origin at all.

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

/// Most redirects followed for one call.
pub const MAX_REDIRECTS: usize = 10;

/// Which redirects a client follows (an HTTP tool's `redirects = "..."`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedirectPolicy {
    /// Follow redirects whose target has the same origin (scheme, host and port) as the
    /// request's first URL; refuse the others with an error. The default.
    #[default]
    SameOrigin,
    /// Follow no redirect: a 3xx answer with a `Location` is an error.
    None,
    /// Follow every redirect (to http or https) the outbound policy allows; from the first
    /// hop to another origin on, the configured headers are no longer sent (nor
    /// Authorization or Cookie).
    Any,
}

impl RedirectPolicy {
    /// The value as written in a declaration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SameOrigin => "same_origin",
            Self::None => "none",
            Self::Any => "any",
        }
    }
}

/// The next request after a redirect answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// Where to go.
    pub url: url::Url,
    /// Whether the request becomes a GET without body (301, 302, 303 after a non-GET,
    /// as browsers and reqwest do); 307 and 308 keep the method and the body.
    pub becomes_get: bool,
    /// Whether `url` has another origin than the request's first URL.
    pub cross_origin: bool,
}

/// Why a redirect was not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The policy is `none`.
    NotAllowed,
    /// The policy is `same_origin` and the target has another origin.
    OtherOrigin(url::Url),
    /// The `Location` is not an http(s) URL.
    BadLocation(String),
}

/// Whether `status` is a redirect a client may follow (300, 304 and 305 are not).
pub fn is_followable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Decides the hop after `current` answered `status` with `location`, for a call that
/// started at `original`. `None` when the answer is not a followable redirect (then it is
/// the response).
pub fn next_hop(
    policy: RedirectPolicy,
    original: &url::Url,
    current: &url::Url,
    status: StatusCode,
    location: Option<&str>,
) -> Option<Result<Hop, Refusal>> {
    let location = location.filter(|_| is_followable(status))?;
    if policy == RedirectPolicy::None {
        return Some(Err(Refusal::NotAllowed));
    }
    let url = match current.join(location) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => url,
        _ => return Some(Err(Refusal::BadLocation(location.to_string()))),
    };
    let cross_origin = url.origin() != original.origin();
    if cross_origin && policy == RedirectPolicy::SameOrigin {
        return Some(Err(Refusal::OtherOrigin(url)));
    }
    Some(Ok(Hop {
        url,
        becomes_get: matches!(status.as_u16(), 301..=303),
        cross_origin,
    }))
}

/// A reqwest redirect policy for clients whose requests reqwest sends itself (MCP over
/// HTTP): same-origin 307 and 308 redirects only (they keep the method and body), at most
/// [`MAX_REDIRECTS`]; anything else is returned to the caller as the redirect answer.
/// A hop to another origin is never followed here, because a policy callback cannot
/// drop the configured headers reqwest would replay to the new host; following such hops
/// takes a client that follows redirects itself ([`next_hop`]).
pub fn same_origin_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn url(text: &str) -> url::Url {
        url::Url::parse(text).unwrap()
    }

    #[test]
    fn policies_decide_which_hops_are_followed() {
        let start = url("http://a:1/x");
        let found = StatusCode::FOUND;
        let same = next_hop(
            RedirectPolicy::SameOrigin,
            &start,
            &start,
            found,
            Some("/y"),
        );
        assert_eq!(
            same,
            Some(Ok(Hop {
                url: url("http://a:1/y"),
                becomes_get: true,
                cross_origin: false
            }))
        );
        let other = next_hop(
            RedirectPolicy::SameOrigin,
            &start,
            &start,
            found,
            Some("http://a:2/y"),
        );
        assert_eq!(other, Some(Err(Refusal::OtherOrigin(url("http://a:2/y")))));
        let any = next_hop(
            RedirectPolicy::Any,
            &start,
            &start,
            StatusCode::TEMPORARY_REDIRECT,
            Some("https://a:1/y"),
        );
        assert_eq!(
            any,
            Some(Ok(Hop {
                url: url("https://a:1/y"),
                becomes_get: false,
                cross_origin: true
            }))
        );
        assert_eq!(
            next_hop(RedirectPolicy::None, &start, &start, found, Some("/y")),
            Some(Err(Refusal::NotAllowed))
        );
        assert_eq!(
            next_hop(
                RedirectPolicy::Any,
                &start,
                &start,
                found,
                Some("file:///etc/passwd")
            ),
            Some(Err(Refusal::BadLocation("file:///etc/passwd".into())))
        );
        // Not a redirect, or no Location: the answer is the response.
        assert_eq!(
            next_hop(
                RedirectPolicy::Any,
                &start,
                &start,
                StatusCode::OK,
                Some("/y")
            ),
            None
        );
        assert_eq!(
            next_hop(RedirectPolicy::Any, &start, &start, found, None),
            None
        );
    }
}
