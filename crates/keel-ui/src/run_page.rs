//! The run page: a thread's facts (agent, model, trace ids, tokens, cost), the approval
//! box of a paused call, and the waterfall of its spans. The live region is re-rendered
//! by [`crate::live`] as the log grows.

use std::collections::HashSet;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_core::store::{ThreadStatus, ThreadSummary};
use keel_core::{Event, EventKind};
use maud::{Markup, html};

use crate::Ui;
use crate::error::UiError;
use crate::layout::{Nav, page as layout};
use crate::row::{RunRow, cost, duration, time};
use crate::timeline::{self, Kind, SpanView, Timeline};

/// `GET /runs/{thread}`.
pub(crate) async fn page(
    State(ui): State<Ui>,
    Path(thread_id): Path<String>,
) -> Result<Response, UiError> {
    let events = ui.source.load(&thread_id).await?;
    let body = html! {
        p class="muted" { a href=(ui.href("/runs")) { "← Runs" } }
        h1 { "Run " span class="mono" id="thread-id" { (thread_id) } }
        (live_region(&ui, &thread_id, &events, Utc::now()))
    };
    let title = format!("Run {thread_id}");
    Ok(Html(layout(&ui, &title, Nav::Runs, body).into_string()).into_response())
}

/// The part of the run page that changes while the run goes on: the `#live` element
/// (its contents are what the live stream sends).
pub(crate) fn live_region(
    ui: &Ui,
    thread_id: &str,
    events: &[Event],
    now: DateTime<Utc>,
) -> Markup {
    let ended = matches!(thread_status(events), ThreadStatus::Ended(_));
    let live_url =
        (!ended).then(|| ui.href(&format!("/runs/{thread_id}/live?after={}", events.len())));
    html! {
        div id="live" data-live-url=[live_url] data-events=(events.len()) {
            (live_contents(ui, thread_id, events, now))
        }
    }
}

/// The contents of `#live`.
pub(crate) fn live_contents(
    ui: &Ui,
    thread_id: &str,
    events: &[Event],
    now: DateTime<Utc>,
) -> Markup {
    let Some(summary) = ThreadSummary::from_events(thread_id, events) else {
        return html! { p class="empty" { "This run has no events." } };
    };
    let row = RunRow::new(&summary, events);
    let status = row.status_name();
    let timeline = timeline::build(events, now);
    let note = ui.note_for(thread_id);
    // A running thread's duration so far reaches the end of its open spans.
    let took = if row.status == ThreadStatus::Running {
        (timeline.t1 - timeline.t0).num_milliseconds()
    } else {
        row.duration_ms
    };
    html! {
        dl class="facts" id="facts" data-status=(status) {
            div { dt { "State" } dd { span class={ "badge " (status) } id="run-state" { (status) } } }
            div { dt { "Agent" } dd { (row.agent) } }
            div { dt { "Model" } dd class="mono" { (row.model) } }
            div { dt { "Started" } dd class="mono" { (time(row.started)) } }
            div { dt { "Duration" } dd { (duration(took)) } }
            div { dt { "Runs" } dd { (row.runs) } }
            div { dt { "Model calls" } dd { (row.turns) } }
            div { dt { "Tool calls" } dd { (row.tool_calls) @if row.tool_errors > 0 { " (" (row.tool_errors) " failed)" } } }
            div { dt { "Tokens" } dd { (row.tokens) } }
            div { dt { "Cost" } dd { (cost(row.cost_usd)) } }
            div { dt { "Events" } dd { (events.len()) } }
            div { dt { "OTLP trace id" } dd class="mono" { (trace_ids(ui, events)) } }
        }
        @if let Some(note) = note {
            p class="notice" id="run-note" { (note) }
        }
        (approval_box(ui, thread_id, events))
        (waterfall(ui, thread_id, &timeline))
    }
}

