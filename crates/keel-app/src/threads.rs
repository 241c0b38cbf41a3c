//! The stored conversations as a user sees them: list (with filters by agent, status and
//! age), show (the conversation folded from the log, and the events), fork and delete —
//! the queries and text renderings behind `keel threads` and the HTTP server's thread
//! endpoints.
//!
//! This lives in the application layer rather than in `keel-store`: the store crate is the
//! backends behind [`EventStore`], while this module adds the user-facing vocabulary
//! (status names, ages like `2h`, the "does not exist" rule, forking through
//! `keel-runtime`'s [`Thread`]) that every surface shares.

use chrono::{DateTime, SecondsFormat, Utc};
use keel_core::store::{ThreadFilter, ThreadStatus, ThreadSummary};
use keel_core::{EndState, Event, EventStore, Message, Part, RunState};
use keel_runtime::Thread;
use serde_json::{Value, json};

/// Why a thread query failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadsError {
    /// A filter value is invalid (the caller's mistake).
    #[error("{0}")]
    Invalid(String),
    /// The thread does not exist in this store.
    #[error("thread {0} does not exist in this store")]
    NotFound(String),
    /// The store failed.
    #[error("{0}")]
    Store(String),
}

/// The threads `filter` selects, most recently updated first.
pub async fn list(
    store: &dyn EventStore,
    filter: &ThreadFilter,
) -> Result<Vec<ThreadSummary>, ThreadsError> {
    store
        .list_threads(filter)
        .await
        .map_err(|e| ThreadsError::Store(format!("cannot list threads: {e}")))
}

/// A thread: its summary, its conversation and its events.
#[derive(Debug, Clone)]
pub struct ThreadView {
    /// Status, agent, counts, times.
    pub summary: ThreadSummary,
    /// The conversation folded from the log.
    pub messages: Vec<Message>,
    /// The log.
    pub events: Vec<Event>,
}

impl ThreadView {
    /// `{"thread": summary, "messages": [...], "events": [...]}`.
    pub fn to_json(&self) -> Value {
        json!({
            "thread": self.summary,
            "messages": self.messages,
            "events": self.events,
        })
    }
}

/// Thread `thread_id`.
pub async fn show(store: &dyn EventStore, thread_id: &str) -> Result<ThreadView, ThreadsError> {
    let events = store
        .load(thread_id)
        .await
        .map_err(|e| ThreadsError::Store(format!("cannot load thread {thread_id}: {e}")))?;
    let Some(summary) = ThreadSummary::from_events(thread_id, &events) else {
        return Err(ThreadsError::NotFound(thread_id.to_string()));
    };
    let messages = RunState::from_events(thread_id, &events)
        .messages()
        .to_vec();
    Ok(ThreadView {
        summary,
        messages,
        events,
    })
}

/// A fork made by [`fork`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    /// The new thread.
    pub thread_id: String,
    /// The thread it was copied from.
    pub forked_from: String,
    /// The last event copied.
    pub at_seq: u64,
    /// How many events the new thread has.
    pub events: u64,
}

impl Forked {
    /// `{"thread_id", "forked_from", "at_seq", "events"}`.
    pub fn to_json(&self) -> Value {
        json!({
            "thread_id": self.thread_id,
            "forked_from": self.forked_from,
            "at_seq": self.at_seq,
            "events": self.events,
        })
    }
}

/// Copies events `0..=at_seq` of `thread_id` into a new thread.
pub async fn fork(
    store: &dyn EventStore,
    thread_id: &str,
    at_seq: u64,
) -> Result<Forked, ThreadsError> {
    let thread = Thread::load(store, thread_id)
        .await
        .map_err(|e| ThreadsError::Store(format!("cannot load thread {thread_id}: {e}")))?;
    if thread.is_empty() {
        return Err(ThreadsError::NotFound(thread_id.to_string()));
    }
    let forked = Thread::fork(store, thread_id, at_seq).await.map_err(|e| {
        ThreadsError::Store(format!("cannot fork thread {thread_id} at {at_seq}: {e}"))
    })?;
    Ok(Forked {
        thread_id: forked.id().to_string(),
        forked_from: thread_id.to_string(),
        at_seq,
        events: forked.state().next_seq(),
    })
}

/// Deletes `thread_id` and its events; `false` when it did not exist.
pub async fn delete(store: &dyn EventStore, thread_id: &str) -> Result<bool, ThreadsError> {
    store
        .delete_thread(thread_id)
        .await
        .map_err(|e| ThreadsError::Store(format!("cannot delete thread {thread_id}: {e}")))
}

/// `running`, `awaiting_approval`, `awaiting_user` or the end state (`done`, `failed`, …).
pub fn status_name(status: ThreadStatus) -> String {
    match status {
        ThreadStatus::Running => "running".into(),
        ThreadStatus::AwaitingApproval => "awaiting_approval".into(),
        ThreadStatus::AwaitingUser => "awaiting_user".into(),
        ThreadStatus::Ended(end_state) => end_state.to_string(),
    }
}

