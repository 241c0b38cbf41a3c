//! Scoring traces against scenarios: every check kind passing and failing, with reasons.

use keel_core::{EndState, EventKind, ToolErrorCode};
use keel_eval::score::Dimension;
use keel_eval::{
    JudgeError, JudgeVerdict, RunTrace, Scenario, Suite, TraceEnd, TrialScore, TrialStatus,
    apply_judge, score_scenario,
};
use serde_json::json;

use crate::common::{Log, detective_run};

const DETECTIVE: &str = r#"
[suite]
name = "detective"
agent = "detective"
trials = 3

[[scenarios]]
id = "high_risk"
input = "Assess release v2.1.0"
setup = { release = "v2.1.0", fail_tool = "get_test_results", fail_with = "500" }

[scenarios.expect.tool_usage]
required = ["get_release", "get_test_results", "file_risk_report"]
forbidden = ["delete_release"]
order = [["get_release", "file_risk_report"]]
max_calls = 3
recovered_from_error = true

[[scenarios.expect.tool_usage.arguments]]
tool = "file_risk_report"
pointer = "/severity"
equals = "high"

[scenarios.expect.decision_quality]
ground_truth = [{ source = "tool:file_risk_report", pointer = "/severity", equals = "high" }]
required_facts = [["coverage dropped", "coverage fell"], { regex = "(?i)flaky" }, "rollback plan"]
forbidden_claims = ["all tests passed"]
rubric = "The report cites the failing tests by name."

[scenarios.expect.robustness]
end_state = "done"
error_reported = ["could not fetch", "unavailable"]
"#;

fn suite() -> Suite {
    Suite::parse(DETECTIVE, "suites/detective.toml").unwrap()
}

fn score(scenario: &Scenario, events: &[keel_core::Event]) -> TrialScore {
    score_scenario(
        scenario,
        &RunTrace::from_events(events),
        &suite().suite.thresholds,
    )
}

/// A scenario from `[expect]` TOML alone.
fn scenario(expect: &str) -> Scenario {
    let text = format!(
        "[suite]\nname = \"t\"\nagent = \"a\"\n[[scenarios]]\nid = \"s\"\ninput = \"go\"\n{expect}"
    );
    let suite = Suite::parse(&text, "t.toml").unwrap_or_else(|d| panic!("{d:#?}"));
    suite.scenarios[0].clone()
}

fn reasons(score: &TrialScore) -> Vec<(String, bool, String)> {
    score
        .checks
        .iter()
        .map(|c| (c.check.clone(), c.passed, c.reason.clone()))
        .collect()
}

fn only(score: &TrialScore) -> (bool, String) {
    assert_eq!(score.checks.len(), 1, "{:#?}", score.checks);
    (score.checks[0].passed, score.checks[0].reason.clone())
}

#[test]
fn trace_reads_the_detective_run() {
    let trace = RunTrace::from_events(&detective_run());
    assert_eq!(trace.thread_id, "thread-1");
    assert_eq!(trace.trace_id, format!("{:032x}", 1));
    let names: Vec<_> = trace.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "get_release",
            "get_test_results",
            "get_test_results",
            "file_risk_report"
        ]
    );
    assert!(trace.tool_calls[1].failed());
    assert_eq!(trace.tool_calls[3].arguments["severity"], "high");
    assert_eq!(trace.end, TraceEnd::Ended(EndState::Done));
    assert!(trace.answer().starts_with("Release v2.1.0 is HIGH risk"));
    assert_eq!(trace.model_calls, 5);
    assert_eq!(trace.usage.input_tokens, 500);
    assert!((trace.cost_usd.unwrap() - 0.005).abs() < 1e-12);
    assert!(trace.tool_result_texts().any(|t| t.contains("HTTP 500")));
}

