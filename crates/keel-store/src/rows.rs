//! Conversions shared by the SQL stores: events to rows, thread status to columns, and
//! timestamps to integer nanoseconds (exact, so summaries equal the events' own times).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_core::EndState;
use keel_core::event::{Event, EventKind};
use keel_core::store::{StoreError, ThreadStatus, ThreadSummary};
use serde::{Deserialize, Serialize};

/// Maps a driver error to [`StoreError::Backend`], naming the operation.
pub(crate) fn backend(operation: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("{operation}: {error}"))
}

/// Whether a sqlx error is a unique-constraint violation.
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// A `u64` as a database integer.
pub(crate) fn to_i64(field: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| {
        StoreError::InvalidBatch(format!(
            "{field} {value} does not fit in a signed 64-bit integer"
        ))
    })
}

/// A database integer as a `u64` (negative values are corrupt data).
pub(crate) fn to_u64(field: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Backend(format!("stored {field} is negative: {value}")))
}

/// A timestamp as nanoseconds since the epoch.
pub(crate) fn ts_to_ns(ts: DateTime<Utc>) -> Result<i64, StoreError> {
    ts.timestamp_nanos_opt().ok_or_else(|| {
        StoreError::InvalidBatch(format!(
            "timestamp {ts} is outside the storable range (years 1677..2262)"
        ))
    })
}

/// Nanoseconds since the epoch as a timestamp.
pub(crate) fn ns_to_ts(ns: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(ns)
}

/// A cutoff/filter time as nanoseconds, saturating at the representable range.
pub(crate) fn ts_to_ns_saturating(ts: DateTime<Utc>) -> i64 {
    ts.timestamp_nanos_opt().unwrap_or(if ts.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// The `(status, end_state)` columns of a status.
pub(crate) fn status_columns(status: ThreadStatus) -> (&'static str, Option<&'static str>) {
    match status {
        ThreadStatus::Running => ("running", None),
        ThreadStatus::AwaitingApproval => ("awaiting_approval", None),
        ThreadStatus::AwaitingUser => ("awaiting_user", None),
        ThreadStatus::Ended(end) => ("ended", Some(end.as_str())),
    }
}

/// A status read back from its columns.
pub(crate) fn status_from_columns(
    status: &str,
    end_state: Option<&str>,
) -> Result<ThreadStatus, StoreError> {
    match (status, end_state) {
        ("running", _) => Ok(ThreadStatus::Running),
        ("awaiting_approval", _) => Ok(ThreadStatus::AwaitingApproval),
        ("awaiting_user", _) => Ok(ThreadStatus::AwaitingUser),
        ("ended", Some(end)) => {
            serde_json::from_value::<EndState>(serde_json::Value::String(end.to_string()))
                .map(ThreadStatus::Ended)
                .map_err(|e| {
                    StoreError::Backend(format!("stored end_state {end:?} is unknown: {e}"))
                })
        }
        (other, end) => Err(StoreError::Backend(format!(
            "stored thread status {other:?} (end_state {end:?}) is unknown"
        ))),
    }
}

/// The status an event sets regardless of the previous one, or `None` when the event
/// leaves the status unchanged (derived from [`ThreadStatus::after`]).
fn status_set_by(kind: &EventKind) -> Option<ThreadStatus> {
    let a = ThreadStatus::after(ThreadStatus::Running, kind);
    let b = ThreadStatus::after(ThreadStatus::AwaitingUser, kind);
    (a == b).then_some(a)
}

/// One event ready to be written; its body is [`Batch::body`].
pub(crate) struct EventRow {
    pub seq: i64,
    pub kind: &'static str,
    pub run_id: Arc<str>,
    pub ts: i64,
    /// Where the body is in [`Batch::bodies`].
    body: std::ops::Range<usize>,
}

/// What an event row's `body` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFormat {
    /// The whole event as JSON (Postgres: `body` is the event, queryable as `jsonb`).
    Whole,
    /// The event without the fields its row's columns already hold — `seq`, `ts`,
    /// `thread_id`, `run_id` (SQLite since migration `0010`): ~140 bytes less per event,
    /// ~30 % of a one-tool conversation's log, so fewer pages per commit and less JSON to
    /// write. Read back by [`EventRows`], which accepts whole events too.
    WithoutColumns,
}

/// An event as [`BodyFormat::WithoutColumns`] writes it.
#[derive(Serialize)]
struct StoredBody<'a> {
    v: u16,
    trace_id: &'a str,
    span_id: &'a str,
    #[serde(flatten)]
    kind: &'a EventKind,
}

impl<'a> StoredBody<'a> {
    fn of(event: &'a Event) -> Self {
        Self {
            v: event.v,
            trace_id: &event.trace_id,
            span_id: &event.span_id,
            kind: &event.kind,
        }
    }
}

/// A stored body read back: a [`StoredBody`], or a whole event written before migration
/// `0010` (its `seq`, `ts`, `thread_id` and `run_id` equal its row's columns and are
/// ignored: no event kind has a field of those names, the event's own would collide).
#[derive(Deserialize)]
struct ReadBody {
    v: u16,
    trace_id: Arc<str>,
    span_id: String,
    #[serde(flatten)]
    kind: EventKind,
}

