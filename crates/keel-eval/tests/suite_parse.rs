//! Suite files: a valid suite round-trips; every problem is a located diagnostic.

use keel_config::{Diagnostic, DiagnosticCode};
use keel_eval::Suite;

const VALID: &str = r#"
[suite]
name = "detective"
agent = "detective"
models = ["anthropic:claude-sonnet-4-5"]
trials = 3
concurrency = 4

[suite.thresholds]
decision_quality = 0.75

[[scenarios]]
id = "high_risk"
input = "Assess release v2.1.0"
setup = { release = "v2.1.0", fail_tool = "get_test_results", fail_with = "500" }

[scenarios.expect.tool_usage]
required = ["get_release", "get_test_results"]
forbidden = ["delete_release"]
order = [["get_release", "file_risk_report"]]
max_calls = 12
recovered_from_error = true

[[scenarios.expect.tool_usage.arguments]]
tool = "file_risk_report"
pointer = "/severity"
in = ["high", "critical"]

[scenarios.expect.decision_quality]
ground_truth = [{ source = "output", pointer = "/severity", equals = "high" }]
required_facts = [["coverage dropped", "coverage fell"], { regex = "(?i)flaky" }]
forbidden_claims = ["all tests passed"]
rubric = "The report cites the failing tests by name."

[scenarios.expect.robustness]
end_state = "done"
error_reported = ["could not fetch", "unavailable"]

[[scenarios]]
id = "low_risk"
input = "Assess release v1.0.1"
"#;

fn errors(text: &str) -> Vec<Diagnostic> {
    match Suite::parse(text, "suites/x.toml") {
        Ok(_) => panic!("expected diagnostics"),
        Err(d) => d,
    }
}

fn find<'a>(diagnostics: &'a [Diagnostic], key: &str) -> &'a Diagnostic {
    diagnostics
        .iter()
        .find(|d| d.key.as_deref() == Some(key))
        .unwrap_or_else(|| panic!("no diagnostic for {key}: {diagnostics:#?}"))
}

#[test]
fn a_valid_suite_parses_and_round_trips() {
    let suite = Suite::parse(VALID, "suites/detective.toml").unwrap();
    assert_eq!(suite.suite.trials, 3);
    assert_eq!(suite.k(), 3);
    assert_eq!(suite.suite.thresholds.decision_quality, 0.75);
    assert_eq!(suite.suite.thresholds.tool_usage, 1.0);
    assert_eq!(suite.suite.min_pass_rate, 1.0);
    assert_eq!(suite.scenarios.len(), 2);
    assert_eq!(
        suite.scenarios[0].setup.as_ref().unwrap()["fail_with"],
        "500"
    );
    let text = toml::to_string(&suite).unwrap();
    let again = Suite::parse(&text, "again.toml").unwrap_or_else(|d| panic!("{text}\n{d:#?}"));
    assert_eq!(again.suite, suite.suite);
    assert_eq!(again.scenarios, suite.scenarios);
}

#[test]
fn an_unknown_key_is_located_with_a_suggestion() {
    let text = VALID.replace(
        "forbidden = [\"delete_release\"]",
        "forbiden = [\"delete_release\"]",
    );
    let d = errors(&text);
    let d = find(&d, "scenarios[0].expect.tool_usage.forbiden");
    assert_eq!(d.code, DiagnosticCode::UnknownKey);
    assert_eq!(d.file, "suites/x.toml");
    assert_eq!((d.line, d.column), (Some(19), Some(1)));
    assert!(
        d.message.contains("did you mean `forbidden`?"),
        "{}",
        d.message
    );
}

#[test]
fn a_missing_input_is_located() {
    let text = VALID.replace("input = \"Assess release v1.0.1\"\n", "");
    let d = errors(&text);
    let d = find(&d, "scenarios[1]");
    assert_eq!(d.code, DiagnosticCode::MissingKey);
    assert!(
        d.message.contains("missing required key `input`"),
        "{}",
        d.message
    );
    assert_eq!(d.file, "suites/x.toml");
    assert!(d.line.is_some() && d.column.is_some(), "{d:?}");
}

