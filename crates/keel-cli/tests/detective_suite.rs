//! The Detective's evaluation suite (`agents/detective/eval/suite.toml`, 22 scenarios) run
//! end to end by `keel eval run` against a scripted model (`tests/fixtures/
//! detective_suite_model.json`, turns in suite order) and a scripted judge: the
//! `release-service` setup hook starts the release service and injects each scenario's
//! faults (500s past the retry policy, a stalled endpoint, malformed JSON, a rejected
//! filing, a 503 on filing absorbed by the idempotent retry). The script answers three
//! scenarios badly on purpose; the test checks the statuses and scores worked out by hand
//! from the suite's checks.
//!
//! The agent file's call rules apply (docs/detective.md, "Guards"): the script files only
//! after both reads of the release succeeded, once per scenario, and every finding quotes
//! a figure, test name or change of that run's tool results — a finding such as "Flaky UI
//! test fails" or "All tests pass; p95 improved" would be refused and shift every later
//! turn of the script. Under malformed test details (v2.5.0) the read still succeeds
//! (the tool returns the cut-off body as text), so the report is filed, citing the failing
//! test named in the part that arrived; where a read never succeeds (v2.7.0-broken, both
//! reads 503) the script files nothing, which the rules would refuse anyway.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::{MockLlm, output_within, workspace_root as repo_root};

/// How long one `keel eval run` may take before the test calls it hung.
const DEADLINE: Duration = Duration::from_secs(600);

fn scenario<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no scenario {id}"))
}

fn score(report: &Value, id: &str, dimension: &str) -> f64 {
    scenario(report, id)["scores"][dimension]
        .as_f64()
        .unwrap_or_else(|| panic!("{id} has no {dimension} score"))
}

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() < 1e-9
}

#[test]
fn the_detective_suite_scores_a_scripted_model_as_computed_by_hand() {
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    // The suite as shipped, with its agent file made absolute: the run happens in a
    // temporary directory so its store and reports stay out of the repository.
    let suite = std::fs::read_to_string(root.join("agents/detective/eval/suite.toml"))
        .unwrap()
        .replace(
            "agent_file = \"agents/detective/agent.toml\"",
            &format!(
                "agent_file = \"{}\"",
                root.join("agents/detective/agent.toml").display()
            ),
        );
    std::fs::write(dir.path().join("suite.toml"), suite).unwrap();
    let fixtures = root.join("crates/keel-cli/tests/fixtures");
    let model = MockLlm::start(
        dir.path(),
        fixtures
            .join("detective_suite_model.json")
            .to_str()
            .unwrap(),
    );
    let judge = MockLlm::start(
        dir.path(),
        fixtures
            .join("detective_suite_judge.json")
            .to_str()
            .unwrap(),
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args([
            "eval",
            "run",
            "suite.toml",
            "--model",
            "openai:mock",
            "--base-url",
            &model.base_url,
            "--judge-model",
            "openai:judge",
            "--judge-base-url",
            &judge.base_url,
            "--judge-cache",
            "judge-cache",
            "--out",
            "out",
        ])
        .current_dir(dir.path())
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("RELEASE_SERVICE_URL");
    let output = output_within(&mut command, DEADLINE);
    let shown = format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Three scenarios fail, so the exit code is 1.
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/report.json"))
            .unwrap_or_else(|e| panic!("no report ({e}):\n{shown}")),
    )
    .unwrap();
    assert!(dir.path().join("out/report.html").is_file());

    // The seed's report shape.
    assert_eq!(report["summary"]["total_scenarios"], 22, "{shown}");
    assert_eq!(report["summary"]["passed"], 19, "{shown}");
    assert_eq!(report["summary"]["failed"], 3, "{shown}");
    assert!(close(
        report["summary"]["pass_rate"].as_f64().unwrap(),
        19.0 / 22.0
    ));
    for key in ["avg_scores", "judge_errors", "flaky"] {
        assert!(report["summary"].get(key).is_some(), "summary.{key}");
    }
    assert!(report["regression_analysis"].is_object());

    let failed: Vec<&str> = report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] != "passed")
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        failed,
        [
            "medium_coverage_drop",
            "edge_zero_tests",
            "error_report_rejected"
        ],
        "{shown}"
    );
    // Wrong severity (low for medium): ground truth 0, both facts stated → 2/3.
    assert!(close(
        score(&report, "medium_coverage_drop", "decision_quality"),
        2.0 / 3.0
    ));
    // "all tests passed" stated while no tool result says so: both forbidden claims
    // fail; ground truth and the fact hold → 2/4.
    assert!(close(
        score(&report, "edge_zero_tests", "decision_quality"),
        0.5
    ));
    // Filing rejected and the answer does not say so: final answer yes, error reported
    // no → 1/2; tool usage still 1 (no end state is required: the critic fails the run).
    assert!(close(
        score(&report, "error_report_rejected", "robustness"),
        0.5
    ));
    assert!(close(
        score(&report, "error_report_rejected", "tool_usage"),
        1.0
    ));
    // The judged scenario: ground truth, three facts, one forbidden claim (all 1) and
    // the scripted judge's 0.9 → 5.9/6.
    assert!(close(
        score(&report, "high_payment_failures", "decision_quality"),
        5.9 / 6.0
    ));
    // Faults the model saw and recovered from: tool usage includes recovered_from_error.
    for id in ["error_summary_500_once", "error_test_details_timeout_once"] {
        let trial = &scenario(&report, id)["trials"][0];
        let recovered = trial["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"].as_str().unwrap().contains("recovered"))
            .unwrap_or_else(|| panic!("{id}: no recovery check in {trial}"));
        assert_eq!(recovered["passed"], true, "{id}: {recovered}");
    }
    // Every scenario without a deliberate mistake scores 1 in every dimension it has.
    for scenario in report["scenarios"].as_array().unwrap() {
        let id = scenario["id"].as_str().unwrap();
        if failed.contains(&id) || id == "high_payment_failures" {
            continue;
        }
        for (dimension, value) in scenario["scores"].as_object().unwrap() {
            assert!(
                close(value.as_f64().unwrap(), 1.0),
                "{id} {dimension} = {value}: {}",
                scenario["trials"][0]["checks"]
            );
        }
    }

    // The release service filed one report per scenario that filed successfully: 22
    // minus three without data (v2.7.0-broken, v9.9.9, both reads 503) and the rejected
    // one (403); the 503 on filing was retried with the same Idempotency-Key, so it filed
    // once; no scenario filed twice (max_successes = 1 would refuse it).
    let reports = std::fs::read_dir(dir.path().join("out/risk-reports"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("rr-") && name.ends_with(".json")
        })
        .count();
    assert_eq!(reports, 18, "{shown}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("release service: http://127.0.0.1:"),
        "{shown}"
    );
}

