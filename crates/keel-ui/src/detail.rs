//! One span's details, fetched when it is opened: for a model call the messages sent and
//! the answer, tokens, cost, retries and a fork button; for a tool call its arguments,
//! result or error (validation details included), attempts, repairs, approval and the
//! policy's decision; for a run its goal, end and span events. Long texts are cut with a
//! "show all"; JSON is pretty-printed; everything was redacted when the log was loaded
//! and is escaped by maud.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;
use keel_core::outcome::ToolResultKind;
use keel_core::{Event, EventKind, Message, Part, RunState};
use maud::{Markup, html};

use crate::Ui;
use crate::error::UiError;
use crate::row::{cost, duration, time};
use crate::timeline::{self, Kind, SpanView, Timeline};

/// Longest text shown before "show all".
const CLIP_CHARS: usize = 2000;
/// Messages sent shown before "earlier messages".
const RECENT_MESSAGES: usize = 12;

/// `GET /runs/{thread}/spans/{span}`.
pub(crate) async fn fragment(
    State(ui): State<Ui>,
    Path((url_id, span_id)): Path<(String, String)>,
    session: Option<axum::Extension<crate::CsrfToken>>,
) -> Result<Response, UiError> {
    let ui = ui.for_request(session.as_ref().map(|s| &s.0));
    let thread_id = ui.store_id(&url_id);
    let events = ui.source.load(&thread_id).await?;
    let timeline = timeline::build(&events, Utc::now());
    let span = timeline
        .span(&span_id)
        .ok_or_else(|| UiError::not_found(format!("run {url_id} has no span {span_id}")))?;
    let body = render(&ui, &thread_id, &events, &timeline, span);
    Ok(Html(body.into_string()).into_response())
}

fn render(
    ui: &Ui,
    thread_id: &str,
    events: &[Event],
    timeline: &Timeline,
    span: &SpanView,
) -> Markup {
    let run_id = timeline.run_of(span);
    let run_events = || {
        events
            .iter()
            .filter(move |e| Some(e.run_id.as_ref()) == run_id.as_deref())
    };
    let specific = match span.kind {
        Kind::Chat => chat(ui, thread_id, events, span, run_events().collect()),
        Kind::Tool | Kind::Approval => tool(span, run_events().collect()),
        Kind::Agent => agent(span, run_events().collect()),
        _ => html! {},
    };
    html! {
        div class="span-detail" data-span-id=(span.id) {
            table class="facts-table" {
                tr { th { "span" } td class="mono" { (span.name) } }
                tr { th { "span id" } td class="mono" { (span.id) } }
                tr { th { "start" } td class="mono" { (time(span.start)) } }
                tr { th { "duration" } td { @if span.open { "running (so far " (duration(span.duration_ms())) ")" } @else { (duration(span.duration_ms())) } } }
                @if let Some(error) = &span.error { tr { th { "error" } td class="error-text" { (error) } } }
            }
            (specific)
            @if !span.attributes.is_empty() {
                details class="more attributes" {
                    summary { "attributes (" (span.attributes.len()) ")" }
                    table {
                        @for (key, value) in &span.attributes {
                            tr { th class="mono" { (key) } td class="mono" { (attr_text(value)) } }
                        }
                    }
                }
            }
        }
    }
}

fn attr_text(value: &keel_telemetry::AttrValue) -> String {
    serde_json::to_value(value)
        .map(|v| match v {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        })
        .unwrap_or_default()
}

/// Text, cut at [`CLIP_CHARS`] with the rest behind "show all".
pub(crate) fn clipped(text: &str) -> Markup {
    match text.char_indices().nth(CLIP_CHARS) {
        None => html! { pre { (text) } },
        Some((cut, _)) => html! {
            pre class="clipped" { (text.get(..cut).unwrap_or(text)) "…" }
            details class="more show-all" {
                summary { "show all (" (text.chars().count()) " characters)" }
                pre { (text) }
            }
        },
    }
}

