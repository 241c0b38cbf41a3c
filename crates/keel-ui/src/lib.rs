//! Keel's web UI: server-rendered pages over an event store — the runs list (filters,
//! sorting, pagination, live rows), a run's span waterfall (details on click, live over
//! server-sent events, approve/deny of a paused call, answers to the agent's questions,
//! fork from a turn), the metrics dashboard (the figures of `keel stats`, combined by
//! [`keel_telemetry::metrics_from_facts`] from the runs' metrics facts the store keeps —
//! the second half of [`keel_telemetry::compute_metrics`] — drawn as inline SVG) and the
//! eval pages (the runs `keel eval run` saved, a run's scenarios × trials grid, its
//! comparison with a baseline).
//!
//! Everything shown passes through a [`keel_telemetry::Redactor`] first, and every value
//! is HTML-escaped by `maud`. Every asset (one stylesheet, one small script) is compiled
//! into the binary: the pages work offline. The crate owns no listener policy and no
//! authentication: `keel ui` serves [`router`] on loopback behind the Host check of
//! [`host`] (against DNS rebinding; `keel serve` puts the same check in front of all its
//! routes), and a server mounting it elsewhere restricts what it sees with a [`Scope`]
//! and puts its own authentication in front. It must not write events itself: approvals, resumes and forks go through
//! `keel-runtime` and `keel-app` like every other surface.

mod actions;
mod assets;
mod charts;
pub mod csrf;
mod dashboard;
mod detail;
mod error;
mod eval_pages;
mod filter;
pub mod host;
mod layout;
mod live;
mod row;
mod run_page;
mod runs_page;
mod source;
mod timeline;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

pub use actions::{AppResumer, ModelHook, Resumer, cross_site_refusal, form};
pub use csrf::{CsrfToken, DecidedBy};
pub use error::UiError;
pub use host::{AllowedHosts, guard_hosts};
pub use live::{LiveGuard, MAX_LIFETIME as LIVE_MAX_LIFETIME};
pub use source::{RunSource, Scope};

/// What the UI serves: a scoped view of a store, how paused runs continue, where trace
/// files are and the path the pages are mounted at.
#[derive(Clone)]
pub struct Ui {
    pub(crate) source: RunSource,
    pub(crate) resumer: Option<Arc<dyn Resumer>>,
    pub(crate) trace_dir: Option<PathBuf>,
    pub(crate) base: String,
    /// URLs and pages name threads relative to the scope's prefix (see
    /// [`Ui::with_relative_ids`]).
    pub(crate) relative_ids: bool,
    /// The last thing an approval, denial or resume said about a thread (shown on its
    /// page): what failed in the background is not lost.
    pub(crate) notes: Arc<Mutex<std::collections::HashMap<String, String>>>,
    /// Saved `keel eval` runs and baselines (the eval pages; none without it).
    pub(crate) evals: Option<Arc<dyn keel_store::EvalResultStore>>,
    /// The anti-forgery token its forms carry: drawn when the UI is made, replaced per
    /// request by a mounting server's session token (see [`csrf`]).
    pub(crate) csrf: Arc<str>,
    /// Where a decision or an answer takes the thread's lease before it writes (the lease
    /// a worker and `keel resume` take), held until the run it continues stops: `keel ui`
    /// drives threads itself. `None` under a server whose continuations are queued jobs.
    pub(crate) claims: Option<Arc<dyn keel_store::RunQueue>>,
}

impl std::fmt::Debug for Ui {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ui")
            .field("source", &self.source)
            .field("resumer", &self.resumer.is_some())
            .field("trace_dir", &self.trace_dir)
            .field("base", &self.base)
            .field("relative_ids", &self.relative_ids)
            .field("evals", &self.evals.is_some())
            .field("claims", &self.claims.is_some())
            .finish()
    }
}

impl Ui {
    /// The UI over `source`, mounted at `/`, read-only for paused runs (no resumer) and
    /// without trace files.
    pub fn new(source: RunSource) -> Self {
        Self {
            source,
            resumer: None,
            trace_dir: None,
            base: String::new(),
            relative_ids: false,
            notes: Arc::default(),
            evals: None,
            csrf: Arc::from(CsrfToken::random().0),
            claims: None,
        }
    }

    /// Decisions and answers take the thread's lease from `queue` (the store's run queue)
    /// and keep it while the run they continue is driven, so this UI never drives a thread
    /// another driver holds — a 409 names the holder — and no other driver starts on it
    /// meanwhile.
    pub fn with_claims(mut self, queue: Arc<dyn keel_store::RunQueue>) -> Self {
        self.claims = Some(queue);
        self
    }

