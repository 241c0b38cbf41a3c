//! The observability, configuration and MCP surfaces of the `keel` binary: `keel trace`,
//! `keel stats`, `keel config check`, and `keel mcp serve` driven by Keel's own MCP client.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use keel_core::{CancellationToken, ToolContext, ToolErrorCode};
use keel_mcp::{McpManager, McpServerConfig};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn keel(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn a_scripted_run_leaves_a_trace_that_keel_trace_shows_and_stats_count() {
    let dir = tempfile::tempdir().unwrap();
    let script = root().join("examples/scripts/rate_limited.json");
    let output = keel(
        &[
            "run",
            "--script",
            script.to_str().unwrap(),
            "--tool",
            "failure_injection",
            "--output",
            "json",
            "go",
        ],
        dir.path(),
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let run: Value = serde_json::from_slice(&output.stdout).unwrap();
    let trace_id = run["trace_id"].as_str().unwrap();

    let list = keel(&["trace", "list"], dir.path());
    assert!(
        String::from_utf8_lossy(&list.stdout).contains(&trace_id[..8]),
        "{}",
        String::from_utf8_lossy(&list.stdout)
    );
    let show = keel(&["trace", "show", trace_id], dir.path());
    assert_eq!(
        show.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let timeline = String::from_utf8_lossy(&show.stdout);
    for needle in ["failure_injection", "done", "retry"] {
        assert!(
            timeline.contains(needle),
            "timeline lacks {needle:?}:\n{timeline}"
        );
    }

    let stats = keel(&["stats"], dir.path());
    assert_eq!(
        stats.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&stats.stderr)
    );
    let prometheus = keel(&["stats", "--prometheus"], dir.path());
    let text = String::from_utf8_lossy(&prometheus.stdout);
    assert!(text.contains("keel_"), "{text}");
}

#[test]
fn config_check_reports_a_misspelled_key_and_a_missing_variable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[telemetry]\nendpont = \"http://127.0.0.1:4318\"\n\n[[mcp.servers]]\nname = \"remote\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Authorization = \"Bearer ${KEEL_TEST_UNSET_TOKEN_VAR}\" }\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["config", "check"])
        .current_dir(dir.path())
        .env_remove("KEEL_TEST_UNSET_TOKEN_VAR")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("endpont") && text.contains("did you mean `endpoint`"),
        "{text}"
    );
    assert!(text.contains("KEEL_TEST_UNSET_TOKEN_VAR"), "{text}");
    // Any other command refuses the broken file with the same diagnostics.
    let output = keel(&["tools", "list"], dir.path());
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_mcp_serve_round_trips_with_keels_own_client() {
    let server = McpServerConfig::stdio(
        "keel",
        env!("CARGO_BIN_EXE_keel"),
        [
            "mcp".to_string(),
            "serve".to_string(),
            "--tool".to_string(),
            "calculator".to_string(),
        ],
    )
    .with_call_timeout(Duration::from_secs(20));
    let manager = McpManager::connect_all(vec![server]).await;
    let statuses = manager.statuses();
    assert_eq!(statuses[0].tools, ["keel__calculator"], "{statuses:?}");
    let tool = manager.tools().into_iter().next().unwrap();
    assert_eq!(tool.spec().input_schema["required"], json!(["expression"]));
    let ctx = ToolContext::new("thr", "run", "c1", CancellationToken::new());
    let ok = tool
        .call(json!({"expression": "17*23"}), &ctx)
        .await
        .unwrap();
    assert!(ok.to_string().contains("391"), "{ok}");
    let error = tool
        .call(json!({"expression": 17}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error:?}");
    manager.shutdown().await;
}
