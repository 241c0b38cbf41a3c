//! `GET /evals/{id}/compare?baseline=NAME|ID&threshold=T`: an eval run against a baseline,
//! computed by `keel_eval::compare` — the same function, threshold and significance rule
//! as `keel eval run --baseline` and `keel eval compare` (a drop beyond the threshold is a
//! regression, significant when the new value lies outside the baseline's 95% interval).
//! Without `baseline` the page uses the baseline the run was compared with when it ran, or
//! offers the saved baselines. Regressions are red (pale when not significant),
//! improvements green, on a diverging SVG chart and in a side-by-side grid.

use axum::extract::{Path, RawQuery, State};
use axum::response::{Html, IntoResponse, Response};
use keel_eval::{Change, Comparison, Dimension, EvalReport, ScenarioReport};
use keel_store::{BaselineInfo, EvalRunId, EvalRunInfo};
use maud::{Markup, html};

use super::grid::status_badge;
use super::{
    decode, load, metric_name, param, pct, query_pairs, results, score, signed, store_error,
    visible, visible_baselines,
};
use crate::Ui;
use crate::error::UiError;
use crate::layout::{Nav, page as layout};

/// The threshold of `keel eval run --baseline` when none is given or recorded.
const DEFAULT_THRESHOLD: f64 = 0.05;

/// The baseline side: its run, report and how it was named.
struct Baseline {
    info: EvalRunInfo,
    report: EvalReport,
    label: String,
}

/// `GET /evals/{id}/compare`.
pub(crate) async fn compare(
    State(ui): State<Ui>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, UiError> {
    let pairs = query_pairs(query.as_deref(), &["baseline", "threshold"])?;
    let (info, report) = load(&ui, &id).await?;
    let recorded = report.run.as_ref().and_then(|m| m.baseline.clone());
    let threshold = match param(&pairs, "threshold") {
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && (0.0..=1.0).contains(t))
            .ok_or_else(|| {
                UiError::bad_input("threshold", format!("{text:?}: give a number from 0 to 1"))
            })?,
        None => recorded.as_ref().map_or(DEFAULT_THRESHOLD, |b| b.threshold),
    };
    let baselines = visible_baselines(&ui).await?;
    let chosen = param(&pairs, "baseline")
        .map(str::to_string)
        .or_else(|| recorded.as_ref().map(|b| b.run_id.to_string()));
    let title = format!("Eval run #{} against a baseline", info.id);
    let Some(chosen) = chosen else {
        let body = chooser(&ui, &info, &report, &baselines);
        return Ok(Html(layout(&ui, &title, Nav::Evals, body).into_string()).into_response());
    };
    let baseline = resolve(&ui, &chosen, &baselines).await?;
    let comparison = keel_eval::compare(&report, &baseline.report, threshold);
    let body = html! {
        (heading(&ui, &info, &report))
        p class="lead" {
            "Against " strong id="baseline-label" { (baseline.label) }
            " (" a href=(ui.href(&format!("/evals/{}", baseline.info.id))) { "open it" } ")"
            " · threshold " span id="threshold" { (format!("{threshold}")) }
            @if baseline.report.suite != report.suite {
                span class="notice" { " the baseline is a run of suite " (baseline.report.suite) }
            }
        }
        (form(&ui, &info, &chosen, threshold))
        (verdict(&comparison))
        (summary_table(&comparison))
        (chart(&comparison))
        (side_by_side(&report, &baseline.report, &comparison))
        (changes_lists(&comparison))
    };
    Ok(Html(layout(&ui, &title, Nav::Evals, body).into_string()).into_response())
}

fn heading(ui: &Ui, info: &EvalRunInfo, report: &EvalReport) -> Markup {
    html! {
        p class="muted" {
            a href=(ui.href("/evals")) { "← Eval runs" } " · "
            a href=(ui.href(&format!("/evals/{}", info.id))) { "eval run #" (info.id) }
        }
        h1 { "Eval run " span class="mono" { "#" (info.id) } " · " (report.suite) " against a baseline" }
    }
}

fn form(ui: &Ui, info: &EvalRunInfo, chosen: &str, threshold: f64) -> Markup {
    html! {
        form class="filters" method="get" action=(ui.href(&format!("/evals/{}/compare", info.id))) {
            label { "baseline (name or run id)" input type="text" name="baseline" id="compare-baseline" value=(chosen); }
            label { "threshold" input type="text" name="threshold" id="compare-threshold" value=(format!("{threshold}")); }
            button type="submit" class="primary" { "Compare" }
        }
    }
}

