//! `keel eval run` / `keel eval compare` end to end: a three-scenario, two-trial suite over
//! the built-in `calculator`, run against `keel mock-llm` scripts (the agent's model and a
//! scripted judge), checked field by field in report.json; a worse script failing two
//! scenarios makes `keel eval compare` exit 1 naming them and the dimensions that dropped;
//! a bad suite exits 2 with file:line:col; an unreachable judge makes trials
//! `judge_error`, never passed; report.html and the comparison's HTML open in headless
//! Chromium without console errors and show every scenario; `keel ui` over the store lists
//! the saved runs and shows the comparison with the baseline.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{MockLlm, output_within};

const KEEL_TOML: &str = r#"
[providers.openai.retry]
max_attempts = 1

[agents.calc]
instructions = "Answer arithmetic with the calculator."
tools = ["calculator"]
"#;

const SUITE: &str = r#"
[suite]
name = "calc"
agent = "calc"
trials = 2
concurrency = 1

[[scenarios]]
id = "add"
input = "what is 2+3?"
[scenarios.expect.tool_usage]
required = ["calculator"]
[scenarios.expect.decision_quality]
required_facts = ["5"]
[scenarios.expect.robustness]
end_state = "done"

[[scenarios]]
id = "mul"
input = "what is 6*7?"
[scenarios.expect.tool_usage]
required = ["calculator"]
[scenarios.expect.decision_quality]
required_facts = ["42"]
[scenarios.expect.robustness]
end_state = "done"

[[scenarios]]
id = "greet"
input = "say hello"
[scenarios.expect.tool_usage]
forbidden = ["calculator"]
[scenarios.expect.decision_quality]
required_facts = ["hello"]
rubric = "The answer greets the user."
"#;

fn calc(expression: &str) -> Value {
    json!({"tool_calls": [{"name": "calculator", "arguments": {"expression": expression}}]})
}

fn text(t: &str) -> Value {
    json!({ "text": t })
}

/// Turns in run order (concurrency 1: scenario by scenario, trial by trial).
fn good_script() -> Value {
    let mut turns = Vec::new();
    for _ in 0..2 {
        turns.extend([calc("2+3"), text("2+3 = 5")]);
    }
    for _ in 0..2 {
        turns.extend([calc("6*7"), text("6*7 = 42")]);
    }
    for _ in 0..2 {
        turns.push(text("hello there"));
    }
    json!({ "turns": turns })
}

/// `mul` never states 42; `greet` calls the forbidden calculator.
fn worse_script() -> Value {
    let mut turns = Vec::new();
    for _ in 0..2 {
        turns.extend([calc("2+3"), text("2+3 = 5")]);
    }
    for _ in 0..2 {
        turns.extend([calc("6*7"), text("I could not work it out.")]);
    }
    for _ in 0..2 {
        turns.extend([calc("1+1"), text("hello there")]);
    }
    json!({ "turns": turns })
}

fn judge_script() -> Value {
    json!({
        "turns": [text(r#"{"score": 0.9, "rationale": "it greets the user"}"#)],
        "when_exhausted": "repeat_last"
    })
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), KEEL_TOML).unwrap();
    std::fs::write(dir.path().join("suite.toml"), SUITE).unwrap();
    for (name, script) in [
        ("good.json", good_script()),
        ("worse.json", worse_script()),
        ("judge.json", judge_script()),
    ] {
        std::fs::write(dir.path().join(name), script.to_string()).unwrap();
    }
    dir
}

/// How long one `keel` command may take before the test calls it hung.
const EVAL_DEADLINE: Duration = Duration::from_secs(600);

fn keel(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG");
    output_within(&mut command, EVAL_DEADLINE)
}

/// `keel ui --bind 127.0.0.1:0` in `dir`, killed when dropped.
struct KeelUi {
    child: std::process::Child,
    addr: String,
}

