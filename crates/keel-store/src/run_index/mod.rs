//! The SQL stores' runs list ([`keel_core::EventStore::list_runs`]): an index of every
//! thread's run statistics (`run_index`) and searchable text (`run_text`), migration
//! `0007`, from which a page is one query — filtered, sorted and paged by the database —
//! instead of a fold over every log.
//!
//! **Kept up to date by the reader, not the appender.** The append path is untouched
//! (it is what a run waits for, see `docs/durability.md`). Each listing first brings the
//! index up to date: one query finds the threads whose log grew past their row's
//! `indexed_count` (or that have no row), and only the events they gained are read and
//! folded with [`RunStats::fold`] and [`push_search_text`] — the same fold the memory
//! store runs over whole logs, so every store gives the same figures. A store written by
//! builds without the index, or by another process, is caught up the same way: the first
//! listing after the migration indexes every existing thread, in steps of at most
//! [`STEP_THREADS`] threads / [`STEP_EVENTS`] events.
//!
//! The same rows hold each thread's metrics facts ([`ThreadMetrics`], migration `0008`),
//! folded alongside, from which [`keel_core::EventStore::run_facts`] answers the
//! dashboard: one query after the same catch-up, no log read. A row whose facts do not
//! cover its `indexed_count` (`facts_count`: rows indexed before `0008`, or moved on by a
//! build without it) is folded again from the thread's first event.
//!
//! A listing catches up for at most [`CATCH_UP_BUDGET`]; a store with more to index than
//! that (a big store's first listing) answers from the threads indexed so far — the page
//! says how many are not yet ([`keel_core::runs::RunPage::unindexed`]) — and goes on
//! indexing in a background task (one per store at a time) until it is done; while that
//! task runs, listings in this process leave the indexing to it.
//!
//! Writes are guarded so that processes indexing at once never go backwards: a row is
//! replaced only by one that folded more events of the same thread (same `created_at`),
//! and only while that thread still exists. Deleting a thread deletes its rows (a trigger
//! on `threads`).

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use keel_core::Event;
use keel_core::run_metrics::{RunFacts, RunFoldState, ThreadMetrics};
use keel_core::runs::{RunQuery, RunSort, RunStats, RunSummary, push_search_text};
use keel_core::store::{StoreError, ThreadStatus};

use crate::rows::{ns_to_ts, status_from_columns, to_u64};

/// How long a listing spends bringing the index up to date before it answers from what
/// is indexed (and leaves the rest to a background task).
pub(crate) const CATCH_UP_BUDGET: Duration = Duration::from_millis(100);

/// Most threads indexed per step of a catch-up.
pub(crate) const STEP_THREADS: usize = 256;

/// A step stops taking threads once it has read this many events.
pub(crate) const STEP_EVENTS: usize = 10_000;

/// `run_text` rows hold at most about this many bytes (whole lines; a longer line is a row
/// of its own): small rows stay inside a table page (SQLite) or a heap tuple, not
/// compressed out of line (Postgres), which keeps a search's scan cheap.
pub(crate) const TEXT_ROW_BYTES: usize = 1500;

/// An index row as stored (`run_index`), before it meets its thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct IndexRow {
    pub indexed_count: i64,
    pub stats: RunStats,
    pub metrics: ThreadMetrics,
}

/// The metrics columns of a row (`facts`, `fold_state`: JSON).
#[derive(Debug, Clone)]
pub(crate) struct MetricsColumns {
    pub facts: String,
    pub fold_state: String,
}

impl MetricsColumns {
    pub(crate) fn of(metrics: &ThreadMetrics) -> Result<Self, StoreError> {
        let fail = |e: serde_json::Error| {
            StoreError::Backend(format!("run index: metrics facts do not serialize: {e}"))
        };
        Ok(Self {
            facts: serde_json::to_string(&metrics.runs).map_err(fail)?,
            fold_state: serde_json::to_string(&metrics.state).map_err(fail)?,
        })
    }

    /// The stored facts and state; `None` when they are missing or do not parse (the row
    /// is then folded again from the first event).
    pub(crate) fn read(facts: Option<&str>, fold_state: Option<&str>) -> Option<ThreadMetrics> {
        let runs: Vec<RunFacts> = serde_json::from_str(facts?).ok()?;
        let state: std::collections::BTreeMap<String, RunFoldState> =
            serde_json::from_str(fold_state?).ok()?;
        Some(ThreadMetrics { runs, state })
    }
}

