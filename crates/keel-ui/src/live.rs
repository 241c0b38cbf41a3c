//! `GET /runs/{thread}/live?after=N`: server-sent events from the log. The stream polls
//! the store (the run may be driven by another process: `keel run`, a worker, `keel
//! approve`) and sends an `update` event — the re-rendered live region of the run page —
//! whenever the log has grown past what the page showed, then `done` once the thread's
//! run has ended.
//!
//! Each poll reads only the log's tail past what was shown ([`EventStore::load_from`],
//! one indexed lookup that finds nothing while the run waits); the whole log is read and
//! the region rendered only when it grew. A stream ends — `done` — when the run ends,
//! after [`MAX_LIFETIME`] (the page says to reload), or when the host's [`LiveGuard`]
//! says its session is over (a revoked key, an expired session).
//!
//! [`EventStore::load_from`]: keel_core::EventStore::load_from

use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use chrono::Utc;
use futures::Stream;
use futures::future::BoxFuture;
use keel_core::store::ThreadStatus;
use tokio::time::Instant;

use crate::Ui;
use crate::error::UiError;

/// How often the store is read while a page follows a run.
const POLL: Duration = Duration::from_millis(400);

/// How often the host's [`LiveGuard`] is asked whether the stream may go on.
const GUARD_CHECK: Duration = Duration::from_secs(2);

/// The longest one stream follows a run (a paused run can wait for days): then it ends and
/// the page offers a reload.
pub const MAX_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// What a host serving the pages to several users (`keel serve`'s `/ui`) attaches to a
/// live-stream request as an extension: `still_allowed` is asked every few seconds while
/// the stream is open (false — the session's key was revoked, the session expired — ends
/// it), and `permit` is held until the stream ends (a slot of the tenant's open-stream
/// allowance, released when dropped).
#[derive(Clone)]
pub struct LiveGuard {
    still_allowed: Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>,
    /// Held, never read: dropped with the stream's last copy of the guard.
    _permit: Arc<dyn Any + Send + Sync>,
}

impl LiveGuard {
    /// A guard asking `still_allowed` and holding `permit`.
    pub fn new(
        still_allowed: impl Fn() -> BoxFuture<'static, bool> + Send + Sync + 'static,
        permit: impl Any + Send + Sync,
    ) -> Self {
        Self {
            still_allowed: Arc::new(still_allowed),
            _permit: Arc::new(permit),
        }
    }
}

impl std::fmt::Debug for LiveGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveGuard").finish_non_exhaustive()
    }
}

struct Follow {
    ui: Ui,
    thread_id: String,
    /// Events the page shows (= the next sequence number).
    seen: usize,
    /// Whether the log read last ended with the thread's run over.
    ended: bool,
    first: bool,
    finished: bool,
    guard: Option<LiveGuard>,
    next_guard_check: Instant,
    deadline: Instant,
}

impl Follow {
    fn done(&mut self, why: &str) -> SseEvent {
        self.finished = true;
        SseEvent::default().event("done").data(why)
    }

    /// The next event to send, once there is one.
    async fn next_event(&mut self) -> SseEvent {
        loop {
            if !std::mem::replace(&mut self.first, false) {
                tokio::time::sleep(POLL).await;
            }
            if Instant::now() >= self.deadline {
                return self.done("expired: reload the page to follow the run further");
            }
            if let Some(guard) = &self.guard
                && Instant::now() >= self.next_guard_check
            {
                self.next_guard_check = Instant::now() + GUARD_CHECK;
                if !(guard.still_allowed)().await {
                    return self.done("signed out: sign in again to follow the run");
                }
            }
            // The tail past what the page shows: nothing while the run waits.
            let grown = match self
                .ui
                .source
                .store()
                .load_from(&self.thread_id, self.seen as u64)
                .await
            {
                Ok(tail) => !tail.is_empty(),
                Err(error) => {
                    let message = self.ui.source.store_error(error).message;
                    return self.done(&message);
                }
            };
            if grown {
                let events = match self.ui.source.load(&self.thread_id).await {
                    Ok(events) => events,
                    Err(error) => return self.done(&error.message),
                };
                self.ended = matches!(
                    events
                        .iter()
                        .fold(ThreadStatus::Running, |s, e| ThreadStatus::after(
                            s, &e.kind
                        )),
                    ThreadStatus::Ended(_)
                );
                self.seen = events.len();
                let html =
                    crate::run_page::live_contents(&self.ui, &self.thread_id, &events, Utc::now())
                        .into_string()
                        .replace("\r\n", "\n")
                        .replace('\r', "\n");
                return SseEvent::default().event("update").data(html);
            }
            if self.ended {
                return self.done("ended");
            }
        }
    }
}

/// `GET /runs/{thread}/live`.
pub(crate) async fn stream(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
    RawQuery(query): RawQuery,
    session: Option<axum::Extension<crate::CsrfToken>>,
    guard: Option<axum::Extension<LiveGuard>>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    let mut seen = 0usize;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "after" => {
                seen = value.parse().map_err(|_| {
                    UiError::bad_input("after", format!("{value:?}: give a whole number"))
                })?;
            }
            other => return Err(UiError::bad_input(other, "unknown parameter: use after")),
        }
    }
    let thread_id = ui.store_id(&thread_id);
    let events = ui.source.load_raw(&thread_id).await?;
    let now = Instant::now();
    // The page was rendered from `seen` events: it is current when the log holds as many.
    // (A count larger than the log is the page's mistake: the next growth re-renders.)
    let ended = matches!(
        events
            .iter()
            .fold(ThreadStatus::Running, |s, e| ThreadStatus::after(
                s, &e.kind
            )),
        ThreadStatus::Ended(_)
    );
    let start = Follow {
        ui,
        thread_id,
        // A page that showed a different count than the log holds is re-rendered at once.
        seen: if seen == events.len() { seen } else { 0 },
        ended,
        first: true,
        finished: false,
        guard: guard.map(|g| g.0),
        next_guard_check: now + GUARD_CHECK,
        deadline: now + MAX_LIFETIME,
    };
    drop(events);
    let events = futures::stream::unfold(start, |mut follow| async move {
        if follow.finished {
            return None;
        }
        let event = follow.next_event().await;
        Some((Ok(event), follow))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
