//! Connection reuse: a finished answer's connection goes back to the pool (the rest of its
//! body — `[DONE]`, the chunked end — is read), and models of the same client settings
//! alive at the same time share one pool, so consecutive calls of one run, and runs
//! overlapping in a server, reuse one connection instead of a new one (a new TLS
//! handshake with a hosted provider) per call. Once the last model is dropped its client
//! and connections are closed: nothing outlives the agents. The server is a raw keep-alive
//! HTTP/1.1 loop on 127.0.0.1 counting the connections it accepts and sees closed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use keel_core::ModelRequest;
use keel_providers::{ProviderOptions, model_from_spec_with_env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{collect, text_of, user};

const OUTER: Duration = Duration::from_secs(60);

/// One streamed answer, as OpenAI sends it: content, a finish reason, `[DONE]`, in one
/// chunked body written at once.
fn answer() -> Vec<u8> {
    let events = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    out.extend_from_slice(format!("{:x}\r\n{events}\r\n0\r\n\r\n", events.len()).as_bytes());
    out
}

/// Serves [`answer`] to every request, keeping connections open; counts connections.
async fn server() -> (String, Arc<AtomicUsize>, Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    let closed = Arc::new(tokio::sync::Notify::new());
    let on_close = closed.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let on_close = on_close.clone();
            tokio::spawn(async move {
                let mut pending: Vec<u8> = Vec::new();
                let mut buffer = [0u8; 8192];
                loop {
                    // A request: its headers, then `content-length` bytes of body.
                    if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if pending.len() >= end + 4 + length {
                            pending.drain(..end + 4 + length);
                            if stream.write_all(&answer()).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => {
                            on_close.notify_one();
                            return;
                        }
                        Ok(n) => pending.extend_from_slice(&buffer[..n]),
                    }
                }
            });
        }
    });
    (base, connections, closed)
}

fn options(base_url: &str) -> ProviderOptions {
    ProviderOptions {
        base_url: Some(base_url.to_string()),
        api_key: Some("test-key".into()),
        loopback_only: true,
        ..ProviderOptions::default()
    }
}

#[tokio::test]
async fn models_alive_together_share_one_connection_and_close_it_when_dropped() {
    let (base, connections, closed) = server().await;
    let messages = user("hi");
    let mut models = Vec::new();
    for model_number in 0..3 {
        // A new model each time, as each run of a server builds its agent; the earlier
        // ones are still alive (overlapping runs).
        let model =
            model_from_spec_with_env("openai:gpt-4o-mini", &options(&base), &|_| None).unwrap();
        for _ in 0..2 {
            let (events, error) =
                tokio::time::timeout(OUTER, collect(model.as_ref(), ModelRequest::new(&messages)))
                    .await
                    .unwrap();
            assert!(error.is_none(), "model {model_number}: {error:?}");
            assert_eq!(text_of(&events), "hello");
        }
        models.push(model);
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "six calls of three models should have used one connection"
    );
    // The last model dropped: its client closes the pooled connection.
    let notified = closed.notified();
    drop(models);
    tokio::time::timeout(OUTER, notified)
        .await
        .expect("the idle connection is closed once no model holds the client");
}
