//! `GET /evals`: the saved eval runs, newest first — suite, when, agent and model, pass
//! rate, scenario counts, trials, cost, duration, the baseline each was compared with and
//! the baselines pointing at it — with a pass-rate chart of the runs shown.

use std::collections::HashMap;

use axum::extract::{RawQuery, State};
use axum::response::{Html, IntoResponse, Response};
use keel_eval::EvalReport;
use keel_store::EvalRunInfo;
use maud::{Markup, html};

use super::{decode, param, pct, query_pairs, results, store_error, visible, visible_baselines};
use crate::Ui;
use crate::error::UiError;
use crate::layout::{Nav, page as layout};
use crate::row::{cost, time};

/// Rows per page by default, and at most.
const PAGE: usize = 25;
const MAX_PAGE: usize = 200;
/// Eval runs examined at most per request when a scope hides some.
const MAX_SCAN: usize = 10_000;

struct Query {
    suite: Option<String>,
    skip: usize,
    limit: usize,
}

fn parse(query: Option<&str>) -> Result<Query, UiError> {
    let pairs = query_pairs(query, &["suite", "skip", "limit"])?;
    let number = |name: &str| -> Result<Option<usize>, UiError> {
        param(&pairs, name)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| UiError::bad_input(name, format!("{v:?}: give a whole number")))
            })
            .transpose()
    };
    let limit = number("limit")?.unwrap_or(PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(UiError::bad_input(
            "limit",
            format!("{limit}: give 1 to {MAX_PAGE}"),
        ));
    }
    Ok(Query {
        suite: param(&pairs, "suite").map(str::to_string),
        skip: number("skip")?.unwrap_or(0),
        limit,
    })
}

/// One row: the run and its report (or why the report cannot be read).
struct Row {
    info: EvalRunInfo,
    report: Result<EvalReport, String>,
}

/// `GET /evals`.
pub(crate) async fn list(
    State(ui): State<Ui>,
    RawQuery(query): RawQuery,
) -> Result<Response, UiError> {
    let query = parse(query.as_deref())?;
    let results = results(&ui)?;
    let wanted = query.skip.saturating_add(query.limit).saturating_add(1);
    // Newest first; with a scope, fetch more until enough visible runs are found.
    let mut fetch = wanted;
    let shown: Vec<EvalRunInfo> = loop {
        let infos = results
            .list_runs(query.suite.as_deref(), fetch)
            .await
            .map_err(|e| store_error(&ui, e))?;
        let ended = infos.len() < fetch;
        let shown: Vec<EvalRunInfo> = infos.into_iter().filter(|i| visible(&ui, i)).collect();
        if shown.len() >= wanted || ended || fetch >= MAX_SCAN {
            break shown;
        }
        fetch = fetch.saturating_mul(4).min(MAX_SCAN);
    };
    let more = shown.len() > query.skip.saturating_add(query.limit);
    let mut rows = Vec::new();
    for info in shown.into_iter().skip(query.skip).take(query.limit) {
        let report = match results.run(&info.id).await {
            Ok(Some(stored)) => decode(&ui, info.id, stored.report),
            Ok(None) => Err(format!("eval run {} was deleted", info.id)),
            Err(error) => Err(ui.source.redact(&error.to_string())),
        };
        rows.push(Row { info, report });
    }
    let mut baselines: HashMap<i64, Vec<String>> = HashMap::new();
    for baseline in visible_baselines(&ui).await? {
        baselines
            .entry(baseline.run_id.0)
            .or_default()
            .push(baseline.name);
    }
    let body = html! {
        h1 { "Eval runs" }
        p class="muted" {
            "Runs saved by " code { "keel eval run" } " in this store, newest first. "
            "Open one for its scenarios × trials grid and its comparison with a baseline."
        }
        form class="filters" method="get" action=(ui.href("/evals")) {
            label { "suite" input type="text" name="suite" id="filter-suite" value=(query.suite.clone().unwrap_or_default()); }
            button type="submit" class="primary" { "Apply" }
            @if query.suite.is_some() { a href=(ui.href("/evals")) { "clear" } }
        }
        @if rows.is_empty() {
            p class="empty" id="evals-empty" {
                @if query.skip > 0 { "No more eval runs." }
                @else { "No eval runs saved yet: run " code { "keel eval run SUITE" } "." }
            }
        } @else {
            (trend(&ui, &rows))
            table class="evals" id="evals-table" {
                thead { tr {
                    th { "run" } th { "suite" } th { "saved" } th { "agent · model" }
                    th class="num" { "pass rate" } th { "scenarios" } th class="num" { "trials" }
                    th class="num" { "cost" } th class="num" { "duration" } th { "vs baseline" } th { "baselines" }
                } }
                tbody id="evals-body" {
                    @for row in &rows { (row_html(&ui, row, baselines.get(&row.info.id.0))) }
                }
            }
        }
        div class="pager" {
            @if query.skip > 0 {
                a href=(page_href(&ui, &query, query.skip.saturating_sub(query.limit))) { "← Newer" }
            }
            @if more {
                a id="evals-next" href=(page_href(&ui, &query, query.skip.saturating_add(query.limit))) { "Older →" }
            }
        }
    };
    Ok(Html(layout(&ui, "Eval runs", Nav::Evals, body).into_string()).into_response())
}

fn page_href(ui: &Ui, query: &Query, skip: usize) -> String {
    let mut pairs = form_urlencoded::Serializer::new(String::new());
    if let Some(suite) = &query.suite {
        pairs.append_pair("suite", suite);
    }
    if skip > 0 {
        pairs.append_pair("skip", &skip.to_string());
    }
    if query.limit != PAGE {
        pairs.append_pair("limit", &query.limit.to_string());
    }
    let pairs = pairs.finish();
    if pairs.is_empty() {
        ui.href("/evals")
    } else {
        ui.href(&format!("/evals?{pairs}"))
    }
}

