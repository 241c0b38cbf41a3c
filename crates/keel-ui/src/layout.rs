//! The page shell (head, navigation, the compiled-in stylesheet and script) and the
//! security headers every response carries.

use axum::http::{HeaderValue, header};
use axum::response::Response;
use maud::{DOCTYPE, Markup, html};

use crate::Ui;

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Runs,
    Dashboard,
    Evals,
}

/// A whole page.
pub(crate) fn page(ui: &Ui, title: &str, nav: Nav, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — keel" }
                link rel="icon" href="data:,";
                link rel="stylesheet" href=(ui.href(&format!("/assets/ui.css?v={}", crate::assets::VERSION)));
                script src=(ui.href(&format!("/assets/ui.js?v={}", crate::assets::VERSION))) defer {}
            }
            body data-base=(ui.base) {
                header class="top" {
                    a class="brand" href=(ui.href("/runs")) { "keel" }
                    nav {
                        a href=(ui.href("/runs")) class=[(nav == Nav::Runs).then_some("current")] { "Runs" }
                        a href=(ui.href("/dashboard")) class=[(nav == Nav::Dashboard).then_some("current")] { "Dashboard" }
                        @if ui.evals.is_some() {
                            a href=(ui.href("/evals")) id="nav-evals" class=[(nav == Nav::Evals).then_some("current")] { "Evals" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// Headers on every response: a strict content security policy (scripts and styles from
/// the UI itself only; inline `style` attributes position the waterfall's bars), no
/// framing, no MIME sniffing, no referrer to other sites, and no caching of pages that change.
pub(crate) async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
             img-src 'self' data:; connect-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
