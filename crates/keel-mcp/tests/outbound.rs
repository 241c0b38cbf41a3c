//! MCP over HTTP under the outbound policy (issue 46), against loopback servers: a
//! redirect to another origin is not followed (the configured headers never reach it),
//! and a server whose address the policy does not allow — a loopback literal, or a
//! public-looking name resolving to loopback — is never contacted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::any;
use keel_mcp::{McpManager, McpServerConfig, McpServerState};
use keel_outbound::{Lookup, OutboundPolicy};

/// Requests a server saw: path and `x-api-key`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A server answering every request with `status` and `location` (if any), recording it.
async fn server(status: StatusCode, location: Option<String>) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let app = Router::new().fallback(any(move |uri: Uri, headers: HeaderMap| {
        let log = log.clone();
        let location = location.clone();
        async move {
            let key = headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            log.lock().unwrap().push((uri.path().to_string(), key));
            match location {
                Some(location) => (status, [("location", location)]).into_response(),
                None => status.into_response(),
            }
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn config(url: &str) -> McpServerConfig {
    let toml_text = format!(
        "name = \"web\"\nurl = \"{url}\"\nheaders = {{ X-Api-Key = \"mcp-secret-key-123\" }}\nstartup_timeout_ms = 5000\n"
    );
    let mut config: McpServerConfig = toml::from_str(&toml_text).unwrap();
    config.startup_timeout = Duration::from_secs(5);
    config
}

fn failure(manager: &McpManager) -> String {
    let status = manager.statuses().remove(0);
    assert_eq!(status.state, McpServerState::Failed, "{status:?}");
    status.error.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_a_redirect_to_another_origin_is_not_followed() {
    let (other, other_seen) = server(StatusCode::OK, None).await;
    let (first, first_seen) = server(
        StatusCode::TEMPORARY_REDIRECT,
        Some(format!("http://{other}/mcp")),
    )
    .await;
    let manager = McpManager::connect_all([config(&format!("http://{first}/mcp"))]).await;
    failure(&manager);
    assert!(
        !first_seen.lock().unwrap().is_empty(),
        "the server was not asked"
    );
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "the other origin received {:?}",
        other_seen.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_a_server_at_an_address_the_policy_refuses_is_never_contacted() {
    let (addr, seen) = server(StatusCode::OK, None).await;
    // A loopback literal the policy does not name.
    let manager = McpManager::connect_all_with(
        [config(&format!("http://{addr}/mcp"))],
        &OutboundPolicy::default(),
    )
    .await;
    let error = failure(&manager);
    assert!(error.contains("outbound_refused"), "{error}");
    assert!(error.contains("loopback"), "{error}");

    // A public-looking name that resolves to loopback (through the policy's lookup: no
    // test depends on real DNS).
    let lookup: Lookup = Arc::new(|name: &str| {
        (name == "mcp.public-looking.example").then(|| vec!["127.0.0.1".parse().unwrap()])
    });
    let manager = McpManager::connect_all_with(
        [config(&format!(
            "http://mcp.public-looking.example:{}/mcp",
            addr.port()
        ))],
        &OutboundPolicy::default().with_lookup(lookup),
    )
    .await;
    let error = failure(&manager);
    assert!(error.contains("outbound_refused"), "{error}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "a request was sent: {:?}",
        seen.lock().unwrap()
    );

    // Allowed by name (as keel.toml's url does), the server is contacted.
    let url = format!("http://{addr}/mcp");
    let manager = McpManager::connect_all_with(
        [config(&url)],
        &OutboundPolicy::default().allowing_destination(&url),
    )
    .await;
    failure(&manager);
    assert!(
        !seen.lock().unwrap().is_empty(),
        "the allowed server was not asked"
    );
}
