//! The JSON report's shape, field by field.

use keel_eval::JudgeError;
use keel_eval::{
    EvalReport, ReportOptions, RunTrace, ScenarioStatus, ScenarioTrials, Suite, Trial, apply_judge,
    compare, score_scenario,
};

use crate::common::{Log, detective_run};

pub const SUITE: &str = r#"
[suite]
name = "mini"
agent = "detective"
trials = 2

[[scenarios]]
id = "high_risk"
input = "Assess release v2.1.0"
[scenarios.expect.tool_usage]
required = ["get_release"]
[scenarios.expect.robustness]
end_state = "done"

[[scenarios]]
id = "judged"
input = "Assess v3"
[scenarios.expect.decision_quality]
required_facts = ["coverage"]
rubric = "cites tests"
"#;

fn trial(suite: &Suite, index: usize, events: &[keel_core::Event], n: usize) -> Trial {
    let trace = RunTrace::from_events(events);
    Trial {
        thread_id: format!("thread-{index}-{n}"),
        trace_id: trace.trace_id.clone(),
        score: score_scenario(&suite.scenarios[index], &trace, &suite.suite.thresholds),
        facts: keel_eval::TrialFacts::default(),
    }
}

pub fn report() -> EvalReport {
    let suite = Suite::parse(SUITE, "mini.toml").unwrap();
    let mut failing = Log::new();
    failing
        .start("go")
        .answer("no idea", &[])
        .end(keel_core::EndState::Done, None);
    let high = ScenarioTrials {
        id: "high_risk".into(),
        trials: vec![
            trial(&suite, 0, &detective_run(), 0),
            trial(&suite, 0, &failing.events, 1),
        ],
    };
    let mut judged = trial(&suite, 1, &detective_run(), 0);
    apply_judge(
        &mut judged.score,
        Err(JudgeError("model unavailable".into())),
        &suite.suite.thresholds,
    );
    let judged = ScenarioTrials {
        id: "judged".into(),
        trials: vec![judged, trial(&suite, 1, &detective_run(), 1)],
    };
    EvalReport::build(
        &suite.suite.name,
        &ReportOptions::from_suite(&suite),
        &[high, judged],
    )
}

#[test]
fn report_has_the_seed_shape() {
    let report = report();
    assert_eq!(
        report.scenario("high_risk").unwrap().status,
        ScenarioStatus::Flaky
    );
    assert_eq!(
        report.scenario("judged").unwrap().status,
        ScenarioStatus::JudgeError
    );
    let json = serde_json::to_value(&report).unwrap();
    let summary = &json["summary"];
    assert_eq!(summary["pass_rate"], 0.0);
    assert_eq!(summary["total_scenarios"], 2);
    assert_eq!(summary["flaky"], 1);
    assert_eq!(summary["judge_errors"], 1);
    assert_eq!(summary["avg_scores"]["tool_usage"], 0.5);
    assert_eq!(summary["avg_scores"]["robustness"], 1.0);
    assert_eq!(summary["avg_scores"]["decision_quality"], 1.0);
    let s = &json["scenarios"][0];
    assert_eq!(s["id"], "high_risk");
    assert_eq!(s["status"], "flaky");
    assert_eq!(s["scores"]["tool_usage"], 0.5);
    assert_eq!(s["pass_rate"], 0.5);
    assert_eq!(s["ci95"].as_array().unwrap().len(), 2);
    assert_eq!(s["k"], 2);
    assert_eq!(s["pass_at_k"], 1.0);
    assert_eq!(s["pass_pow_k"], 0.0);
    assert_eq!(s["flaky"], true);
    let t = &s["trials"][1];
    assert_eq!(t["thread_id"], "thread-0-1");
    assert_eq!(t["trace_id"], format!("{:032x}", 1));
    assert_eq!(t["status"], "failed");
    assert_eq!(t["scores"]["tool_usage"], 0.0);
    assert_eq!(t["checks"][0]["dimension"], "tool_usage");
    assert_eq!(
        t["checks"][0]["reason"],
        "required tool `get_release` never called"
    );
    assert_eq!(json["scenarios"][1]["trials"][0]["status"], "judge_error");
    assert_eq!(
        json["scenarios"][1]["trials"][0]["judge_error"],
        "judge failed: model unavailable"
    );
    assert_eq!(
        json["regression_analysis"]["regressions"],
        serde_json::json!([])
    );
    assert_eq!(
        json["regression_analysis"]["improvements"],
        serde_json::json!([])
    );
    // Round-trips (a stored baseline is read back).
    let back: EvalReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[test]
fn report_json_snapshot() {
    let mut report = report();
    let comparison = compare(&report, &report.clone(), 0.05);
    report.attach(&comparison);
    insta::assert_json_snapshot!(report);
}
