//! The A2A client under an explicit outbound policy (keel-outbound), over loopback
//! sockets: a public-looking name resolving to loopback is refused before anything is
//! sent; a trusted interface origin receives the call, unless its address is refused.
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
use keel_a2a::{A2aClient, ClientError, ClientOptions, Message};
use keel_outbound::{AddressClass, Lookup, OutboundPolicy, RedirectPolicy};
use serde_json::json;

use crate::common::{DEADLINE, env_of, serve};

fn card(interface: &str) -> serde_json::Value {
    json!({
        "name": "peer",
        "supportedInterfaces": [
            {"url": interface, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": false},
        "skills": []
    })
}

/// A server serving `card(interface)` for every request, counting them.
async fn card_server(interface: Option<String>) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let url = serve(move |base| {
        let interface = interface.unwrap_or_else(|| format!("{base}/rpc"));
        Router::new().fallback(any(move |uri: Uri| {
            log.lock().unwrap().push(uri.path().to_string());
            let interface = interface.clone();
            async move {
                if uri.path().ends_with("agent-card.json") {
                    axum::Json(card(&interface))
                } else {
                    axum::Json(json!({"jsonrpc": "2.0", "id": 1, "result": {
                        "message": {"role": "agent", "messageId": "m1", "parts": [{"text": "hi"}]}
                    }}))
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
        ..ClientOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_looking_name_resolving_to_loopback_is_refused() {
    let (url, seen) = card_server(None).await;
    let port = url.rsplit(':').next().unwrap();
    // No test depends on real DNS: the name resolves through the policy's lookup.
    let lookup: Lookup = Arc::new(|name: &str| {
        (name == "agents.public-looking.example").then(|| vec!["127.0.0.1".parse().unwrap()])
    });
    let client = A2aClient::new(
        &format!("http://agents.public-looking.example:{port}"),
        options(),
    )
    .unwrap()
    .with_outbound(OutboundPolicy::default().with_lookup(lookup))
    .unwrap();
    match client.card().await {
        Err(ClientError::Refused(refused)) => {
            assert_eq!(refused.class, AddressClass::Loopback);
            assert_eq!(refused.host, "agents.public-looking.example");
            assert!(refused.to_string().contains("[outbound] allow_private"));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(seen.lock().unwrap().is_empty(), "a request was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_interface_origin_is_called_unless_its_address_is_refused() {
    let (other, other_seen) = card_server(None).await;
    let (url, _) = card_server(Some(format!("{other}/rpc"))).await;
    // The other loopback origin, trusted and reachable (the host of both is 127.0.0.1,
    // which the agent's URL names).
    let client = A2aClient::new(&url, options())
        .unwrap()
        .trusting_origins([other.as_str()])
        .unwrap();
    client.send(&Message::user("hello"), true).await.unwrap();
    assert_eq!(other_seen.lock().unwrap().as_slice(), ["/rpc"]);

    // Trusted as an origin, but the metadata address is still refused.
    let (url, _) = card_server(Some("http://169.254.169.254/rpc".into())).await;
    let client = A2aClient::new(&url, options())
        .unwrap()
        .trusting_origins(["http://169.254.169.254"])
        .unwrap();
    match client.send(&Message::user("hello"), true).await {
        Err(ClientError::Refused(refused)) => assert_eq!(refused.class, AddressClass::Metadata),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redirects_any_no_credential_crosses_origins_and_addresses_are_still_checked() {
    // The other origin records the credential headers it receives.
    type Credentials = (Option<String>, Option<String>);
    let seen: Arc<Mutex<Vec<Credentials>>> = Arc::default();
    let log = seen.clone();
    let other = serve(move |base| {
        let interface = format!("{base}/rpc");
        Router::new().fallback(any(move |headers: HeaderMap| {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            log.lock()
                .unwrap()
                .push((header("x-api-key"), header("authorization")));
            let interface = interface.clone();
            async move { axum::Json(card(&interface)) }
        }))
    })
    .await;
    let redirecting = |target: String| async move {
        serve(move |_| {
            Router::new().fallback(any(move || {
                let target = target.clone();
                async move { (StatusCode::FOUND, [("location", target)]).into_response() }
            }))
        })
        .await
    };
    let options = ClientOptions {
        timeout: DEADLINE,
        auth: Auth {
            bearer_env: Some("TOKEN".into()),
            headers: BTreeMap::from([("X-Api-Key".to_string(), "KEY".to_string())]),
        },
        env: env_of(&[("TOKEN", "tok-123456789"), ("KEY", "key-123456789")]),
        ..ClientOptions::default()
    };
    let first = redirecting(format!("{other}/.well-known/agent-card.json")).await;
    let client = A2aClient::new(&first, options.clone())
        .unwrap()
        .with_redirects(RedirectPolicy::Any);
    // The hop to the other origin carried no credential; the card it answered names an
    // interface on that origin, not the configured one, so nothing more is sent.
    let error = client.card().await.unwrap_err();
    assert!(
        matches!(error, ClientError::OtherOrigin { .. }),
        "{error:?}"
    );
    assert_eq!(seen.lock().unwrap().as_slice(), [(None, None)]);

    let first = redirecting("http://169.254.169.254/latest/meta-data/".into()).await;
    let client = A2aClient::new(&first, options)
        .unwrap()
        .with_redirects(RedirectPolicy::Any);
    match client.card().await {
        Err(ClientError::Refused(refused)) => assert_eq!(refused.class, AddressClass::Metadata),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
