//! keel-mcp over Streamable HTTP against server-everything started in `streamableHttp`
//! mode on a loopback port.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::time::{Duration, Instant};

use common::{ctx, everything_js};
use keel_core::ToolErrorCode;
use keel_mcp::{McpManager, McpServerConfig, McpServerState};
use serde_json::json;

struct HttpServer {
    child: tokio::process::Child,
}

impl HttpServer {
    async fn start(port: u16) -> Self {
        let child = tokio::process::Command::new("node")
            .arg(everything_js())
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "server-everything did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self { child }
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_server_tools_and_reconnect_after_server_restart() {
    let port = free_port();
    let server = HttpServer::start(port).await;
    let config = McpServerConfig::http("web", format!("http://127.0.0.1:{port}/mcp"))
        .with_header("X-Keel-Test", "yes")
        .with_call_timeout(Duration::from_secs(3));
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    assert_eq!(status.transport, "http");
    assert!(status.tools.iter().any(|t| t == "web__echo"), "{status:#?}");

    let echo = manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "web__echo")
        .unwrap();
    let out = echo
        .call(json!({"message": "over http"}), &ctx("h1"))
        .await
        .unwrap();
    assert!(
        out["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("over http"),
        "{out}"
    );

    // The server restarts and forgets the session. server-everything answers the unknown
    // session with 400 (not the 404 the spec asks for, which rmcp would re-initialize
    // transparently), so the first call after the restart fails as data (timeout or
    // retryable); the liveness probe then reconnects and the next call succeeds.
    server.stop().await;
    let server = HttpServer::start(port).await;
    let first = echo.call(json!({"message": "again"}), &ctx("h2")).await;
    if let Err(error) = &first {
        assert!(
            matches!(
                error.code,
                ToolErrorCode::RetryableServer | ToolErrorCode::Timeout
            ),
            "{error:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while manager.statuses()[0].restarts == 0 {
            assert!(
                Instant::now() < deadline,
                "never reconnected: {:#?}",
                manager.statuses()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let out = echo
        .call(json!({"message": "again"}), &ctx("h3"))
        .await
        .unwrap();
    assert!(
        out["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("again"),
        "{out}"
    );
    eprintln!("first call after restart: {first:?}");
    manager.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_http_server_is_reported_and_skipped() {
    let port = free_port();
    let config = McpServerConfig::http("nowhere", format!("http://127.0.0.1:{port}/mcp"))
        .with_startup_timeout(Duration::from_secs(5));
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Failed, "{status:#?}");
    assert!(status.error.is_some());
    assert!(manager.tools().is_empty());
}