/// No baseline chosen and none recorded: the saved baselines to pick from.
fn chooser(ui: &Ui, info: &EvalRunInfo, report: &EvalReport, baselines: &[BaselineInfo]) -> Markup {
    let href = |what: &str| {
        let value: String = form_urlencoded::byte_serialize(what.as_bytes()).collect();
        ui.href(&format!("/evals/{}/compare?baseline={value}", info.id))
    };
    html! {
        (heading(ui, info, report))
        p { "This run was not compared with a baseline when it ran. Pick one:" }
        @if baselines.is_empty() {
            p class="empty" id="no-baselines" {
                "No baselines saved yet: save one with "
                code { "keel eval run SUITE --save-baseline NAME" }
                ", or give any eval run's id below."
            }
        } @else {
            table id="baseline-choices" {
                thead { tr { th { "baseline" } th { "eval run" } th { "suite" } th class="num" { "pass rate" } } }
                tbody {
                    @for b in baselines {
                        tr class=[(b.suite == report.suite).then_some("same-suite")] {
                            td { a href=(href(&b.name)) { (b.name) } }
                            td class="mono" { "#" (b.run_id) }
                            td { (b.suite) }
                            td class="num" { (pct(b.pass_rate)) }
                        }
                    }
                }
            }
        }
        (form(ui, info, "", DEFAULT_THRESHOLD))
    }
}

/// The baseline side: a saved run id, else a baseline name (as `keel eval compare` reads
/// its arguments).
async fn resolve(ui: &Ui, chosen: &str, baselines: &[BaselineInfo]) -> Result<Baseline, UiError> {
    if let Ok(id) = chosen.parse::<EvalRunId>() {
        let (info, report) = load(ui, chosen).await.map_err(|_| {
            UiError::bad_input(
                "baseline",
                format!("there is no eval run {id} (the eval runs page lists them)"),
            )
        })?;
        let names: Vec<&str> = baselines
            .iter()
            .filter(|b| b.run_id == id)
            .map(|b| b.name.as_str())
            .collect();
        let label = if names.is_empty() {
            format!("eval run #{id}")
        } else {
            format!("eval run #{id} (baseline {})", names.join(", "))
        };
        return Ok(Baseline {
            info,
            report,
            label,
        });
    }
    let unknown = || {
        UiError::bad_input(
            "baseline",
            format!(
                "there is no baseline named {chosen:?} (`keel eval baselines` lists them; save \
                 one with `keel eval run SUITE --save-baseline {chosen}`), and it is not an \
                 eval run id"
            ),
        )
    };
    let stored = results(ui)?
        .baseline(chosen)
        .await
        .map_err(|e| store_error(ui, e))?
        .ok_or_else(unknown)?;
    if !visible(ui, &stored.info) {
        return Err(unknown());
    }
    let id = stored.info.id;
    let report = decode(ui, id, stored.report).map_err(UiError::store)?;
    Ok(Baseline {
        info: stored.info,
        report,
        label: format!("baseline {chosen} (eval run #{id})"),
    })
}

fn verdict(comparison: &Comparison) -> Markup {
    let significant = comparison
        .regressions
        .iter()
        .filter(|c| c.significant)
        .count();
    let noise = comparison.regressions.len() - significant;
    html! {
        @if comparison.is_regression() {
            div class="verdict regressed" id="verdict" data-regression="true" {
                strong { "Significant regression" }
                ": " (significant) " metric" @if significant != 1 { "s" }
                " dropped by more than the threshold, outside the baseline's 95% interval — "
                code { "keel eval run --baseline" } " would exit 1."
            }
        } @else {
            div class="verdict ok" id="verdict" data-regression="false" {
                strong { "No significant regression" }
                @if noise > 0 { " (" (noise) " drop" @if noise != 1 { "s" } " beyond the threshold but inside the baseline's interval: may be noise)" }
                @if !comparison.improvements.is_empty() { " · " (comparison.improvements.len()) " improvement" @if comparison.improvements.len() != 1 { "s" } }
            }
        }
    }
}

fn delta_class(delta: f64, threshold: f64) -> &'static str {
    if delta < -threshold - 1e-12 {
        "down"
    } else if delta > threshold + 1e-12 {
        "up"
    } else {
        "flat"
    }
}

