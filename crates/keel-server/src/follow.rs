//! Following a thread's log as it grows: [`event_stream`] (Server-Sent Events: one event
//! per journaled event with `id:` = its sequence number, text deltas without an id, and a
//! final `outcome`) and [`wait_settled`] (a non-streaming chat waiting for its run to end
//! or pause). Both re-read the store when the [`Hub`](crate::hub::Hub) announces an
//! append to the thread (each subscribes to its own thread only), and at least every poll
//! interval, so runs driven by other processes are followed too. A stream reads only the
//! log's tail past what it sent ([`EventStore::load_from`](keel_core::EventStore::load_from)),
//! holds a [`StreamPermit`] of its tenant and key, and ends when its key is revoked
//! (checked every [`KEY_CHECK`]). Every wait is bounded (stream timeout, request timeout,
//! shutdown, client gone).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use keel_core::{Event, EventKind};
use keel_store::JobState;
use serde_json::json;
use tokio::sync::{broadcast, mpsc};

use crate::hub::{HubMessage, ThreadSubscription};
use crate::jobs::submission_of;
use crate::outcome::{RunPosition, position, run_events, run_json};
use crate::state::AppState;
use crate::streams::{KEY_CHECK, StreamPermit, key_still_active};
use crate::tenancy::Tenant;

/// The longest one store read may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// When a stream ends (besides timeout, shutdown and the client leaving).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// After the `run_ended` of the run that records this submission id (a chat's run).
    Run(String),
    /// Once the thread is idle: its last event is a `run_ended`.
    Idle,
}

/// What to follow.
#[derive(Debug, Clone)]
pub struct Follow {
    /// The tenant (shows its client ids).
    pub tenant: Tenant,
    /// Store thread id.
    pub store_id: String,
    /// Client thread id.
    pub client_id: String,
    /// The first sequence number to send.
    pub from_seq: u64,
    /// When to stop.
    pub until: Until,
}

/// A stream slot of `tenant` (its key's and its own allowance of open streams); 429
/// `too_many_streams` beyond.
pub fn open_stream(
    state: &AppState,
    tenant: &Tenant,
) -> Result<StreamPermit, crate::error::ApiError> {
    let limits = state.config.limits_for(&tenant.name);
    state.streams.open(&tenant.name, &tenant.key_id, &limits)
}

