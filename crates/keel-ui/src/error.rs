//! Error pages: an unknown run or page is a 404 page, a malformed filter a 400 page that
//! names the field, a store failure a 502 page (redacted). Never a bare 500.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::html;

/// A request the UI cannot answer, rendered as an HTML page with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Page heading.
    pub title: String,
    /// What went wrong and what to do.
    pub message: String,
}

impl UiError {
    /// 404: no such run (or one outside the scope — the same answer, so a scope does not
    /// reveal what exists beyond it).
    pub fn not_found(what: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            title: "Not found".into(),
            message: what.into(),
        }
    }

    /// 400: a malformed parameter; the message names it.
    pub fn bad_input(field: &str, problem: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            title: "Bad request".into(),
            message: format!("invalid `{field}`: {problem}"),
        }
    }

    /// 409: the action does not apply in the thread's current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            title: "Cannot do that now".into(),
            message: message.into(),
        }
    }

    /// 403: a cross-site form post.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            title: "Forbidden".into(),
            message: message.into(),
        }
    }

    /// 502: the store failed (the message has been redacted by the caller).
    pub fn store(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            title: "Store unavailable".into(),
            message: message.into(),
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let page = html! {
            (maud::DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (self.title) " — keel" }
                    link rel="icon" href="data:,";
                    style { (maud::PreEscaped(crate::assets::ERROR_CSS)) }
                }
                body {
                    main class="error-page" {
                        h1 { (self.status.as_u16()) " " (self.title) }
                        p id="error-message" { (self.message) }
                    }
                }
            }
        };
        (self.status, Html(page.into_string())).into_response()
    }
}

/// The fallback: an unknown path.
pub async fn not_found(uri: axum::http::Uri) -> UiError {
    UiError::not_found(format!("there is no page at {}", uri.path()))
}
