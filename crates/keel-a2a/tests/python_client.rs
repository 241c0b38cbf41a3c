//! The Keel server router driven by the official Python SDK's client
//! (`tests/peers/a2a_client.py`, a2a-sdk from `./scripts/install-a2a-peers`): streamed and
//! blocking sends, input-required, cancel and get — in protocol 1.0 and 0.3.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use keel_a2a::testing::EchoBackend;

use crate::common::{DEADLINE, python, script, serve};

async fn python_client_against_the_router(version: &str) {
    let url = serve(|url| keel_a2a::router(Arc::new(EchoBackend::new()), url).build()).await;
    let output = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new(python())
            .arg(script("a2a_client.py"))
            .args(["--url", &format!("{url}/a2a/echo"), "--version", version])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a2a_client.py finished in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "a2a_client.py --version {version} failed:\n{stdout}\n{stderr}"
    );
    for step in ["card", "stream", "send", "input-required", "cancel", "get"] {
        assert!(
            stdout.contains(&format!("OK {step}")),
            "no `OK {step}`:\n{stdout}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_speaks_1_0_to_the_keel_router() {
    python_client_against_the_router("1.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_speaks_0_3_to_the_keel_router() {
    python_client_against_the_router("0.3").await;
}