/// The columns of an event row that a [`BodyFormat::WithoutColumns`] body leaves out.
pub(crate) struct RowColumns<'a> {
    pub seq: i64,
    pub ts: i64,
    pub run_id: &'a str,
    pub body: &'a str,
}

/// Rebuilds the events of one thread from its rows (in `seq` order), sharing one
/// allocation of the thread id and of each run id among them, as the runner does.
pub(crate) struct EventRows {
    thread_id: Arc<str>,
    run_id: Arc<str>,
}

impl EventRows {
    pub(crate) fn new(thread_id: &str) -> Self {
        Self {
            thread_id: thread_id.into(),
            run_id: "".into(),
        }
    }

    /// The event of one row; `body` in either [`BodyFormat`].
    pub(crate) fn event(&mut self, row: &RowColumns<'_>) -> Result<Event, StoreError> {
        let read: ReadBody = serde_json::from_str(row.body).map_err(|e| {
            StoreError::Backend(format!(
                "stored event {} of thread {} does not parse: {e}",
                row.seq, self.thread_id
            ))
        })?;
        if *self.run_id != *row.run_id {
            self.run_id = row.run_id.into();
        }
        Ok(Event {
            v: read.v,
            seq: to_u64("seq", row.seq)?,
            ts: ns_to_ts(row.ts),
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            trace_id: read.trace_id,
            span_id: read.span_id,
            kind: read.kind,
        })
    }
}

/// A batch of rows plus what it changes in the thread's summary row.
pub(crate) struct Batch {
    pub rows: Vec<EventRow>,
    /// Every row's body, one after the other (one allocation for the whole batch instead
    /// of one growing buffer per event: W1 wrote ten `String`s a conversation, each
    /// reallocated two or three times on its way to ~400 bytes).
    bodies: String,
    /// Status set by the batch (`None`: unchanged).
    pub status: Option<ThreadStatus>,
    /// Agent of the batch's last `run_started` (`None`: unchanged).
    pub agent: Option<String>,
    /// Time of the first event.
    pub first_ts: i64,
    /// Time of the last event.
    pub last_ts: i64,
}

/// Room reserved per event in [`Batch::bodies`] before serializing (most bodies of a
/// conversation are 150–750 bytes; a larger one grows the buffer once).
const BODY_BYTES_GUESS: usize = 512;

impl Batch {
    /// Serializes a (non-empty, already checked) batch, each body as `format` says. All
    /// the CPU work happens here, before any transaction is opened.
    ///
    /// Bodies are written with `sonic-rs`, whose output is the JSON `serde_json` writes
    /// for the same value (the test `bodies_are_what_serde_json_writes` checks it on the
    /// conformance suite's awkward events and on edge numbers) with SIMD string escaping:
    /// serializing was a third of the SQLite store's CPU in `./scripts/bench` W1, most of
    /// it escaping strings byte by byte.
    pub(crate) fn new<E: std::borrow::Borrow<Event>>(
        events: &[E],
        format: BodyFormat,
    ) -> Result<Self, StoreError> {
        let mut rows = Vec::with_capacity(events.len());
        let mut buffer: Vec<u8> = Vec::with_capacity(events.len().saturating_mul(BODY_BYTES_GUESS));
        let mut status = None;
        let mut agent = None;
        for event in events.iter().map(std::borrow::Borrow::borrow) {
            if let Some(set) = status_set_by(&event.kind) {
                status = Some(set);
            }
            if let EventKind::RunStarted { agent: name, .. } = &event.kind {
                agent = Some(name.clone());
            }
            let start = buffer.len();
            match format {
                BodyFormat::Whole => sonic_rs::to_writer(&mut buffer, event),
                BodyFormat::WithoutColumns => {
                    sonic_rs::to_writer(&mut buffer, &StoredBody::of(event))
                }
            }
            .map_err(|e| {
                StoreError::InvalidBatch(format!("event {} does not serialize: {e}", event.seq))
            })?;
            rows.push(EventRow {
                seq: to_i64("seq", event.seq)?,
                kind: event.kind.name(),
                run_id: Arc::clone(&event.run_id),
                ts: ts_to_ns(event.ts)?,
                body: start..buffer.len(),
            });
        }
        let bodies = String::from_utf8(buffer).map_err(|e| {
            StoreError::InvalidBatch(format!("a serialized event is not UTF-8: {e}"))
        })?;
        let first_ts = rows.first().map(|r| r.ts).unwrap_or_default();
        let last_ts = rows.last().map(|r| r.ts).unwrap_or_default();
        Ok(Self {
            rows,
            bodies,
            status,
            agent,
            first_ts,
            last_ts,
        })
    }

    /// The body of one of this batch's rows.
    pub(crate) fn body(&self, row: &EventRow) -> &str {
        self.bodies.get(row.body.clone()).unwrap_or_default()
    }

    /// The status a new thread starts in after this batch.
    pub(crate) fn initial_status(&self) -> ThreadStatus {
        self.status.unwrap_or(ThreadStatus::Running)
    }
}

