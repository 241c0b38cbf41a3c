//! `GET /evals/{id}`: one eval run — who ran it, when, for how long and at what cost, its
//! average scores, and the grid: one row per scenario (status, trials passed, each
//! dimension's score), one cell per trial (passed or failed, the failed checks' reasons
//! on hover, a link to the trial's run page while its thread is in the store), and under
//! each row every trial's checks with their reasons.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use futures::StreamExt;
use keel_eval::report::TrialReport;
use keel_eval::{
    Dimension, EvalReport, RunTrace, ScenarioReport, ScenarioStatus, TrialFacts, TrialStatus,
};
use keel_store::EvalRunInfo;
use maud::{Markup, html};

use super::{load, metric_name, pct, score, visible_baselines};
use crate::Ui;
use crate::charts::{self, Bar};
use crate::error::UiError;
use crate::layout::{Nav, page as layout};
use crate::row::{cost, time};

/// Trial threads read at once when checking which are still in the store.
const LOADS_AT_ONCE: usize = 8;

/// What the store still holds of a trial's thread.
struct TrialThread {
    /// The thread is in the store (and visible): its run page can be linked.
    present: bool,
    /// Facts computed from the log, for reports saved before trials carried them.
    facts: Option<TrialFacts>,
}

/// `GET /evals/{id}`.
pub(crate) async fn run(State(ui): State<Ui>, Path(id): Path<String>) -> Result<Response, UiError> {
    let (info, report) = load(&ui, &id).await?;
    let threads = trial_threads(&ui, &report).await;
    let baselines = visible_baselines(&ui).await?;
    let pointing: Vec<&str> = baselines
        .iter()
        .filter(|b| b.run_id == info.id)
        .map(|b| b.name.as_str())
        .collect();
    let others: Vec<_> = baselines
        .iter()
        .filter(|b| b.run_id != info.id && b.suite == info.suite)
        .collect();
    let max_trials = report
        .scenarios
        .iter()
        .map(|s| s.trials.len())
        .max()
        .unwrap_or(0);
    let dimensions: Vec<Dimension> = Dimension::ALL
        .into_iter()
        .filter(|d| report.scenarios.iter().any(|s| s.scores.contains_key(d)))
        .collect();
    let compare_href = ui.href(&format!("/evals/{}/compare", info.id));
    let body = html! {
        p class="muted" { a href=(ui.href("/evals")) { "← Eval runs" } }
        h1 { "Eval run " span class="mono" id="eval-id" { "#" (info.id) } " · " (report.suite) }
        (facts(&info, &report, &pointing))
        div class="compare-box" id="compare-box" {
            @if let Some(b) = report.run.as_ref().and_then(|m| m.baseline.as_ref()) {
                p {
                    "Compared with baseline " strong { (b.name) } " (eval run #" (b.run_id) ") when it ran: "
                    a id="recorded-comparison" href=(format!("{compare_href}?baseline={}", b.run_id)) { "see the comparison" }
                }
            }
            form method="get" action=(compare_href) {
                "Compare with "
                @for b in &others {
                    a class="baseline-link" href=(format!("{compare_href}?baseline={}", url_part(&b.name))) { "baseline " (b.name) " (#" (b.run_id) ")" }
                    " · "
                }
                input type="text" name="baseline" id="compare-with" placeholder="baseline name or run id";
                " "
                button type="submit" { "Compare" }
            }
        }
        @if !report.summary.avg_scores.is_empty() {
            div class="chart scores" {
                h2 { "Average scores" }
                (charts::bars("avg-scores", &report.summary.avg_scores.iter().map(|(d, v)| Bar {
                    label: metric_name(d.as_str()),
                    value: *v,
                    text: score(*v),
                }).collect::<Vec<_>>(), "score"))
            }
        }
        h2 { "Scenarios × trials" }
        p class="muted" {
            "Each cell is one trial: " span class="cell-key passed" { "✓" } " passed, "
            span class="cell-key failed" { "✗" } " failed, " span class="cell-key judge_error" { "!" }
            " judge error. Hover a cell for why; click it for the trial's run. Open a row's checks for every reason."
        }
        table class="eval-grid" id="eval-grid" data-scenarios=(report.scenarios.len()) {
            thead { tr {
                th { "scenario" } th { "status" } th class="num" { "passed" }
                @for n in 1..=max_trials { th class="trial-head" { "trial " (n) } }
                @for d in &dimensions { th class="num" { (metric_name(d.as_str())) } }
            } }
            tbody {
                @for scenario in &report.scenarios {
                    (scenario_row(&ui, scenario, max_trials, &dimensions, &threads))
                    (checks_row(&ui, scenario, max_trials + dimensions.len() + 3, &threads))
                }
            }
        }
    };
    let title = format!("Eval run #{} · {}", info.id, report.suite);
    Ok(Html(layout(&ui, &title, Nav::Evals, body).into_string()).into_response())
}