fn thread_status(events: &[Event]) -> ThreadStatus {
    events.iter().fold(ThreadStatus::Running, |status, e| {
        ThreadStatus::after(status, &e.kind)
    })
}

fn trace_ids(ui: &Ui, events: &[Event]) -> Markup {
    let mut seen = HashSet::new();
    let ids: Vec<&str> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .map(|e| e.trace_id.as_str())
        .filter(|id| seen.insert(*id))
        .collect();
    html! {
        @for id in ids {
            span class="trace-id" data-trace-id=(id) {
                (id)
                @if trace_file(ui, id).is_some() {
                    " " a href=(ui.href(&format!("/traces/{id}"))) { "trace file" }
                }
            }
            br;
        }
    }
}

/// The trace file of `trace_id`, when trace files are served and it exists. Only for an
/// unscoped UI: trace files are not split by tenant.
fn trace_file(ui: &Ui, trace_id: &str) -> Option<std::path::PathBuf> {
    if *ui.source.scope() != crate::Scope::All
        || trace_id.len() != 32
        || !trace_id.chars().all(|c| c.is_ascii_hexdigit())
    {
        return None;
    }
    let path = keel_telemetry::trace_file_path(ui.trace_dir.as_deref()?, trace_id);
    path.is_file().then_some(path)
}

/// `GET /traces/{trace_id}`: the trace file, redacted again (the rules of this process
/// may be stricter than those of the process that wrote it).
pub(crate) async fn trace_file_text(
    State(ui): State<Ui>,
    Path(trace_id): Path<String>,
) -> Result<Response, UiError> {
    let path = trace_file(&ui, &trace_id)
        .ok_or_else(|| UiError::not_found(format!("there is no trace file for {trace_id}")))?;
    let text = tokio::fs::read_to_string(&path)
        .await
        .map_err(|e| UiError::not_found(format!("cannot read the trace file: {e}")))?;
    let redacted = ui.source.redact(&text);
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        redacted,
    )
        .into_response())
}

/// Calls of the latest run waiting for a decision.
pub(crate) fn pending_approvals(events: &[Event]) -> Vec<(String, String, String)> {
    let latest = events
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .map(|e| e.run_id.as_str());
    let mut pending: Vec<(String, String, String)> = Vec::new();
    for event in events.iter().filter(|e| Some(e.run_id.as_str()) == latest) {
        match &event.kind {
            EventKind::ApprovalRequested {
                call_id,
                name,
                arguments,
            } => pending.push((call_id.clone(), name.clone(), arguments.clone())),
            EventKind::ApprovalGranted { call_id, .. }
            | EventKind::ApprovalDenied { call_id, .. } => pending.retain(|p| &p.0 != call_id),
            EventKind::RunEnded { .. } => pending.clear(),
            _ => {}
        }
    }
    pending
}

fn approval_box(ui: &Ui, thread_id: &str, events: &[Event]) -> Markup {
    if thread_status(events) != ThreadStatus::AwaitingApproval {
        return html! {};
    }
    let pending = pending_approvals(events);
    html! {
        @for (call_id, name, arguments) in &pending {
            div class="approval" id=(format!("approval-{}", timeline::sanitize(call_id))) data-call-id=(call_id) {
                p { strong { (name) } " waits for approval " span class="mono muted" { "(" (call_id) ")" } }
                (crate::detail::json_block(arguments))
                @if ui.resumer.is_some() {
                    form method="post" action=(ui.href(&format!("/runs/{thread_id}/approve"))) {
                        input type="hidden" name="call_id" value=(call_id);
                        button type="submit" class="primary approve" { "Approve" }
                    }
                    form method="post" action=(ui.href(&format!("/runs/{thread_id}/deny"))) {
                        input type="hidden" name="call_id" value=(call_id);
                        input type="text" name="reason" placeholder="reason (shown to the model)";
                        " "
                        button type="submit" class="danger deny" { "Deny" }
                    }
                } @else {
                    p class="muted" {
                        "Decide with " code { "keel approve " (thread_id) " " (call_id) }
                        " or " code { "keel deny " (thread_id) " " (call_id) }
                    }
                }
            }
        }
    }
}

