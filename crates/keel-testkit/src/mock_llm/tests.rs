//! Tests of the mock server itself: script parsing (including the documented example),
//! exhaustion, unknown paths, and `serve_until` on a fixed port.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    let payload = body.to_string();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    socket.read_to_string(&mut out).await.unwrap();
    let status = out.split(' ').nth(1).unwrap().parse().unwrap();
    (status, out)
}

#[test]
fn documented_example_parses() {
    let doc = include_str!("../../../../docs/mock-llm.md");
    let start = doc.find("```json\n").unwrap() + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let script = MockScript::from_json(&doc[start..end]).unwrap();
    assert_eq!(script.turns.len(), 3);
    assert_eq!(script.turns[0].tool_calls[0].name, "calculator");
    assert_eq!(
        script.turns[1].error.as_ref().unwrap().retry_after_ms,
        Some(500)
    );
}

#[test]
fn scripts_reject_unknown_fields_and_accept_lists() {
    assert!(MockScript::from_json(r#"[{"text": "a", "txet": "typo"}]"#).is_err());
    let script =
        MockScript::from_json(r#"{"steps": [{"text": "a"}], "when_exhausted": "cycle"}"#).unwrap();
    assert_eq!(script.when_exhausted, WhenExhausted::Cycle);
    assert!(MockScript::from_file("/nonexistent/script.json").is_err());
}

#[tokio::test]
async fn exhausted_script_and_unknown_paths_are_clear_errors() {
    let server = MockLlmServer::start(MockScript::new(vec![MockTurn::text("only one")]))
        .await
        .unwrap();
    let body = json!({"model": "m", "messages": [], "stream": false});
    let (status, _) = post(server.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let (status, text) = post(server.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 500);
    assert!(text.contains("script exhausted"), "{text}");
    let (status, text) = post(server.addr(), "/v2/unknown", &body).await;
    assert_eq!(status, 404);
    assert!(text.contains("/v1/messages"), "{text}");
    let log = server.requests();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0].turn, Some(0));
    assert_eq!(log[1].turn, None);
    assert_eq!(log[2].protocol, None);
    server.shutdown().await;
}

#[tokio::test]
async fn repeat_last_and_every_protocol_non_streaming() {
    let script =
        MockScript::new(vec![MockTurn::text("same")]).when_exhausted(WhenExhausted::RepeatLast);
    let server = MockLlmServer::start(script).await.unwrap();
    for path in [
        "/v1/messages",
        "/v1/chat/completions",
        "/v1/responses",
        "/api/chat",
    ] {
        let body = json!({"model": "m", "messages": [], "stream": false});
        let (status, text) = post(server.addr(), path, &body).await;
        assert_eq!(status, 200, "{path}: {text}");
        assert!(text.contains("same"), "{path}: {text}");
    }
    assert_eq!(server.turns_used(), 4);
}

#[tokio::test]
async fn serve_until_runs_on_a_port_and_stops() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let script = MockScript::new(vec![MockTurn::text("served")]);
    let task = tokio::spawn(serve_until(script, port, async move {
        let _ = stopped.await;
    }));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut answer = None;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            answer = Some(
                post(
                    addr,
                    "/api/chat",
                    &json!({"model": "m", "messages": [], "stream": false}),
                )
                .await,
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, text) = answer.expect("server came up");
    assert_eq!(status, 200);
    assert!(text.contains("served"));
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn chaos_from_a_script_injects_counted_faults_and_the_log_can_be_skipped() {
    let script = MockScript::from_json(
        r#"{"turns": [{"text": "fine"}], "when_exhausted": "repeat_last",
            "chaos": {"seed": 3, "rate": 1.0, "faults": ["rate_limited"], "max_retry_after_ms": 0}}"#,
    )
    .unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let options = MockServerOptions {
        no_log: true,
        on_request: Some(Arc::new(move |request: &MockRequest| {
            assert_eq!(request.path, "/v1/chat/completions");
            counter.fetch_add(1, Ordering::SeqCst);
        })),
    };
    let server = MockLlmServer::start_with(script, 0, options).await.unwrap();
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false});
    for _ in 0..3 {
        let (status, text) = post(server.addr(), "/v1/chat/completions", &body).await;
        assert_eq!(status, 429, "{text}");
        assert!(
            text.to_ascii_lowercase().contains("retry-after: 0"),
            "{text}"
        );
    }
    assert_eq!(server.request_count(), 3);
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    assert!(server.requests().is_empty());
    assert_eq!(
        server.faults_injected().get(&ChaosFault::RateLimited),
        Some(&3)
    );
    server.shutdown().await;
}
