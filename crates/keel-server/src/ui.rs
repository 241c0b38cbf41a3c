//! The web UI (`keel-ui`) under `/ui`, behind a session and scoped to its tenant.
//!
//! Browsers cannot send `Authorization: Bearer` on a navigation, so `/ui` has sessions:
//! `GET /ui/login` is a form where the user pastes an API key; `POST /ui/login` checks it
//! with the key store ([`keys::resolve`]) and sets the cookie [`COOKIE`] holding a random
//! 256-bit session id (`HttpOnly`, `SameSite=Strict`, `Path=/ui`, `Secure` when the
//! request came over TLS — `X-Forwarded-Proto: https` from a proxy). The key itself is
//! never put in a cookie: the server keeps, in memory and keyed by SHA-256 of the session
//! id, the session's tenant, key id and key digest, and on **every** `/ui` request checks
//! that the key is still active (one indexed lookup, like a `/v1` request), so a revoked
//! key's sessions end at their next request. Sessions last [`SESSION_TTL`];
//! `POST /ui/logout` ends one. A request without a valid session is redirected to the
//! login page (`303`, with `next` to come back to).
//!
//! Each tenant gets its own [`keel_ui::router`] over a [`Scope::ThreadPrefix`] of its
//! store prefix ([`crate::tenancy`]): another tenant's run is the UI's 404 page, exactly as
//! for an id nobody uses, and pages show client thread ids
//! ([`keel_ui::Ui::with_relative_ids`]). Approvals from the pages are recorded by keel-ui
//! (through the runtime's `Thread`) and the run continues **on a worker**: the
//! [`QueueResumer`] queues the continuation of the run's job, like
//! `POST /v1/threads/{id}/approvals/{call}`. keel-ui's own check refusing cross-site form
//! posts stays in force, and the login and logout forms get the same check.
//!
//! Sessions are per process: behind a load balancer with several `keel serve` processes,
//! use sticky sessions (or log in on each).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use keel_core::EventStore;
use keel_runtime::Thread;
use keel_telemetry::Redactor;
use keel_ui::{Resumer, RunSource, Scope, Ui};
use rand::RngCore;
use tower::ServiceExt;

use crate::jobs::enqueue_continue;
use crate::keys;
use crate::state::AppState;

/// The session cookie's name.
pub const COOKIE: &str = "keel_session";

/// How long a session lasts after login (the key is still checked on every request).
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Sessions kept at most (the ones closest to expiry are dropped first).
const MAX_SESSIONS: usize = 10_000;

/// Sessions one tenant keeps at most: logging in again and again drops that tenant's
/// oldest session, never another tenant's.
pub const MAX_SESSIONS_PER_TENANT: usize = 100;

/// A logged-in browser.
#[derive(Debug, Clone)]
struct Session {
    tenant: String,
    key_id: String,
    key_sha256: String,
    expires: Instant,
    /// The session's anti-forgery token, carried by every form of its pages.
    csrf: keel_ui::CsrfToken,
}

/// The `/ui` mount: sessions and the tenants' UI routers.
struct UiMount {
    state: AppState,
    redactor: Redactor,
    /// By SHA-256 of the session id.
    sessions: Mutex<HashMap<String, Session>>,
    /// By tenant (a tenant's UI keeps its notes on approvals between requests).
    routers: Mutex<HashMap<String, Router>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The `/ui` routes (merged into the server's router).
pub fn routes<S: Clone + Send + Sync + 'static>(state: &AppState) -> Router<S> {
    let redactor = match Redactor::from_config(&state.app.config().telemetry.redaction) {
        Ok(redactor) if redactor.is_enabled() => redactor,
        // Like `keel ui`: at least the built-in rules, even when redaction is off for traces.
        _ => Redactor::default(),
    };
    let mount = Arc::new(UiMount {
        state: state.clone(),
        redactor,
        sessions: Mutex::default(),
        routers: Mutex::default(),
    });
    Router::new()
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui", any(dispatch))
        .route("/ui/{*rest}", any(dispatch))
        .with_state(mount)
}

impl UiMount {
    /// The tenant's UI router.
    fn router_for(&self, tenant: &str) -> Router {
        let mut routers = locked(&self.routers);
        routers
            .entry(tenant.to_string())
            .or_insert_with(|| {
                let source = RunSource::new(self.state.events.clone(), self.redactor.clone())
                    .with_scope(Scope::ThreadPrefix(format!("{tenant}.")));
                let ui = Ui::new(source)
                    .with_base_path("/ui")
                    .with_relative_ids()
                    .with_resumer(Arc::new(QueueResumer {
                        state: self.state.clone(),
                        tenant: tenant.to_string(),
                    }));
                keel_ui::router(ui)
            })
            .clone()
    }

