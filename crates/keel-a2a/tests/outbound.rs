//! The A2A client's outbound calls cannot be turned against the host or its credentials
//! (issue 46), each over real loopback sockets: a redirect to another origin carries no
//! credential there; a card naming its interface on another origin gets nothing sent
//! there; an interface at the metadata address is refused; an error body reaches the tool
//! error capped and redacted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::any;
use keel_a2a::client::Auth;
use keel_a2a::{A2aClient, A2aTool, A2aToolArgs, ClientOptions, Message, RemoteAgent};
use keel_core::{Tool, ToolErrorCode};
use serde_json::{Value, json};

use crate::common::{DEADLINE, ctx, env_of, serve};

/// The configured secret header value, and the bearer token.
const API_KEY: &str = "peer-api-key-0123456789";
const TOKEN: &str = "peer-bearer-token-9876543210";

/// What a server saw: path and the credential headers of each request.
type Seen = Arc<Mutex<Vec<Value>>>;

fn record(seen: &Seen, uri: &Uri, headers: &HeaderMap) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    seen.lock().unwrap().push(json!({
        "path": uri.path(),
        "x_api_key": header("x-api-key"),
        "authorization": header("authorization"),
    }));
}

/// A 1.0 card whose JSON-RPC interface is at `interface`.
fn card(interface: &str) -> Value {
    json!({
        "name": "peer",
        "description": "A test peer.",
        "version": "1.0.0",
        "supportedInterfaces": [
            {"url": interface, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": false},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": []
    })
}

/// A server recording every request; it serves a card naming itself and answers
/// JSON-RPC with an empty error.
async fn recording_peer() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let url = serve(move |base| {
        let interface = format!("{base}/rpc");
        Router::new().fallback(any(move |uri: Uri, headers: HeaderMap| {
            let log = log.clone();
            let interface = interface.clone();
            async move {
                record(&log, &uri, &headers);
                if uri.path().ends_with("agent-card.json") {
                    axum::Json(card(&interface)).into_response()
                } else {
                    axum::Json(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "nope"}}))
                        .into_response()
                }
            }
        }))
    })
    .await;
    (url, seen)
}

fn options() -> ClientOptions {
    ClientOptions {
        timeout: DEADLINE,
        auth: Auth {
            bearer_env: Some("PEER_TOKEN".into()),
            headers: BTreeMap::from([("X-Api-Key".to_string(), "PEER_KEY".to_string())]),
        },
        env: env_of(&[("PEER_TOKEN", TOKEN), ("PEER_KEY", API_KEY)]),
        ..ClientOptions::default()
    }
}

fn credentials_seen(seen: &Seen) -> Vec<Value> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|entry| !entry["x_api_key"].is_null() || !entry["authorization"].is_null())
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_carries_no_credential_there() {
    let (other, other_seen) = recording_peer().await;
    for status in [StatusCode::FOUND, StatusCode::TEMPORARY_REDIRECT] {
        let target = format!("{other}/.well-known/agent-card.json");
        let first = serve(move |_| {
            Router::new().fallback(any(move || {
                let target = target.clone();
                async move { (status, [("location", target)]).into_response() }
            }))
        })
        .await;
        let client = A2aClient::new(&first, options()).unwrap();
        let error = client.card().await.unwrap_err();
        assert!(
            error.to_string().contains("another origin"),
            "{status}: {error}"
        );
        assert_eq!(
            credentials_seen(&other_seen),
            Vec::<Value>::new(),
            "{status}: the other origin received credentials"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_naming_another_origin_for_its_interface_gets_nothing_sent_there() {
    let (other, other_seen) = recording_peer().await;
    let interface = format!("{other}/rpc");
    let card_seen: Seen = Arc::default();
    let log = card_seen.clone();
    let url = serve(move |_| {
        Router::new().fallback(any(move |uri: Uri, headers: HeaderMap| {
            let log = log.clone();
            let interface = interface.clone();
            async move {
                record(&log, &uri, &headers);
                axum::Json(card(&interface))
            }
        }))
    })
    .await;
    let client = A2aClient::new(&url, options()).unwrap();
    let error = client
        .send(&Message::user("hello"), true)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("another origin"), "{text}");
    assert!(text.contains("interface_origins"), "{text}");
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "the interface's origin received {:?}",
        other_seen.lock().unwrap()
    );
    // The card came from the configured origin, which may see the credentials.
    assert_eq!(card_seen.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interface_at_the_metadata_address_is_refused() {
    let url = serve(|_| {
        Router::new().fallback(any(|| async {
            axum::Json(card("http://169.254.169.254/latest/meta-data/"))
        }))
    })
    .await;
    let mut agent = RemoteAgent::new("peer", url);
    agent.timeout = std::time::Duration::from_secs(5);
    let tool = A2aTool::new(agent).unwrap();
    let (ctx, _) = ctx("call-metadata");
    let error = tool
        .call(
            A2aToolArgs {
                message: "hello".into(),
                task_id: None,
            },
            &ctx,
        )
        .await
        .unwrap_err();
    // Refused here, before any request left: not an answer from whatever listens there.
    assert_eq!(error.code, ToolErrorCode::Forbidden, "{}", error.message);
    let details = error.details.clone().unwrap_or_default();
    assert!(
        matches!(
            details["error"].as_str(),
            Some("other_origin_refused" | "outbound_refused")
        ),
        "{}: {details}",
        error.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_body_reaches_the_tool_error_capped_and_redacted() {
    let url = serve(|base| {
        let interface = format!("{base}/rpc");
        Router::new().fallback(any(move |uri: Uri| {
            let interface = interface.clone();
            async move {
                if uri.path().ends_with("agent-card.json") {
                    return axum::Json(card(&interface)).into_response();
                }
                let mut body = format!(
                    "<html>upstream exploded; config: OPENAI_API_KEY=sk-proj-AbCdEfGhIjKlMnOpQrStUv012345 \
                     echo X-Api-Key: {API_KEY} "
                );
                body.push_str(&"lorem ipsum ".repeat(200));
                body.truncate(2_000);
                (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
            }
        }))
    })
    .await;
    let mut agent = RemoteAgent::new("peer", url);
    agent.auth = options().auth;
    agent.env = options().env;
    agent.timeout = std::time::Duration::from_secs(20);
    let tool = A2aTool::new(agent).unwrap();
    let (ctx, _) = ctx("call-body");
    let error = tool
        .call(
            A2aToolArgs {
                message: "hello".into(),
                task_id: None,
            },
            &ctx,
        )
        .await
        .unwrap_err();
    let text = serde_json::to_string(&error).unwrap();
    assert!(!text.contains("sk-proj-AbCdEf"), "{text}");
    assert!(!text.contains(API_KEY), "{text}");
    assert!(text.contains("upstream exploded"), "{text}");
    let body = error.details.as_ref().unwrap()["body"].as_str().unwrap();
    assert!(body.len() <= 512 + 40, "{} bytes: {body}", body.len());
    assert!(
        error.message.len() <= 512 + 200,
        "{} bytes: {}",
        error.message.len(),
        error.message
    );
}