/// JSON text pretty-printed (cut like [`clipped`]); text that is not JSON as it is.
pub(crate) fn json_block(text: &str) -> Markup {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => {
            clipped(&serde_json::to_string_pretty(&value).unwrap_or_else(|_| text.to_string()))
        }
        Err(_) => html! {
            @if !text.trim().is_empty() { p class="muted" { "(not valid JSON)" } }
            (clipped(text))
        },
    }
}

fn json_value(value: &serde_json::Value) -> Markup {
    clipped(&serde_json::to_string_pretty(value).unwrap_or_default())
}

fn role(message: &Message) -> &'static str {
    match message.role {
        keel_core::Role::System => "system",
        keel_core::Role::User => "user",
        keel_core::Role::Assistant => "assistant",
        keel_core::Role::Tool => "tool",
    }
}

pub(crate) fn message(message: &Message) -> Markup {
    let role = role(message);
    html! {
        div class={ "message role-" (role) } {
            div class="role" { (role) }
            @for part in &message.parts {
                @match part {
                    Part::Text { text } => { (clipped(text)) }
                    Part::ToolCall(call) => {
                        div class="tool-call" { "→ call " strong { (call.name) } " " span class="mono muted" { (call.id) } }
                        (json_block(&call.arguments))
                    }
                    Part::ToolResult(result) => {
                        div class="tool-result" { "← result of " strong { (result.name) } " " span class="mono muted" { (result.call_id) } }
                        (clipped(&result.content))
                    }
                    Part::Summary { text, replaced } => {
                        div class="muted" { "summary of " (replaced) " earlier messages" }
                        (clipped(text))
                    }
                    Part::ProviderItem { provider, item } => {
                        details class="more" { summary { "provider item (" (provider) ")" } (json_value(item)) }
                    }
                }
            }
        }
    }
}

