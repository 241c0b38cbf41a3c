//! `/openapi.json` is the contract the server keeps, checked by the field's own
//! property-based API fuzzer: Schemathesis (pinned, from PyPI; `./scripts/install-api-fuzzer`
//! installs it into `.peers/api-fuzzer`) generates requests from the document for every
//! operation — valid ones, and ones that break the schema — and runs them against a real
//! server on a loopback port three times: with a valid key, with no key, and with another
//! tenant's key. Every one of Schemathesis's checks is on (`--checks all`: any 5xx, a status
//! code or header the document does not list, a response not matching its schema, a
//! schema-valid request rejected, a schema-violating one accepted, …), seeded and
//! deterministic, with no expected-failures list: one failure fails the test, with
//! Schemathesis's report (and the `curl` line reproducing it) in the output.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::common::{Backend, Harness};

/// The longest one fuzzing pass may take (it takes well under a minute on an idle machine).
const PASS_DEADLINE: Duration = Duration::from_secs(900);

/// Schemathesis's command line, from `$KEEL_API_FUZZER` or `<workspace>/.peers/api-fuzzer`.
fn schemathesis() -> PathBuf {
    let root = std::env::var_os("KEEL_API_FUZZER").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/api-fuzzer"),
        PathBuf::from,
    );
    let path = root.join("venv/bin/schemathesis");
    assert!(
        path.exists(),
        "the API fuzzer (schemathesis from PyPI) is not installed at {}: run \
         ./scripts/install-api-fuzzer (./scripts/test does)",
        path.display()
    );
    path
}

/// One pass of Schemathesis over every operation, `authorization` sent on every request
/// (none: no key); the report when it found anything.
async fn fuzz(h: &Harness, label: &str, authorization: Option<&str>) -> Result<String, String> {
    let report_dir = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(schemathesis());
    command
        .arg("run")
        .arg(h.url("/openapi.json"))
        .args(["--checks", "all"])
        .args(["--seed", "20261203"])
        .arg("--generation-deterministic")
        .args(["--workers", "1"])
        .args(["--max-examples", "30"])
        .args(["--request-timeout", "120"])
        .args(["--max-redirects", "0"])
        .arg("--no-color")
        .args(["--output-truncate", "false"])
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .current_dir(report_dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // KEEL_CONTRACT_REPORTS=<dir> keeps each pass's requests and answers (a VCR cassette)
    // for a failure's investigation.
    if let Some(dir) = std::env::var_os("KEEL_CONTRACT_REPORTS") {
        let dir = PathBuf::from(dir).join(label.replace(' ', "-"));
        command
            .args(["--report", "vcr"])
            .arg("--report-dir")
            .arg(dir);
    }
    if let Some(value) = authorization {
        command.args(["--header", &format!("Authorization: {value}")]);
    }
    let output = tokio::time::timeout(PASS_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("schemathesis ({label}) did not finish in {PASS_DEADLINE:?}"))
        .expect("schemathesis runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("schemathesis ({label}) failed:\n{text}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_keeps_the_openapi_contract_under_schemathesis() {
    // No rate limit here (the fuzzer sends thousands of requests; 429 is documented and
    // checked on its own in tenancy.rs) and short waits for runs that do not settle.
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": [{"text": "hello"}]}),
        // A fork of a run's middle is a thread whose run never ends (nobody drives it):
        // waits and streams on it end at these timeouts, not at the defaults' minutes.
        "request_timeout_ms = 2000\nstream_timeout_ms = 2000\n\
         [server.limits]\nrequests_per_minute = 0\nconcurrent_runs = 0\n",
    )
    .await;
    let alpha = h.key("alpha").await;
    let beta = h.key("beta").await;
    // The harness's operator tenant (`[server] operators`): `/metrics` answers it too.
    let ops = h.key("ops").await;
    // Alpha has a thread: the other keys' requests on its id must find nothing.
    let (status, _, answer) = h
        .send(
            "POST",
            "/v1/chat",
            &alpha,
            Some(json!({"agent": "bot", "message": "hi", "thread_id": "thr_contract"})),
        )
        .await;
    assert!(status == 200 || status == 404, "{status} {answer}");

    let mut failures = Vec::new();
    for (label, authorization) in [
        ("a valid key", Some(format!("Bearer {ops}"))),
        ("no key", None),
        ("another tenant's key", Some(format!("Bearer {beta}"))),
    ] {
        match fuzz(&h, label, authorization.as_deref()).await {
            Ok(report) => println!("schemathesis ({label}):\n{report}"),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    h.stop().await;
}