    /// The 429 page when `tenant` has used its requests-per-minute allowance
    /// (`[server.limits]`), after taking one request of it.
    fn limited(&self, tenant: &str) -> Option<Response> {
        let per_minute = self.state.config.limits_for(tenant).requests_per_minute;
        let error = self.state.rate.check(tenant, per_minute).err()?;
        self.state.metrics.limited.fetch_add(1, Ordering::Relaxed);
        Some(too_many(&error.message, error.retry_after.unwrap_or(1)))
    }

    /// What a live page's stream holds and asks: a stream slot of the session's tenant and
    /// key (`too_many_streams` when none is left), and whether the session (by the digest `id`
    /// of its cookie) still stands: not logged out, not expired, its key still active.
    fn live_guard(
        self: &Arc<Self>,
        id: String,
        session: &Session,
    ) -> Result<keel_ui::LiveGuard, crate::error::ApiError> {
        let limits = self.state.config.limits_for(&session.tenant);
        let permit = self
            .state
            .streams
            .open(&session.tenant, &session.key_id, &limits)?;
        let mount = Arc::clone(self);
        let session = session.clone();
        let still_allowed = move || -> futures::future::BoxFuture<'static, bool> {
            let mount = Arc::clone(&mount);
            let session = session.clone();
            let id = id.clone();
            Box::pin(async move {
                let open = locked(&mount.sessions)
                    .get(&id)
                    .is_some_and(|s| s.expires > Instant::now());
                open && crate::streams::key_still_active(
                    &mount.state,
                    &session.tenant,
                    &session.key_id,
                    &session.key_sha256,
                )
                .await
            })
        };
        Ok(keel_ui::LiveGuard::new(still_allowed, permit))
    }

    fn forget(&self, id: &str) {
        locked(&self.sessions).remove(id);
    }

    /// A new session for a key; returns the session id for the cookie.
    fn open(&self, tenant: String, key_id: String, key_sha256: String) -> String {
        let mut token = [0u8; 32];
        rand::rng().fill_bytes(&mut token);
        let token = keys::hex(&token);
        let now = Instant::now();
        let mut sessions = locked(&self.sessions);
        sessions.retain(|_, s| s.expires > now);
        while sessions.values().filter(|s| s.tenant == tenant).count() >= MAX_SESSIONS_PER_TENANT {
            let oldest = sessions
                .iter()
                .filter(|(_, s)| s.tenant == tenant)
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => sessions.remove(&id),
                None => break,
            };
        }
        while sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => sessions.remove(&id),
                None => break,
            };
        }
        sessions.insert(
            keys::digest(&token),
            Session {
                tenant,
                key_id,
                key_sha256,
                expires: now + SESSION_TTL,
                csrf: keel_ui::CsrfToken::random(),
            },
        );
        token
    }

    /// The request's session, its key still active; otherwise the answer to give.
    async fn session(&self, headers: &HeaderMap, uri: &Uri) -> Result<Session, Response> {
        let Some(token) = cookie(headers, COOKIE) else {
            return Err(to_login(uri, None));
        };
        let id = keys::digest(&token);
        let found = locked(&self.sessions).get(&id).cloned();
        let Some(session) = found.filter(|s| s.expires > Instant::now()) else {
            self.forget(&id);
            return Err(to_login(uri, Some("expired")));
        };
        let checked = tokio::time::timeout(
            self.state.request_timeout(),
            self.state.serving.find_api_key(&session.key_sha256),
        )
        .await;
        match checked {
            Ok(Ok(Some(info)))
                if info.key_id == session.key_id && info.tenant == session.tenant =>
            {
                Ok(session)
            }
            Ok(Ok(_)) => {
                self.forget(&id);
                self.state
                    .metrics
                    .unauthorized
                    .fetch_add(1, Ordering::Relaxed);
                Err(to_login(uri, Some("revoked")))
            }
            Ok(Err(e)) => Err(page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                &format!("cannot check the session's key: {e}; retry"),
            )),
            Err(_) => Err(page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                "the key store did not answer in time; retry",
            )),
        }
    }
}

