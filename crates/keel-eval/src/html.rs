//! The self-contained HTML report: one file that opens in any browser with no network —
//! inline CSS, a few lines of inline JavaScript (the "failing only" filter) and SVG charts:
//! the average score of each dimension, a pass/fail grid of every scenario's trials, the
//! changes against a baseline when the report carries a comparison, and per scenario its
//! scores, confidence intervals and every trial's checks with a link to the trial's trace.
//!
//! Markup is built with `maud`, which escapes every interpolated string, so scenario ids,
//! model output and check reasons can hold any text.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::compare::Change;
use crate::report::{EvalReport, ScenarioReport, ScenarioStatus, TrialReport};
use crate::score::{Dimension, TrialStatus};

/// How the HTML report links and labels what lies outside it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HtmlOptions {
    /// A URL template for a trial's trace, with `{trace_id}` and `{thread_id}` replaced
    /// (e.g. a trace viewer's address). Without one, each trial names the command that
    /// shows its events.
    pub trace_url: Option<String>,
    /// A line under the title (e.g. when and with which model the suite ran).
    pub subtitle: Option<String>,
}

const STYLE: &str = r#"
:root { --pass:#1a7f37; --fail:#cf222e; --flaky:#bf8700; --judge:#8250df; --muted:#57606a;
        --line:#d0d7de; --bg:#ffffff; --panel:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1f2328; background: var(--bg); }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 0; }
.sub { color: var(--muted); margin: 0 0 16px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
        padding: 10px 14px; min-width: 120px; }
.card b { display: block; font-size: 20px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; color: #fff;
         font-size: 12px; font-weight: 600; }
.passed { background: var(--pass); } .failed { background: var(--fail); }
.flaky { background: var(--flaky); } .judge_error { background: var(--judge); }
table { border-collapse: collapse; width: 100%; margin: 6px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
section.scenario { border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px;
                   margin: 12px 0; }
.scenario header { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; }
.check-fail { color: var(--fail); } .check-pass { color: var(--pass); }
.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
.trial { margin: 8px 0 0 0; padding: 6px 10px; background: var(--panel); border-radius: 6px; }
.hidden { display: none; }
svg text { font: 12px system-ui, sans-serif; fill: #1f2328; }
label.filter { display: inline-block; margin: 8px 0; }
"#;

/// Renders `report` as one self-contained HTML document.
pub fn render_html(report: &EvalReport, options: &HtmlOptions) -> String {
    let summary = &report.summary;
    let document: Markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "keel eval — " (report.suite) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                main {
                    h1 { "Evaluation: " (report.suite) }
                    @if let Some(subtitle) = &options.subtitle {
                        p.sub { (subtitle) }
                    }
                    div.cards {
                        div.card { "pass rate" b #pass-rate { (percent(summary.pass_rate)) } }
                        div.card { "scenarios" b { (summary.total_scenarios) } }
                        div.card { "passed" b { (summary.passed) } }
                        div.card { "failed" b { (summary.failed) } }
                        div.card { "flaky" b { (summary.flaky) } }
                        div.card { "judge errors" b { (summary.judge_errors) } }
                    }
                    h2 { "Average score per dimension" }
                    (dimension_chart(report))
                    h2 { "Trials" }
                    p.sub { "One square per trial; select one to see its checks." }
                    (trial_grid(report))
                    h2 { "Against the baseline" }
                    (baseline_chart(&report.regression_analysis.regressions,
                                    &report.regression_analysis.improvements))
                    h2 { "Scenarios" }
                    label.filter {
                        input #only-failing type="checkbox";
                        " only scenarios that did not pass"
                    }
                    @for (index, scenario) in report.scenarios.iter().enumerate() {
                        (scenario_section(index, scenario, options))
                    }
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    };
    document.into_string()
}

/// Hides passed scenarios while the box is ticked.
const SCRIPT: &str = r#"
(function () {
  var box = document.getElementById('only-failing');
  if (!box) { return; }
  box.addEventListener('change', function () {
    document.querySelectorAll('section.scenario').forEach(function (s) {
      s.classList.toggle('hidden', box.checked && s.dataset.status === 'passed');
    });
  });
})();
"#;

fn percent(value: f64) -> String {
    format!("{:.0}%", value * 100.0)
}

fn status_name(status: ScenarioStatus) -> &'static str {
    match status {
        ScenarioStatus::Passed => "passed",
        ScenarioStatus::Failed => "failed",
        ScenarioStatus::Flaky => "flaky",
        ScenarioStatus::JudgeError => "judge_error",
    }
}

fn trial_status_name(status: TrialStatus) -> &'static str {
    match status {
        TrialStatus::Passed => "passed",
        TrialStatus::Failed => "failed",
        TrialStatus::JudgeError => "judge_error",
    }
}

fn status_color(name: &str) -> &'static str {
    match name {
        "passed" => "#1a7f37",
        "flaky" => "#bf8700",
        "judge_error" => "#8250df",
        _ => "#cf222e",
    }
}

/// Horizontal bars, one per dimension the suite scored, on a 0–100% axis.
fn dimension_chart(report: &EvalReport) -> Markup {
    let rows: Vec<(Dimension, f64)> = report
        .summary
        .avg_scores
        .iter()
        .map(|(d, v)| (*d, v.clamp(0.0, 1.0)))
        .collect();
    if rows.is_empty() {
        return html! { p.sub { "No dimension was scored." } };
    }
    let label_width = 130.0;
    let bar_width = 420.0;
    let row_height = 26.0;
    let height = row_height * rows.len() as f64 + 24.0;
    html! {
        svg #dimension-chart width=(label_width + bar_width + 70.0) height=(height)
            role="img" aria-label="average score per dimension" {
            @for (i, (dimension, value)) in rows.iter().enumerate() {
                @let y = 4.0 + i as f64 * row_height;
                text x="0" y=(y + 15.0) { (dimension.as_str()) }
                rect x=(label_width) y=(y) width=(bar_width) height="18" fill="#eaeef2" {}
                rect x=(label_width) y=(y) width=(bar_width * value) height="18"
                    fill=(if *value >= 0.999 { "#1a7f37" } else if *value >= 0.5 { "#bf8700" } else { "#cf222e" }) {}
                text x=(label_width + bar_width + 8.0) y=(y + 15.0) { (format!("{:.2}", value)) }
            }
            @let axis = 8.0 + row_height * rows.len() as f64;
            @for tick in [0.0_f64, 0.5, 1.0] {
                text x=(label_width + bar_width * tick - 8.0) y=(axis + 8.0) { (percent(tick)) }
            }
        }
    }
}

/// Rows of scenarios, columns of trials: a coloured square per trial linking to its
/// details below.
fn trial_grid(report: &EvalReport) -> Markup {
    let columns = report
        .scenarios
        .iter()
        .map(|s| s.trials.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let label_width = 260.0;
    let cell = 18.0;
    let row_height = 22.0;
    let width = label_width + (cell + 4.0) * columns as f64 + 10.0;
    let height = row_height * report.scenarios.len() as f64 + 6.0;
    html! {
        svg #trial-grid width=(width) height=(height) role="img"
            aria-label="pass/fail grid of every trial" {
            @for (row, scenario) in report.scenarios.iter().enumerate() {
                @let y = 2.0 + row as f64 * row_height;
                a href=(format!("#scenario-{row}")) {
                    text x="0" y=(y + 14.0) data-scenario=(scenario.id) {
                        (clip(&scenario.id, 34))
                    }
                }
                @for (column, trial) in scenario.trials.iter().enumerate() {
                    @let status = trial_status_name(trial.status);
                    a href=(format!("#scenario-{row}-trial-{column}")) {
                        rect x=(label_width + column as f64 * (cell + 4.0)) y=(y) width=(cell)
                            height=(cell) rx="3" fill=(status_color(status))
                            class="trial-cell" data-status=(status) {
                            title { (scenario.id) " trial " (column + 1) ": " (status) }
                        }
                    }
                }
            }
        }
    }
}

/// Diverging bars: each change against the baseline beyond the comparison's threshold.
fn baseline_chart(regressions: &[Change], improvements: &[Change]) -> Markup {
    let changes: Vec<&Change> = regressions.iter().chain(improvements).collect();
    if changes.is_empty() {
        return html! {
            p.sub #no-baseline {
                "No change beyond the threshold against a baseline (or no baseline compared: "
                span.mono { "keel eval compare CURRENT BASELINE --html report.html" } ")."
            }
        };
    }
    let label_width = 330.0;
    let half = 160.0;
    let row_height = 24.0;
    let height = row_height * changes.len() as f64 + 8.0;
    let center = label_width + half;
    html! {
        svg #baseline-chart width=(label_width + 2.0 * half + 80.0) height=(height) role="img"
            aria-label="changes against the baseline" {
            line x1=(center) x2=(center) y1="0" y2=(height) stroke="#8c959f" {}
            @for (i, change) in changes.iter().enumerate() {
                @let y = 4.0 + i as f64 * row_height;
                @let length = change.delta.abs().min(1.0) * half;
                @let x = if change.delta < 0.0 { center - length } else { center };
                @let color = if change.delta < 0.0 {
                    if change.significant { "#cf222e" } else { "#e5a1a6" }
                } else { "#1a7f37" };
                text x="0" y=(y + 14.0) {
                    (clip(&format!("{} · {}", change.scenario, change.metric), 46))
                }
                rect x=(x) y=(y) width=(length.max(1.0)) height="16" fill=(color) {
                    title {
                        (change.scenario) " " (change.metric) ": "
                        (format!("{:.3} → {:.3}", change.before, change.after))
                        @if !change.significant { " (inside the baseline's 95% interval)" }
                    }
                }
                text x=(center + half + 8.0) y=(y + 14.0) {
                    (format!("{:+.2}", change.delta))
                    @if change.delta < 0.0 && !change.significant { " n.s." }
                }
            }
        }
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let kept: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{kept}…")
    }
}

fn scenario_section(index: usize, s: &ScenarioReport, options: &HtmlOptions) -> Markup {
    let status = status_name(s.status);
    html! {
        section.scenario id=(format!("scenario-{index}")) data-status=(status)
            data-scenario=(s.id) {
            header {
                h3 { (s.id) }
                span class=(format!("badge {status}")) { (status) }
                span.sub {
                    (s.trials_passed) "/" (s.trials_run) " trials passed · 95% CI ["
                    (format!("{:.2}, {:.2}", s.ci95.lo, s.ci95.hi)) "]"
                    @if let (Some(at), Some(pow)) = (s.pass_at_k, s.pass_pow_k) {
                        " · pass@" (s.k) " " (format!("{at:.2}"))
                        " · pass^" (s.k) " " (format!("{pow:.2}"))
                    }
                }
            }
            @if !s.dimensions.is_empty() {
                table {
                    tr { th { "dimension" } th { "score" } th { "95% CI" } th { "trials" } }
                    @for (dimension, d) in &s.dimensions {
                        tr {
                            td { (dimension.as_str()) }
                            td { (format!("{:.2}", d.score)) }
                            td { (format!("[{:.2}, {:.2}]", d.ci95.lo, d.ci95.hi)) }
                            td { (d.trials) }
                        }
                    }
                }
            }
            @for (number, trial) in s.trials.iter().enumerate() {
                (trial_details(index, number, trial, options))
            }
        }
    }
}

fn trace_link(trial: &TrialReport, options: &HtmlOptions) -> Markup {
    match &options.trace_url {
        Some(template) => {
            let url = template
                .replace("{trace_id}", &trial.trace_id)
                .replace("{thread_id}", &trial.thread_id);
            html! { a href=(url) { "trace " span.mono { (trial.trace_id) } } }
        }
        None => html! {
            span.mono title="keel threads show THREAD" { "keel threads show " (trial.thread_id) }
            " · "
            span.mono title="keel trace show TRACE" { "keel trace show " (trial.trace_id) }
        },
    }
}

fn trial_details(
    scenario: usize,
    number: usize,
    trial: &TrialReport,
    options: &HtmlOptions,
) -> Markup {
    let status = trial_status_name(trial.status);
    html! {
        div.trial id=(format!("scenario-{scenario}-trial-{number}")) {
            "Trial " (number + 1) " "
            span class=(format!("badge {status}")) { (status) }
            " · " (trace_link(trial, options))
            @if let Some(error) = &trial.error {
                div.check-fail { "run error: " (error) }
            }
            @if let Some(error) = &trial.judge_error {
                div.check-fail { "judge error: " (error) }
            }
            @if !trial.checks.is_empty() {
                table {
                    tr { th { "" } th { "dimension" } th { "check" } th { "reason" } }
                    @for check in &trial.checks {
                        tr class=(if check.passed { "check-pass" } else { "check-fail" }) {
                            td { (if check.passed { "✓" } else { "✗" }) }
                            td { (check.dimension.as_str()) }
                            td.mono { (check.check) }
                            td { (check.reason) }
                        }
                    }
                }
            }
        }
    }
}