fn chat(ui: &Ui, thread_id: &str, events: &[Event], span: &SpanView, run: Vec<&Event>) -> Markup {
    let turn = span
        .attr_i64("keel.turn")
        .and_then(|t| u32::try_from(t).ok());
    let requested = run
        .iter()
        .find(|e| matches!(&e.kind, EventKind::ModelRequested { turn: t, .. } if Some(*t) == turn));
    let answered = run.iter().find(|e| {
        matches!(&e.kind,
            EventKind::ModelResponded { turn: t, .. } | EventKind::ModelFailed { turn: t, .. } if Some(*t) == turn)
    });
    let sent: Vec<Message> = match requested {
        Some(req) => {
            let before = events.iter().take_while(|e| e.seq < req.seq);
            RunState::from_events(thread_id, before).messages().to_vec()
        }
        None => Vec::new(),
    };
    let earlier = sent.len().saturating_sub(RECENT_MESSAGES);
    let retries: Vec<&&Event> = run
        .iter()
        .filter(|e| match (requested, answered) {
            (Some(r), Some(a)) => e.seq > r.seq && e.seq < a.seq,
            (Some(r), None) => e.seq > r.seq,
            _ => false,
        })
        .filter(|e| matches!(&e.kind, EventKind::Retry { scope, .. } if scope == "model"))
        .collect();
    html! {
        @if let Some(Event { kind: EventKind::ModelRequested { model, message_count, tool_count, estimated_input_tokens, temperature, max_tokens, .. }, .. }) = requested.copied() {
            h4 { "Request" }
            table {
                tr { th { "model" } td class="mono" { (model) } }
                tr { th { "messages" } td { (message_count) } }
                tr { th { "tools offered" } td { (tool_count) } }
                tr { th { "estimated input tokens" } td { (estimated_input_tokens) } }
                @if let Some(t) = temperature { tr { th { "temperature" } td { (t) } } }
                @if let Some(m) = max_tokens { tr { th { "max tokens" } td { (m) } } }
            }
            details class="more messages-sent" {
                summary { "messages sent (" (sent.len()) ")" }
                @if earlier > 0 {
                    details class="more" {
                        summary { (earlier) " earlier messages" }
                        @for m in sent.iter().take(earlier) { (message(m)) }
                    }
                }
                @for m in sent.iter().skip(earlier) { (message(m)) }
            }
        }
        @for retry in &retries {
            @if let EventKind::Retry { attempt, class, wait_ms, .. } = &retry.kind {
                p class="notice retry" { "attempt " (attempt) " failed (" (class) "); waited " (duration(i64::try_from(*wait_ms).unwrap_or(i64::MAX))) }
            }
        }
        @match answered.map(|e| &e.kind) {
            Some(EventKind::ModelResponded { message: answer, usage, latency_ms, stop_reason, response_id, cost_usd, first_token_ms, .. }) => {
                h4 { "Response" }
                table {
                    tr class="ttft" {
                        th { "time to first token" }
                        @match first_token_ms {
                            Some(ms) => { td class="ttft-value" data-ms=(ms) { (duration(i64::try_from(*ms).unwrap_or(i64::MAX))) } }
                            None => { td class="muted" { "not recorded (a log written before Keel recorded it, or an agent that does not stream)" } }
                        }
                    }
                    tr { th { "tokens" } td { (usage.input_tokens) " in · " (usage.output_tokens) " out" @if usage.cache_read_tokens > 0 { " · " (usage.cache_read_tokens) " cache read" } } }
                    tr { th { "cost" } td { (cost(*cost_usd)) } }
                    tr { th { "latency" } td { (duration(i64::try_from(*latency_ms).unwrap_or(i64::MAX))) } }
                    tr { th { "stop reason" } td { (format!("{stop_reason:?}")) } }
                    @if let Some(id) = response_id { tr { th { "response id" } td class="mono" { (id) } } }
                }
                (message(answer))
            }
            Some(EventKind::ModelFailed { error, .. }) => {
                h4 { "Failed" }
                p class="notice error" { (format!("{:?}", error.kind)) @if let Some(s) = error.status { " (HTTP " (s) ")" } ": " (error.message) }
            }
            _ => { p class="muted" { "waiting for the model…" } }
        }
        @if let Some(req) = requested {
            @if req.seq > 0 {
                form method="post" class="fork" action=(ui.run_href(thread_id, "/fork")) {
                    input type="hidden" name="csrf" value=(ui.csrf);
                    input type="hidden" name="at_seq" value=(req.seq - 1);
                    button type="submit" class="fork-button" title="Copy the log up to just before this model call into a new thread (continue it with keel resume)" { "Fork before this call" }
                }
            }
        }
    }
}

