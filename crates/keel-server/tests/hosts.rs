//! The serving edges an attacker reaches without a key, over raw sockets (a client sends
//! any `Host` and any method it likes): DNS rebinding (a foreign `Host` gets 421 before
//! any handler), the A2A cards' URLs (from configuration, never from the request) and the
//! metrics labels (a closed set: made-up methods and paths add no series).

use std::sync::Arc;
use std::time::Duration;

use keel_app::App;
use keel_server::Server;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Backend, DEADLINE, Harness};

/// One raw HTTP/1.1 exchange with the server at `base`: `method path` with these `Host`
/// and extra header lines; answers the status and the body (the connection is closed
/// after the answer).
async fn raw(base: &str, method: &str, path: &str, host: &str, extra: &[String]) -> (u16, String) {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for line in extra {
        request.push_str(line);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
        .await
        .expect("the server answered in time")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

fn bearer(key: &str) -> Vec<String> {
    vec![format!("Authorization: Bearer {key}")]
}

/// The JSON of a body that may be sent chunked (the JSON object is its first `{`…`}`).
fn json_of(body: &str) -> Value {
    let start = body
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {body:?}"));
    let end = body.rfind('}').unwrap();
    serde_json::from_str(&body[start..=end]).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_gets_421_and_no_data_before_any_handler() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": []}), "").await;
    let key = h.key("acme").await;
    let port = h.base.rsplit(':').next().unwrap().to_string();

    for (path, extra) in [
        ("/v1/threads", bearer(&key)),
        ("/v1/threads/thr_secret", bearer(&key)),
        ("/ui/", Vec::new()),
        ("/ui/login", Vec::new()),
        ("/.well-known/agent-card.json", Vec::new()),
        ("/openapi.json", Vec::new()),
        ("/metrics", bearer(&key)),
        ("/no/such/page", Vec::new()),
    ] {
        for host in [
            format!("attacker.example:{port}"),
            "attacker.example".to_string(),
            format!("localhost.attacker.example:{port}"),
        ] {
            let (status, body) = raw(&h.base, "GET", path, &host, &extra).await;
            assert_eq!(status, 421, "GET {path} with Host {host}: {body}");
            let error = json_of(&body);
            assert_eq!(error["error"]["code"], "misdirected_host", "{body}");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains("[server] allowed_hosts"), "{message}");
            assert!(
                !body.contains("thr_") && !body.contains("keel_server_"),
                "{body}"
            );
        }
    }
    // A state-changing request is refused the same way, and changes nothing.
    let (status, _) = raw(
        &h.base,
        "DELETE",
        "/v1/threads/thr_secret",
        "attacker.example",
        &bearer(&key),
    )
    .await;
    assert_eq!(status, 421);

    // Loopback names and the address served, with or without the port, are answered.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ] {
        let (status, body) = raw(&h.base, "GET", "/v1/threads", &host, &bearer(&key)).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    // Health checks answer whatever name a load balancer probes with (they show nothing).
    let (status, _) = raw(&h.base, "GET", "/healthz", "10.1.2.3:9", &[]).await;
    assert_eq!(status, 200);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_and_public_url_widen_the_host_check() {
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": []}),
        "public_url = \"https://agents.example\"\nallowed_hosts = [\"keel.internal\"]\n",
    )
    .await;
    let key = h.key("acme").await;
    for host in ["agents.example", "agents.example:443", "keel.internal:8080"] {
        let (status, body) = raw(&h.base, "GET", "/v1/threads", host, &bearer(&key)).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    for host in ["agents.example:8443", "evil.example"] {
        let (status, _) = raw(&h.base, "GET", "/v1/threads", host, &bearer(&key)).await;
        assert_eq!(status, 421, "Host {host}");
    }
    h.stop().await;
}

/// Every URL in a card (any string value starting with a scheme).
fn urls(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) if s.contains("://") => vec![s.clone()],
        Value::Array(items) => items.iter().flat_map(urls).collect(),
        Value::Object(map) => map.values().flat_map(urls).collect(),
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_card_urls_come_from_configuration_never_from_request_headers() {
    // The Host check off (`*`), so only the card itself stands between the header and
    // the URLs it names.
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": []}),
        "allowed_hosts = [\"*\"]\n",
    )
    .await;
    let forwarded = vec![
        "X-Forwarded-Host: evil.example".to_string(),
        "X-Forwarded-Proto: https".to_string(),
        "Forwarded: host=evil.example;proto=https".to_string(),
    ];
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/bot/.well-known/agent-card.json",
    ] {
        for host in ["evil.example", "evil.example:8080"] {
            let (status, body) = raw(&h.base, "GET", path, host, &forwarded).await;
            assert_eq!(status, 200, "{body}");
            let card = json_of(&body);
            let found = urls(&card);
            assert!(!found.is_empty(), "{card}");
            for url in &found {
                assert!(!url.contains("evil.example"), "{url} in {card}");
            }
            assert_eq!(card["url"], h.url("/a2a/bot"), "{card}");
            assert_eq!(card["supportedInterfaces"][0]["url"], h.url("/a2a/bot"));
        }
    }
    h.stop().await;

    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": []}),
        "public_url = \"https://agents.example/\"\n",
    )
    .await;
    let (status, body) = raw(
        &h.base,
        "GET",
        "/.well-known/agent-card.json",
        "agents.example",
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let card = json_of(&body);
    assert_eq!(card["url"], "https://agents.example/a2a/bot", "{card}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_bind_without_public_url_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[agents.bot]\nmodel = \"openai:gpt-4.1-mini\"\ninstructions = \"x\"\n\
                [server]\nbind = \"0.0.0.0:8080\"\n";
    let env: keel_app::Env = Arc::new(|_: &str| Some("sk-test".to_string()));
    let app = Arc::new(App::from_toml_str(toml, dir.path(), env).unwrap());
    let url = format!("sqlite://{}", dir.path().join("keel.db").display());
    let store = keel_store::open(&url).await.unwrap();
    let config = app.config().server.clone();
    let refused = Server::new(app.clone(), &store, config.clone()).unwrap_err();
    let text = refused.to_string();
    assert!(text.contains("[server] public_url"), "{text}");

    // Handed a listener on every interface, `serve` refuses it the same way.
    let loopback = keel_config::ServerConfig {
        bind: "127.0.0.1:0".into(),
        ..config.clone()
    };
    let server = Server::new(app.clone(), &store, loopback).unwrap();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = tokio::time::timeout(DEADLINE, server.serve(listener, async {}))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        refused.to_string().contains("[server] public_url"),
        "{refused}"
    );

    // With public_url it serves.
    let public = keel_config::ServerConfig {
        public_url: Some("https://agents.example".into()),
        ..config
    };
    assert!(Server::new(app, &store, public).is_ok());
}