#[test]
fn a_bad_regex_names_the_field() {
    let text = VALID.replace("(?i)flaky", "(unclosed");
    let d = errors(&text);
    let d = find(
        &d,
        "scenarios[0].expect.decision_quality.required_facts[1].regex",
    );
    assert_eq!(d.code, DiagnosticCode::InvalidValue);
    assert_eq!((d.line, d.column), (Some(31), Some(60)));
    assert!(d.message.contains("is not a valid regex"), "{}", d.message);
}

#[test]
fn duplicate_ids_are_located() {
    let text = VALID.replace("id = \"low_risk\"", "id = \"high_risk\"");
    let d = errors(&text);
    let d = find(&d, "scenarios[1].id");
    assert_eq!((d.line, d.column), (Some(40), Some(1)));
    assert_eq!(
        d.render(),
        "suites/x.toml:40:1: error: duplicate scenario id `high_risk` (also `scenarios[0].id`): ids \
         must be unique"
    );
}

#[test]
fn semantic_problems_are_all_reported() {
    let text = VALID
        .replace("trials = 3", "trials = 0")
        .replace("decision_quality = 0.75", "decision_quality = 1.5")
        .replace(
            "in = [\"high\", \"critical\"]",
            "in = [\"high\"]\nequals = \"high\"",
        )
        .replace("source = \"output\"", "source = \"tools:x\"");
    let d = errors(&text);
    assert!(find(&d, "suite.trials").message.contains("at least 1"));
    assert!(
        find(&d, "suite.thresholds.decision_quality")
            .message
            .contains("between 0 and 1, got 1.5")
    );
    assert!(
        find(&d, "scenarios[0].expect.tool_usage.arguments[0]")
            .message
            .contains("exactly one of")
    );
    assert!(
        find(
            &d,
            "scenarios[0].expect.decision_quality.ground_truth[0].source"
        )
        .message
        .contains("`tool:NAME`")
    );
    // Sorted by position.
    let lines: Vec<_> = d.iter().map(|d| d.line.unwrap()).collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted);
}

#[test]
fn an_empty_suite_and_a_missing_agent_are_errors() {
    let d = errors("[suite]\nname = \"x\"\n");
    assert!(
        d.iter().any(|d| d.message.contains("no scenarios")),
        "{d:#?}"
    );
    assert!(
        d.iter()
            .any(|d| d.message.contains("missing `suite.agent`")),
        "{d:#?}"
    );
    assert!(d.iter().all(|d| d.line == Some(1)), "{d:#?}");
}

#[test]
fn unknown_tools_are_reported_against_the_catalog() {
    let suite = Suite::parse(VALID, "suites/detective.toml").unwrap();
    let d = suite.check_tools(&[
        "get_release",
        "get_test_results",
        "file_risk_report",
        "delete_releases",
    ]);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(
        d[0].key.as_deref(),
        Some("scenarios[0].expect.tool_usage.forbidden[0]")
    );
    assert_eq!((d[0].line, d[0].column), (Some(19), Some(14)));
    assert!(
        d[0].message.contains("did you mean `delete_releases`?"),
        "{}",
        d[0].message
    );
}

#[test]
fn a_rubric_is_located_in_the_suite_file() {
    let suite = Suite::parse(VALID, "suites/detective.toml").unwrap();
    assert_eq!(
        suite.rubric_location("high_risk"),
        "suites/detective.toml:33:1"
    );
    // A scenario without a rubric points at the scenario.
    let low = suite.rubric_location("low_risk");
    let line: usize = low.split(':').nth(1).unwrap().parse().unwrap();
    assert!((38..=41).contains(&line), "{low}");
}