/// Every `/ui` page and action: the session's tenant's UI, or the login page.
async fn dispatch(State(mount): State<Arc<UiMount>>, request: Request) -> Response {
    let session = match mount.session(request.headers(), request.uri()).await {
        Ok(session) => session,
        Err(answer) => return answer,
    };
    // Every page, action and live stream counts against the tenant's allowance, as a
    // `/v1` request does: a browser tab cannot be used to get around the limit.
    if let Some(limited) = mount.limited(&session.tenant) {
        return limited;
    }
    let (mut parts, body) = request.into_parts();
    let full = parts.uri.path_and_query().map_or("/ui", |p| p.as_str());
    let rest = full.strip_prefix("/ui").unwrap_or(full);
    let rest = if rest.starts_with('/') {
        rest.to_string()
    } else {
        format!("/{rest}")
    };
    parts.uri = match rest.parse::<Uri>() {
        Ok(uri) => uri,
        Err(_) => return page(StatusCode::BAD_REQUEST, "Bad request", "invalid path"),
    };
    // A fresh request for the UI's router: the outer route's path parameters must not
    // reach the UI's extractors.
    parts.extensions = axum::http::Extensions::new();
    parts.extensions.insert(session.csrf.clone());
    parts
        .extensions
        .insert(keel_ui::DecidedBy(format!("ui:{}", session.key_id)));
    // A live page is a stream: it takes a slot of the tenant's and the key's open
    // streams, and ends when the session does (its key revoked, its time up).
    if parts.method == Method::GET && parts.uri.path().ends_with("/live") {
        let id = cookie(&parts.headers, COOKIE).map_or_else(String::new, |t| keys::digest(&t));
        match mount.live_guard(id, &session) {
            Ok(guard) => {
                parts.extensions.insert(guard);
            }
            Err(error) => return too_many(&error.message, error.retry_after.unwrap_or(1)),
        }
    }
    let router = mount.router_for(&session.tenant);
    match router.oneshot(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// `GET /ui/login` (`next`, `why`).
async fn login_page(uri: Uri) -> Response {
    let query = keel_ui::form(uri.query().unwrap_or(""));
    let next = safe_next(query_field(&query, "next"));
    let message = match query_field(&query, "why") {
        Some("expired") => Some("Your session ended; sign in again."),
        Some("revoked") => Some("The key of your session was revoked; sign in with another key."),
        _ => None,
    };
    login_form(StatusCode::OK, message, &next)
}

/// `POST /ui/login` (`key`, `next`): checks the key and opens a session.
async fn login(State(mount): State<Arc<UiMount>>, headers: HeaderMap, body: String) -> Response {
    if let Some(refused) = cross_site(&headers) {
        return refused;
    }
    let fields = keel_ui::form(&body);
    let next = safe_next(query_field(&fields, "next"));
    let key = query_field(&fields, "key").map(str::trim).unwrap_or("");
    let state = &mount.state;
    let found =
        tokio::time::timeout(state.request_timeout(), keys::resolve(&state.serving, key)).await;
    let info = match found {
        // A sign-in is a request of the key's tenant, like any other (a bad key is a 401
        // like a `/v1` request with one: it has no tenant to charge, and charging a
        // shared budget would let anyone lock every tenant out).
        Ok(Ok(Some(info))) => {
            if let Some(limited) = mount.limited(&info.tenant) {
                return limited;
            }
            info
        }
        Ok(Ok(None)) => {
            state.metrics.unauthorized.fetch_add(1, Ordering::Relaxed);
            return login_form(
                StatusCode::UNAUTHORIZED,
                Some(
                    "That key is not valid (unknown or revoked). Create one with \
                     `keel keys create --tenant NAME`.",
                ),
                &next,
            );
        }
        Ok(Err(e)) => {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                &e.to_string(),
            );
        }
        Err(_) => {
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                "the key store did not answer in time; retry",
            );
        }
    };
    let token = mount.open(info.tenant, info.key_id, keys::digest(key));
    let secure = if over_tls(&headers) { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    );
    let mut response = see_other(&next);
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// `POST /ui/logout`: ends the session.
async fn logout(State(mount): State<Arc<UiMount>>, headers: HeaderMap) -> Response {
    if let Some(refused) = cross_site(&headers) {
        return refused;
    }
    if let Some(token) = cookie(&headers, COOKIE) {
        mount.forget(&keys::digest(&token));
    }
    let mut response = see_other("/ui/login");
    let secure = if over_tls(&headers) { "; Secure" } else { "" };
    let cleared = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
    if let Ok(value) = HeaderValue::from_str(&cleared) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// Continues a run decided on from the pages on a worker: queues the continuation of the
/// run's own job (as the `/v1` approvals route does), never runs it in the request.
pub struct QueueResumer {
    state: AppState,
    /// The tenant whose pages these are (its run limits apply to runs an answer starts).
    tenant: String,
}

impl std::fmt::Debug for QueueResumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueResumer").finish_non_exhaustive()
    }
}

