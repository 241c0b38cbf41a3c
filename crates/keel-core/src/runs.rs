//! The runs list: a thread's runs summed up ([`RunSummary`]: agent, model, start,
//! duration, status, model calls, tool calls, tokens, cost) and the query that filters,
//! sorts and pages it ([`RunQuery`]), answered by [`EventStore::list_runs`].
//!
//! The statistics are a fold over the thread's log ([`RunStats::fold`]), one event at a
//! time, so a store can keep them up to date incrementally (the SQL stores keep an index
//! of them; see `keel-store`) and every store computes exactly the same figures. The text
//! a search looks in ([`push_search_text`]) is defined here for the same reason.
//!
//! Paging is by keyset: a page ends with a [`RunCursor`] (the last row's sort value and
//! thread id) and the next page starts strictly after it, so pages neither repeat nor skip
//! rows when the order stays, however deep the page.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::{Event, EventKind};
use crate::message::{Message, Part};
use crate::store::{EventStore, StoreError, ThreadFilter, ThreadStatus, ThreadSummary};

/// The most rows a page holds ([`RunQuery::limit`] is clamped to it).
pub const MAX_RUN_PAGE: usize = 200;

/// Each text searched ([`push_search_text`]) is cut to this many characters.
pub const SEARCH_TEXT_CHARS: usize = 2000;

/// A run's goal is kept to this many characters.
pub const GOAL_CHARS: usize = 200;

/// What the runs list is ordered by. Ties are broken by thread id, ascending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunSort {
    /// The last event's time (the thread's latest activity).
    #[default]
    Updated,
    /// The first event's time.
    Started,
    /// Last event's time minus first event's time.
    Duration,
    /// Model calls.
    Turns,
    /// Tool calls.
    ToolCalls,
    /// Input plus output tokens.
    Tokens,
    /// Cost in US dollars (a thread without a reported cost counts as 0).
    Cost,
}

impl RunSort {
    /// Every key, in the order a UI lists them.
    pub const ALL: [RunSort; 7] = [
        RunSort::Updated,
        RunSort::Started,
        RunSort::Duration,
        RunSort::Turns,
        RunSort::ToolCalls,
        RunSort::Tokens,
        RunSort::Cost,
    ];

    /// The key's name (`updated`, `started`, `duration`, `turns`, `tool_calls`, `tokens`,
    /// `cost`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Updated => "updated",
            Self::Started => "started",
            Self::Duration => "duration",
            Self::Turns => "turns",
            Self::ToolCalls => "tool_calls",
            Self::Tokens => "tokens",
            Self::Cost => "cost",
        }
    }

    /// The key named `text`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// Whether the key's values are floating point (cost) rather than integers.
    pub fn is_float(self) -> bool {
        self == Self::Cost
    }
}

/// A sort key's value: integers (times and durations in nanoseconds, counts) or a cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SortValue {
    /// Times, durations (nanoseconds) and counts.
    Int(i64),
    /// Cost.
    Float(f64),
}

impl SortValue {
    fn cmp_to(&self, other: &SortValue) -> Ordering {
        match (self, other) {
            (Self::Int(a), Self::Int(b)) => a.cmp(b),
            (Self::Float(a), Self::Float(b)) => a.total_cmp(b),
            (Self::Int(a), Self::Float(b)) => (*a as f64).total_cmp(b),
            (Self::Float(a), Self::Int(b)) => a.total_cmp(&(*b as f64)),
        }
    }
}

impl std::fmt::Display for SortValue {
    /// Integers as digits; floats in Rust's shortest form that parses back exactly.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Float(v) => write!(f, "{v:?}"),
        }
    }
}

/// Where a page of the runs list ends: the next page holds the rows strictly after this
/// one in the query's order.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCursor {
    /// The sort key's value of the last row.
    pub value: SortValue,
    /// The last row's thread id.
    pub thread_id: String,
}

impl RunCursor {
    /// The cursor of `run` under `sort`.
    pub fn of(run: &RunSummary, sort: RunSort) -> Self {
        Self {
            value: run.sort_value(sort),
            thread_id: run.thread_id.clone(),
        }
    }

    /// `VALUE~THREAD` (for a URL).
    pub fn encode(&self) -> String {
        format!("{}~{}", self.value, self.thread_id)
    }