fn tool(span: &SpanView, run: Vec<&Event>) -> Markup {
    let Some(call_id) = span.attr_str("gen_ai.tool.call.id") else {
        return html! {};
    };
    let mine = |e: &&&Event| match &e.kind {
        EventKind::ToolCallRequested { call, .. } => call.id == call_id,
        EventKind::ToolCallFinished { result } => result.call_id == call_id,
        EventKind::ApprovalRequested { call_id: c, .. }
        | EventKind::ApprovalGranted { call_id: c, .. }
        | EventKind::ApprovalDenied { call_id: c, .. }
        | EventKind::PolicyApplied { call_id: c, .. } => c == call_id,
        EventKind::Retry {
            call_id: Some(c), ..
        } => c == call_id,
        _ => false,
    };
    let related: Vec<&&Event> = run.iter().filter(mine).collect();
    html! {
        @for event in related {
            @match &event.kind {
                EventKind::ToolCallRequested { call, effect, requires_approval } => {
                    h4 { "Arguments" }
                    div class="tool-arguments" { (json_block(&call.arguments)) }
                    p class="muted" {
                        "effect: " (effect.map(|e| format!("{e:?}").to_lowercase()).unwrap_or_else(|| "unknown tool".into()))
                        @if *requires_approval { " · requires approval" }
                    }
                }
                EventKind::ApprovalRequested { .. } => { p { "Approval requested at " (time(event.ts)) } }
                EventKind::ApprovalGranted { by, .. } => { p class="approved" { "Approved" @if let Some(by) = by { " by " (by) } " at " (time(event.ts)) } }
                EventKind::ApprovalDenied { reason, .. } => { p class="denied" { "Denied" @if let Some(r) = reason { ": " (r) } " at " (time(event.ts)) } }
                EventKind::Retry { attempt, class, wait_ms, .. } => {
                    p class="notice retry" { "attempt " (attempt) " failed (" (class) "); waited " (duration(i64::try_from(*wait_ms).unwrap_or(i64::MAX))) }
                }
                EventKind::ToolCallFinished { result } => {
                    @let o = &result.outcome;
                    h4 { "Result" }
                    table {
                        tr { th { "outcome" } td { @if o.is_ok() { "ok" } @else { "error" } } }
                        tr { th { "attempts" } td { (o.attempts) } }
                        tr { th { "latency" } td { (duration(i64::try_from(o.latency_ms).unwrap_or(i64::MAX))) } }
                    }
                    @match &o.result {
                        ToolResultKind::Ok { data, schema_validated, truncated } => {
                            div class="tool-result-data" { (json_value(data)) }
                            p class="muted" {
                                @if *schema_validated { "validated against the output schema" } @else { "not validated (no output schema)" }
                                @if *truncated { " · truncated to the payload cap" }
                            }
                        }
                        ToolResultKind::Error { code, message, details } => {
                            p class="notice error tool-error" { strong { (code.as_str()) } ": " (message) }
                            @if let Some(details) = details {
                                h4 { "Error details (validation errors)" }
                                (json_value(details))
                            }
                        }
                    }
                    @if !o.repairs.is_empty() {
                        h4 { "Repairs" }
                        ul { @for r in &o.repairs { li { (r) } } }
                    }
                    details class="more" {
                        summary { "what the model saw" }
                        (clipped(&result.content))
                    }
                }
                EventKind::PolicyApplied { error_code, decision, .. } => {
                    h4 { "Policy" }
                    p class="policy" { "after " code { (error_code.as_str()) } ": " }
                    (json_value(&serde_json::to_value(decision).unwrap_or_default()))
                }
                _ => {}
            }
        }
    }
}

fn agent(span: &SpanView, run: Vec<&Event>) -> Markup {
    html! {
        @for event in &run {
            @match &event.kind {
                EventKind::RunStarted { goal, constraints, budget, .. } => {
                    h4 { "Goal" }
                    (clipped(goal))
                    @if !constraints.is_empty() { ul { @for c in constraints { li { (c) } } } }
                    details class="more" { summary { "budget" } (json_value(&serde_json::to_value(budget).unwrap_or_default())) }
                }
                EventKind::RunEnded { end_state, reason, final_text } => {
                    h4 { "Ended " (end_state.as_str()) }
                    @if let Some(r) = reason { p { (r) } }
                    @if let Some(t) = final_text { (clipped(t)) }
                }
                EventKind::Notice { code, message, .. } => {
                    p class="notice" { code { (code) } " " (message) }
                }
                EventKind::Critique { satisfied, known_gaps, next, .. } => {
                    p { "critic: " @if *satisfied { "satisfied" } @else { "not satisfied" } " · next " (format!("{next:?}").to_lowercase())
                        @if !known_gaps.is_empty() { " · gaps: " (known_gaps.join("; ")) } }
                }
                EventKind::UserAsked { question, .. } => { p { "asked the user: " (question) } }
                EventKind::UserAnswered { answer } => { p { "the user answered: " (answer) } }
                _ => {}
            }
        }
        @if !span.events.is_empty() {
            h4 { "Span events" }
            table {
                @for e in &span.events {
                    tr {
                        td class="mono" { (time(e.ts)) }
                        td { (e.name) }
                        td class="mono" { @for (k, v) in &e.attributes { (k) "=" (attr_text(v)) " " } }
                    }
                }
            }
        }
    }
}
