//! [`RunRow`]: one line of the runs page, folded from a thread's (redacted) log — the
//! thread's runs taken together (a thread continued by `keel resume`, `reply` or a handoff
//! holds several): agent and model of the latest run, start, duration, status, model
//! calls, tool calls, tokens and cost.

use chrono::{DateTime, Utc};
use keel_core::store::{ThreadStatus, ThreadSummary};
use keel_core::{Event, EventKind};

/// One thread on the runs page.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunRow {
    pub thread_id: String,
    pub agent: String,
    /// Model of the latest run.
    pub model: String,
    /// Every model the thread's runs used (for the model filter).
    pub models: Vec<String>,
    pub goal: String,
    pub started: DateTime<Utc>,
    pub updated: DateTime<Utc>,
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
    pub trace_id: String,
}

impl RunRow {
    /// Folds `events` (the thread's whole log) under `summary`.
    pub(crate) fn new(summary: &ThreadSummary, events: &[Event]) -> Self {
        let mut row = Self {
            thread_id: summary.thread_id.clone(),
            agent: summary.agent.clone().unwrap_or_default(),
            model: String::new(),
            models: Vec::new(),
            goal: String::new(),
            started: summary.created_at,
            updated: summary.updated_at,
            duration_ms: (summary.updated_at - summary.created_at).num_milliseconds(),
            status: summary.status,
            runs: 0,
            turns: 0,
            tool_calls: 0,
            tool_errors: 0,
            tokens: 0,
            cost_usd: None,
            trace_id: String::new(),
        };
        if let (Some(first), Some(last)) = (events.first(), events.last()) {
            row.started = first.ts;
            row.updated = last.ts;
            row.duration_ms = (last.ts - first.ts).num_milliseconds();
        }
        let mut status = ThreadStatus::Running;
        for event in events {
            status = ThreadStatus::after(status, &event.kind);
            match &event.kind {
                EventKind::RunStarted {
                    agent, model, goal, ..
                } => {
                    row.runs = row.runs.saturating_add(1);
                    row.agent.clone_from(agent);
                    row.model.clone_from(model);
                    if !row.models.contains(model) {
                        row.models.push(model.clone());
                    }
                    if row.goal.is_empty() {
                        row.goal = goal.chars().take(120).collect();
                    }
                    row.trace_id.clone_from(&event.trace_id);
                }
                EventKind::ModelRequested { .. } => row.turns = row.turns.saturating_add(1),
                EventKind::ModelResponded {
                    usage, cost_usd, ..
                } => {
                    row.tokens = row
                        .tokens
                        .saturating_add(usage.input_tokens)
                        .saturating_add(usage.output_tokens);
                    if let Some(cost) = cost_usd {
                        row.cost_usd = Some(row.cost_usd.unwrap_or(0.0) + cost);
                    }
                }
                EventKind::ToolCallFinished { result } => {
                    row.tool_calls = row.tool_calls.saturating_add(1);
                    if !result.outcome.is_ok() {
                        row.tool_errors = row.tool_errors.saturating_add(1);
                    }
                }
                _ => {}
            }
        }
        if !events.is_empty() {
            row.status = status;
        }
        row
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