fn waterfall(ui: &Ui, thread_id: &str, timeline: &Timeline) -> Markup {
    let total = timeline.total_us() as f64 / 1000.0;
    let ticks: Vec<(f64, String)> = (0..=4)
        .map(|i| (f64::from(i) * 25.0, tick(total * f64::from(i) / 4.0)))
        .collect();
    html! {
        h2 { "Timeline" }
        div class="waterfall" id="waterfall" data-spans=(timeline.spans.len()) {
            div class="axis" {
                div class="label" { "span" }
                div class="ticks" {
                    @for (left, label) in &ticks {
                        span style=(format!("left:{left:.1}%")) { (label) }
                    }
                }
            }
            @for span in &timeline.spans {
                (span_row(ui, thread_id, timeline, span))
            }
        }
    }
}

/// An axis label: fractions of a millisecond for very short runs.
fn tick(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        duration(ms.round() as i64)
    }
}

fn span_row(ui: &Ui, thread_id: &str, timeline: &Timeline, span: &SpanView) -> Markup {
    let (left, width) = timeline.position(span);
    let detail = ui.href(&format!("/runs/{thread_id}/spans/{}", span.id));
    let meta = span_meta(span);
    let mut bar_class = String::from("bar");
    if span.open {
        bar_class.push_str(" open");
    }
    if span.error.is_some() {
        bar_class.push_str(" error");
    }
    html! {
        details class={ "span k-" (span.kind.as_str()) } id={ "span-" (span.id) }
            data-span-id=(span.id) data-kind=(span.kind.as_str()) data-detail=(detail)
            data-open-span=(span.open) {
            summary {
                div class="label" style=(format!("padding-left:{}px", 8 + span.depth * 16)) title=(span.name) {
                    (span.name)
                    span class="meta" { (meta) }
                }
                div class="track" {
                    span class=(bar_class) style=(format!("left:{left:.3}%;width:{width:.3}%")) title=(duration(span.duration_ms())) {}
                }
            }
            div class="detail" {}
        }
    }
}

/// The short facts next to a span's name.
fn span_meta(span: &SpanView) -> String {
    let took = if span.open {
        "running".to_string()
    } else {
        duration(span.duration_ms())
    };
    match span.kind {
        Kind::Agent if span.open => format!("in progress · {took}"),
        Kind::Agent => format!("{} · {took}", span.attr_str("keel.end_state").unwrap_or("")),
        Kind::Chat => {
            let tokens = match (
                span.attr_i64("gen_ai.usage.input_tokens"),
                span.attr_i64("gen_ai.usage.output_tokens"),
            ) {
                (Some(i), Some(o)) => format!(" · {i}→{o} tok"),
                _ => String::new(),
            };
            let turn = span
                .attr_i64("keel.turn")
                .map(|t| format!("turn {t} · "))
                .unwrap_or_default();
            format!("{turn}{took}{tokens}")
        }
        Kind::Tool => {
            let outcome = match (
                span.attr_str("keel.tool.error_code"),
                span.attr_str("keel.tool.outcome"),
            ) {
                (Some(code), _) => code.to_string(),
                (None, Some(o)) => o.to_string(),
                _ => String::new(),
            };
            if outcome.is_empty() {
                took
            } else {
                format!("{outcome} · {took}")
            }
        }
        Kind::Retry => format!(
            "{} · wait {}",
            span.attr_str("keel.retry.class").unwrap_or(""),
            duration(span.attr_i64("keel.retry.wait_ms").unwrap_or(0))
        ),
        Kind::Approval => span
            .attr_str("keel.approval")
            .map_or_else(|| "waiting".to_string(), |d| format!("{d} · {took}")),
        _ => took,
    }
}