/// A [`status_name`] back as a status. The error quotes `text` (callers prefix the name
/// of the flag or parameter that gave it).
pub fn parse_status(text: &str) -> Result<ThreadStatus, ThreadsError> {
    let ends = [
        EndState::Done,
        EndState::ClarifyNeeded,
        EndState::BudgetExceeded,
        EndState::UnrecoverableToolContract,
        EndState::Cancelled,
        EndState::Failed,
    ];
    match text {
        "running" => Ok(ThreadStatus::Running),
        "awaiting_approval" => Ok(ThreadStatus::AwaitingApproval),
        "awaiting_user" => Ok(ThreadStatus::AwaitingUser),
        other => ends
            .into_iter()
            .find(|e| e.as_str() == other)
            .map(ThreadStatus::Ended)
            .ok_or_else(|| {
                ThreadsError::Invalid(format!(
                    "{other:?}: use running, awaiting_approval, awaiting_user, {}",
                    ends.map(EndState::as_str).join(", ")
                ))
            }),
    }
}

/// An RFC 3339 time, or an age (`90s`, `15m`, `2h`, `7d`) before `now` — a list's
/// `since`. The error quotes `text` (callers prefix the flag or parameter name).
pub fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, ThreadsError> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let bad = || {
        ThreadsError::Invalid(format!(
            "{text:?}: give an RFC 3339 time or an age like 30s, 15m, 2h, 7d"
        ))
    };
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (number, unit) = (
        text.get(..split).ok_or_else(bad)?,
        text.get(split..).ok_or_else(bad)?,
    );
    let n: i64 = number.parse().map_err(|_| bad())?;
    let age = match unit {
        "s" => chrono::Duration::try_seconds(n),
        "m" => chrono::Duration::try_minutes(n),
        "h" => chrono::Duration::try_hours(n),
        "d" => chrono::Duration::try_days(n),
        _ => None,
    }
    .ok_or_else(bad)?;
    now.checked_sub_signed(age).ok_or_else(bad)
}

/// The thread list as a table: a header line, then one line per thread.
pub fn render_list(threads: &[ThreadSummary]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<40} {:<18} {:>7}  {:<10} UPDATED",
        "THREAD", "STATUS", "EVENTS", "AGENT"
    )];
    lines.extend(threads.iter().map(|t| {
        format!(
            "{:<40} {:<18} {:>7}  {:<10} {}",
            t.thread_id,
            status_name(t.status),
            t.event_count,
            t.agent.as_deref().unwrap_or("-"),
            t.updated_at.to_rfc3339_opts(SecondsFormat::Secs, true)
        )
    }));
    lines
}

/// A thread shown as text lines: a header, `== conversation ==` (one line per text, tool
/// call and tool result), `== events ==` (seq, time, run, kind), a blank line before each
/// section.
pub fn render_view(view: &ThreadView) -> Vec<String> {
    let mut lines = vec![
        format!(
            "thread {}  {}  {} events",
            view.summary.thread_id,
            status_name(view.summary.status),
            view.summary.event_count
        ),
        String::new(),
        "== conversation ==".to_string(),
    ];
    for message in &view.messages {
        lines.extend(render_message(message));
    }
    lines.push(String::new());
    lines.push("== events ==".to_string());
    lines.extend(view.events.iter().map(|event| {
        format!(
            "{:>5}  {}  {}  {}",
            event.seq,
            event.ts.format("%H:%M:%S%.3f"),
            event.run_id,
            event.kind.name()
        )
    }));
    lines
}

/// A message as lines `role: text`, `role: → tool args (id)`, `role: ← tool (id): result`.
pub fn render_message(message: &Message) -> Vec<String> {
    let role = serde_json::to_value(message.role)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    message
        .parts
        .iter()
        .filter_map(|part| match part {
            Part::Text { text } => Some(format!("{role}: {text}")),
            Part::ToolCall(call) => Some(format!(
                "{role}: → {} {} ({})",
                call.name, call.arguments, call.id
            )),
            Part::ToolResult(result) => Some(format!(
                "{role}: ← {} ({}): {}",
                result.name, result.call_id, result.content
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn since_accepts_ages_and_times() {
        let now = Utc::now();
        assert_eq!(
            parse_since("2h", now).unwrap(),
            now - chrono::Duration::hours(2)
        );
        assert!(parse_since("2026-01-01T00:00:00Z", now).is_ok());
        assert!(parse_since("2x", now).is_err());
        assert!(parse_since("", now).is_err());
        assert_eq!(
            parse_status("done").unwrap(),
            ThreadStatus::Ended(EndState::Done)
        );
        assert!(parse_status("nope").is_err());
    }

    #[tokio::test]
    async fn show_fork_and_delete_a_missing_thread() {
        let store = keel_core::MemoryStore::new();
        assert_eq!(
            show(&store, "thr_x").await.unwrap_err(),
            ThreadsError::NotFound("thr_x".into())
        );
        assert_eq!(
            fork(&store, "thr_x", 0).await.unwrap_err().to_string(),
            "thread thr_x does not exist in this store"
        );
        assert!(!delete(&store, "thr_x").await.unwrap());
        assert!(
            list(&store, &ThreadFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }
}