/// The SSE response following `follow`, holding `permit` until it ends; `hub` is a
/// subscription to the thread taken before the run was queued (so no delta is missed), or
/// `None` to subscribe now.
pub fn event_stream(
    state: AppState,
    follow: Follow,
    hub: Option<ThreadSubscription>,
    permit: StreamPermit,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let (tx, rx) = mpsc::channel::<SseEvent>(256);
    // Subscribed before the first read so no announcement falls in between.
    let hub = hub.unwrap_or_else(|| state.hub.subscribe_thread(&follow.store_id));
    tokio::spawn(async move {
        state.metrics.streams_open.fetch_add(1, Ordering::Relaxed);
        pump(&state, follow, hub, &tx).await;
        state.metrics.streams_open.fetch_sub(1, Ordering::Relaxed);
        drop(permit);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok(event), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// Reads the thread once (bounded); `None` on a store failure or timeout.
pub(crate) async fn load(state: &AppState, store_id: &str) -> Option<Vec<Event>> {
    load_from(state, store_id, 0).await
}

/// Reads the thread's events from `from_seq` on, once (bounded); `None` on a store
/// failure or timeout.
pub(crate) async fn load_from(
    state: &AppState,
    store_id: &str,
    from_seq: u64,
) -> Option<Vec<Event>> {
    match tokio::time::timeout(LOAD_TIMEOUT, state.events.load_from(store_id, from_seq)).await {
        Ok(Ok(events)) => Some(events),
        Ok(Err(e)) => {
            tracing::warn!(thread = store_id, error = %e, "stream: cannot load thread");
            None
        }
        Err(_) => None,
    }
}

/// Where a stream stands.
struct Cursor {
    follow: Follow,
    /// The next sequence number to send.
    next: u64,
    /// The run the stream ends with (`Until::Run`), once seen starting.
    own_run: Option<String>,
}

/// Whether the stream is over after a send.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    More,
    Done,
}

impl Cursor {
    /// Reads the log's tail: the events from `next` on, and the one before (whether the
    /// thread is idle shows in its last event, which the stream may have sent already).
    async fn tail(&self, state: &AppState) -> Option<Vec<Event>> {
        load_from(state, &self.follow.store_id, self.next.saturating_sub(1)).await
    }

    /// Reads the log's tail, then sends its stored events from `next` up to `upto` (every
    /// one when `None`).
    async fn send(
        &mut self,
        state: &AppState,
        upto: Option<u64>,
        tx: &mpsc::Sender<SseEvent>,
    ) -> Sent {
        let Some(events) = self.tail(state).await else {
            return Sent::More;
        };
        self.send_loaded(state, &events, upto, tx).await
    }

    /// Sends everything the thread holds after what the hub already queued for this
    /// stream. A read of the store can be newer than the announcements still waiting in
    /// the subscription — a stream that fell behind its run, or that starts after its run
    /// ended — and sending the read first would end the stream with the run's `run_ended`
    /// while text deltas still wait: they would be lost. So the store is read first, then
    /// the queued announcements are replayed in order (deltas sent, announced events sent
    /// from the read, re-read when newer), and only then the rest of the read. Every delta
    /// of an answer is announced before the answer's `model_responded` is stored, so the
    /// deltas of every answer the read holds are in the subscription by then.
    async fn catch_up(
        &mut self,
        state: &AppState,
        hub: &mut ThreadSubscription,
        tx: &mpsc::Sender<SseEvent>,
    ) -> Sent {
        let Some(mut events) = self.tail(state).await else {
            return Sent::More;
        };
        loop {
            match hub.receiver().try_recv() {
                Ok(HubMessage::Appended(thread, seq)) if *thread == *self.follow.store_id => {
                    if seq < self.next {
                        continue;
                    }
                    if events.last().is_none_or(|last| last.seq < seq) {
                        match self.tail(state).await {
                            Some(newer) => events = newer,
                            None => return Sent::More,
                        }
                    }
                    if self.send_loaded(state, &events, Some(seq), tx).await == Sent::Done {
                        return Sent::Done;
                    }
                }
                Ok(HubMessage::Delta {
                    thread,
                    run_id,
                    text,
                }) if *thread == *self.follow.store_id => {
                    if send_delta(tx, &run_id, &text).await.is_err() {
                        return Sent::Done;
                    }
                }
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(
                    broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed,
                ) => break,
            }
        }
        self.send_loaded(state, &events, None, tx).await
    }

    /// Sends the stored events of `events` (a tail of the log, see [`Cursor::tail`]) from
    /// `next` up to `upto` (every one when `None`): events a hub announcement names are
    /// sent in announcement order, between the deltas.
    async fn send_loaded(
        &mut self,
        state: &AppState,
        events: &[Event],
        upto: Option<u64>,
        tx: &mpsc::Sender<SseEvent>,
    ) -> Sent {
        let start = self.next;
        for event in events
            .iter()
            .filter(|e| e.seq >= start && upto.is_none_or(|u| e.seq <= u))
        {
            if let Until::Run(submission) = &self.follow.until
                && self.own_run.is_none()
                && submission_of(event).as_deref() == Some(submission.as_str())
            {
                self.own_run = Some(event.run_id.to_string());
            }
            let data = self.follow.tenant.event_json(event, &self.follow.client_id);
            let sse = SseEvent::default()
                .id(event.seq.to_string())
                .event(event.kind.name())
                .data(data.to_string());
            if tx.send(sse).await.is_err() {
                return Sent::Done;
            }
            self.next = event.seq + 1;
            if matches!(event.kind, EventKind::RunEnded { .. }) {
                let done = match &self.follow.until {
                    Until::Run(_) => self.own_run.as_deref() == Some(event.run_id.as_ref()),
                    Until::Idle => events.last().is_some_and(|l| l.seq == event.seq),
                };
                if done {
                    // The outcome sums the whole run up: its events may start before the
                    // tail this stream read, so the log is read whole once, here.
                    let whole = load(state, &self.follow.store_id).await;
                    let run = run_json(
                        &self.follow.client_id,
                        &event.run_id,
                        &run_events(whole.as_deref().unwrap_or(events), &event.run_id),
                    );
                    let _ = tx
                        .send(SseEvent::default().event("outcome").data(run.to_string()))
                        .await;
                    return Sent::Done;
                }
            }
        }
        // Reconnected after the end of an idle thread: nothing more will come.
        if self.follow.until == Until::Idle
            && events
                .last()
                .is_some_and(|l| l.seq < self.next && matches!(l.kind, EventKind::RunEnded { .. }))
        {
            return Sent::Done;
        }
        Sent::More
    }
}

/// Sends a text delta (no id: deltas are not stored).
async fn send_delta(
    tx: &mpsc::Sender<SseEvent>,
    run_id: &str,
    text: &str,
) -> Result<(), mpsc::error::SendError<SseEvent>> {
    let data = json!({"run_id": run_id, "text": text});
    tx.send(
        SseEvent::default()
            .event("text_delta")
            .data(data.to_string()),
    )
    .await
}

/// Sends events until `follow.until`, the deadline, shutdown or the client leaving.
async fn pump(
    state: &AppState,
    follow: Follow,
    mut hub: ThreadSubscription,
    tx: &mpsc::Sender<SseEvent>,
) {
    let deadline = crate::state::deadline_after(state.stream_timeout());
    let mut cursor = Cursor {
        next: follow.from_seq,
        follow,
        own_run: None,
    };
    if cursor.catch_up(state, &mut hub, tx).await == Sent::Done {
        return;
    }
    // One timer for the whole stream: other threads' announcements do not postpone it.
    let mut poll = tokio::time::interval(state.poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut key_check =
        tokio::time::interval_at(tokio::time::Instant::now() + KEY_CHECK, KEY_CHECK);
    key_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let tenant = cursor.follow.tenant.clone();
    loop {
        let sent = tokio::select! {
            // A revoked key stops receiving (a tenant acting without a key has none to
            // check).
            _ = key_check.tick(), if !tenant.key_sha256.is_empty() => {
                if key_still_active(state, &tenant.name, &tenant.key_id, &tenant.key_sha256).await {
                    continue;
                }
                let _ = tx
                    .send(SseEvent::default().event("error").data(
                        json!({"error": {"code": "unauthorized", "message":
                            "the stream's API key was revoked"}}).to_string(),
                    ))
                    .await;
                return;
            }
            message = hub.recv() => match message {
                Ok(HubMessage::Appended(thread, seq)) if *thread == *cursor.follow.store_id => {
                    if seq < cursor.next {
                        continue;
                    }
                    cursor.send(state, Some(seq), tx).await
                }
                Ok(HubMessage::Delta { thread, run_id, text })
                    if *thread == *cursor.follow.store_id =>
                {
                    if send_delta(tx, &run_id, &text).await.is_err() {
                        return;
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    cursor.catch_up(state, &mut hub, tx).await
                }
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep(state.poll).await;
                    cursor.send(state, None, tx).await
                }
            },
            // Runs driven by other processes are announced by nobody: poll.
            _ = poll.tick() => cursor.catch_up(state, &mut hub, tx).await,
            () = tx.closed() => return,
            () = state.shutdown.cancelled() => return,
            () = tokio::time::sleep_until(deadline) => return,
        };
        if sent == Sent::Done {
            return;
        }
    }
}

/// How a wait for a run ended.
#[derive(Debug)]
pub enum Settled {
    /// The run ended or paused: its JSON (`keel run --output json`'s shape).
    Run(serde_json::Value),
    /// Still going when the wait ended: the run id when it started.
    Pending(Option<String>),
    /// The job ended before any run of it started (it failed, died or was cancelled): its
    /// record, with the reason.
    JobEnded(keel_store::JobInfo),
}

/// How often a waiting chat whose run has not started looks its job up: a job that fails
/// before its run starts writes no event to wake the wait.
const JOB_LOOKUP: Duration = Duration::from_secs(1);

/// Waits until the run recording `submission` on `store_id` ends or pauses, at most
/// `timeout` (or until shutdown).
pub async fn wait_settled(
    state: &AppState,
    store_id: &str,
    client_id: &str,
    submission: &str,
    job_id: keel_store::JobId,
    timeout: Duration,
) -> Settled {
    let deadline = crate::state::deadline_after(timeout);
    let mut hub = state.hub.subscribe_thread(store_id);
    let mut own_run: Option<String> = None;
    let mut next_lookup = tokio::time::Instant::now() + JOB_LOOKUP;
    loop {
        if own_run.is_none() && tokio::time::Instant::now() >= next_lookup {
            next_lookup = tokio::time::Instant::now() + JOB_LOOKUP;
            // A lookup that fails decides nothing: the wait goes on.
            if let Ok(Some(job)) = state.queue.job(job_id).await
                && matches!(
                    job.state,
                    JobState::Failed | JobState::Dead | JobState::Cancelled
                )
            {
                // Its run may have started and ended just before: the log says.
                let started = load(state, store_id).await.is_some_and(|events| {
                    events
                        .iter()
                        .any(|e| submission_of(e).as_deref() == Some(submission))
                });
                if !started {
                    return Settled::JobEnded(job);
                }
            }
        }
        if let Some(events) = load(state, store_id).await {
            if own_run.is_none() {
                own_run = events
                    .iter()
                    .find(|e| submission_of(e).as_deref() == Some(submission))
                    .map(|e| e.run_id.to_string());
            }
            if let Some(run_id) = &own_run {
                let own = run_events(&events, run_id);
                if !matches!(position(&own), RunPosition::Running) {
                    return Settled::Run(run_json(client_id, run_id, &own));
                }
            }
        }
        let wake = wait_for_append(hub.receiver(), store_id, state.poll);
        tokio::select! {
            () = wake => {}
            () = tokio::time::sleep_until(deadline) => return Settled::Pending(own_run),
            () = state.shutdown.cancelled() => return Settled::Pending(own_run),
        }
    }
}

/// Resolves on an append to `store_id` announced by the hub, or after `poll`.
pub(crate) async fn wait_for_append(
    hub: &mut broadcast::Receiver<HubMessage>,
    store_id: &str,
    poll: Duration,
) {
    let store_id: Arc<str> = Arc::from(store_id);
    let announced = async {
        loop {
            match hub.recv().await {
                Ok(HubMessage::Appended(thread, _)) if thread == store_id => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => {
                    futures::future::pending::<()>().await;
                }
            }
        }
    };
    tokio::select! {
        () = announced => {}
        () = tokio::time::sleep(poll) => {}
    }
}