/// The stored `facts` of a thread listed for the dashboard.
pub(crate) fn read_facts(thread_id: &str, facts: &str) -> Result<Vec<RunFacts>, StoreError> {
    serde_json::from_str(facts).map_err(|e| {
        StoreError::Backend(format!(
            "run index: the metrics facts of thread {thread_id} do not parse: {e}"
        ))
    })
}

/// A thread whose row is behind its log, as the detection query saw it.
#[derive(Debug, Clone)]
pub(crate) struct Stale {
    pub thread_id: String,
    /// The thread's `created_at`.
    pub created_at: i64,
    /// Its current row, when it is of this thread (same `created_at`) and not ahead of the
    /// log: the fold continues from it. `None`: fold from the first event.
    pub base: Option<IndexRow>,
}

impl Stale {
    /// The first event to fold.
    pub(crate) fn first_seq(&self) -> i64 {
        self.base.as_ref().map_or(0, |b| b.indexed_count)
    }
}

/// A new index row and the text of the events it added.
#[derive(Debug, Clone)]
pub(crate) struct Indexed {
    pub thread_id: String,
    pub created_at: i64,
    /// Folded from the first event (old rows of the thread's text are dropped).
    pub restart: bool,
    /// First event folded in this step.
    pub from_seq: i64,
    /// Events folded in all (the new `indexed_count`).
    pub indexed_count: i64,
    pub stats: RunStats,
    pub metrics: ThreadMetrics,
    /// Searchable text of the events from `from_seq`, as `run_text` rows (maybe none).
    pub text: Vec<String>,
}

/// Folds the events a stale thread gained (`events`: its log from `stale.first_seq()`, in
/// order) onto its row. Stops at a gap in the sequence numbers (there is none in a log
/// written through a store). `None` when there was nothing new.
pub(crate) fn fold(stale: Stale, events: &[Event]) -> Option<Indexed> {
    let from_seq = stale.first_seq();
    let restart = stale.base.is_none();
    let (mut stats, mut metrics) = stale.base.map(|b| (b.stats, b.metrics)).unwrap_or_default();
    let mut text = String::new();
    let mut next = from_seq;
    for event in events {
        if i64::try_from(event.seq).ok() != Some(next) {
            break;
        }
        stats.fold(event);
        metrics.fold(event);
        push_search_text(event, &mut text);
        next = next.saturating_add(1);
    }
    (next > from_seq).then_some(Indexed {
        thread_id: stale.thread_id,
        created_at: stale.created_at,
        restart,
        from_seq,
        indexed_count: next,
        stats,
        metrics,
        text: text_rows(&text),
    })
}

/// Splits searchable text (lines, each ending with a line break) into rows of whole lines
/// of at most [`TEXT_ROW_BYTES`] bytes where possible. A search text has no line break,
/// so no match spans two rows.
pub(crate) fn text_rows(text: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut row = String::new();
    for line in text.split_inclusive('\n') {
        if !row.is_empty() && row.len() + line.len() > TEXT_ROW_BYTES {
            rows.push(std::mem::take(&mut row));
        }
        row.push_str(line);
    }
    if !row.is_empty() {
        rows.push(row);
    }
    rows
}

/// Stores (by [`background`]'s key) with a background catch-up under way.
static CATCHING_UP: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn catching_up() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    match CATCHING_UP.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Removes its key from [`CATCHING_UP`] when the task ends, however it ends.
struct Running(String);

impl Drop for Running {
    fn drop(&mut self) {
        catching_up().remove(&self.0);
    }
}

/// Whether a background catch-up is under way for the store named `key` (a listing then
/// leaves the indexing to it and answers at once).
pub(crate) fn in_background(key: &str) -> bool {
    catching_up().contains(key)
}

/// Runs `work` (a catch-up to the end) on a Tokio task unless one is already running for
/// the store named `key`. Its failure is dropped: the next listing tries again.
pub(crate) fn background<F>(key: String, work: F)
where
    F: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    if !catching_up().insert(key.clone()) {
        return;
    }
    let running = Running(key);
    tokio::spawn(async move {
        let _running = running;
        let _ = work.await;
    });
}

/// `models` as stored: each id followed by a line break, the list preceded by one (so a
/// filter without a line break matches within one id).
pub(crate) fn join_models(models: &[String]) -> String {
    let mut out = String::from("\n");
    for model in models {
        out.push_str(&model.replace(['\n', '\0'], " "));
        out.push('\n');
    }
    out
}

/// The stored `models` column as a list.
pub(crate) fn split_models(models: &str) -> Vec<String> {
    models
        .split('\n')
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect()
}

