//! The run page: a thread's facts (agent, model, trace ids, tokens, cost), the eval run it
//! was a trial of, the approval box of a paused call, the question the agent asked with a
//! reply form, and the waterfall of its spans (model calls marked at their first token).
//! The live region is re-rendered by [`crate::live`] as the log grows.

use std::collections::HashSet;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use keel_core::store::{ThreadStatus, ThreadSummary};
use keel_core::{EndState, Event, EventKind};
use maud::{Markup, html};

use crate::Ui;
use crate::error::UiError;
use crate::layout::{Nav, page as layout};
use crate::row::{RunRow, cost, duration, time};
use crate::timeline::{self, Kind, SpanView, Timeline};

/// `GET /runs/{thread}`.
pub(crate) async fn page(
    State(ui): State<Ui>,
    Path(url_id): Path<String>,
    session: Option<axum::Extension<crate::CsrfToken>>,
) -> Result<Response, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    let thread_id = ui.store_id(&url_id);
    let events = ui.source.load(&thread_id).await?;
    let shown = ui.shown_id(&thread_id);
    let evals = eval_links(&ui, &thread_id).await;
    let body = html! {
        p class="muted" { a href=(ui.href("/runs")) { "← Runs" } }
        h1 { "Run " span class="mono" id="thread-id" { (shown) } }
        (evals)
        (live_region(&ui, &thread_id, &events, Utc::now()))
    };
    let title = format!("Run {shown}");
    Ok(Html(layout(&ui, &title, Nav::Runs, body).into_string()).into_response())
}

/// "Trial 2 of scenario X in eval run 7", when the thread was an eval trial (nothing when
/// the UI shows no eval results or the lookup fails: it is a convenience).
async fn eval_links(ui: &Ui, thread_id: &str) -> Markup {
    let Some(results) = &ui.evals else {
        return html! {};
    };
    let Ok(runs) = results.runs_for_thread(thread_id).await else {
        return html! {};
    };
    html! {
        @for run in runs.iter().filter(|r| {
            *ui.source.scope() == crate::Scope::All
                || (!r.threads.is_empty() && r.threads.iter().all(|t| ui.source.scope().allows(&t.thread_id)))
        }) {
            @for link in run.threads.iter().filter(|t| t.thread_id == thread_id) {
                p class="eval-link" {
                    "Trial " (link.trial) " of scenario " code { (link.scenario) } " in "
                    a href=(ui.href(&format!("/evals/{}", run.id))) { "eval run #" (run.id) " (" (run.suite) ")" }
                }
            }
        }
    }
}

