//! The dashboard: the figures of `keel stats` — turn survival, step success, repair
//! success and mean retries, p95 tool latency per tool, the error taxonomy, end states —
//! plus cost per day, drawn as inline SVG. They are combined by
//! [`keel_telemetry::metrics_from_facts`] from each run's metrics facts, which the store
//! keeps ([`keel_core::EventStore::run_facts`]; no log is read): the report
//! [`keel_telemetry::compute_metrics`] (`keel stats`) gives over the same runs' events.
//! Cost per day is the same combination over each day's runs, a run counted on the day it
//! started.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{RawQuery, State};
use axum::response::{Html, IntoResponse, Response};
use chrono::{NaiveDate, Utc};
use keel_core::run_metrics::{FactsQuery, RunFacts};
use keel_telemetry::{MetricsOptions, MetricsReport, metrics_from_facts, render_summary};
use maud::{Markup, html};

use crate::Ui;
use crate::charts::{self, Bar, CurvePoint};
use crate::error::UiError;
use crate::layout::{Nav, page as layout};

/// Days shown on the cost chart (the most recent ones with runs).
const COST_DAYS: usize = 30;

struct Query {
    agent: Option<String>,
    from_text: String,
    filter: FactsQuery,
}

fn parse(query: Option<&str>) -> Result<Query, UiError> {
    let mut out = Query {
        agent: None,
        from_text: String::new(),
        filter: FactsQuery::default(),
    };
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = value.trim();
        match key.as_ref() {
            "agent" => out.agent = (!value.is_empty()).then(|| value.to_string()),
            "from" => {
                if !value.is_empty() {
                    out.filter.active_since = Some(
                        keel_app::threads::parse_since(value, Utc::now())
                            .map_err(|e| UiError::bad_input("from", e))?,
                    );
                }
                out.from_text = value.to_string();
            }
            other => {
                return Err(UiError::bad_input(
                    other,
                    "unknown parameter: use agent or from",
                ));
            }
        }
    }
    out.filter.agent.clone_from(&out.agent);
    Ok(out)
}

/// `GET /dashboard`.
pub(crate) async fn page(
    State(ui): State<Ui>,
    RawQuery(query): RawQuery,
) -> Result<Response, UiError> {
    let query = parse(query.as_deref())?;
    let facts = ui.source.facts(query.filter.clone()).await?;
    // Each run's segments on the day the run started (its first segment read), in the
    // order `keel stats` reads their events: by day, then thread by thread.
    let mut days: BTreeMap<NaiveDate, Vec<&RunFacts>> = BTreeMap::new();
    let mut run_day: HashMap<&str, NaiveDate> = HashMap::new();
    for segment in facts.threads.iter().flat_map(|thread| &thread.runs) {
        let day = *run_day
            .entry(segment.run_id.as_str())
            .or_insert_with(|| segment.started_at.date_naive());
        days.entry(day).or_default().push(segment);
    }
    let options = MetricsOptions::default();
    let report = metrics_from_facts(days.values().flatten().copied(), &options);
    let cost_per_day: Vec<(NaiveDate, f64, u64)> = days
        .iter()
        .rev()
        .take(COST_DAYS)
        .rev()
        .map(|(day, segments)| {
            let r = metrics_from_facts(segments.iter().copied(), &options);
            (*day, r.models.values().map(|m| m.cost_usd).sum(), r.runs)
        })
        .collect();
    let body = html! {
        h1 { "Dashboard" }
        form class="filters" method="get" action=(ui.href("/dashboard")) {
            label { "Agent" input type="text" name="agent" value=(query.agent.as_deref().unwrap_or("")); }
            label { "From" input type="text" name="from" placeholder="7d or RFC 3339" value=(query.from_text); }
            button type="submit" class="primary" { "Apply" }
        }
        @if facts.unindexed > 0 {
            p class="notice" id="indexing-notice" {
                "The store is indexing its runs: " (facts.unindexed) " not yet included below. Reload in a moment."
            }
        }
        (cards(&report))
        div class="charts" {
            div class="chart" {
                h2 { "Turn survival" }
                p class="muted" { "Share of runs not failed before N tool calls." }
                (charts::survival(&survival_points(&report)))
            }
            div class="chart" {
                h2 { "p95 tool latency" }
                (charts::bars("latency-chart", &report.tools.iter().map(|(name, t)| Bar {
                    label: ui.source.redact(name),
                    value: t.p95_ms as f64,
                    text: format!("{} ms · {} calls", t.p95_ms, t.calls),
                }).collect::<Vec<_>>(), ""))
            }
            div class="chart" {
                h2 { "Error taxonomy" }
                (charts::bars("errors-chart", &errors(&report), "err"))
            }
            div class="chart" {
                h2 { "End states" }
                (charts::bars("end-states-chart", &report.end_states.iter().map(|(state, n)| Bar {
                    label: state.clone(),
                    value: *n as f64,
                    text: n.to_string(),
                }).collect::<Vec<_>>(), "state"))
            }
            div class="chart" {
                h2 { "Cost per day" }
                (charts::bars("cost-chart", &cost_per_day.iter().map(|(day, cost, runs)| Bar {
                    label: day.to_string(),
                    value: *cost,
                    text: format!("${cost:.4} · {runs} runs"),
                }).collect::<Vec<_>>(), "cost"))
            }
        }
        details class="more" {
            summary { "as `keel stats` prints it" }
            pre id="stats-text" { (ui.source.redact(&render_summary(&report))) }
        }
    };
    Ok(Html(layout(&ui, "Dashboard", Nav::Dashboard, body).into_string()).into_response())
}

fn survival_points(report: &MetricsReport) -> Vec<CurvePoint> {
    report
        .survival
        .iter()
        .map(|p| CurvePoint {
            tool_calls: p.tool_calls,
            rate: p.rate,
            alive: p.alive,
            reached: p.reached,
        })
        .collect()
}

fn errors(report: &MetricsReport) -> Vec<Bar> {
    let tools = report
        .tool_errors
        .iter()
        .map(|(code, n)| (format!("tool: {code}"), *n));
    let models = report
        .model_errors
        .iter()
        .map(|(kind, n)| (format!("model: {kind}"), *n));
    tools
        .chain(models)
        .map(|(label, n)| Bar {
            label,
            value: n as f64,
            text: n.to_string(),
        })
        .collect()
}

fn pct(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{:.1}%", v * 100.0))
}

fn cards(report: &MetricsReport) -> Markup {
    let cost: f64 = report.models.values().map(|m| m.cost_usd).sum();
    html! {
        div class="cards" id="cards" {
            div class="card" id="card-runs" { div class="value" { (report.runs) } div class="label" { "runs" } }
            div class="card" id="card-step-success" { div class="value" { (pct(report.step_success_rate)) } div class="label" { "step success (" (report.tool_calls_ok) "/" (report.tool_calls) " tool calls)" } }
            div class="card" id="card-repair" { div class="value" { (pct(report.repair_success_rate)) } div class="label" { "repair success (" (report.repairs_succeeded) "/" (report.repair_attempts) ")" } }
            div class="card" id="card-retries" { div class="value" { (report.mean_retries.map_or_else(|| "n/a".to_string(), |m| format!("{m:.3}"))) } div class="label" { "mean retries per tool call" } }
            div class="card" id="card-cost" { div class="value" { (format!("${cost:.4}")) } div class="label" { "cost" } }
        }
    }
}
