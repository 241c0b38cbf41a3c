//! Golden conversations through the real binary: the Detective's committed cassettes
//! (agents/detective/eval/golden) replay offline; `keel run --record` against the release
//! service and the mock LLM writes a cassette that replays with neither running; a tool
//! renamed in the agent file makes the replay fail with a readable diff; differences the
//! cassette allows (ids, timestamps, tolerated argument fields, final text) do not.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::common::{KeelServer, MockLlm, output_within, workspace_root};

/// Generous: a replay makes no network call, but the machine may be busy.
const DEADLINE: Duration = Duration::from_secs(180);

fn keel(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        // A replay needs no service: point the agent's URL where nothing listens.
        .env("RELEASE_SERVICE_URL", "http://127.0.0.1:9")
        .env_remove("OPENAI_API_KEY");
    output_within(&mut command, DEADLINE)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Records the v2.1.0 golden script into `dir/cassette.json` and returns its path.
fn record(dir: &Path) -> PathBuf {
    let root = workspace_root();
    let script = root.join("agents/detective/eval/golden-scripts/v2.1.0-high.json");
    let reports = dir.join("reports");
    let service = KeelServer::start(
        &[
            "detective",
            "serve",
            "--port",
            "0",
            "--reports-dir",
            reports.to_str().unwrap(),
        ],
        dir,
    );
    let mock = MockLlm::start(dir, script.to_str().unwrap());
    let cassette = dir.join("cassette.json");
    let agent = root.join("agents/detective/agent.toml");
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["run", "--store", "memory:", "--agent"])
        .arg(&agent)
        .args([
            "--model",
            "openai:mock",
            "--base-url",
            &mock.base_url,
            "--record",
        ])
        .arg(&cassette)
        .arg("Assess release v2.1.0")
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env("OPENAI_API_KEY", "test-key")
        .env("RELEASE_SERVICE_URL", &service.url);
    let output = output_within(&mut command, DEADLINE);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("recorded: ") && text(&output).contains("end state done"),
        "{}",
        text(&output)
    );
    cassette
}

#[test]
fn the_detective_golden_suite_replays_offline() {
    let root = workspace_root();
    let output = keel(&root, &["eval", "replay", "agents/detective/eval/golden"]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    for name in [
        "v1.9.8-low",
        "v2.1.0-high",
        "v2.4.0-guarded",
        "v9.9.9-unknown",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("ok ") && l.contains(&format!("{name}.json"))),
            "{name} not replayed ok:\n{out}"
        );
    }
    assert!(
        out.contains("replay: 4 cassettes, 4 passed, 0 failed"),
        "{out}"
    );
}