/// Parses a stored event body.
pub(crate) fn parse_event(thread_id: &str, body: &str) -> Result<Event, StoreError> {
    serde_json::from_str(body).map_err(|e| {
        StoreError::Backend(format!(
            "stored event of thread {thread_id} does not parse: {e}"
        ))
    })
}

/// A raw `threads` row.
pub(crate) struct ThreadRow {
    pub thread_id: String,
    pub agent: Option<String>,
    pub status: String,
    pub end_state: Option<String>,
    pub event_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ThreadRow {
    /// The public summary.
    pub(crate) fn into_summary(self) -> Result<ThreadSummary, StoreError> {
        Ok(ThreadSummary {
            status: status_from_columns(&self.status, self.end_state.as_deref())?,
            event_count: to_u64("event_count", self.event_count)?,
            created_at: ns_to_ts(self.created_at),
            updated_at: ns_to_ts(self.updated_at),
            agent: self.agent,
            thread_id: self.thread_id,
        })
    }
}

/// Builds the `conflict` error.
pub(crate) fn conflict(thread_id: &str, expected: u64, actual: i64) -> StoreError {
    StoreError::Conflict {
        thread_id: thread_id.to_string(),
        expected,
        actual: u64::try_from(actual).unwrap_or(0),
    }
}

/// What a fenced append found of its lease's run-queue row (`None`: no such job).
pub(crate) struct FencedRow {
    /// `queued`, `leased`, `done`, …
    pub state: String,
    /// The job's fencing token now.
    pub token: i64,
    /// Whether its lease expiry is still ahead by the store's clock.
    pub live: bool,
}

/// Store-side fencing, shared by the SQL stores: `None` when `found` is the lease `fence`
/// names, still leased and not lapsed; else the [`StoreError::Fenced`] saying what became
/// of it.
pub(crate) fn fence_refusal(
    thread_id: &str,
    fence: keel_core::AppendFence,
    found: Option<FencedRow>,
) -> Option<StoreError> {
    let reason = match found {
        None => "no longer exists".to_string(),
        Some(row) if u64::try_from(row.token).ok() != Some(fence.token) => {
            format!("was taken over (token {} now)", row.token)
        }
        Some(row) if row.state != "leased" => format!("has ended (the job is {})", row.state),
        Some(row) if !row.live => "has lapsed by the store's clock".to_string(),
        Some(_) => return None,
    };
    Some(StoreError::Fenced {
        thread_id: thread_id.to_string(),
        job_id: fence.job_id,
        token: fence.token,
        reason,
    })
}

/// Parses a prefix of `source`'s log and rewrites it onto `target`.
pub(crate) fn rebase(
    source: &str,
    target: &str,
    bodies: &[String],
) -> Result<Vec<Event>, StoreError> {
    bodies
        .iter()
        .map(|body| {
            let mut event = parse_event(source, body)?;
            event.thread_id = target.into();
            Ok(event)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::fixtures::{event, rich_log};

    /// Events whose serialization is most likely to differ between JSON writers: the
    /// conformance suite's awkward log plus numbers at the edges of `f64`/`i64`/`u64`.
    fn awkward_events() -> Vec<Event> {
        let mut events = rich_log("thread-ü");
        let numbers = serde_json::json!({
            "big": 1e300, "tiny": 5e-324, "neg_zero": -0.0, "third": 1.0 / 3.0,
            "u64": u64::MAX, "i64": i64::MIN, "whole": 42.0, "exp": 1.5e21,
            "text": "\u{7f}\u{1f}\u{2028}\u{2029}</script>",
        });
        events.push(event(
            "thread-ü",
            events.len() as u64,
            99,
            EventKind::Notice {
                code: "numbers".into(),
                message: "edges".into(),
                data: Some(numbers),
            },
        ));
        events
    }

    #[test]
    fn bodies_are_what_serde_json_writes() {
        let events = awkward_events();
        for (format, expected) in [
            (
                BodyFormat::Whole,
                events
                    .iter()
                    .map(|e| serde_json::to_string(e).unwrap())
                    .collect::<Vec<_>>(),
            ),
            (
                BodyFormat::WithoutColumns,
                events
                    .iter()
                    .map(|e| serde_json::to_string(&StoredBody::of(e)).unwrap())
                    .collect(),
            ),
        ] {
            let batch = Batch::new(&events, format).unwrap();
            assert_eq!(batch.rows.len(), events.len());
            for (row, expected) in batch.rows.iter().zip(&expected) {
                assert_eq!(batch.body(row), expected, "{format:?}, event {}", row.seq);
            }
        }
    }

    #[test]
    fn bodies_read_back_as_the_events_written() {
        let events = awkward_events();
        let batch = Batch::new(&events, BodyFormat::WithoutColumns).unwrap();
        let mut reader = EventRows::new("thread-ü");
        for (row, written) in batch.rows.iter().zip(&events) {
            let read = reader
                .event(&RowColumns {
                    seq: row.seq,
                    ts: row.ts,
                    run_id: &row.run_id,
                    body: batch.body(row),
                })
                .unwrap();
            assert_eq!(&read, written);
        }
    }
}