impl KeelUi {
    fn start(dir: &Path) -> KeelUi {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["ui", "--bind", "127.0.0.1:0"])
            .current_dir(dir)
            .env("KEEL_TEST_MODE", "1")
            .env_remove("KEEL_STORE")
            .env_remove("KEEL_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(rest) = line.strip_prefix("keel ui: serving http://") {
                    let _ = tx.send(rest.split('/').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(EVAL_DEADLINE)
            .expect("keel ui did not say where it serves");
        KeelUi { child, addr }
    }

    /// The whole HTTP answer to `GET path`.
    fn get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(EVAL_DEADLINE)).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }
}

impl Drop for KeelUi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn show(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `keel eval run suite.toml --model openai:mock --base-url MOCK --out DIR [extra]`.
fn eval_run(dir: &Path, script: &str, out: &str, extra: &[&str]) -> (Output, Value) {
    let mock = MockLlm::start(dir, script);
    let mut args = vec![
        "eval",
        "run",
        "suite.toml",
        "--model",
        "openai:mock",
        "--base-url",
        &mock.base_url,
        "--out",
        out,
        "--judge-cache",
        "judge-cache",
    ];
    args.extend_from_slice(extra);
    let output = keel(dir, &args);
    let report = std::fs::read_to_string(dir.join(out).join("report.json"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{}", show(&output)));
    (output, serde_json::from_str(&report).unwrap())
}

fn scenario<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()
}

fn close(value: &Value, expected: f64) -> bool {
    (value.as_f64().unwrap() - expected).abs() < 1e-9
}

#[test]
fn eval_run_scores_the_suite_with_a_scripted_judge_and_compare_gates_regressions() {
    let dir = setup();
    let path = dir.path();
    let judge = MockLlm::start(path, "judge.json");
    let (output, good) = eval_run(
        path,
        "good.json",
        "good",
        &[
            "--judge-model",
            "openai:judge",
            "--judge-base-url",
            &judge.base_url,
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("report: good/report.json"), "{stdout}");
    assert!(stdout.contains("3 scenarios: 3 passed"), "{stdout}");

    // The JSON shape and the hand-computed scores.
    assert_eq!(good["suite"], "calc");
    assert_eq!(good["summary"]["total_scenarios"], 3);
    assert_eq!(good["summary"]["passed"], 3);
    assert!(close(&good["summary"]["pass_rate"], 1.0));
    // decision quality: add 1, mul 1, greet (fact 1 + judge 0.9) / 2 = 0.95.
    assert!(close(
        &good["summary"]["avg_scores"]["decision_quality"],
        (1.0 + 1.0 + 0.95) / 3.0
    ));
    assert!(close(&good["summary"]["avg_scores"]["tool_usage"], 1.0));
    assert!(close(&good["summary"]["avg_scores"]["robustness"], 1.0));
    for id in ["add", "mul"] {
        let s = scenario(&good, id);
        assert_eq!(s["status"], "passed", "{s}");
        assert_eq!(s["trials_run"], 2);
        assert_eq!(s["trials_passed"], 2);
        assert_eq!(s["k"], 2);
        assert!(close(&s["pass_at_k"], 1.0));
        for d in ["tool_usage", "decision_quality", "robustness"] {
            assert!(close(&s["scores"][d], 1.0), "{id} {d}: {s}");
        }
    }
    let greet = scenario(&good, "greet");
    assert_eq!(greet["status"], "passed", "{greet}");
    assert!(close(&greet["scores"]["decision_quality"], 0.95), "{greet}");
    assert!(greet["scores"].get("robustness").is_none(), "{greet}");
    for trial in greet["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "passed");
        assert!(
            trial["thread_id"]
                .as_str()
                .unwrap()
                .starts_with("eval-greet-")
        );
        let rubric = trial["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "rubric")
            .unwrap();
        assert!(close(&rubric["score"], 0.9), "{rubric}");
        assert!(
            rubric["reason"]
                .as_str()
                .unwrap()
                .contains("it greets the user")
        );
    }
    // Both greet trials gave the same answer: the second verdict came from the cache.
    assert_eq!(
        std::fs::read_dir(path.join("judge-cache")).unwrap().count(),
        1
    );

    // A worse model: mul and greet fail.
    let (output, _) = eval_run(path, "worse.json", "worse", &[]);
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    // Run without --judge-model, the rubric is said to be unscored.
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(
            "warning: 1 scenario(s) have a rubric (greet), and no --judge-model was given"
        ),
        "{}",
        show(&output)
    );

    let compare = keel(
        path,
        &["eval", "compare", "worse/report.json", "good/report.json"],
    );
    assert_eq!(compare.status.code(), Some(1), "{}", show(&compare));
    let stdout = String::from_utf8_lossy(&compare.stdout);
    let regressions: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("REGRESSION "))
        .collect();
    assert!(
        regressions
            .iter()
            .any(|l| l.starts_with("REGRESSION mul decision_quality:")),
        "{stdout}"
    );
    assert!(
        regressions
            .iter()
            .any(|l| l.starts_with("REGRESSION greet tool_usage:")),
        "{stdout}"
    );
    assert!(
        regressions
            .iter()
            .all(|l| l.contains(" mul ") || l.contains(" greet ")),
        "{stdout}"
    );

    // A report compared with itself: no regression.
    let same = keel(
        path,
        &["eval", "compare", "good/report.json", "good/report.json"],
    );
    assert_eq!(same.status.code(), Some(0), "{}", show(&same));
    assert!(String::from_utf8_lossy(&same.stdout).contains("no significant regression"));
}

#[test]
fn an_unreachable_judge_makes_trials_judge_error_never_passed() {
    let dir = setup();
    let path = dir.path();
    let (output, report) = eval_run(
        path,
        "good.json",
        "out",
        &[
            "--judge-model",
            "openai:judge",
            "--judge-base-url",
            "http://127.0.0.1:1",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    let greet = scenario(&report, "greet");
    assert_eq!(greet["status"], "judge_error", "{greet}");
    assert_eq!(greet["trials_passed"], 0);
    for trial in greet["trials"].as_array().unwrap() {
        assert_eq!(trial["status"], "judge_error");
        let error = trial["judge_error"].as_str().unwrap();
        assert!(error.contains("could not be reached"), "{error}");
        // It points at the rubric in the suite file.
        assert!(
            error.contains("suite.toml:") && error.contains("the rubric of scenario `greet`"),
            "{error}"
        );
    }
    assert_eq!(report["summary"]["judge_errors"], 1);
    // Scenarios without a rubric are unaffected.
    assert_eq!(scenario(&report, "add")["status"], "passed");
}

#[test]
fn a_suite_with_an_unknown_key_exits_2_with_its_position() {
    let dir = setup();
    std::fs::write(
        dir.path().join("bad.toml"),
        "[suite]\nname = \"x\"\nagent = \"calc\"\ntrails = 2\n\n[[scenarios]]\nid = \"a\"\ninput = \"hi\"\n",
    )
    .unwrap();
    let output = keel(dir.path(), &["eval", "run", "bad.toml"]);
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.toml:4:1"), "{stderr}");
    assert!(stderr.contains("trials"), "{stderr}");
}

/// What a page shows of the report, read in the browser: every scenario section's id and
/// status, the grid's trial squares, and whether the baseline chart is drawn.
const PAGE_SUMMARY: &str = r#"
return {
  sections: Array.from(document.querySelectorAll('section.scenario'))
    .map(function (s) { return [s.dataset.scenario, s.dataset.status]; }),
  cells: document.querySelectorAll('#trial-grid rect.trial-cell').length,
  baseline: document.querySelectorAll('#baseline-chart rect').length,
  passRate: document.getElementById('pass-rate').textContent,
  title: document.title
};
"#;

#[test]
fn the_html_reports_render_in_headless_chromium_without_console_errors() {
    let dir = setup();
    let path = dir.path();
    let (output, _) = eval_run(path, "good.json", "good", &[]);
    // Without a judge the rubric is unscored; greet still passes on its fact and tools.
    assert!(output.status.code().is_some(), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("html:   good/report.html"), "{stdout}");
    let (output, _) = eval_run(path, "worse.json", "worse", &[]);
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    let compare = keel(
        path,
        &[
            "eval",
            "compare",
            "worse/report.json",
            "good/report.json",
            "--html",
            "compare.html",
        ],
    );
    assert_eq!(compare.status.code(), Some(1), "{}", show(&compare));

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let browser = keel_testkit::browser::Browser::launch().await.unwrap();
        // The console check can fail: a page that throws is seen as an error.
        std::fs::write(
            path.join("throws.html"),
            "<!DOCTYPE html><title>t</title><script>throw new Error('boom')</script>",
        )
        .unwrap();
        browser.open_file(&path.join("throws.html")).await.unwrap();
        let errors = browser.console_errors().await.unwrap();
        assert!(errors.iter().any(|e| e.contains("boom")), "{errors:?}");

        browser
            .open_file(&path.join("good/report.html"))
            .await
            .unwrap();
        let page = browser.execute(PAGE_SUMMARY, vec![]).await.unwrap();
        assert_eq!(
            page["sections"],
            json!([["add", "passed"], ["mul", "passed"], ["greet", "passed"]]),
            "{page}"
        );
        assert_eq!(page["cells"], 6, "{page}");
        assert_eq!(page["baseline"], 0, "{page}");
        assert_eq!(page["passRate"], "100%", "{page}");
        assert_eq!(page["title"], "keel eval — calc", "{page}");
        let errors = browser.console_errors().await.unwrap();
        assert!(errors.is_empty(), "console errors: {errors:?}");

        // The comparison: the two failing scenarios' drops are drawn, and the filter hides
        // the scenario that still passes.
        browser.open_file(&path.join("compare.html")).await.unwrap();
        let page = browser.execute(PAGE_SUMMARY, vec![]).await.unwrap();
        assert_eq!(
            page["sections"],
            json!([["add", "passed"], ["mul", "failed"], ["greet", "failed"]]),
            "{page}"
        );
        assert!(page["baseline"].as_u64().unwrap() >= 2, "{page}");
        let hidden = browser
            .execute(
                "var box = document.getElementById('only-failing'); box.click();
                 return Array.from(document.querySelectorAll('section.scenario.hidden'))
                   .map(function (s) { return s.dataset.scenario; });",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(hidden, json!(["add"]));
        let errors = browser.console_errors().await.unwrap();
        assert!(errors.is_empty(), "console errors: {errors:?}");
        browser.close().await;
    });
}

#[test]
fn baselines_live_in_the_store_and_gate_a_worse_run() {
    let dir = setup();
    let path = dir.path();
    let (output, _) = eval_run(path, "good.json", "good", &["--save-baseline", "main"]);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(stdout.contains("saved:  eval run 1 ("), "{}", show(&output));
    assert!(stdout.contains("baseline main -> eval run 1"), "{stdout}");

    let listed = keel(path, &["eval", "baselines"]);
    assert_eq!(listed.status.code(), Some(0), "{}", show(&listed));
    let table = String::from_utf8_lossy(&listed.stdout);
    let row = table.lines().find(|l| l.starts_with("main ")).unwrap();
    assert!(
        row.contains(" calc ") && row.contains("openai:mock"),
        "{table}"
    );

    // The worse model against the stored baseline: exit 1, both scenarios named with the
    // dimension that dropped, and the report carries the comparison.
    let (output, report) = eval_run(path, "worse.json", "worse", &["--baseline", "main"]);
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("compared with baseline main (eval run 1):"),
        "{stdout}"
    );
    assert!(
        stdout.contains("REGRESSION mul decision_quality:"),
        "{stdout}"
    );
    assert!(stdout.contains("REGRESSION greet tool_usage:"), "{stdout}");
    assert!(!stdout.contains("REGRESSION add "), "{stdout}");
    let regressions = report["regression_analysis"]["regressions"]
        .as_array()
        .unwrap();
    assert!(
        regressions
            .iter()
            .any(|r| r["scenario"] == "mul" && r["significant"] == true),
        "{regressions:?}"
    );
    let html = std::fs::read_to_string(path.join("worse/report.html")).unwrap();
    assert!(html.contains("id=\"baseline-chart\""));

    // Saved runs are addressed by id or baseline name.
    let compare = keel(path, &["eval", "compare", "2", "main"]);
    assert_eq!(compare.status.code(), Some(1), "{}", show(&compare));
    assert!(String::from_utf8_lossy(&compare.stdout).contains("REGRESSION mul "));
    let same = keel(path, &["eval", "compare", "1", "main"]);
    assert_eq!(same.status.code(), Some(0), "{}", show(&same));
    let runs = keel(path, &["eval", "runs"]);
    let runs = String::from_utf8_lossy(&runs.stdout);
    let ids: Vec<&str> = runs
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(ids, ["2", "1"], "{runs}");

    // `keel ui` over the same store shows the saved runs and the comparison.
    let ui = KeelUi::start(path);
    let list = ui.get("/evals");
    assert!(list.starts_with("HTTP/1.1 200"), "{list}");
    for run in ["data-run=\"2\"", "data-run=\"1\"", ">main<"] {
        assert!(list.contains(run), "{run} not in {list}");
    }
    let compared = ui.get("/evals/2/compare");
    assert!(compared.contains("data-regression=\"true\""), "{compared}");
    assert!(
        compared.contains("data-scenario=\"mul\" data-change=\"regressed\""),
        "{compared}"
    );
    drop(ui);

    // Mistakes name the fix.
    let missing = keel(path, &["eval", "compare", "2", "nightly"]);
    assert_eq!(missing.status.code(), Some(2), "{}", show(&missing));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("keel eval baselines lists them"),
        "{}",
        show(&missing)
    );
    let bad = keel(
        path,
        &["eval", "run", "suite.toml", "--baseline", "nightly"],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", show(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no baseline named `nightly`"),
        "{}",
        show(&bad)
    );
}