#[test]
fn detective_run_scores_exactly() {
    let suite = suite();
    let s = score(&suite.scenarios[0], &detective_run());
    let tu = s.dimensions[&Dimension::ToolUsage];
    assert_eq!((tu.passed, tu.total), (7, 8));
    assert!((tu.score - 0.875).abs() < 1e-12);
    assert!(!tu.met);
    let dq = s.dimensions[&Dimension::DecisionQuality];
    assert_eq!((dq.passed, dq.total), (4, 5));
    assert!((dq.score - 0.8).abs() < 1e-12);
    assert!(dq.met, "0.8 meets the default 0.8 threshold");
    let rb = s.dimensions[&Dimension::Robustness];
    assert_eq!((rb.passed, rb.total, rb.met), (2, 2, true));
    assert_eq!(s.status, TrialStatus::Failed);
    let expected: Vec<(String, bool, String)> = [
        ("required", true, "`get_release` called (1×)"),
        ("required", true, "`get_test_results` called (2×)"),
        ("required", true, "`file_risk_report` called (1×)"),
        ("forbidden", true, "`delete_release` not called"),
        (
            "order",
            true,
            "`get_release` before `file_risk_report`, as expected",
        ),
        ("max_calls", false, "4 tool calls, more than the 3 allowed"),
        (
            "recovered_from_error",
            true,
            "1 failed call(s); the run still ended `done` with an answer",
        ),
        (
            "argument",
            true,
            "`file_risk_report` argument `/severity` equals \"high\" in all 1 call(s)",
        ),
        (
            "ground_truth",
            true,
            "ground truth `/severity` equals \"high\" (in `tool:file_risk_report`)",
        ),
        (
            "required_fact",
            true,
            "fact 1 of 3 stated: [\"coverage dropped\", \"coverage fell\"]",
        ),
        ("required_fact", true, "fact 2 of 3 stated: /(?i)flaky/"),
        (
            "required_fact",
            false,
            "fact 3 of 3 missing: none of \"rollback plan\" in the answer",
        ),
        ("forbidden_claim", true, "no claim \"all tests passed\""),
        ("end_state", true, "ended `done`"),
        (
            "error_reported",
            true,
            "the answer reports the failure ([\"could not fetch\", \"unavailable\"])",
        ),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.to_string(), b, c.to_string()))
    .collect();
    assert_eq!(reasons(&s), expected);
}

#[test]
fn a_dimension_without_checks_is_absent() {
    let s = score(
        &scenario("[scenarios.expect.robustness]\nend_state = \"done\"\n"),
        &detective_run(),
    );
    assert_eq!(
        s.dimensions.keys().copied().collect::<Vec<_>>(),
        [Dimension::Robustness]
    );
    assert_eq!(s.status, TrialStatus::Passed);
    let none = score(&scenario(""), &detective_run());
    assert!(none.dimensions.is_empty());
}

#[test]
fn order_fails_with_the_offending_pair() {
    let s = score(
        &scenario(
            "[scenarios.expect.tool_usage]\norder = [[\"file_risk_report\", \"get_release\"]]\n",
        ),
        &detective_run(),
    );
    assert_eq!(
        only(&s),
        (
            false,
            "`get_release` called before `file_risk_report`".into()
        )
    );
    let s = score(
        &scenario("[scenarios.expect.tool_usage]\norder = [[\"get_release\", \"notify\"]]\n"),
        &detective_run(),
    );
    assert_eq!(
        only(&s),
        (
            false,
            "`get_release` before `notify`: `notify` never called".into()
        )
    );
}

#[test]
fn required_and_forbidden_fail() {
    let s = score(
        &scenario(
            "[scenarios.expect.tool_usage]\nrequired = [\"notify\"]\nforbidden = [\"get_release\"]\n",
        ),
        &detective_run(),
    );
    let r = reasons(&s);
    assert_eq!(
        r[0],
        (
            "required".into(),
            false,
            "required tool `notify` never called".into()
        )
    );
    assert_eq!(
        r[1],
        (
            "forbidden".into(),
            false,
            "forbidden tool `get_release` called (1×)".into()
        )
    );
    assert_eq!(s.score(Dimension::ToolUsage), Some(0.0));
}

#[test]
fn max_calls_passes_at_the_limit() {
    let s = score(
        &scenario("[scenarios.expect.tool_usage]\nmax_calls = 4\n"),
        &detective_run(),
    );
    assert_eq!(only(&s), (true, "4 tool calls (at most 4)".into()));
}