    /// Reads [`RunCursor::encode`]'s form for a listing sorted by `sort`.
    pub fn decode(sort: RunSort, text: &str) -> Result<Self, String> {
        let (value, thread_id) = text
            .split_once('~')
            .ok_or_else(|| format!("{text:?}: expected VALUE~THREAD"))?;
        let value = if sort.is_float() {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .map(SortValue::Float)
        } else {
            value.parse::<i64>().ok().map(SortValue::Int)
        }
        .ok_or_else(|| {
            format!(
                "{value:?} is not a position in a listing sorted by {}",
                sort.as_str()
            )
        })?;
        Ok(Self {
            value,
            thread_id: thread_id.to_string(),
        })
    }
}

/// A query for [`EventStore::list_runs`]. Every filter set must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct RunQuery {
    /// Only threads whose id starts with this (a tenant's namespace).
    pub thread_prefix: Option<String>,
    /// Only threads in exactly this status.
    pub status: Option<ThreadStatus>,
    /// Only threads whose latest run used this agent (exact name).
    pub agent: Option<String>,
    /// Only threads one of whose runs used a model whose id contains this, ignoring
    /// ASCII case.
    pub model: Option<String>,
    /// Only threads active at or after this time (last event at or after it).
    pub active_since: Option<DateTime<Utc>>,
    /// Only threads started at or before this time (first event at or before it).
    pub started_before: Option<DateTime<Utc>>,
    /// Only threads whose messages contain this text, ignoring case: user, assistant and
    /// tool messages, questions, answers and final texts, each cut to
    /// [`SEARCH_TEXT_CHARS`] characters (see [`push_search_text`]).
    pub text: Option<String>,
    /// The order.
    pub sort: RunSort,
    /// Smallest first (default: largest first).
    pub ascending: bool,
    /// Start after this row (the previous page's [`RunPage::next`]).
    pub after: Option<RunCursor>,
    /// Rows per page, clamped to `1..=`[`MAX_RUN_PAGE`].
    pub limit: usize,
}

impl Default for RunQuery {
    fn default() -> Self {
        Self {
            thread_prefix: None,
            status: None,
            agent: None,
            model: None,
            active_since: None,
            started_before: None,
            text: None,
            sort: RunSort::Updated,
            ascending: false,
            after: None,
            limit: 25,
        }
    }
}

impl RunQuery {
    /// The page size: [`RunQuery::limit`] within `1..=`[`MAX_RUN_PAGE`].
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_RUN_PAGE)
    }

    /// Checks what a store cannot answer: a search text or model with a control
    /// character (texts are searched line by line), a cursor of another order.
    pub fn validate(&self) -> Result<(), StoreError> {
        for (field, value) in [("text", &self.text), ("model", &self.model)] {
            if value
                .as_deref()
                .is_some_and(|v| v.chars().any(char::is_control))
            {
                return Err(StoreError::InvalidQuery(format!(
                    "{field} contains a control character (a line break, a tab…): search for one line of text"
                )));
            }
        }
        if let Some(after) = &self.after
            && matches!(after.value, SortValue::Float(_)) != self.sort.is_float()
        {
            return Err(StoreError::InvalidQuery(format!(
                "the cursor does not belong to a listing sorted by {}",
                self.sort.as_str()
            )));
        }
        Ok(())
    }

    /// The search text as matched: lowercase.
    pub fn text_needle(&self) -> Option<String> {
        self.text.as_deref().map(str::to_lowercase)
    }

    /// The model filter as matched: ASCII lowercase.
    pub fn model_needle(&self) -> Option<String> {
        self.model.as_deref().map(str::to_ascii_lowercase)
    }

    /// The filters other than the text and the cursor.
    pub fn matches(&self, run: &RunSummary) -> bool {
        self.thread_prefix
            .as_deref()
            .is_none_or(|p| run.thread_id.starts_with(p))
            && self.status.is_none_or(|s| run.status == s)
            && self
                .agent
                .as_deref()
                .is_none_or(|a| run.agent.as_deref() == Some(a))
            && self.model_needle().is_none_or(|needle| {
                run.models
                    .iter()
                    .any(|m| m.to_ascii_lowercase().contains(&needle))
            })
            && self.active_since.is_none_or(|t| run.updated_at >= t)
            && self.started_before.is_none_or(|t| run.created_at <= t)
    }

    /// The query's order between two rows (ties by thread id, ascending).
    pub fn compare(&self, a: &RunSummary, b: &RunSummary) -> Ordering {
        let by_key = a.sort_value(self.sort).cmp_to(&b.sort_value(self.sort));
        let by_key = if self.ascending {
            by_key
        } else {
            by_key.reverse()
        };
        by_key.then_with(|| a.thread_id.cmp(&b.thread_id))
    }

    /// Whether `run` comes after the cursor (always, without one).
    pub fn is_after_cursor(&self, run: &RunSummary) -> bool {
        let Some(after) = &self.after else {
            return true;
        };
        let by_key = run.sort_value(self.sort).cmp_to(&after.value);
        let by_key = if self.ascending {
            by_key
        } else {
            by_key.reverse()
        };
        by_key.then_with(|| run.thread_id.as_str().cmp(after.thread_id.as_str()))
            == Ordering::Greater
    }
}