#[test]
fn a_suite_listing_models_runs_each_and_prints_the_matrix() {
    let dir = setup();
    let path = dir.path();
    let suite = SUITE.replace(
        "agent = \"calc\"",
        "agent = \"calc\"\nmodels = [\"openai:good\", \"openai:worse\"]",
    );
    std::fs::write(path.join("matrix.toml"), suite).unwrap();
    // One mock serves both models in run order: the good turns, then the worse ones.
    let mut turns = good_script()["turns"].as_array().unwrap().clone();
    turns.extend(worse_script()["turns"].as_array().unwrap().iter().cloned());
    std::fs::write(
        path.join("both.json"),
        json!({ "turns": turns }).to_string(),
    )
    .unwrap();
    let mock = MockLlm::start(path, "both.json");
    let output = keel(
        path,
        &[
            "eval",
            "run",
            "matrix.toml",
            "--base-url",
            &mock.base_url,
            "--out",
            "out",
        ],
    );
    let shown = show(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let report = |model: &str| -> Value {
        let text = std::fs::read_to_string(path.join("out").join(model).join("report.json"))
            .unwrap_or_else(|e| panic!("no report for {model} ({e}):\n{shown}"));
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(report("openai-good")["summary"]["passed"], 3, "{shown}");
    assert_eq!(report("openai-worse")["summary"]["passed"], 1, "{shown}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("== model openai:good =="), "{shown}");
    assert!(stdout.contains("model matrix:"), "{shown}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("openai:good") && l.contains("3/3")),
        "{shown}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("openai:worse") && l.contains("1/3")),
        "{shown}"
    );
    // A baseline compares one model's runs: with a matrix it needs --model.
    let refused = keel(
        path,
        &[
            "eval",
            "run",
            "matrix.toml",
            "--base-url",
            &mock.base_url,
            "--save-baseline",
            "m",
        ],
    );
    assert_eq!(refused.status.code(), Some(2), "{}", show(&refused));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("pick one with --model"));
}
