//! Text renderings of trace files for the CLI: the timeline of `keel trace show ID`
//! (durations, tokens, cost, tool outcomes, retries, end state) and the table of
//! `keel trace list`. Pure functions from records to strings.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use chrono::{DateTime, Utc};
use keel_core::{Event, EventKind, ToolResultKind};
use serde::Serialize;

use crate::error::TelemetryError;
use crate::spans::{AttrValue, Completed, SpanOptions, SpanRecord, SpanStatus};
use crate::tracefile::{TraceRecord, list_trace_files, read_trace_file};

/// One row of `keel trace list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSummary {
    /// Trace id.
    pub trace_id: String,
    /// Run id (the first run in the file).
    pub run_id: String,
    /// Agent name.
    pub agent: String,
    /// Model id.
    pub model: String,
    /// First event time.
    pub started: Option<DateTime<Utc>>,
    /// First to last event, ms.
    pub duration_ms: i64,
    /// End state, or `running` / `incomplete`.
    pub end_state: String,
    /// Model calls answered.
    pub model_calls: u64,
    /// Tool calls finished.
    pub tool_calls: u64,
    /// Tool calls that failed.
    pub tool_errors: u64,
    /// Retry events.
    pub retries: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Known cost, US dollars.
    pub cost_usd: f64,
}

fn events(records: &[TraceRecord]) -> impl Iterator<Item = &Event> {
    records.iter().filter_map(|r| match r {
        TraceRecord::Event { event } => Some(event),
        _ => None,
    })
}

/// Summarizes the records of one trace file; `None` when it has no events.
pub fn summarize_trace(records: &[TraceRecord]) -> Option<TraceSummary> {
    let first = events(records).next()?;
    let mut s = TraceSummary {
        trace_id: first.trace_id.to_string(),
        run_id: first.run_id.to_string(),
        agent: String::new(),
        model: String::new(),
        started: Some(first.ts),
        duration_ms: 0,
        end_state: "running".into(),
        model_calls: 0,
        tool_calls: 0,
        tool_errors: 0,
        retries: 0,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: 0.0,
    };
    let mut last = first.ts;
    for e in events(records) {
        last = last.max(e.ts);
        match &e.kind {
            // The trace's first run is its root (runs it started nest under it).
            EventKind::RunStarted { agent, model, .. } if s.agent.is_empty() => {
                s.agent = agent.clone();
                s.model = model.clone();
            }
            EventKind::ModelResponded {
                usage, cost_usd, ..
            } => {
                s.model_calls += 1;
                s.input_tokens += usage.input_tokens;
                s.output_tokens += usage.output_tokens;
                s.cost_usd += cost_usd.unwrap_or(0.0);
            }
            EventKind::ToolCallFinished { result } => {
                s.tool_calls += 1;
                if result.is_error() {
                    s.tool_errors += 1;
                }
            }
            EventKind::Retry { .. } => s.retries += 1,
            EventKind::RunEnded { end_state, .. } => s.end_state = end_state.as_str().into(),
            _ => {}
        }
    }
    s.duration_ms = (last - first.ts).num_milliseconds();
    Some(s)
}

/// Summaries of every trace file in `dir`, newest first. Unreadable files are skipped.
pub fn list_traces(dir: &Path) -> Result<Vec<TraceSummary>, TelemetryError> {
    let mut out: Vec<TraceSummary> = list_trace_files(dir)?
        .iter()
        .filter_map(|p| read_trace_file(p).ok())
        .filter_map(|records| summarize_trace(&records))
        .collect();
    out.sort_by(|a, b| {
        b.started
            .cmp(&a.started)
            .then_with(|| a.trace_id.cmp(&b.trace_id))
    });
    Ok(out)
}

fn secs(ms: i64) -> String {
    format!("{:.3}s", ms as f64 / 1000.0)
}

/// The table of `keel trace list`.
pub fn render_trace_list(traces: &[TraceSummary]) -> String {
    if traces.is_empty() {
        return "no traces\n".into();
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<32}  {:<20}  {:<16}  {:<27}  {:>9}  {:>5}  {:>10}  {:>9}",
        "TRACE", "STARTED", "AGENT", "END STATE", "DURATION", "TOOLS", "TOKENS", "COST"
    );
    for t in traces {
        let started = t
            .started
            .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default();
        let tools = if t.tool_errors > 0 {
            format!("{}!{}", t.tool_calls, t.tool_errors)
        } else {
            t.tool_calls.to_string()
        };
        let _ = writeln!(
            o,
            "{:<32}  {:<20}  {:<16}  {:<27}  {:>9}  {:>5}  {:>10}  {:>9}",
            t.trace_id,
            started,
            t.agent,
            t.end_state,
            secs(t.duration_ms),
            tools,
            t.input_tokens + t.output_tokens,
            format!("${:.4}", t.cost_usd)
        );
    }
    o
}