fn summary_table(comparison: &Comparison) -> Markup {
    html! {
        h2 { "Summary" }
        table class="compare-summary" id="compare-summary" {
            thead { tr { th { "metric" } th class="num" { "baseline" } th class="num" { "this run" } th class="num" { "change" } } }
            tbody {
                @for m in &comparison.summary {
                    tr data-metric=(m.metric) {
                        td { (metric_name(&m.metric)) }
                        td class="num" { (score(m.before)) }
                        td class="num" { (score(m.after)) }
                        td class={ "num delta " (delta_class(m.delta, comparison.threshold)) } { (signed(m.delta)) }
                    }
                }
            }
        }
    }
}

/// Every listed change as a diverging bar: drops to the left in red, rises to the right in
/// green; changes inside the baseline's interval pale.
fn chart(comparison: &Comparison) -> Markup {
    let changes: Vec<(&Change, bool)> = comparison
        .regressions
        .iter()
        .map(|c| (c, true))
        .chain(comparison.improvements.iter().map(|c| (c, false)))
        .collect();
    if changes.is_empty() {
        return html! { p class="empty" id="compare-chart-empty" { "No metric of a scenario moved by more than the threshold." } };
    }
    let (w, row_h, label_w) = (720.0, 22.0, 260.0);
    let mid = label_w + (w - label_w) / 2.0;
    let half = (w - label_w) / 2.0 - 50.0;
    let h = row_h * changes.len() as f64 + 24.0;
    html! {
        h2 { "Changes beyond the threshold" }
        svg id="compare-chart" viewBox=(format!("0 0 {w} {h}")) width="100%" role="img" aria-label="changes against the baseline" {
            line class="grid" x1=(mid) x2=(mid) y1="0" y2=(format!("{:.1}", h - 18.0)) {}
            text x=(mid - half) y=(format!("{:.1}", h - 4.0)) text-anchor="middle" { "−1" }
            text x=(mid) y=(format!("{:.1}", h - 4.0)) text-anchor="middle" { "0" }
            text x=(mid + half) y=(format!("{:.1}", h - 4.0)) text-anchor="middle" { "+1" }
            @for (i, (change, drop)) in changes.iter().enumerate() {
                @let top = 4.0 + row_h * i as f64;
                @let width = (change.delta.abs().min(1.0) * half).max(2.0);
                @let x = if *drop { mid - width } else { mid };
                @let class = if *drop { if change.significant { "change regression" } else { "change regression ns" } } else { "change improvement" };
                g class=(class) data-scenario=(change.scenario) data-metric=(change.metric) data-delta=(format!("{:.6}", change.delta)) data-significant=(change.significant) {
                    text x=(label_w - 6.0) y=(format!("{:.1}", top + 14.0)) text-anchor="end" { (change.scenario) " · " (metric_name(&change.metric)) }
                    rect x=(format!("{x:.1}")) y=(format!("{:.1}", top + 3.0)) width=(format!("{width:.1}")) height="14" rx="2" {
                        title { (change.scenario) " " (metric_name(&change.metric)) ": " (score(change.before)) " → " (score(change.after)) " (" (signed(change.delta)) ")" @if !change.significant { ", inside the baseline's 95% interval" } }
                    }
                    text x=(format!("{:.1}", if *drop { x - 4.0 } else { x + width + 4.0 })) y=(format!("{:.1}", top + 14.0))
                        text-anchor=(if *drop { "end" } else { "start" }) {
                        (signed(change.delta)) @if !change.significant { " n.s." }
                    }
                }
            }
        }
    }
}

/// The change of `metric` in `scenario`, when it is listed.
fn listed<'a>(
    comparison: &'a Comparison,
    scenario: &str,
    metric: &str,
) -> Option<(&'a Change, bool)> {
    comparison
        .regressions
        .iter()
        .map(|c| (c, true))
        .chain(comparison.improvements.iter().map(|c| (c, false)))
        .find(|(c, _)| c.scenario == scenario && c.metric == metric)
}

fn metric_value(s: &ScenarioReport, metric: &str) -> Option<f64> {
    if metric == "pass_rate" {
        return Some(s.pass_rate);
    }
    Dimension::ALL
        .into_iter()
        .find(|d| d.as_str() == metric)
        .and_then(|d| s.dimensions.get(&d))
        .map(|r| r.score)
}