#[async_trait]
impl Resumer for QueueResumer {
    async fn resume(&self, store: Arc<dyn EventStore>, thread_id: &str) -> Result<String, String> {
        let events = store
            .load(thread_id)
            .await
            .map_err(|e| format!("cannot read the thread: {e}"))?;
        let thread = Thread::from_events(thread_id, events);
        let queued = enqueue_continue(self.state.queue.as_ref(), &thread).await?;
        self.state
            .metrics
            .runs_queued
            .fetch_add(1, Ordering::Relaxed);
        Ok(format!(
            "the run continues on a worker (job {})",
            queued.job_id
        ))
    }

    /// An answer after a run ended `clarify_needed`: the thread's next run, with the
    /// answer as its message and the recorded agent, queued like `POST
    /// /v1/threads/{id}/reply` queues it (the tenant's run limits apply).
    async fn reply(
        &self,
        store: Arc<dyn EventStore>,
        thread_id: &str,
        message: &str,
    ) -> Result<String, String> {
        let events = store
            .load(thread_id)
            .await
            .map_err(|e| format!("cannot read the thread: {e}"))?;
        let thread = Thread::from_events(thread_id, events);
        let recipe = keel_app::recipe::Recipe::recorded(thread.run_events())
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                "the thread's last run recorded no agent, so no worker can start its next run"
                    .to_string()
            })?;
        let tenant = crate::tenancy::Tenant {
            name: self.tenant.clone(),
            key_id: String::new(),
            key_sha256: String::new(),
        };
        let admission = crate::api::chat::check_run_limits(&self.state, &tenant)
            .await
            .map_err(|e| e.message)?;
        let recipe = keel_app::recipe::Recipe {
            submission: None,
            ..recipe
        };
        let queued = crate::jobs::enqueue_new(
            self.state.queue.as_ref(),
            &thread,
            recipe,
            message.to_string(),
        )
        .await?;
        self.state
            .metrics
            .runs_queued
            .fetch_add(1, Ordering::Relaxed);
        crate::api::chat::track(&self.state, &tenant, thread.id(), queued.job_id);
        drop(admission);
        Ok(format!(
            "the next run, with the answer, is queued (job {})",
            queued.job_id
        ))
    }
}