fn short(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut s: String = one_line.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// The timeline of `keel trace show ID`.
pub fn render_timeline(records: &[TraceRecord]) -> String {
    let Some(summary) = summarize_trace(records) else {
        return "empty trace: no events\n".into();
    };
    let mut o = String::new();
    let _ = writeln!(o, "trace {}", summary.trace_id);
    let _ = writeln!(
        o,
        "run {}  agent {}  model {}",
        summary.run_id, summary.agent, summary.model
    );
    let _ = writeln!(
        o,
        "started {}  duration {}  end state {}",
        summary
            .started
            .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_default(),
        secs(summary.duration_ms),
        summary.end_state
    );
    let _ = writeln!(
        o,
        "model calls {}  tokens in {} out {}  cost ${:.4}  tool calls {} ({} failed)  retries {}",
        summary.model_calls,
        summary.input_tokens,
        summary.output_tokens,
        summary.cost_usd,
        summary.tool_calls,
        summary.tool_errors,
        summary.retries
    );
    let _ = writeln!(o);
    let origin = summary.started.unwrap_or_else(Utc::now);
    let mut requested_at: std::collections::HashMap<u32, (DateTime<Utc>, String)> =
        Default::default();
    let mut tool_started: std::collections::HashMap<String, DateTime<Utc>> = Default::default();
    for e in events(records) {
        let at = |ts: DateTime<Utc>| {
            format!(
                "{:>+9.3}s",
                (ts - origin).num_milliseconds() as f64 / 1000.0
            )
        };
        let line = match &e.kind {
            EventKind::RunStarted { agent, goal, .. } => {
                format!("{}  run started  {agent}: {}", at(e.ts), short(goal, 72))
            }
            EventKind::UserMessage { message } => {
                format!("{}  user  {}", at(e.ts), short(&message.text(), 72))
            }
            EventKind::ModelRequested { turn, model, .. } => {
                requested_at.insert(*turn, (e.ts, model.clone()));
                continue;
            }
            EventKind::ModelResponded {
                turn,
                usage,
                latency_ms,
                stop_reason,
                cost_usd,
                message,
                ..
            } => {
                let (start, model) = requested_at
                    .remove(turn)
                    .unwrap_or((e.ts, summary.model.clone()));
                let calls: Vec<String> = message.tool_calls().map(|c| c.name.clone()).collect();
                let what = if calls.is_empty() {
                    format!("text: {}", short(&message.text(), 48))
                } else {
                    format!("calls {}", calls.join(", "))
                };
                format!(
                    "{}  chat #{turn} {model}  {}  in {} out {}  finish {}{}  {what}",
                    at(start),
                    secs(i64::try_from(*latency_ms).unwrap_or(0)),
                    usage.input_tokens,
                    usage.output_tokens,
                    crate::spans::finish_reason(*stop_reason),
                    cost_usd.map(|c| format!("  ${c:.4}")).unwrap_or_default()
                )
            }
            EventKind::ModelFailed { turn, error } => {
                let kind = serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                format!(
                    "{}  chat #{turn} FAILED {kind}: {}",
                    at(e.ts),
                    short(&error.message, 60)
                )
            }
            EventKind::ToolCallStarted { call_id, .. } => {
                tool_started.insert(call_id.clone(), e.ts);
                continue;
            }
            EventKind::ToolCallFinished { result } => {
                let o = &result.outcome;
                let start = tool_started.remove(&result.call_id).unwrap_or(e.ts);
                let outcome = match &o.result {
                    ToolResultKind::Ok { .. } => "ok".to_string(),
                    ToolResultKind::Error { code, message, .. } => {
                        format!("ERROR {code}: {}", short(message, 48))
                    }
                };
                format!(
                    "{}  tool {} [{}]  {}  attempts {}  {outcome}",
                    at(start),
                    result.name,
                    result.call_id,
                    secs(i64::try_from(o.latency_ms).unwrap_or(0)),
                    o.attempts
                )
            }
            EventKind::Retry {
                scope,
                attempt,
                class,
                wait_ms,
                call_id,
            } => format!(
                "{}  retry {scope}{} after attempt {attempt} ({class}), wait {wait_ms} ms",
                at(e.ts),
                call_id
                    .as_ref()
                    .map(|c| format!(" [{c}]"))
                    .unwrap_or_default()
            ),
            EventKind::ApprovalRequested { call_id, name, .. } => {
                format!("{}  approval requested {name} [{call_id}]", at(e.ts))
            }
            EventKind::ApprovalGranted { call_id, .. } => {
                format!("{}  approval granted [{call_id}]", at(e.ts))
            }
            EventKind::ApprovalDenied { call_id, .. } => {
                format!("{}  approval denied [{call_id}]", at(e.ts))
            }
            EventKind::UserAsked { question, .. } => {
                format!("{}  asked user: {}", at(e.ts), short(question, 72))
            }
            EventKind::UserAnswered { answer } => {
                format!("{}  user answered: {}", at(e.ts), short(answer, 72))
            }
            EventKind::Replanned { subgoals } => {
                format!("{}  replanned: {} subgoals", at(e.ts), subgoals.len())
            }
            EventKind::Compacted {
                strategy, replaced, ..
            } => format!(
                "{}  compacted ({strategy}): {replaced} messages replaced",
                at(e.ts)
            ),
            EventKind::Critique {
                satisfied,
                next,
                known_gaps,
                ..
            } => format!(
                "{}  critique: {}  next {}  gaps {}",
                at(e.ts),
                if *satisfied {
                    "satisfied"
                } else {
                    "not satisfied"
                },
                serde_json::to_value(next)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                known_gaps.len()
            ),
            EventKind::Notice { code, message, .. } => {
                format!("{}  notice {code}: {}", at(e.ts), short(message, 60))
            }
            EventKind::Handoff {
                from, to, reason, ..
            } => format!(
                "{}  handoff {from} -> {to}{}",
                at(e.ts),
                reason
                    .as_ref()
                    .map(|r| format!(": {}", short(r, 60)))
                    .unwrap_or_default()
            ),
            EventKind::RunEnded {
                end_state, reason, ..
            } => format!(
                "{}  run ended: {end_state}{}",
                at(e.ts),
                reason
                    .as_ref()
                    .map(|r| format!(" ({})", short(r, 60)))
                    .unwrap_or_default()
            ),
            EventKind::ToolCallRequested { .. } => continue,
            other => format!("{}  {}", at(e.ts), other.name()),
        };
        let _ = writeln!(o, "{line}");
    }
    render_span_tree(records, &mut o);
    o
}

/// The spans of the trace as a tree (children indented under their parent, in start
/// order): a run started by another — an agent called as a tool, a handoff's target —
/// shows inside the span of the call that started it. Span records of the file are used;
/// a file without any (telemetry off) gets the spans folded from its events.
fn render_span_tree(records: &[TraceRecord], o: &mut String) {
    let mut spans: Vec<SpanRecord> = records
        .iter()
        .filter_map(|r| match r {
            TraceRecord::Span { span } => Some(span.clone()),
            _ => None,
        })
        .collect();
    if spans.is_empty() {
        spans = crate::assembler::spans_for_events(events(records), SpanOptions::default())
            .into_iter()
            .filter_map(|c| match c {
                Completed::Span(span) => Some(span),
                Completed::Turn(_) => None,
            })
            .collect();
    }
    if spans.is_empty() {
        return;
    }
    spans.sort_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then_with(|| a.span_id.cmp(&b.span_id))
    });
    let ids: HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: HashMap<&str, Vec<&SpanRecord>> = HashMap::new();
    let mut roots = Vec::new();
    for span in &spans {
        match span.parent_span_id.as_deref().filter(|p| ids.contains(p)) {
            Some(parent) => children.entry(parent).or_default().push(span),
            None => roots.push(span),
        }
    }
    let _ = writeln!(o, "\nspans");
    let mut stack: Vec<(&SpanRecord, usize)> = roots.into_iter().rev().map(|s| (s, 1)).collect();
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some((span, depth)) = stack.pop() {
        if !seen.insert(span.span_id.as_str()) {
            continue;
        }
        let status = match &span.status {
            SpanStatus::Ok => "ok".to_string(),
            SpanStatus::Unset => String::new(),
            SpanStatus::Error { message } => format!("ERROR {}", short(message, 48)),
        };
        let end_state = span
            .attr("keel.end_state")
            .and_then(AttrValue::as_str)
            .map(|s| format!("  {s}"))
            .unwrap_or_default();
        let line = format!(
            "{:indent$}{}  {}  {status}{end_state}",
            "",
            span.name,
            secs(span.duration_ms()),
            indent = depth * 2
        );
        let _ = writeln!(o, "{}", line.trim_end());
        if let Some(kids) = children.get(span.span_id.as_str()) {
            stack.extend(kids.iter().rev().map(|k| (*k, depth.saturating_add(1))));
        }
    }
}
