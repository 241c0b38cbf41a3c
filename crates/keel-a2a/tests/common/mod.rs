//! Shared helpers of the keel-a2a integration tests: the Python A2A peer installed by
//! `./scripts/install-a2a-peers` (`keel_a2a::peers`: started on 127.0.0.1, its stdout
//! lines as events), the Keel router served on a loopback port, and tool contexts.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_a2a::client::{EnvLookup, process_env};
use keel_a2a::peers::PythonPeer;
use keel_a2a::{A2aClient, ClientOptions, ProtocolVersion};
use keel_core::{CancellationToken, ToolContext};

/// Generous deadline for anything a test waits for (never a timing assertion).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The venv's python, with a2a-sdk installed (see [`keel_a2a::peers`]).
pub fn python() -> PathBuf {
    keel_a2a::peers::python().unwrap_or_else(|e| panic!("{e}"))
}

/// A script of `tests/peers/`.
pub fn script(name: &str) -> PathBuf {
    keel_a2a::peers::script(name)
}

/// A running `a2a_peer.py` ([`PythonPeer`] with the tests' deadline; failures panic).
pub struct Peer {
    inner: PythonPeer,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
}

impl Peer {
    /// Starts the peer with `args` and `env`; waits for its `READY` line.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Peer {
        let inner = PythonPeer::start(args, env, DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Peer {
            url: inner.url.clone(),
            inner,
        }
    }

    /// The next stdout line starting with `prefix` (e.g. `SLOW `), without the prefix.
    pub async fn line(&mut self, prefix: &str) -> String {
        self.inner
            .line(prefix)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Serves the router `router` builds for its base URL on a loopback port; answers that
/// URL.
pub async fn serve(router: impl FnOnce(&str) -> axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = router(&format!("http://{address}"));
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