/// The value of cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The refusal of a form posted from another site (keel-ui's rule for its own forms).
fn cross_site(headers: &HeaderMap) -> Option<Response> {
    keel_ui::cross_site_refusal(headers).map(|why| page(StatusCode::FORBIDDEN, "Forbidden", &why))
}

fn query_field<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Where to go after login: a path inside `/ui` only (never another site).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(next)
            if (next == "/ui" || next.starts_with("/ui/") || next.starts_with("/ui?"))
                && !next.starts_with("/ui/login")
                && !next.contains("//")
                && !next.contains('\\')
                && !next.chars().any(char::is_control) =>
        {
            next.to_string()
        }
        _ => "/ui/runs".to_string(),
    }
}

/// `303` to the login page, coming back to `uri` after.
fn to_login(uri: &Uri, why: Option<&str>) -> Response {
    let back = uri.path_and_query().map_or("/ui/runs", |p| p.as_str());
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("next", &safe_next(Some(back)));
    if let Some(why) = why {
        query.append_pair("why", why);
    }
    let mut response = see_other(&format!("/ui/login?{}", query.finish()));
    if why.is_some() {
        let cleared = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
        if let Ok(value) = HeaderValue::from_str(&cleared) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    secured(response)
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:15px system-ui,sans-serif;max-width:32rem;margin:4rem auto;\
padding:0 1rem;color:#1d2330}input[type=password]{width:100%;padding:.5rem;font:inherit;\
box-sizing:border-box}button{margin-top:.8rem;padding:.45rem 1rem;font:inherit}\
.error{color:#a3261b}code{font-size:.9em}";

fn html(status: StatusCode, title: &str, body: &str) -> Response {
    let text = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Keel</title><style>{STYLE}</style></head><body>{body}</body></html>",
        escape(title)
    );
    let mut response = (status, text).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secured(response)
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

fn page(status: StatusCode, title: &str, message: &str) -> Response {
    html(
        status,
        title,
        &format!(
            "<h1>{}</h1><p class=\"error\">{}</p><p><a href=\"/ui/login\">Sign in</a></p>",
            escape(title),
            escape(message)
        ),
    )
}

/// The 429 page, with `Retry-After`.
fn too_many(message: &str, retry_after: u64) -> Response {
    let mut response = page(StatusCode::TOO_MANY_REQUESTS, "Too many requests", message);
    if let Ok(value) = HeaderValue::from_str(&retry_after.max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

fn login_form(status: StatusCode, message: Option<&str>, next: &str) -> Response {
    let message = message.map_or_else(String::new, |m| {
        format!("<p class=\"error\" id=\"login-error\">{}</p>", escape(m))
    });
    html(
        status,
        "Sign in",
        &format!(
            "<h1>Keel · sign in</h1>{message}\
             <form method=\"post\" action=\"/ui/login\">\
             <label for=\"key\">API key</label>\
             <input type=\"password\" id=\"key\" name=\"key\" autocomplete=\"off\" required \
             placeholder=\"keel_…\" autofocus>\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <button type=\"submit\">Sign in</button></form>\
             <p>The key acts for one tenant: the pages show that tenant's runs. It is checked \
             on every request and never stored in the browser; create one with \
             <code>keel keys create --tenant NAME</code>.</p>\
             <form method=\"post\" action=\"/ui/logout\"><button type=\"submit\">Sign out\
             </button></form>",
            escape(next)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_inside_the_ui() {
        assert_eq!(safe_next(Some("/ui/runs/x?a=1")), "/ui/runs/x?a=1");
        assert_eq!(safe_next(Some("/ui")), "/ui");
        for bad in [
            "https://evil.example/",
            "//evil.example",
            "/ui//evil",
            "/uiother",
            "/ui/login?next=x",
            "/ui/\\evil",
        ] {
            assert_eq!(safe_next(Some(bad)), "/ui/runs", "{bad}");
        }
        assert_eq!(safe_next(None), "/ui/runs");
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; keel_session=abc ; b=2"),
        );
        assert_eq!(cookie(&headers, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