#[test]
fn a_recorded_run_replays_without_the_service_or_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = record(dir.path());
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&cassette).unwrap()).unwrap();
    assert_eq!(json["format"], "keel-cassette/1");
    assert_eq!(json["model"], "openai:mock");
    assert_eq!(json["model_responses"].as_array().unwrap().len(), 3);
    let outputs = json["tool_outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 3, "{json:#}");
    assert!(
        outputs
            .iter()
            .any(|o| o["tool"] == "get_release_summary" && o["data"]["version"] == "v2.1.0"),
        "{outputs:#?}"
    );
    let recipe_agent = json["recipe"]["agent"].as_str().unwrap();
    assert!(
        !Path::new(recipe_agent).is_absolute(),
        "the agent file is stored relative to the cassette: {recipe_agent}"
    );
    // Service and mock are gone (dropped in `record`): the replay is offline.
    let output = keel(dir.path(), &["eval", "replay", "cassette.json"]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(
        out.contains("ok      cassette.json: 3 calls, end state done, 3 of 3"),
        "{out}"
    );

    let json_output = keel(
        dir.path(),
        &["eval", "replay", "cassette.json", "--output", "json"],
    );
    let reports: Value = serde_json::from_slice(&json_output.stdout).unwrap();
    assert_eq!(reports[0]["passed"], true, "{reports:#}");
    assert_eq!(
        reports[0]["replayed"]["calls"][2]["tool"],
        "file_risk_report"
    );
}

#[test]
fn renaming_a_tool_in_the_agent_fails_the_replay_with_a_readable_diff() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = record(dir.path());
    let agent = std::fs::read_to_string(workspace_root().join("agents/detective/agent.toml"))
        .unwrap()
        .replace("name = \"get_test_details\"", "name = \"get_test_report\"")
        // The call rule on `file_risk_report` names the tool too (else the agent does not
        // build: a rule naming a tool the agent lacks is a configuration error).
        .replace(
            "after = [\"get_release_summary\", \"get_test_details\"]",
            "after = [\"get_release_summary\", \"get_test_report\"]",
        );
    std::fs::write(dir.path().join("renamed.toml"), agent).unwrap();
    let output = keel(
        dir.path(),
        &[
            "eval",
            "replay",
            cassette.to_str().unwrap(),
            "--agent",
            "renamed.toml",
        ],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("FAILED") && out.contains("cassette.json"),
        "{out}"
    );
    assert!(out.contains("tools offered to the model:"), "{out}");
    assert!(
        out.contains("no longer offered: get_test_details; new: get_test_report; a renamed tool?"),
        "{out}"
    );
    assert!(out.contains("call 2 (get_test_details): outcome:"), "{out}");
    assert!(out.contains("- recorded: ok"), "{out}");
    assert!(out.contains("+ replayed: error:not_found"), "{out}");
    assert!(
        out.contains("the agent has no tool `get_test_details` any more"),
        "{out}"
    );
    assert!(
        out.contains("replay: 1 cassette, 0 passed, 1 failed"),
        "{out}"
    );
}

#[test]
fn allowed_differences_do_not_fail_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = record(dir.path());
    let original = std::fs::read_to_string(&cassette).unwrap();

    // Ids and timestamps are never compared: new call ids and a new recording time replay.
    let mut json: Value = serde_json::from_str(&original).unwrap();
    json["recorded_at"] = Value::from("2030-01-01T00:00:00Z");
    let renumbered = serde_json::to_string(&json)
        .unwrap()
        .replace("\"call_mock_", "\"renumbered_");
    assert_ne!(renumbered, original);
    std::fs::write(dir.path().join("ids.json"), renumbered).unwrap();
    let output = keel(dir.path(), &["eval", "replay", "ids.json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    // A live model whose findings and final text differ: a deviation… (still citing the
    // recorded data: a finding citing nothing the tools returned would be refused, and
    // the refusal is a different outcome, which no allowance tolerates)
    let script = dir.path().join("reworded.json");
    let reworded = std::fs::read_to_string(
        workspace_root().join("agents/detective/eval/golden-scripts/v2.1.0-high.json"),
    )
    .unwrap()
    .replace(
        "Error rate 2% against a 0.4% baseline",
        "Error rate is five times its 0.4% baseline",
    )
    .replace("Filed the report.", "Report filed.");
    std::fs::write(&script, reworded).unwrap();
    let strict = keel(
        dir.path(),
        &[
            "eval",
            "replay",
            "cassette.json",
            "--script",
            "reworded.json",
        ],
    );
    let out = text(&strict);
    assert_eq!(strict.status.code(), Some(1), "{out}");
    assert!(
        out.contains("call 3 (file_risk_report): arguments:")
            && out.contains("fields differing: /findings/1"),
        "{out}"
    );
    assert!(out.contains("final text:"), "{out}");

    // …that the allowances tolerate, from the command line…
    let allowed = keel(
        dir.path(),
        &[
            "eval",
            "replay",
            "cassette.json",
            "--script",
            "reworded.json",
            "--allow-argument",
            "file_risk_report:/findings",
            "--allow-final-text",
        ],
    );
    assert_eq!(allowed.status.code(), Some(0), "{}", text(&allowed));

    // …or declared in the cassette.
    let mut json: Value = serde_json::from_str(&original).unwrap();
    json["allow"] = serde_json::json!({
        "final_text": true,
        "arguments": ["file_risk_report:/findings"]
    });
    std::fs::write(dir.path().join("cassette.json"), json.to_string()).unwrap();
    let declared = keel(
        dir.path(),
        &[
            "eval",
            "replay",
            "cassette.json",
            "--script",
            "reworded.json",
        ],
    );
    assert_eq!(declared.status.code(), Some(0), "{}", text(&declared));

    // A change outside the allowances still fails: the severity.
    let severity = std::fs::read_to_string(&script)
        .unwrap()
        .replace("\"severity\": \"high\"", "\"severity\": \"medium\"");
    std::fs::write(&script, severity).unwrap();
    let output = keel(
        dir.path(),
        &[
            "eval",
            "replay",
            "cassette.json",
            "--script",
            "reworded.json",
        ],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(out.contains("fields differing: /severity"), "{out}");
}

#[test]
fn unreadable_cassettes_are_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.json"), "{\"turns\": []}").unwrap();
    let output = keel(dir.path(), &["eval", "replay", "bad.json"]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(2), "{out}");
    assert!(
        out.contains("bad.json: no `format` field: not a keel cassette"),
        "{out}"
    );
    let output = keel(dir.path(), &["eval", "replay", "missing.json"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("missing.json: no such cassette"));
    let output = keel(
        dir.path(),
        &["eval", "replay", "bad.json", "--allow-argument", "findings"],
    );
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("TOOL:/json/pointer"),
        "{}",
        text(&output)
    );
}