fn suite_href(ui: &Ui, suite: &str) -> String {
    let pairs = form_urlencoded::Serializer::new(String::new())
        .append_pair("suite", suite)
        .finish();
    ui.href(&format!("/evals?{pairs}"))
}

fn row_html(ui: &Ui, row: &Row, baselines: Option<&Vec<String>>) -> Markup {
    let info = &row.info;
    let href = ui.href(&format!("/evals/{}", info.id));
    let report = row.report.as_ref().ok();
    let meta = report.and_then(|r| r.run.as_ref());
    let summary = report.map(|r| &r.summary);
    let regressions = report.map_or(0, |r| {
        r.regression_analysis
            .regressions
            .iter()
            .filter(|c| c.significant)
            .count()
    });
    html! {
        tr data-run=(info.id) data-suite=(info.suite) data-pass-rate=(format!("{:.6}", info.pass_rate)) {
            td class="mono" { a href=(href) { "#" (info.id) } }
            td { a href=(suite_href(ui, &info.suite)) { (info.suite) } }
            td class="mono" { (time(info.created_at)) }
            td {
                @if let Some(meta) = meta { (meta.agent) " · " }
                span class="mono" { (info.model.as_deref().or(meta.and_then(|m| m.model.as_deref())).unwrap_or("—")) }
            }
            td class="num" {
                (rate_bar(info.pass_rate))
                " " (pct(info.pass_rate))
            }
            td {
                @match summary {
                    Some(s) => {
                        span class="ok-text" { (s.passed) " passed" }
                        @if s.failed > 0 { " · " span class="err-text" { (s.failed) " failed" } }
                        @if s.flaky > 0 { " · " span class="warn-text" { (s.flaky) " flaky" } }
                        @if s.judge_errors > 0 { " · " span class="err-text" { (s.judge_errors) " judge errors" } }
                        span class="muted" { " of " (s.total_scenarios) }
                    }
                    None => { span class="muted" { (info.total_scenarios) " scenarios" } }
                }
            }
            td class="num" { @match meta { Some(m) => { (m.trials) } None => { "—" } } }
            td class="num" { (cost(meta.and_then(|m| m.cost_usd))) }
            td class="num" { @match meta { Some(m) => { (super::ms(m.duration_ms)) } None => { "—" } } }
            td {
                @match meta.and_then(|m| m.baseline.as_ref()) {
                    Some(b) => {
                        a href=(ui.href(&format!("/evals/{}/compare?baseline={}", info.id, b.run_id))) {
                            @if regressions > 0 {
                                span class="badge failed" { (regressions) " regression" @if regressions > 1 { "s" } }
                            } @else {
                                span class="badge done" { "no regression" }
                            }
                        }
                        span class="muted" { " vs " (b.name) }
                    }
                    None => { span class="muted" { "—" } }
                }
            }
            td {
                @for name in baselines.into_iter().flatten() { span class="badge baseline" { (name) } " " }
                @if let Err(problem) = &row.report { span class="err-text" title=(problem) { "unreadable report" } }
            }
        }
    }
}

/// A small horizontal bar for a rate (inline style: the width is the value).
pub(super) fn rate_bar(rate: f64) -> Markup {
    let width = (rate.clamp(0.0, 1.0) * 100.0).round();
    html! {
        span class="rate" title=(pct(rate)) {
            span class="rate-fill" style=(format!("width:{width:.0}%")) {}
        }
    }
}

/// The pass rate of the runs shown, oldest to newest, as an inline SVG line.
fn trend(ui: &Ui, rows: &[Row]) -> Markup {
    if rows.len() < 2 {
        return html! {};
    }
    let (w, h, left, right, top, bottom) = (640.0, 150.0, 40.0, 12.0, 12.0, 26.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let points: Vec<&Row> = rows.iter().rev().collect();
    let n = points.len();
    let x = |i: usize| left + plot_w * i as f64 / (n - 1).max(1) as f64;
    let y = |rate: f64| top + plot_h * (1.0 - rate.clamp(0.0, 1.0));
    let path: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{:.1},{:.1}", x(i), y(r.info.pass_rate)))
        .collect();
    html! {
        div class="chart trend" {
            h2 { "Pass rate of the runs shown" }
            svg id="evals-trend" viewBox=(format!("0 0 {w} {h}")) width="100%" role="img" aria-label="pass rate per eval run" {
                @for tick in [0.0, 0.5, 1.0] {
                    line class="grid" x1=(left) x2=(w - right) y1=(format!("{:.1}", y(tick))) y2=(format!("{:.1}", y(tick))) {}
                    text x=(left - 6.0) y=(format!("{:.1}", y(tick) + 4.0)) text-anchor="end" { (format!("{:.0}%", tick * 100.0)) }
                }
                polyline class="curve" points=(path.join(" ")) {}
                @for (i, row) in points.iter().enumerate() {
                    a href=(ui.href(&format!("/evals/{}", row.info.id))) {
                        circle class="point" cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(row.info.pass_rate))) r="4"
                            data-run=(row.info.id) data-rate=(format!("{:.6}", row.info.pass_rate)) {
                            title { "eval run " (row.info.id) " (" (row.info.suite) "): " (pct(row.info.pass_rate)) }
                        }
                    }
                    text x=(format!("{:.1}", x(i))) y=(h - 8.0) text-anchor="middle" { "#" (row.info.id) }
                }
            }
        }
    }
}