/// A page of the runs list.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    /// The rows, in the query's order.
    pub runs: Vec<RunSummary>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<RunCursor>,
    /// Threads (within the query's prefix) the page could not consider yet: a store that
    /// keeps an index and is still building it (the first listing of a big store written
    /// without one) answers within its time budget from what it has indexed and goes on
    /// indexing in the background. 0 when the page covers every thread.
    pub unindexed: u64,
}

/// A thread with its runs summed up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Thread id.
    pub thread_id: String,
    /// Agent of the latest run.
    pub agent: Option<String>,
    /// Model of the latest run.
    pub model: Option<String>,
    /// Every model the thread's runs used, in first-use order.
    pub models: Vec<String>,
    /// The first run's goal (its first [`GOAL_CHARS`] characters).
    pub goal: Option<String>,
    /// The latest run's trace id.
    pub trace_id: Option<String>,
    /// Status.
    pub status: ThreadStatus,
    /// Number of events.
    pub event_count: u64,
    /// First event time.
    pub created_at: DateTime<Utc>,
    /// Last event time.
    pub updated_at: DateTime<Utc>,
    /// Runs (`run_started` events).
    pub runs: u32,
    /// Model calls (`model_requested` events).
    pub turns: u32,
    /// Finished tool calls.
    pub tool_calls: u32,
    /// Tool calls that finished with an error.
    pub tool_errors: u32,
    /// Input plus output tokens of every model answer.
    pub tokens: u64,
    /// Sum of the reported costs; `None` when no answer reported one.
    pub cost_usd: Option<f64>,
}

fn nanos(ts: DateTime<Utc>) -> i64 {
    ts.timestamp_nanos_opt().unwrap_or(if ts.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

impl RunSummary {
    /// The thread's span: last event time minus first, in nanoseconds.
    pub fn duration_nanos(&self) -> i64 {
        nanos(self.updated_at).saturating_sub(nanos(self.created_at))
    }

    /// The value this row is ordered by under `sort`.
    pub fn sort_value(&self, sort: RunSort) -> SortValue {
        match sort {
            RunSort::Updated => SortValue::Int(nanos(self.updated_at)),
            RunSort::Started => SortValue::Int(nanos(self.created_at)),
            RunSort::Duration => SortValue::Int(self.duration_nanos()),
            RunSort::Turns => SortValue::Int(i64::from(self.turns)),
            RunSort::ToolCalls => SortValue::Int(i64::from(self.tool_calls)),
            RunSort::Tokens => SortValue::Int(i64::try_from(self.tokens).unwrap_or(i64::MAX)),
            RunSort::Cost => SortValue::Float(self.cost_usd.unwrap_or(0.0)),
        }
    }
}

/// The statistics of a thread's log so far, folded one event at a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStats {
    /// Runs.
    pub runs: u32,
    /// Model calls.
    pub turns: u32,
    /// Finished tool calls.
    pub tool_calls: u32,
    /// Failed tool calls.
    pub tool_errors: u32,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Summed cost, when any answer reported one.
    pub cost_usd: Option<f64>,
    /// Model of the latest run.
    pub model: Option<String>,
    /// Every model used, in first-use order.
    pub models: Vec<String>,
    /// The first run's goal, cut to [`GOAL_CHARS`] characters (NUL characters replaced by
    /// spaces).
    pub goal: Option<String>,
    /// The latest run's trace id.
    pub trace_id: Option<String>,
}

impl RunStats {
    /// The statistics of a whole log.
    pub fn from_events(events: &[Event]) -> Self {
        let mut stats = Self::default();
        for event in events {
            stats.fold(event);
        }
        stats
    }

    /// Adds one event (the next of the log).
    pub fn fold(&mut self, event: &Event) {
        match &event.kind {
            EventKind::RunStarted { model, goal, .. } => {
                self.runs = self.runs.saturating_add(1);
                self.model = Some(model.clone());
                if !self.models.contains(model) {
                    self.models.push(model.clone());
                }
                if self.goal.is_none() {
                    self.goal = Some(
                        goal.chars()
                            .take(GOAL_CHARS)
                            .map(|c| if c == '\0' { ' ' } else { c })
                            .collect(),
                    );
                }
                self.trace_id = Some(event.trace_id.to_string());
            }
            EventKind::ModelRequested { .. } => self.turns = self.turns.saturating_add(1),
            EventKind::ModelResponded {
                usage, cost_usd, ..
            } => {
                self.tokens = self
                    .tokens
                    .saturating_add(usage.input_tokens)
                    .saturating_add(usage.output_tokens);
                if let Some(cost) = cost_usd {
                    self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + cost);
                }
            }
            EventKind::ToolCallFinished { result } => {
                self.tool_calls = self.tool_calls.saturating_add(1);
                if !result.outcome.is_ok() {
                    self.tool_errors = self.tool_errors.saturating_add(1);
                }
            }
            _ => {}
        }
    }

    /// The row of a thread: `thread` gives id, agent, status, count and times.
    pub fn into_summary(self, thread: ThreadSummary) -> RunSummary {
        RunSummary {
            thread_id: thread.thread_id,
            agent: thread.agent,
            model: self.model,
            models: self.models,
            goal: self.goal,
            trace_id: self.trace_id,
            status: thread.status,
            event_count: thread.event_count,
            created_at: thread.created_at,
            updated_at: thread.updated_at,
            runs: self.runs,
            turns: self.turns,
            tool_calls: self.tool_calls,
            tool_errors: self.tool_errors,
            tokens: self.tokens,
            cost_usd: self.cost_usd,
        }
    }
}