    /// This UI as it answers one request: its forms carry the request's anti-forgery
    /// token (a mounting server's session token, else the UI's own).
    pub(crate) fn for_request(&self, session: Option<&CsrfToken>) -> Self {
        match session {
            Some(token) if *token.0 != *self.csrf => Self {
                csrf: Arc::from(token.0.as_str()),
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// Refuses a posted form whose `csrf` field is not this request's token.
    pub(crate) fn check_csrf(&self, posted: Option<&str>) -> Result<(), error::UiError> {
        if csrf::matches(posted, &self.csrf) {
            Ok(())
        } else {
            Err(error::UiError::forbidden(
                "the form's anti-forgery token is missing or stale: reload the page and \
                 submit again (forms from other sites are refused)"
                    .to_string(),
            ))
        }
    }

    /// The eval pages (`/evals`): runs saved by `keel eval run` in `results` (the same
    /// database as the store), each run's per-scenario grid and its comparison with a
    /// baseline. Under a [`Scope`], only eval runs whose every trial thread is inside it
    /// are shown.
    pub fn with_eval_results(mut self, results: Arc<dyn keel_store::EvalResultStore>) -> Self {
        self.evals = Some(results);
        self
    }

    /// Approve and deny buttons continue paused runs through `resumer`.
    pub fn with_resumer(mut self, resumer: Arc<dyn Resumer>) -> Self {
        self.resumer = Some(resumer);
        self
    }

    /// Per-run trace files (`.keel/traces`): a run page links its trace file.
    pub fn with_trace_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.trace_dir = Some(dir.into());
        self
    }

    /// The path the router is nested at (e.g. `/ui`), so that links and forms point
    /// inside it. Empty (the default) for the root.
    pub fn with_base_path(mut self, base: &str) -> Self {
        self.base = base.trim_end_matches('/').to_string();
        self
    }

    /// Under a [`Scope::ThreadPrefix`], links, forms and page titles name a thread by its
    /// id without the prefix (a tenant's own id, e.g. `thr_1` for store thread
    /// `acme.thr_1`), and a thread named in a URL is looked up under the prefix. Without a
    /// prefix scope this changes nothing.
    pub fn with_relative_ids(mut self) -> Self {
        self.relative_ids = true;
        self
    }

    /// A link inside the UI.
    pub(crate) fn href(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn id_prefix(&self) -> Option<&str> {
        match self.source.scope() {
            Scope::ThreadPrefix(prefix) if self.relative_ids => Some(prefix.as_str()),
            _ => None,
        }
    }

    /// The store id of the thread a URL names.
    pub(crate) fn store_id(&self, url_id: &str) -> String {
        match self.id_prefix() {
            Some(prefix) => format!("{prefix}{url_id}"),
            None => url_id.to_string(),
        }
    }

    /// How a store thread id is shown and named in URLs.
    pub(crate) fn shown_id<'a>(&self, store_id: &'a str) -> &'a str {
        self.id_prefix()
            .and_then(|prefix| store_id.strip_prefix(prefix))
            .unwrap_or(store_id)
    }

    /// The link to store thread `store_id`'s run page, plus `suffix`.
    pub(crate) fn run_href(&self, store_id: &str, suffix: &str) -> String {
        self.href(&format!("/runs/{}{suffix}", self.shown_id(store_id)))
    }

    pub(crate) fn note(&self, thread_id: &str, text: Option<String>) {
        let mut notes = match self.notes.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        match text {
            Some(text) => notes.insert(thread_id.to_string(), text),
            None => notes.remove(thread_id),
        };
    }

    pub(crate) fn note_for(&self, thread_id: &str) -> Option<String> {
        let notes = match self.notes.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        notes.get(thread_id).cloned()
    }
}

/// Serves `router` on `listener` until `shutdown` completes. Not a graceful shutdown: a
/// page following a live run holds its connection open indefinitely.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    use std::future::IntoFuture;
    tokio::select! {
        served = axum::serve(listener, router).into_future() => served,
        () = shutdown => Ok(()),
    }
}

/// The UI's routes (relative to where the caller nests them; see [`Ui::with_base_path`]):
///
/// | route | what |
/// | --- | --- |
/// | `GET /` | redirect to `/runs` |
/// | `GET /runs` | runs page (`state`, `agent`, `model`, `from`, `to`, `q`, `sort`, `dir`, `limit`, `after` — keyset, from the page links; `fragment=rows` for the table body only) |
/// | `GET /runs/{thread}` | run page: header, waterfall, approval box |
/// | `GET /runs/{thread}/live?after=N` | server-sent events: the live region re-rendered when the log grows |
/// | `GET /runs/{thread}/spans/{span}` | one span's details (HTML fragment) |
/// | `POST /runs/{thread}/approve`, `/deny` | record a decision on the paused call, then continue the run |
/// | `POST /runs/{thread}/fork` | copy the log up to `at_seq` into a new thread |
/// | `POST /runs/{thread}/reply` | answer the question the run asked (`answer`), then continue it or start the thread's next run |
/// | `GET /evals` | saved eval runs (`suite`, `skip`, `limit`); only with [`Ui::with_eval_results`] |
/// | `GET /evals/{id}` | one eval run: scenarios × trials, checks with their reasons |
/// | `GET /evals/{id}/compare` | the run against a baseline (`baseline`: a name or run id; `threshold`) |
/// | `GET /dashboard` | metrics (`agent`, `from`) as inline SVG charts |
/// | `GET /traces/{trace_id}` | a trace file, redacted again, as text |
/// | `GET /assets/ui.css`, `/assets/ui.js` | the compiled-in assets |
pub fn router(ui: Ui) -> Router {
    Router::new()
        .route("/", get(runs_page::index))
        .route("/runs", get(runs_page::page))
        .route("/runs/{thread}", get(run_page::page))
        .route("/runs/{thread}/live", get(live::stream))
        .route("/runs/{thread}/spans/{span}", get(detail::fragment))
        .route("/runs/{thread}/approve", post(actions::approve))
        .route("/runs/{thread}/deny", post(actions::deny))
        .route("/runs/{thread}/fork", post(actions::fork))
        .route("/runs/{thread}/reply", post(actions::reply))
        .route("/evals", get(eval_pages::list))
        .route("/evals/{id}", get(eval_pages::run))
        .route("/evals/{id}/compare", get(eval_pages::compare))
        .route("/dashboard", get(dashboard::page))
        .route("/traces/{trace}", get(run_page::trace_file_text))
        .route("/assets/{name}", get(assets::serve))
        .fallback(error::not_found)
        .layer(axum::middleware::map_response(layout::security_headers))
        .with_state(ui)
}
