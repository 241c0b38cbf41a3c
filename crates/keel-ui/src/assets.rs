//! The compiled-in assets: one stylesheet and one script, served from the binary (no CDN,
//! works offline), cacheable because their URLs carry the crate version.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::UiError;

/// The stylesheet.
pub(crate) const CSS: &str = include_str!("../assets/ui.css");
/// The script.
pub(crate) const JS: &str = include_str!("../assets/ui.js");
/// The little style of error pages (inline: they are rendered without the base path).
pub(crate) const ERROR_CSS: &str = "body{font:15px/1.5 system-ui,sans-serif;color:#1d2330;margin:0}\
main{max-width:720px;margin:64px auto;padding:0 24px}h1{font-size:22px}\
#error-message{background:#fdecec;border:1px solid #f5c2c2;border-radius:4px;padding:10px 12px}";
/// Part of the assets' URLs, so a new build is never served a stale cached copy.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `GET /assets/{name}`.
pub(crate) async fn serve(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "ui.css" => (CSS, "text/css; charset=utf-8"),
        "ui.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return UiError::not_found(format!("there is no asset {name}")).into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
        ],
        body,
    )
        .into_response()
}
