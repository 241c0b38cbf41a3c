//! [`RunRow`]: one line of the runs page — a thread's runs taken together (a thread
//! continued by `keel resume`, `reply` or a handoff holds several): agent and model of the
//! latest run, start, duration, status, model calls, tool calls, tokens and cost. The
//! runs page gets them from the store's runs list ([`RunSummary`]); the run page folds
//! them from the log with the same fold ([`RunStats`]).

use chrono::{DateTime, Utc};
use keel_core::Event;
use keel_core::runs::{RunStats, RunSummary};
use keel_core::store::{ThreadStatus, ThreadSummary};

/// One thread on the runs page.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunRow {
    pub thread_id: String,
    pub agent: String,
    /// Model of the latest run.
    pub model: String,
    pub goal: String,
    pub started: DateTime<Utc>,
    pub duration_ms: i64,
    pub status: ThreadStatus,
    pub runs: u32,
    /// Model calls.
    pub turns: u32,
    pub tool_calls: u32,
    pub tool_errors: u32,
    pub tokens: u64,
    /// `None` when no call reported a cost.
    pub cost_usd: Option<f64>,
}

impl RunRow {
    /// A row of the store's runs list.
    pub(crate) fn from_summary(run: RunSummary) -> Self {
        Self {
            duration_ms: (run.updated_at - run.created_at).num_milliseconds(),
            thread_id: run.thread_id,
            agent: run.agent.unwrap_or_default(),
            model: run.model.unwrap_or_default(),
            goal: run
                .goal
                .map(|goal| goal.chars().take(120).collect())
                .unwrap_or_default(),
            started: run.created_at,
            status: run.status,
            runs: run.runs,
            turns: run.turns,
            tool_calls: run.tool_calls,
            tool_errors: run.tool_errors,
            tokens: run.tokens,
            cost_usd: run.cost_usd,
        }
    }

    /// Folds `events` (the thread's whole log) under `summary`.
    pub(crate) fn new(summary: &ThreadSummary, events: &[Event]) -> Self {
        let mut summary = summary.clone();
        if let Some(from_log) = ThreadSummary::from_events(&summary.thread_id, events) {
            summary = ThreadSummary {
                // The agent of the latest run, as the store lists it.
                agent: from_log.agent.or(summary.agent),
                ..from_log
            };
        }
        Self::from_summary(RunStats::from_events(events).into_summary(summary))
    }

    /// `running`, `awaiting_approval`, … or the end state.
    pub(crate) fn status_name(&self) -> String {
        keel_app::threads::status_name(self.status)
    }

    /// Whether the row can still change (the page refreshes it).
    pub(crate) fn is_live(&self) -> bool {
        !matches!(self.status, ThreadStatus::Ended(_))
    }
}

/// `1.2 s`, `340 ms`, `2 m 05 s`, `1 h 02 m`.
pub(crate) fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} m {:02} s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{} h {:02} m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

/// `$0.0123`, or `—` when unknown.
pub(crate) fn cost(value: Option<f64>) -> String {
    match value {
        Some(v) => format!("${v:.4}"),
        None => "—".into(),
    }
}

/// `2026-01-02 03:04:05`.
pub(crate) fn time(ts: DateTime<Utc>) -> String {
    ts.format("%Y-%m-%d %H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(-5), "0 ms");
        assert_eq!(duration(340), "340 ms");
        assert_eq!(duration(1234), "1.2 s");
        assert_eq!(duration(125_000), "2 m 05 s");
        assert_eq!(duration(3_720_000), "1 h 02 m");
        assert_eq!(cost(None), "—");
        assert_eq!(cost(Some(0.5)), "$0.5000");
    }
}