/// A text for a query value.
fn url_part(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Which trial threads the store still holds (visible ones only), with their facts.
async fn trial_threads(ui: &Ui, report: &EvalReport) -> HashMap<String, TrialThread> {
    let ids: Vec<String> = report
        .scenarios
        .iter()
        .flat_map(|s| s.trials.iter().map(|t| t.thread_id.clone()))
        .collect();
    futures::stream::iter(ids)
        .map(|id| async move {
            let thread = match ui.source.load_raw(&id).await {
                Ok(events) => TrialThread {
                    present: true,
                    facts: Some(TrialFacts::from_events(
                        &events,
                        &RunTrace::from_events(&events),
                    )),
                },
                Err(_) => TrialThread {
                    present: false,
                    facts: None,
                },
            };
            (id, thread)
        })
        .buffer_unordered(LOADS_AT_ONCE)
        .collect()
        .await
}

/// A trial's facts: as saved, else computed from its thread.
fn trial_facts<'a>(
    trial: &'a TrialReport,
    threads: &'a HashMap<String, TrialThread>,
) -> &'a TrialFacts {
    if trial.facts != TrialFacts::default() {
        return &trial.facts;
    }
    threads
        .get(&trial.thread_id)
        .and_then(|t| t.facts.as_ref())
        .unwrap_or(&trial.facts)
}

fn facts(info: &EvalRunInfo, report: &EvalReport, pointing: &[&str]) -> Markup {
    let meta = report.run.as_ref();
    let s = &report.summary;
    html! {
        dl class="facts" id="eval-facts" {
            div { dt { "Suite" } dd { (report.suite) } }
            div { dt { "Saved" } dd class="mono" { (time(info.created_at)) } }
            div { dt { "Agent" } dd { (meta.map_or("—", |m| m.agent.as_str())) } }
            div { dt { "Model" } dd class="mono" { (info.model.as_deref().or(meta.and_then(|m| m.model.as_deref())).unwrap_or("—")) } }
            div { dt { "Pass rate" } dd id="eval-pass-rate" { (super::list::rate_bar(s.pass_rate)) " " (pct(s.pass_rate)) " (" (s.passed) " of " (s.total_scenarios) " scenarios)" } }
            div { dt { "Failed · flaky · judge errors" } dd { (s.failed) " · " (s.flaky) " · " (s.judge_errors) } }
            div { dt { "Trials per scenario" } dd { (meta.map_or_else(|| "—".to_string(), |m| m.trials.to_string())) } }
            div { dt { "Started" } dd class="mono" { (meta.map_or_else(|| "—".to_string(), |m| time(m.started_at))) } }
            div { dt { "Duration" } dd { (meta.map_or_else(|| "—".to_string(), |m| super::ms(m.duration_ms))) } }
            div { dt { "Tokens" } dd { (meta.map_or_else(|| "—".to_string(), |m| m.tokens.to_string())) } }
            div { dt { "Cost" } dd id="eval-cost" { (cost(meta.and_then(|m| m.cost_usd))) } }
            div { dt { "Baseline of" } dd { @if pointing.is_empty() { "—" } @for name in pointing { span class="badge baseline" { (name) } " " } } }
        }
    }
}

fn status_class(status: ScenarioStatus) -> &'static str {
    match status {
        ScenarioStatus::Passed => "passed",
        ScenarioStatus::Failed => "failed",
        ScenarioStatus::Flaky => "flaky",
        ScenarioStatus::JudgeError => "judge_error",
    }
}

pub(super) fn status_badge(status: ScenarioStatus) -> Markup {
    let class = status_class(status);
    let shown = match status {
        ScenarioStatus::Passed => "done",
        ScenarioStatus::Failed | ScenarioStatus::JudgeError => "failed",
        ScenarioStatus::Flaky => "clarify_needed",
    };
    html! { span class={ "badge " (shown) } { (class.replace('_', " ")) } }
}

fn trial_class(status: TrialStatus) -> &'static str {
    match status {
        TrialStatus::Passed => "passed",
        TrialStatus::Failed => "failed",
        TrialStatus::JudgeError => "judge_error",
    }
}

/// Why a trial did not pass, in one line (empty when it passed).
fn why(trial: &TrialReport) -> String {
    let mut reasons: Vec<String> = Vec::new();
    if let Some(error) = &trial.error {
        reasons.push(format!("run failed: {error}"));
    }
    if let Some(error) = &trial.judge_error {
        reasons.push(format!("judge: {error}"));
    }
    reasons.extend(
        trial
            .checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{} {}: {}", c.dimension.as_str(), c.check, c.reason)),
    );
    reasons.join("\n")
}

