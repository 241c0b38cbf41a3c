//! `GET /runs/{thread}/live?after=N`: server-sent events from the log. The stream polls
//! the store (the run may be driven by another process: `keel run`, a worker, `keel
//! approve`) and sends an `update` event — the re-rendered live region of the run page —
//! whenever the log has grown past what the page showed, then `done` once the thread's
//! run has ended.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use chrono::Utc;
use futures::Stream;
use keel_core::store::ThreadStatus;

use crate::Ui;
use crate::error::UiError;

/// How often the store is read while a page follows a run.
const POLL: Duration = Duration::from_millis(400);

struct Follow {
    ui: Ui,
    thread_id: String,
    seen: usize,
    first: bool,
    finished: bool,
}

/// `GET /runs/{thread}/live`.
pub(crate) async fn stream(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
    RawQuery(query): RawQuery,
    session: Option<axum::Extension<crate::CsrfToken>>,
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
    ui.source.load_raw(&thread_id).await?;
    let start = Follow {
        ui,
        thread_id,
        seen,
        first: true,
        finished: false,
    };
    let events = futures::stream::unfold(start, |mut follow| async move {
        if follow.finished {
            return None;
        }
        loop {
            if !std::mem::replace(&mut follow.first, false) {
                tokio::time::sleep(POLL).await;
            }
            let events = match follow.ui.source.load(&follow.thread_id).await {
                Ok(events) => events,
                Err(error) => {
                    follow.finished = true;
                    let done = SseEvent::default().event("done").data(error.message);
                    return Some((Ok(done), follow));
                }
            };
            let ended = matches!(
                events
                    .iter()
                    .fold(ThreadStatus::Running, |s, e| ThreadStatus::after(
                        s, &e.kind
                    )),
                ThreadStatus::Ended(_)
            );
            if events.len() != follow.seen {
                follow.seen = events.len();
                let html = crate::run_page::live_contents(
                    &follow.ui,
                    &follow.thread_id,
                    &events,
                    Utc::now(),
                )
                .into_string()
                .replace("\r\n", "\n")
                .replace('\r', "\n");
                let update = SseEvent::default().event("update").data(html);
                return Some((Ok(update), follow));
            }
            if ended {
                follow.finished = true;
                return Some((Ok(SseEvent::default().event("done").data("ended")), follow));
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