/// Appends the texts of `event` a search looks in — user, assistant and tool messages
/// (text, summaries, tool-call arguments, tool results), questions, answers and final
/// texts — each cut to [`SEARCH_TEXT_CHARS`] characters, lowercased, with NUL characters
/// replaced by spaces, and followed by a line break.
pub fn push_search_text(event: &Event, out: &mut String) {
    let mut push = |text: &str| {
        for c in text.chars().take(SEARCH_TEXT_CHARS) {
            if c == '\0' {
                out.push(' ');
            } else {
                out.extend(c.to_lowercase());
            }
        }
        out.push('\n');
    };
    let mut message = |message: &Message| {
        for part in &message.parts {
            match part {
                Part::Text { text } | Part::Summary { text, .. } => push(text),
                Part::ToolCall(call) => push(&call.arguments),
                Part::ToolResult(result) => push(&result.content),
                Part::ProviderItem { .. } => {}
            }
        }
    };
    match &event.kind {
        EventKind::UserMessage { message: m }
        | EventKind::ModelResponded { message: m, .. }
        | EventKind::AgentMessage { message: m, .. } => message(m),
        EventKind::ToolCallFinished { result } => push(&result.content),
        EventKind::UserAnswered { answer } => push(answer),
        EventKind::UserAsked { question, .. } => push(question),
        EventKind::RunEnded {
            final_text: Some(text),
            ..
        } => push(text),
        _ => {}
    }
}

/// [`EventStore::list_runs`] for a store without an index: folds the log of every thread
/// the store's own filters let through (agent, status, activity). Fine for the memory
/// store; the SQL stores answer from their index instead.
pub async fn list_runs_by_folding<S: EventStore + ?Sized>(
    store: &S,
    query: &RunQuery,
) -> Result<RunPage, StoreError> {
    query.validate()?;
    let threads = store
        .list_threads(&ThreadFilter {
            agent: query.agent.clone(),
            updated_since: query.active_since,
            status: query.status,
            limit: None,
            id_prefix: None,
        })
        .await?;
    let needle = query.text_needle();
    let mut rows = Vec::new();
    for thread in threads {
        let outside = query
            .thread_prefix
            .as_deref()
            .is_some_and(|p| !thread.thread_id.starts_with(p))
            || query.started_before.is_some_and(|t| thread.created_at > t);
        if outside {
            continue;
        }
        let events = store.load(&thread.thread_id).await?;
        let Some(thread) = ThreadSummary::from_events(&thread.thread_id, &events) else {
            continue;
        };
        let run = RunStats::from_events(&events).into_summary(thread);
        if !query.matches(&run) || !query.is_after_cursor(&run) {
            continue;
        }
        if let Some(needle) = &needle {
            let mut text = String::new();
            for event in &events {
                push_search_text(event, &mut text);
            }
            if !text.contains(needle.as_str()) {
                continue;
            }
        }
        rows.push(run);
    }
    rows.sort_by(|a, b| query.compare(a, b));
    Ok(page_of(rows, query))
}

