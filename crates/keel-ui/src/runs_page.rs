//! The runs page: every thread of the (scoped) store with its agent, model, start,
//! duration, status, model calls, tool calls, tokens and cost; filters, sorting (click a
//! column heading) and pages, all applied by the store's runs list; rows of running
//! threads refresh themselves.

use axum::extract::{RawQuery, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use keel_core::runs::{RunCursor, RunSort};
use maud::{Markup, html};

use crate::Ui;
use crate::error::UiError;
use crate::filter::RunsFilter;
use crate::layout::{Nav, page as layout};
use crate::row::{RunRow, cost, duration, time};
use crate::source::RunsPage;

/// `GET /`: the runs page.
pub(crate) async fn index(State(ui): State<Ui>) -> Redirect {
    Redirect::to(&ui.href("/runs"))
}

/// `GET /runs`.
pub(crate) async fn page(
    State(ui): State<Ui>,
    RawQuery(query): RawQuery,
) -> Result<Response, UiError> {
    let filter = RunsFilter::parse(query.as_deref(), chrono::Utc::now())?;
    let store_query = filter.store_query(None, |id| ui.store_id(id));
    let runs = ui.source.page(store_query).await?;
    if filter.fragment.as_deref() == Some("rows") {
        return Ok(Html(rows(&ui, &runs.rows).into_string()).into_response());
    }
    let body = html! {
        h1 { "Runs" }
        (filters(&ui, &filter))
        @if runs.unindexed > 0 {
            p class="notice" id="indexing-notice" {
                "The store is indexing its runs: " (runs.unindexed) " not yet included below. Reload in a moment."
            }
        }
        @if runs.hidden > 0 {
            p class="notice" id="hidden-notice" {
                (runs.hidden) " run(s) of this page matched the search only inside redacted text and are not shown."
            }
        }
        table id="runs" {
            thead { tr {
                th { "Run" }
                th { "Agent" }
                th { "Model" }
                (sort_header(&ui, &filter, RunSort::Started, "Started", false))
                (sort_header(&ui, &filter, RunSort::Duration, "Duration", true))
                th { "State" }
                (sort_header(&ui, &filter, RunSort::Turns, "Turns", true))
                (sort_header(&ui, &filter, RunSort::ToolCalls, "Tool calls", true))
                (sort_header(&ui, &filter, RunSort::Tokens, "Tokens", true))
                (sort_header(&ui, &filter, RunSort::Cost, "Cost", true))
            } }
            tbody id="runs-body" { (rows(&ui, &runs.rows)) }
        }
        @if runs.rows.is_empty() {
            p class="empty" id="no-runs" { "No runs match." }
        }
        (pager(&ui, &filter, &runs))
    };
    Ok(Html(layout(&ui, "Runs", Nav::Runs, body).into_string()).into_response())
}

fn filters(ui: &Ui, filter: &RunsFilter) -> Markup {
    const STATES: [&str; 9] = [
        "running",
        "awaiting_approval",
        "awaiting_user",
        "done",
        "failed",
        "clarify_needed",
        "budget_exceeded",
        "unrecoverable_tool_contract",
        "cancelled",
    ];
    html! {
        form class="filters" id="filters" method="get" action=(ui.href("/runs")) {
            label { "State"
                select name="state" id="filter-state" {
                    option value="" selected[filter.state_text.is_empty()] { "any" }
                    @for state in STATES {
                        option value=(state) selected[filter.state_text == state] { (state) }
                    }
                }
            }
            label { "Agent" input type="text" name="agent" value=(filter.agent.as_deref().unwrap_or("")); }
            label { "Model" input type="text" name="model" placeholder="part of the id" value=(filter.model.as_deref().unwrap_or("")); }
            label { "From" input type="text" name="from" placeholder="2h, 7d or RFC 3339" value=(filter.from_text); }
            label { "To" input type="text" name="to" placeholder="RFC 3339 or age" value=(filter.to_text); }
            label { "Text" input type="search" name="q" id="filter-q" placeholder="in messages" value=(filter.q.as_deref().unwrap_or("")); }
            @if filter.sort != RunSort::Updated { input type="hidden" name="sort" value=(filter.sort.as_str()); }
            @if !filter.descending { input type="hidden" name="dir" value="asc"; }
            button type="submit" class="primary" id="apply-filters" { "Filter" }
            a href=(ui.href("/runs")) { "Clear" }
        }
    }
}

/// A column heading that sorts by its column (the whole list, from the first page),
/// largest first; clicked again, the other way. The filters are kept.
fn sort_header(ui: &Ui, filter: &RunsFilter, key: RunSort, label: &str, num: bool) -> Markup {
    let current = filter.sort == key;
    let descending = if current { !filter.descending } else { true };
    let href = format!(
        "{}?{}",
        ui.href("/runs"),
        filter.query(None, key, descending)
    );
    let arrow = match (current, filter.descending) {
        (true, true) => " ↓",
        (true, false) => " ↑",
        _ => "",
    };
    html! {
        th class=[num.then_some("num")] {
            a href=(href) data-sort=(key.as_str()) title={ "Sort by " (label.to_lowercase()) } { (label) (arrow) }
        }
    }
}

/// The table body (also the live refresh's fragment).
fn rows(ui: &Ui, rows: &[RunRow]) -> Markup {
    html! {
        @for row in rows {
            @let status = row.status_name();
            tr data-thread=(ui.shown_id(&row.thread_id)) data-status=(status) data-live=(row.is_live()) {
                td {
                    a class="mono run-link" href=(ui.run_href(&row.thread_id, "")) { (ui.shown_id(&row.thread_id)) }
                    @if !row.goal.is_empty() { div class="goal" title=(row.goal) { (row.goal) } }
                }
                td { (row.agent) }
                td class="mono" { (row.model) }
                td class="mono" { (time(row.started)) }
                td class="num" { (duration(row.duration_ms)) }
                td { span class={ "badge " (status) } { (status) } }
                td class="num" { (row.turns) }
                td class="num" {
                    (row.tool_calls)
                    @if row.tool_errors > 0 { span class="muted" { " (" (row.tool_errors) " failed)" } }
                }
                td class="num" { (row.tokens) }
                td class="num" { (cost(row.cost_usd)) }
            }
        }
    }
}

fn pager(ui: &Ui, filter: &RunsFilter, runs: &RunsPage) -> Markup {
    // The cursor as the URL names its thread (relative to a tenant's prefix).
    let next = runs.next.as_ref().map(|next| RunCursor {
        value: next.value,
        thread_id: ui.shown_id(&next.thread_id).to_string(),
    });
    html! {
        div class="pager" {
            @if filter.after.is_some() {
                a id="first-page" href=(format!("{}?{}", ui.href("/runs"), filter.query(None, filter.sort, filter.descending))) { "← First page" }
            }
            @if let Some(next) = &next {
                a id="next-page" href=(format!("{}?{}", ui.href("/runs"), filter.query(Some(next), filter.sort, filter.descending))) { "Next page →" }
            }
            span class="muted" {
                (runs.rows.len()) " shown"
                @if filter.sort != RunSort::Updated {
                    " · sorted by " (filter.sort.as_str().replace('_', " ")) ", " (if filter.descending { "largest first" } else { "smallest first" })
                }
            }
        }
    }
}