/// A count read back from the index.
pub(crate) fn count_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// A NUL character cannot be stored in a Postgres `TEXT`: replaced by a space.
pub(crate) fn no_nul(text: &str) -> String {
    text.replace('\0', " ")
}

/// The statistics columns of a stored row.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatsColumns {
    pub runs: i64,
    pub turns: i64,
    pub tool_calls: i64,
    pub tool_errors: i64,
    pub tokens: i64,
    pub cost: Option<f64>,
    pub model: Option<String>,
    pub models: String,
    pub goal: Option<String>,
    pub trace_id: Option<String>,
}

impl StatsColumns {
    pub(crate) fn of(stats: &RunStats) -> Self {
        Self {
            runs: i64::from(stats.runs),
            turns: i64::from(stats.turns),
            tool_calls: i64::from(stats.tool_calls),
            tool_errors: i64::from(stats.tool_errors),
            tokens: i64::try_from(stats.tokens).unwrap_or(i64::MAX),
            cost: stats.cost_usd,
            model: stats.model.as_deref().map(no_nul),
            models: join_models(&stats.models),
            goal: stats.goal.clone(),
            trace_id: stats.trace_id.as_deref().map(no_nul),
        }
    }

    pub(crate) fn into_stats(self) -> RunStats {
        RunStats {
            runs: count_u32(self.runs),
            turns: count_u32(self.turns),
            tool_calls: count_u32(self.tool_calls),
            tool_errors: count_u32(self.tool_errors),
            tokens: u64::try_from(self.tokens.max(0)).unwrap_or(0),
            cost_usd: self.cost,
            model: self.model,
            models: split_models(&self.models),
            goal: self.goal,
            trace_id: self.trace_id,
        }
    }
}

/// The thread columns of a listed row.
#[derive(Debug, Clone)]
pub(crate) struct ThreadColumns {
    pub thread_id: String,
    pub agent: Option<String>,
    pub status: String,
    pub end_state: Option<String>,
    pub event_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A listed row.
pub(crate) fn summary(
    thread: ThreadColumns,
    stats: StatsColumns,
) -> Result<RunSummary, StoreError> {
    let status: ThreadStatus = status_from_columns(&thread.status, thread.end_state.as_deref())?;
    let stats = stats.into_stats();
    Ok(RunSummary {
        thread_id: thread.thread_id,
        agent: thread.agent,
        model: stats.model,
        models: stats.models,
        goal: stats.goal,
        trace_id: stats.trace_id,
        status,
        event_count: to_u64("event_count", thread.event_count)?,
        created_at: ns_to_ts(thread.created_at),
        updated_at: ns_to_ts(thread.updated_at),
        runs: stats.runs,
        turns: stats.turns,
        tool_calls: stats.tool_calls,
        tool_errors: stats.tool_errors,
        tokens: stats.tokens,
        cost_usd: stats.cost_usd,
    })
}

/// The SQL expression a listing is ordered by, over the listing's `t` (thread) and `r`
/// (index) columns.
pub(crate) fn sort_expression(sort: RunSort) -> &'static str {
    match sort {
        RunSort::Updated => "t.updated_at",
        RunSort::Started => "t.created_at",
        RunSort::Duration => "(t.updated_at - t.created_at)",
        RunSort::Turns => "r.turns",
        RunSort::ToolCalls => "r.tool_calls",
        RunSort::Tokens => "r.tokens",
        RunSort::Cost => "COALESCE(r.cost, 0.0)",
    }
}

/// The comparison that keeps rows after the cursor for the query's direction: `<` when
/// largest first.
pub(crate) fn after_operator(query: &RunQuery) -> &'static str {
    if query.ascending { ">" } else { "<" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_round_trip_and_keep_ids_apart() {
        let models = vec!["openai:gpt-4o".to_string(), "mock:model".to_string()];
        let joined = join_models(&models);
        assert_eq!(joined, "\nopenai:gpt-4o\nmock:model\n");
        assert_eq!(split_models(&joined), models);
        assert_eq!(split_models(&join_models(&[])), Vec::<String>::new());
    }

    #[test]
    fn text_rows_keep_lines_whole() {
        let long = "x".repeat(TEXT_ROW_BYTES + 10);
        let text = format!("a\nb\n{long}\nc\n");
        let rows = text_rows(&text);
        assert_eq!(
            rows,
            vec!["a\nb\n".to_string(), format!("{long}\n"), "c\n".to_string()]
        );
        assert_eq!(rows.concat(), text);
        assert!(text_rows("").is_empty());
    }
}