#[test]
fn argument_predicates_pass_and_fail() {
    let case = |pred: &str| {
        let s = score(
            &scenario(&format!(
                "[[scenarios.expect.tool_usage.arguments]]\ntool = \"file_risk_report\"\npointer = \"/severity\"\n{pred}\n"
            )),
            &detective_run(),
        );
        only(&s)
    };
    assert!(case("matches = \"^(high|critical)$\"").0);
    assert_eq!(
        case("matches = \"^low$\""),
        (
            false,
            "`file_risk_report` argument `/severity`: call 1: \"high\" does not match /^low$/"
                .into()
        )
    );
    assert!(case("in = [\"high\", \"critical\"]").0);
    assert_eq!(
        case("in = [\"low\", \"medium\"]"),
        (
            false,
            "`file_risk_report` argument `/severity`: call 1: \"high\" not in [\"low\",\"medium\"]"
                .into()
        )
    );
    assert_eq!(
        case("equals = \"low\""),
        (
            false,
            "`file_risk_report` argument `/severity`: call 1: expected \"low\", got \"high\""
                .into()
        )
    );
    let s = score(
        &scenario(
            "[[scenarios.expect.tool_usage.arguments]]\ntool = \"get_release\"\npointer = \"/nope\"\nequals = 1\n",
        ),
        &detective_run(),
    );
    assert_eq!(
        only(&s),
        (
            false,
            "`get_release` argument `/nope`: call 1 has no `/nope`".into()
        )
    );
}

#[test]
fn recovered_from_error_needs_an_error_and_a_recovery() {
    let expect = "[scenarios.expect.tool_usage]\nrecovered_from_error = true\n";
    // No failure at all.
    let mut log = Log::new();
    log.start("go")
        .answer("", &[("c1", "get_release", json!({}))])
        .ok("c1", "get_release", json!({}))
        .answer("fine", &[])
        .end(EndState::Done, Some("fine"));
    assert_eq!(
        only(&score(&scenario(expect), &log.events)),
        (
            false,
            "no tool call failed, so there was no error to recover from".into()
        )
    );
    // A failure, never retried, and the run failed.
    let mut log = Log::new();
    log.start("go")
        .answer("", &[("c1", "get_test_results", json!({}))])
        .fail(
            "c1",
            "get_test_results",
            ToolErrorCode::RetryableServer,
            "HTTP 500",
        )
        .end(EndState::Failed, None);
    assert_eq!(
        only(&score(&scenario(expect), &log.events)),
        (
            false,
            "`get_test_results` failed and was never called successfully afterwards, and the run \
             ended `failed` without an answer"
                .into()
        )
    );
    // Retried successfully but the run then stopped on its budget: still recovered.
    let mut log = Log::new();
    log.start("go")
        .answer("", &[("c1", "get_test_results", json!({}))])
        .fail("c1", "get_test_results", ToolErrorCode::Timeout, "slow")
        .answer("", &[("c2", "get_test_results", json!({}))])
        .ok("c2", "get_test_results", json!({}))
        .end(EndState::BudgetExceeded, None);
    assert_eq!(
        only(&score(&scenario(expect), &log.events)),
        (
            true,
            "1 failed call(s), each later retried successfully".into()
        )
    );
}

fn answering(text: &str) -> Vec<keel_core::Event> {
    let mut log = Log::new();
    log.start("go")
        .answer("", &[("c1", "get_test_results", json!({}))])
        .ok(
            "c1",
            "get_test_results",
            json!({"summary": "all tests passed on main"}),
        )
        .answer(text, &[])
        .end(EndState::Done, None);
    log.events
}

#[test]
fn ground_truth_on_the_output() {
    let expect = "[scenarios.expect.decision_quality]\nground_truth = [{ source = \"output\", pointer = \"/severity\", in = [\"high\", \"critical\"] }]\n";
    let ok = score(
        &scenario(expect),
        &answering("```json\n{\"severity\": \"critical\"}\n```"),
    );
    assert_eq!(
        only(&ok),
        (
            true,
            "ground truth `/severity` in [\"high\",\"critical\"] (in `output`)".into()
        )
    );
    let bad = score(&scenario(expect), &answering("{\"severity\": \"low\"}"));
    assert_eq!(
        only(&bad),
        (false, "ground truth `/severity` in [\"high\",\"critical\"] (in `output`): \"low\" not in [\"high\",\"critical\"]".into())
    );
    let prose = score(&scenario(expect), &answering("It is high."));
    assert_eq!(
        only(&prose),
        (
            false,
            "ground truth `/severity` in [\"high\",\"critical\"]: the final answer is not JSON"
                .into()
        )
    );
}

#[test]
fn ground_truth_on_a_tool_that_was_not_called() {
    let expect = "[scenarios.expect.decision_quality]\nground_truth = [{ source = \"tool:file_risk_report\", pointer = \"/severity\", equals = \"high\" }]\n";
    let s = score(&scenario(expect), &answering("done"));
    assert_eq!(
        only(&s),
        (
            false,
            "ground truth `/severity` equals \"high\": `file_risk_report` never called".into()
        )
    );
}

