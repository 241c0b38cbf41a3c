//! Shared helpers of the keel-a2a integration tests: the Python A2A peer installed by
//! `./scripts/install-a2a-peers` (started on 127.0.0.1, its stdout lines as events), the
//! Keel router served on a loopback port, and tool contexts.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use keel_a2a::client::{EnvLookup, process_env};
use keel_a2a::{A2aClient, ClientOptions, ProtocolVersion};
use keel_core::{CancellationToken, ToolContext};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// Generous deadline for anything a test waits for (never a timing assertion).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The install root of the peers: `$KEEL_A2A_PEERS` or `<workspace>/.peers/a2a`.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os("KEEL_A2A_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/a2a"),
    }
}

/// The venv's python, with a2a-sdk installed.
pub fn python() -> PathBuf {
    let path = peers_dir().join("venv/bin/python");
    assert!(
        path.exists(),
        "the Python A2A peer (a2a-sdk from PyPI) is not installed at {}: run ./scripts/install-a2a-peers",
        path.display()
    );
    path
}

/// A script of `tests/peers/`.
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(name)
}

/// A running `a2a_peer.py`.
pub struct Peer {
    child: tokio::process::Child,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Peer {
    /// Starts the peer with `args` and `env`; waits for its `READY` line.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Peer {
        let mut command = tokio::process::Command::new(python());
        command
            .arg(script("a2a_peer.py"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("start a2a_peer.py");
        let (sender, mut lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().unwrap();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = child.stderr.take().unwrap();
        let (err_sender, mut err_lines) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                eprintln!("a2a_peer: {line}");
                let _ = err_sender.send(line);
            }
        });
        let ready = tokio::time::timeout(DEADLINE, lines.recv()).await;
        let url = match ready {
            Ok(Some(line)) if line.starts_with("READY ") => {
                line.trim_start_matches("READY ").to_string()
            }
            other => {
                let mut stderr = Vec::new();
                while let Ok(line) = err_lines.try_recv() {
                    stderr.push(line);
                }
                panic!(
                    "a2a_peer.py did not start ({other:?}); stderr:\n{}\n(is the peer installed? run ./scripts/install-a2a-peers)",
                    stderr.join("\n")
                );
            }
        };
        Peer { child, url, lines }
    }

    /// The next stdout line starting with `prefix` (e.g. `SLOW `), without the prefix.
    pub async fn line(&mut self, prefix: &str) -> String {
        loop {
            let line = tokio::time::timeout(DEADLINE, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("the peer printed no `{prefix}` line"))
                .unwrap_or_else(|| panic!("the peer exited before a `{prefix}` line"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_string();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Serves `router` on a loopback port; answers its base URL.
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{address}")
}

/// A client with a generous timeout, optionally forced to a version.
pub fn client(url: &str, version: Option<ProtocolVersion>) -> A2aClient {
    client_with(url, version, process_env())
}

/// A client reading credentials from `env`.
pub fn client_with(url: &str, version: Option<ProtocolVersion>, env: EnvLookup) -> A2aClient {
    A2aClient::new(
        url,
        ClientOptions {
            timeout: DEADLINE,
            force_version: version,
            env,
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

/// An environment of `pairs` only.
pub fn env_of(pairs: &[(&str, &str)]) -> EnvLookup {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    Arc::new(move |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// A fresh tool context and its cancellation token.
pub fn ctx(call_id: &str) -> (ToolContext, CancellationToken) {
    let token = CancellationToken::new();
    (
        ToolContext::new("thr_test", "run_test", call_id, token.clone()),
        token,
    )
}