#[test]
fn bad_setup_hooks_and_setups_are_located_errors_before_anything_runs() {
    let root = repo_root();
    let agent = root.join("agents/detective/agent.toml");
    let dir = tempfile::tempdir().unwrap();
    let suite = |hook: &str, concurrency: u32, setup: &str| {
        format!(
            "[suite]\nname = \"d\"\nagent_file = \"{}\"\nsetup_hook = \"{hook}\"\nconcurrency = {concurrency}\n\n\
             [[scenarios]]\nid = \"a\"\ninput = \"Assess v2.1.0\"\nsetup = {setup}\n",
            agent.display()
        )
    };
    let cases = [
        (
            suite("release-servce", 1, "{}"),
            "suite.toml:4:",
            "unknown setup hook `release-servce`; keel eval run provides: release-service",
        ),
        (
            suite("release-service", 2, "{}"),
            "suite.toml:5:",
            "set concurrency = 1",
        ),
        (
            suite(
                "release-service",
                1,
                r#"{ faults = [{ endpoint = "sumary", status = 500 }] }"#,
            ),
            "suite.toml:10:",
            "unknown variant `sumary`",
        ),
        (
            suite(
                "release-service",
                1,
                r#"{ faults = [{ endpoint = "summary", status = 500, malformed = true }] }"#,
            ),
            "suite.toml:10:",
            "faults[0]: a fault needs exactly one of",
        ),
    ];
    for (text, location, message) in cases {
        std::fs::write(dir.path().join("suite.toml"), &text).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(["eval", "run", "suite.toml", "--model", "openai:mock"])
            .current_dir(dir.path())
            .env("KEEL_TEST_MODE", "1")
            .env("OPENAI_API_KEY", "test-key")
            .env_remove("KEEL_STORE")
            .env_remove("KEEL_CONFIG");
        let output = output_within(&mut command, DEADLINE);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}\n{stderr}");
        assert!(stderr.contains(location), "{location} in:\n{stderr}");
        assert!(stderr.contains(message), "{message} in:\n{stderr}");
        assert!(
            !dir.path().join(".keel/eval").exists(),
            "nothing ran: {stderr}"
        );
    }
}