fn scenario_row(
    ui: &Ui,
    scenario: &ScenarioReport,
    max_trials: usize,
    dimensions: &[Dimension],
    threads: &HashMap<String, TrialThread>,
) -> Markup {
    html! {
        tr class={ "scenario " (status_class(scenario.status)) } data-scenario=(scenario.id) data-status=(status_class(scenario.status)) {
            td class="mono" { a href=(format!("#checks-{}", crate::timeline::sanitize(&scenario.id))) { (scenario.id) } }
            td { (status_badge(scenario.status)) }
            td class="num" title=(format!("95% interval {} – {}", pct(scenario.ci95.lo), pct(scenario.ci95.hi))) {
                (scenario.trials_passed) "/" (scenario.trials_run)
            }
            @for n in 0..max_trials {
                @match scenario.trials.get(n) {
                    Some(trial) => { (trial_cell(ui, scenario, n, trial, threads)) }
                    None => { td class="trial none" {} }
                }
            }
            @for d in dimensions {
                @match scenario.scores.get(d) {
                    Some(v) => { td class={ "num dim " (score_class(*v)) } data-dimension=(d.as_str()) { (score(*v)) } }
                    None => { td class="num muted" { "—" } }
                }
            }
        }
    }
}

fn score_class(value: f64) -> &'static str {
    if value >= 0.999 {
        "full"
    } else if value >= 0.5 {
        "part"
    } else {
        "low"
    }
}

fn trial_cell(
    ui: &Ui,
    scenario: &ScenarioReport,
    index: usize,
    trial: &TrialReport,
    threads: &HashMap<String, TrialThread>,
) -> Markup {
    let class = trial_class(trial.status);
    let mark = match trial.status {
        TrialStatus::Passed => "✓",
        TrialStatus::Failed => "✗",
        TrialStatus::JudgeError => "!",
    };
    let reason = why(trial);
    let title = if reason.is_empty() {
        format!("{} trial {}: passed", scenario.id, index + 1)
    } else {
        format!("{} trial {}: {reason}", scenario.id, index + 1)
    };
    let present = threads.get(&trial.thread_id).is_some_and(|t| t.present);
    html! {
        td class={ "trial " (class) } data-trial=(index + 1) data-status=(class) data-thread=(trial.thread_id) title=(title) {
            @if present {
                a class="trial-link" href=(ui.run_href(&trial.thread_id, "")) { (mark) }
            } @else {
                span class="trial-gone" { (mark) }
            }
        }
    }
}

fn checks_row(
    ui: &Ui,
    scenario: &ScenarioReport,
    columns: usize,
    threads: &HashMap<String, TrialThread>,
) -> Markup {
    let failing = scenario.status != ScenarioStatus::Passed;
    let failed_checks: usize = scenario
        .trials
        .iter()
        .map(|t| t.checks.iter().filter(|c| !c.passed).count())
        .sum();
    html! {
        tr class="checks-row" {
            td colspan=(columns) {
                details class="more checks" id=(format!("checks-{}", crate::timeline::sanitize(&scenario.id))) data-scenario=(scenario.id) open[failing] {
                    summary {
                        "checks of " (scenario.id)
                        @if failed_checks > 0 { " (" (failed_checks) " failed)" }
                        @if let (Some(at_k), Some(pow_k)) = (scenario.pass_at_k, scenario.pass_pow_k) {
                            span class="muted" { " · pass@" (scenario.k) " " (score(at_k)) " · pass^" (scenario.k) " " (score(pow_k)) }
                        }
                    }
                    @for (n, trial) in scenario.trials.iter().enumerate() {
                        (trial_detail(ui, n, trial, threads))
                    }
                }
            }
        }
    }
}

fn trial_detail(
    ui: &Ui,
    index: usize,
    trial: &TrialReport,
    threads: &HashMap<String, TrialThread>,
) -> Markup {
    let class = trial_class(trial.status);
    let facts = trial_facts(trial, threads);
    let present = threads.get(&trial.thread_id).is_some_and(|t| t.present);
    html! {
        div class={ "trial-detail " (class) } data-trial=(index + 1) {
            p {
                strong { "trial " (index + 1) } " — " span class={ "trial-status " (class) } { (class.replace('_', " ")) }
                @if let Some(end) = &facts.end_state { " · ended " span class={ "badge " (end) } { (end) } }
                @if let Some(d) = facts.duration_ms { " · " (super::ms(d)) }
                @if let Some(t) = facts.tokens { " · " (t) " tokens" }
                @if facts.cost_usd.is_some() { " · " (cost(facts.cost_usd)) }
                " · "
                @if present {
                    a href=(ui.run_href(&trial.thread_id, "")) class="mono" { (ui.shown_id(&trial.thread_id)) }
                } @else {
                    span class="mono muted" title="this thread is no longer in the store" { (ui.shown_id(&trial.thread_id)) " (not in the store)" }
                }
            }
            @if let Some(error) = &trial.error { p class="notice error" { "The run failed: " (error) } }
            @if let Some(error) = &trial.judge_error { p class="notice error" { "The judge failed: " (error) } }
            @if !trial.checks.is_empty() {
                table class="checks-table" {
                    @for check in &trial.checks {
                        tr class=(if check.passed { "check ok" } else { "check failed" }) {
                            td class="mark" { @if check.passed { "✓" } @else { "✗" } }
                            td { (metric_name(check.dimension.as_str())) }
                            td class="mono" { (check.check) }
                            td class="num" { (score(check.score)) }
                            td class="reason" { (check.reason) }
                        }
                    }
                }
            }
        }
    }
}