/// Whether the thread's last run has ended.
pub(crate) fn ended(events: &[Event]) -> bool {
    matches!(thread_status(events), ThreadStatus::Ended(_))
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
        (!ended).then(|| ui.run_href(thread_id, &format!("/live?after={}", events.len())));
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
        (question_box(ui, thread_id, events))
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
        .map(|e| e.trace_id.as_ref())
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
        .map(|e| e.run_id.as_ref());
    let mut pending: Vec<(String, String, String)> = Vec::new();
    for event in events.iter().filter(|e| Some(e.run_id.as_ref()) == latest) {
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
                    form method="post" action=(ui.run_href(thread_id, "/approve")) {
                        input type="hidden" name="csrf" value=(ui.csrf);
                        input type="hidden" name="call_id" value=(call_id);
                        button type="submit" class="primary approve" { "Approve" }
                    }
                    form method="post" action=(ui.run_href(thread_id, "/deny")) {
                        input type="hidden" name="csrf" value=(ui.csrf);
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

/// A question of the agent's latest run that no answer followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Question {
    pub question: String,
    pub missing_fields: Vec<String>,
    /// The run still waits (an answer continues it); otherwise it ended
    /// `clarify_needed` and an answer starts the thread's next run.
    pub in_run: bool,
}

/// The question the latest run asked (`ask_user`, or the policy asking the user) and no
/// answer followed: the run is still waiting, or it ended `clarify_needed` with it.
pub(crate) fn pending_question(events: &[Event]) -> Option<Question> {
    let latest = events
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .map(|e| e.run_id.as_ref());
    let mut question: Option<Question> = None;
    for event in events.iter().filter(|e| Some(e.run_id.as_ref()) == latest) {
        match &event.kind {
            EventKind::UserAsked {
                question: text,
                missing_fields,
            } => {
                question = Some(Question {
                    question: text.clone(),
                    missing_fields: missing_fields.clone(),
                    in_run: true,
                });
            }
            EventKind::ToolCallFinished { result }
                if result.name == keel_core::planner::ASK_USER && result.outcome.is_ok() =>
            {
                question = None;
            }
            EventKind::UserAnswered { .. } => question = None,
            EventKind::RunEnded { end_state, .. } => {
                if *end_state == EndState::ClarifyNeeded {
                    if let Some(q) = question.as_mut() {
                        q.in_run = false;
                    }
                } else {
                    question = None;
                }
            }
            _ => {}
        }
    }
    question
}

fn question_box(ui: &Ui, thread_id: &str, events: &[Event]) -> Markup {
    let Some(question) = pending_question(events) else {
        return html! {};
    };
    let shown = ui.shown_id(thread_id);
    html! {
        div class="question" id="question" data-in-run=(question.in_run) {
            p { strong { "The agent asks:" } }
            blockquote id="question-text" { (question.question) }
            @if !question.missing_fields.is_empty() {
                p class="muted" { "It needs: " (question.missing_fields.join(", ")) }
            }
            @if ui.resumer.is_some() {
                form method="post" action=(ui.run_href(thread_id, "/reply")) id="reply-form" {
                    input type="hidden" name="csrf" value=(ui.csrf);
                    textarea name="answer" id="reply-answer" rows="3" required placeholder="your answer (sent to the agent as the user's reply)" {}
                    br;
                    button type="submit" class="primary reply" id="reply-send" { "Send answer" }
                }
                p class="muted" {
                    @if question.in_run { "The run waits for this answer and continues with it." }
                    @else { "The run ended " code { "clarify_needed" } "; the answer starts the thread's next run with the same agent (as " code { "keel reply" } ")." }
                }
            } @else {
                p class="muted" { "Answer with " code { "keel reply " (shown) " ANSWER" } }
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
    let detail = ui.run_href(thread_id, &format!("/spans/{}", span.id));
    let meta = span_meta(span);
    let mut bar_class = String::from("bar");
    if span.open {
        bar_class.push_str(" open");
    }
    if span.error.is_some() {
        bar_class.push_str(" error");
    }
    let first_token = span
        .attr_i64(timeline::FIRST_TOKEN_ATTR)
        .filter(|_| span.kind == Kind::Chat);
    html! {
        details class={ "span k-" (span.kind.as_str()) } id={ "span-" (span.id) }
            data-span-id=(span.id) data-kind=(span.kind.as_str()) data-detail=(detail)
            data-open-span=(span.open) data-ttft-ms=[first_token] {
            summary {
                div class="label" style=(format!("padding-left:{}px", 8 + span.depth * 16)) title=(span.name) {
                    (span.name)
                    span class="meta" { (meta) }
                }
                div class="track" {
                    span class=(bar_class) style=(format!("left:{left:.3}%;width:{width:.3}%")) title=(duration(span.duration_ms())) {}
                    @if let Some(ms) = first_token {
                        span class="ttft" style=(format!("left:{:.3}%", timeline.offset_of(span, ms))) title=(format!("first token after {}", duration(ms))) {}
                    }
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
            let first = span
                .attr_i64(timeline::FIRST_TOKEN_ATTR)
                .map(|ms| format!(" · ttft {}", duration(ms)))
                .unwrap_or_default();
            format!("{turn}{took}{first}{tokens}")
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