/// The `keel_server_requests_total` series of a `/metrics` body.
fn series(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| l.starts_with("keel_server_requests_total{"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_and_paths_add_no_metric_series() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": []}), "").await;
    let key = h.key("ops").await;
    let host = h.base.trim_start_matches("http://").to_string();
    let metrics = |h: &Harness| {
        let h = h.base.clone();
        let key = key.clone();
        let host = host.clone();
        async move {
            let (status, body) = raw(&h, "GET", "/metrics", &host, &bearer(&key)).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    // Requests with no key, each a new 2,000-byte method and a new path.
    let send = |round: usize| {
        let base = h.base.clone();
        let host = host.clone();
        async move {
            let method: String = format!("M{round:05}")
                .chars()
                .chain(std::iter::repeat_n('X', 1995))
                .collect();
            let path = format!("/v1/threads/thr_{round}/nothing/{round}");
            raw(&base, &method, &path, &host, &[]).await
        }
    };
    for round in 0..20 {
        let (status, _) = send(round).await;
        assert!(status >= 400, "{status}");
    }
    let _ = metrics(&h).await; // the scrape's own series exists from here on
    let early = metrics(&h).await;
    for round in 20..220 {
        let (status, _) = send(round).await;
        assert!(status >= 400, "{status}");
    }
    let late = metrics(&h).await;
    assert!(
        !late.contains("XXXXXXXX"),
        "a made-up method became a label"
    );
    assert!(!late.contains("thr_1"), "a made-up path became a label");
    // 200 more requests of the same kinds: the same series (their counts grew), and a
    // body that grew only by the counts' digits.
    let labels = |body: &str| -> Vec<String> {
        series(body)
            .iter()
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .filter(|l| !l.contains("route=\"/metrics\""))
            .collect()
    };
    assert_eq!(labels(&early), labels(&late), "{late}");
    assert!(
        late.len() < early.len() + 64,
        "/metrics grew from {} to {} bytes:\n{late}",
        early.len(),
        late.len()
    );
    assert!(
        late.contains("method=\"other\""),
        "made-up methods count as `other`: {late}"
    );
    // Not a slow-down either: the last scrape answered promptly.
    let started = std::time::Instant::now();
    let _ = metrics(&h).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    h.stop().await;
}