/// Scenario by scenario: the baseline's status and pass rate, this run's, and the change of
/// every metric (highlighted when listed).
fn side_by_side(current: &EvalReport, baseline: &EvalReport, comparison: &Comparison) -> Markup {
    let metrics: Vec<&str> = std::iter::once("pass_rate")
        .chain(
            Dimension::ALL
                .into_iter()
                .filter(|d| {
                    current
                        .scenarios
                        .iter()
                        .chain(&baseline.scenarios)
                        .any(|s| s.dimensions.contains_key(d))
                })
                .map(Dimension::as_str),
        )
        .collect();
    let removed: Vec<&ScenarioReport> = baseline
        .scenarios
        .iter()
        .filter(|s| current.scenario(&s.id).is_none())
        .collect();
    html! {
        h2 { "Scenario by scenario" }
        table class="eval-grid compare-grid" id="compare-grid" {
            thead { tr {
                th { "scenario" } th { "baseline" } th { "this run" }
                @for m in &metrics { th class="num" { "Δ " (metric_name(m)) } }
            } }
            tbody {
                @for s in &current.scenarios {
                    @let before = baseline.scenario(&s.id);
                    @let regressed = comparison.regressions.iter().any(|c| c.scenario == s.id && c.significant);
                    @let improved = comparison.improvements.iter().any(|c| c.scenario == s.id);
                    @let row_class = if before.is_none() { "added" } else if regressed { "regressed" } else if improved { "improved" } else { "same" };
                    tr class=(row_class) data-scenario=(s.id) data-change=(row_class) {
                        td class="mono" { (s.id) }
                        td { @match before {
                            Some(b) => { (status_badge(b.status)) " " (b.trials_passed) "/" (b.trials_run) }
                            None => { span class="muted" { "new scenario" } }
                        } }
                        td { (status_badge(s.status)) " " (s.trials_passed) "/" (s.trials_run) }
                        @for m in &metrics {
                            @match (before.and_then(|b| metric_value(b, m)), metric_value(s, m), listed(comparison, &s.id, m)) {
                                (_, _, Some((change, true))) => {
                                    td class={ "num delta down" @if !change.significant { " ns" } } data-metric=(m)
                                        title=(format!("{} → {}{}", score(change.before), score(change.after), if change.significant { "" } else { " (inside the baseline's 95% interval)" })) {
                                        (signed(change.delta)) @if !change.significant { " n.s." }
                                    }
                                }
                                (_, _, Some((change, false))) => {
                                    td class="num delta up" data-metric=(m) title=(format!("{} → {}", score(change.before), score(change.after))) { (signed(change.delta)) }
                                }
                                (Some(b), Some(a), None) => {
                                    td class="num delta flat" data-metric=(m) { (signed(a - b)) }
                                }
                                _ => { td class="num muted" { "—" } }
                            }
                        }
                    }
                }
                @for s in &removed {
                    tr class="removed" data-scenario=(s.id) data-change="removed" {
                        td class="mono" { (s.id) }
                        td { (status_badge(s.status)) " " (s.trials_passed) "/" (s.trials_run) }
                        td { span class="muted" { "not in this run" } }
                        @for _ in &metrics { td class="num muted" { "—" } }
                    }
                }
            }
        }
    }
}

fn change_rows(changes: &[Change]) -> Markup {
    html! {
        table class="changes" {
            thead { tr { th { "scenario" } th { "metric" } th class="num" { "baseline" } th class="num" { "this run" } th class="num" { "change" } th { "significant" } } }
            tbody {
                @for c in changes {
                    tr class=[(!c.significant).then_some("ns")] data-scenario=(c.scenario) data-metric=(c.metric) {
                        td class="mono" { (c.scenario) }
                        td { (metric_name(&c.metric)) }
                        td class="num" { (score(c.before)) }
                        td class="num" { (score(c.after)) }
                        td class="num" { (signed(c.delta)) }
                        td { @if c.significant { "yes" } @else { "no — inside the baseline's 95% interval" } }
                    }
                }
            }
        }
    }
}

fn changes_lists(comparison: &Comparison) -> Markup {
    html! {
        @if !comparison.regressions.is_empty() {
            h2 class="err-text" { "Regressions (" (comparison.regressions.len()) ")" }
            div id="regressions" class="changes-list regressions" { (change_rows(&comparison.regressions)) }
        }
        @if !comparison.improvements.is_empty() {
            h2 class="ok-text" { "Improvements (" (comparison.improvements.len()) ")" }
            div id="improvements" class="changes-list improvements" { (change_rows(&comparison.improvements)) }
        }
        @if !comparison.added.is_empty() {
            p id="added" { "Scenarios new in this run: " @for (i, s) in comparison.added.iter().enumerate() { @if i > 0 { ", " } code { (s) } } }
        }
        @if !comparison.removed.is_empty() {
            p id="removed" { "Scenarios of the baseline missing here: " @for (i, s) in comparison.removed.iter().enumerate() { @if i > 0 { ", " } code { (s) } } }
        }
    }
}
