//! Baseline comparison: significant regressions versus noise inside the intervals.

use keel_core::EndState;
use keel_eval::{
    EvalReport, ReportOptions, RunTrace, ScenarioTrials, Suite, Trial, compare, score_scenario,
};

use crate::common::{Log, detective_run};

const SUITE: &str = r#"
[suite]
name = "cmp"
agent = "detective"
trials = 10
[[scenarios]]
id = "high_risk"
input = "Assess release v2.1.0"
[scenarios.expect.tool_usage]
required = ["get_release"]
"#;

/// A report where `passes` of 10 trials pass.
fn report(passes: usize) -> EvalReport {
    let suite = Suite::parse(SUITE, "cmp.toml").unwrap();
    let mut bad = Log::new();
    bad.start("go").answer("no", &[]).end(EndState::Done, None);
    let good = detective_run();
    let trials = (0..10)
        .map(|i| {
            let events = if i < passes { &good } else { &bad.events };
            let trace = RunTrace::from_events(events);
            Trial {
                thread_id: format!("t{i}"),
                trace_id: trace.trace_id.clone(),
                score: score_scenario(&suite.scenarios[0], &trace, &suite.suite.thresholds),
                facts: keel_eval::TrialFacts::default(),
            }
        })
        .collect();
    EvalReport::build(
        "cmp",
        &ReportOptions::from_suite(&suite),
        &[ScenarioTrials {
            id: "high_risk".into(),
            trials,
        }],
    )
}

#[test]
fn a_drop_from_10_to_4_is_a_significant_regression_naming_the_dimension() {
    let c = compare(&report(4), &report(10), 0.05);
    assert!(c.is_regression());
    let metrics: Vec<_> = c
        .regressions
        .iter()
        .map(|r| (r.metric.as_str(), r.significant))
        .collect();
    assert_eq!(metrics, [("pass_rate", true), ("tool_usage", true)]);
    let tu = &c.regressions[1];
    assert_eq!(
        (tu.scenario.as_str(), tu.before, tu.after),
        ("high_risk", 1.0, 0.4)
    );
    assert!((tu.delta + 0.6).abs() < 1e-12);
    assert!(c.improvements.is_empty());
    assert_eq!(c.summary[0].metric, "pass_rate");
    assert_eq!((c.summary[0].before, c.summary[0].after), (1.0, 0.0));
    let mut current = report(4);
    current.attach(&c);
    assert_eq!(current.regression_analysis.regressions.len(), 2);
}

#[test]
fn a_drop_from_10_to_9_is_inside_the_intervals_and_not_a_regression() {
    let c = compare(&report(9), &report(10), 0.05);
    assert_eq!(c.regressions.len(), 2, "the drop is listed");
    assert!(c.regressions.iter().all(|r| !r.significant));
    assert!(!c.is_regression());
}

#[test]
fn rises_are_improvements_and_small_changes_are_ignored() {
    let c = compare(&report(10), &report(4), 0.05);
    assert!(!c.is_regression());
    assert_eq!(c.improvements.len(), 2);
    assert!(c.improvements.iter().all(|i| i.significant));
    let c = compare(&report(10), &report(10), 0.05);
    assert!(c.regressions.is_empty() && c.improvements.is_empty());
}

#[test]
fn added_and_removed_scenarios_are_listed() {
    let mut current = report(10);
    current.scenarios[0].id = "renamed".into();
    let c = compare(&current, &report(10), 0.05);
    assert_eq!(c.added, ["renamed"]);
    assert_eq!(c.removed, ["high_risk"]);
}