#[test]
fn facts_match_any_phrasing_case_insensitively_or_a_regex() {
    let expect = "[scenarios.expect.decision_quality]\nrequired_facts = [[\"coverage dropped\", \"coverage fell\"], { regex = \"\\\\btest_\\\\w+\" }]\n";
    let s = score(
        &scenario(expect),
        &answering("Coverage FELL; see test_checkout."),
    );
    assert_eq!(s.score(Dimension::DecisionQuality), Some(1.0));
    let s = score(&scenario(expect), &answering("Nothing to see."));
    assert_eq!(
        reasons(&s)[1],
        (
            "required_fact".into(),
            false,
            "fact 2 of 2 missing: none of /\\btest_\\w+/ in the answer".into()
        )
    );
}

#[test]
fn forbidden_claims_are_hallucinations_only_without_support() {
    let supported =
        "[scenarios.expect.decision_quality]\nforbidden_claims = [\"all tests passed\"]\n";
    let s = score(&scenario(supported), &answering("All tests passed."));
    assert_eq!(
        only(&s),
        (
            true,
            "claim \"all tests passed\" is in the answer but a tool result supports it".into()
        )
    );
    let unsupported =
        "[scenarios.expect.decision_quality]\nforbidden_claims = [[\"no risk\", \"zero risk\"]]\n";
    let s = score(&scenario(unsupported), &answering("There is zero risk."));
    assert_eq!(
        only(&s),
        (false, "hallucination: the answer claims [\"no risk\", \"zero risk\"], which no tool result supports".into())
    );
}

#[test]
fn end_state_and_error_reported() {
    let expect = "[scenarios.expect.robustness]\nend_state = \"failed\"\nerror_reported = [\"could not fetch\"]\nfinal_answer = true\n";
    let s = score(&scenario(expect), &answering("Done, everything is fine."));
    assert_eq!(
        reasons(&s),
        vec![
            (
                "end_state".into(),
                false,
                "expected end state `failed`, got `done`".into()
            ),
            (
                "error_reported".into(),
                false,
                "the answer does not report the failure: none of [\"could not fetch\"] in it"
                    .into()
            ),
            (
                "final_answer".into(),
                true,
                "the run produced a final answer".into()
            ),
        ]
    );
    assert_eq!(s.status, TrialStatus::Failed);
    let s = score(&scenario(expect), &{
        let mut log = Log::new();
        log.start("go")
            .answer("I COULD NOT FETCH the results.", &[])
            .end(EndState::Failed, None);
        log.events
    });
    assert_eq!(s.score(Dimension::Robustness), Some(1.0));
}

#[test]
fn paused_runs_have_a_pause_end_state() {
    let mut log = Log::new();
    log.start("go")
        .answer("", &[("c1", "delete_release", json!({}))])
        .push(EventKind::ApprovalRequested {
            call_id: "c1".into(),
            name: "delete_release".into(),
            arguments: "{}".into(),
        });
    let trace = RunTrace::from_events(&log.events);
    assert_eq!(trace.end, TraceEnd::AwaitingApproval);
    let s = score(
        &scenario("[scenarios.expect.robustness]\nend_state = \"paused\"\n"),
        &log.events,
    );
    assert_eq!(only(&s), (true, "ended `awaiting_approval`".into()));
    let s = score(
        &scenario("[scenarios.expect.robustness]\nend_state = \"done\"\n"),
        &log.events,
    );
    assert_eq!(
        only(&s),
        (
            false,
            "expected end state `done`, got `awaiting_approval`".into()
        )
    );
}

#[test]
fn a_judge_error_is_never_passed_and_a_verdict_counts_in_decision_quality() {
    let thresholds = suite().suite.thresholds;
    let sc = scenario(
        "[scenarios.expect.decision_quality]\nrequired_facts = [\"fine\"]\nrubric = \"be nice\"\n",
    );
    let trace = RunTrace::from_events(&answering("fine"));
    let mut s = score_scenario(&sc, &trace, &thresholds);
    assert_eq!(s.status, TrialStatus::Passed);
    apply_judge(&mut s, Err(JudgeError("timeout".into())), &thresholds);
    assert_eq!(s.status, TrialStatus::JudgeError);
    let mut s = score_scenario(&sc, &trace, &thresholds);
    apply_judge(
        &mut s,
        Ok(JudgeVerdict {
            score: 0.4,
            rationale: "terse".into(),
        }),
        &thresholds,
    );
    assert_eq!(s.score(Dimension::DecisionQuality), Some(0.7));
    assert_eq!(s.status, TrialStatus::Failed);
}