/// The first page of `sorted` rows (all after the cursor) for `query`: at most the page
/// size, with the cursor of its last row when more follow.
pub fn page_of(mut sorted: Vec<RunSummary>, query: &RunQuery) -> RunPage {
    let size = query.page_size();
    let more = sorted.len() > size;
    sorted.truncate(size);
    let next = if more {
        sorted.last().map(|run| RunCursor::of(run, query.sort))
    } else {
        None
    };
    RunPage {
        runs: sorted,
        next,
        unindexed: 0,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn run(id: &str, tokens: u64, cost: Option<f64>) -> RunSummary {
        RunSummary {
            thread_id: id.into(),
            agent: None,
            model: None,
            models: vec!["openai:GPT-4o".into()],
            goal: None,
            trace_id: None,
            status: ThreadStatus::Running,
            event_count: 1,
            created_at: DateTime::from_timestamp(1_000, 0).unwrap(),
            updated_at: DateTime::from_timestamp(1_000 + tokens as i64, 0).unwrap(),
            runs: 1,
            turns: 0,
            tool_calls: 0,
            tool_errors: 0,
            tokens,
            cost_usd: cost,
        }
    }

    #[test]
    fn cursors_round_trip_and_refuse_another_order() {
        let c = RunCursor {
            value: SortValue::Float(0.1 + 0.2),
            thread_id: "t~1".into(),
        };
        assert_eq!(RunCursor::decode(RunSort::Cost, &c.encode()).unwrap(), c);
        let c = RunCursor::of(&run("a", 7, None), RunSort::Tokens);
        assert_eq!(RunCursor::decode(RunSort::Tokens, &c.encode()).unwrap(), c);
        assert!(RunCursor::decode(RunSort::Tokens, "0.5~a").is_err());
        assert!(RunCursor::decode(RunSort::Cost, "inf~a").is_err());
        assert!(RunCursor::decode(RunSort::Turns, "12").is_err());
        let query = RunQuery {
            sort: RunSort::Cost,
            after: Some(RunCursor {
                value: SortValue::Int(1),
                thread_id: "a".into(),
            }),
            ..RunQuery::default()
        };
        assert!(matches!(query.validate(), Err(StoreError::InvalidQuery(_))));
        let query = RunQuery {
            text: Some("two\nlines".into()),
            ..RunQuery::default()
        };
        assert!(matches!(query.validate(), Err(StoreError::InvalidQuery(_))));
    }

    #[test]
    fn keyset_pages_follow_the_order_without_repeats() {
        let rows: Vec<RunSummary> = [("a", 5), ("b", 3), ("c", 5), ("d", 1), ("e", 3)]
            .into_iter()
            .map(|(id, tokens)| run(id, tokens, None))
            .collect();
        for ascending in [false, true] {
            let mut query = RunQuery {
                sort: RunSort::Tokens,
                ascending,
                limit: 2,
                ..RunQuery::default()
            };
            let mut sorted = rows.clone();
            sorted.sort_by(|a, b| query.compare(a, b));
            let mut walked = Vec::new();
            loop {
                let rest: Vec<RunSummary> = sorted
                    .iter()
                    .filter(|r| query.is_after_cursor(r))
                    .cloned()
                    .collect();
                let page = page_of(rest, &query);
                walked.extend(page.runs.iter().map(|r| r.thread_id.clone()));
                match page.next {
                    Some(next) => query.after = Some(next),
                    None => break,
                }
            }
            let expected: Vec<String> = sorted.iter().map(|r| r.thread_id.clone()).collect();
            assert_eq!(walked, expected);
        }
        let mut q = RunQuery {
            sort: RunSort::Tokens,
            ..RunQuery::default()
        };
        let mut sorted = rows;
        sorted.sort_by(|a, b| q.compare(a, b));
        let ids: Vec<&str> = sorted.iter().map(|r| r.thread_id.as_str()).collect();
        assert_eq!(ids, ["a", "c", "b", "e", "d"]);
        q.model = Some("gpt-4O".into());
        assert!(q.matches(&sorted[0]));
        q.model = Some("claude".into());
        assert!(!q.matches(&sorted[0]));
    }
}
