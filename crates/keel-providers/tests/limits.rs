//! Bounds and secrets: a server that streams forever or sends an endless line makes the
//! call fail with the right error (overall deadline, event size limit); API keys and URL
//! credentials never appear in `Debug` output or error messages. The misbehaving servers
//! are small axum apps on 127.0.0.1 started by each test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, Uri, header};
use axum::response::Response;
use bytes::Bytes;
use common::{collect, user};
use keel_core::{ModelError, ModelErrorKind, ModelRequest, StreamEvent};
use keel_providers::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_EVENT_BYTES, Jitter, ProviderConfigError, ProviderOptions,
    RecordingSleeper, RetryConfig, model_from_spec_with_env,
};

/// Generous bound on every call in this file: the assertions are on the error kind, never
/// on timing; this only keeps a regression from hanging the suite.
const OUTER: Duration = Duration::from_secs(60);

const CHAT_DELTA: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n";
const OLLAMA_DELTA: &str =
    "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"done\":false}\n";

/// A body that repeats `piece` forever, pausing a little between pieces so the test does
/// not spin a core.
fn endless(piece: Bytes, pause: Duration) -> Body {
    let stream = futures::stream::unfold(piece, move |piece| async move {
        tokio::time::sleep(pause).await;
        Some((Ok::<Bytes, Infallible>(piece.clone()), piece))
    });
    Body::from_stream(stream)
}

fn streaming(content_type: &'static str, body: Body) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .unwrap()
}

/// Starts the misbehaving server; the behaviour is chosen by the first path segment of
/// the base URL (`/forever`, `/huge`, `/loop`).
async fn start_server() -> String {
    async fn handle(uri: Uri) -> Response {
        let path = uri.path().to_owned();
        let ndjson = path.ends_with("/api/chat");
        if path.starts_with("/forever") {
            if ndjson {
                return streaming(
                    "application/x-ndjson",
                    endless(
                        Bytes::from_static(OLLAMA_DELTA.as_bytes()),
                        Duration::from_millis(5),
                    ),
                );
            }
            return streaming(
                "text/event-stream",
                endless(
                    Bytes::from_static(CHAT_DELTA.as_bytes()),
                    Duration::from_millis(5),
                ),
            );
        }
        if path.starts_with("/huge") {
            // One line that never ends: SSE starts a `data:` field, NDJSON a JSON string.
            let (content_type, start) = if ndjson {
                ("application/x-ndjson", "{\"message\":{\"content\":\"")
            } else {
                ("text/event-stream", "data: {\"choices\":\"")
            };
            let head = futures::stream::once(async move {
                Ok::<Bytes, Infallible>(Bytes::from_static(start.as_bytes()))
            });
            let filler = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Some((
                    Ok::<Bytes, Infallible>(Bytes::from(vec![b'x'; 64 * 1024])),
                    (),
                ))
            });
            use futures::StreamExt;
            return streaming(content_type, Body::from_stream(head.chain(filler)));
        }
        if path.starts_with("/loop") {
            // Redirects to itself with credentials in the query until reqwest gives up;
            // its error then names the last URL, query included.
            return Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(
                    header::LOCATION,
                    format!("{path}?key=QUERYKEY123&sig=SIG456SIG"),
                )
                .body(Body::empty())
                .unwrap();
        }
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Body::empty())
            .unwrap()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().fallback(handle))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

fn options(base_url: String, clock: &RecordingSleeper) -> ProviderOptions {
    ProviderOptions {
        base_url: Some(base_url),
        api_key: Some("test-key".into()),
        retry: RetryConfig {
            max_attempts: 3,
            jitter: Jitter::None,
            ..RetryConfig::default()
        },
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(30),
        loopback_only: true,
        sleeper: Some(Arc::new(clock.clone())),
        ..ProviderOptions::default()
    }
}

/// Runs one call to the end (bounded by [`OUTER`]) and returns its events and error.
async fn call(spec: &str, options: &ProviderOptions) -> (Vec<StreamEvent>, ModelError) {
    let model = model_from_spec_with_env(spec, options, &|_| None).unwrap();
    let messages = user("hi");
    let (events, error) =
        tokio::time::timeout(OUTER, collect(model.as_ref(), ModelRequest::new(&messages)))
            .await
            .unwrap_or_else(|_| panic!("{spec}: the call did not end within {OUTER:?}"));
    (
        events,
        error.unwrap_or_else(|| panic!("{spec}: the call succeeded")),
    )
}

fn retries(events: &[StreamEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Retry { .. }))
        .count()
}

#[test]
fn defaults_bound_every_call() {
    let defaults = ProviderOptions::default();
    assert_eq!(defaults.call_timeout, DEFAULT_CALL_TIMEOUT);
    assert_eq!(DEFAULT_CALL_TIMEOUT, Duration::from_secs(600));
    assert_eq!(defaults.max_event_bytes, DEFAULT_MAX_EVENT_BYTES);
    assert_eq!(DEFAULT_MAX_EVENT_BYTES, 16 * 1024 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_of_deltas_ends_at_the_call_deadline() {
    let base = start_server().await;
    for spec in ["openai:gpt-4o-mini", "ollama:llama3.1"] {
        let clock = RecordingSleeper::new();
        let options = ProviderOptions {
            call_timeout: Duration::from_millis(500),
            ..options(format!("{base}/forever"), &clock)
        };
        let (events, error) = call(spec, &options).await;
        assert_eq!(error.kind, ModelErrorKind::Timeout, "{spec}: {error:?}");
        assert!(error.message.contains("call_timeout"), "{spec}: {error:?}");
        assert!(error.message.contains("500 ms"), "{spec}: {error:?}");
        // Deltas did arrive (the idle timeout never fired), and the deadline is final.
        assert!(
            events
                .iter()
                .any(|e| matches!(e, StreamEvent::TextDelta(_))),
            "{spec}: no deltas"
        );
        assert_eq!(retries(&events), 0, "{spec}: retried after the deadline");
        assert!(clock.waits().is_empty(), "{spec}: {:?}", clock.waits());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_fails_at_the_event_size_limit_without_retrying() {
    let base = start_server().await;
    for spec in [
        "openai:gpt-4o-mini",
        "anthropic:claude-sonnet-4-5",
        "ollama:llama3.1",
    ] {
        let clock = RecordingSleeper::new();
        let options = ProviderOptions {
            max_event_bytes: 1024 * 1024,
            ..options(format!("{base}/huge"), &clock)
        };
        let (events, error) = call(spec, &options).await;
        assert_eq!(error.kind, ModelErrorKind::Other, "{spec}: {error:?}");
        assert!(!error.is_retryable());
        assert!(
            error.message.contains("max_event_bytes"),
            "{spec}: {error:?}"
        );
        assert!(error.message.contains("1048576 bytes"), "{spec}: {error:?}");
        assert_eq!(retries(&events), 0, "{spec}");
        assert!(clock.waits().is_empty(), "{spec}: {:?}", clock.waits());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_errors_do_not_show_query_secrets() {
    let base = start_server().await;
    let clock = RecordingSleeper::new();
    let options = ProviderOptions {
        retry: RetryConfig::none(),
        ..options(format!("{base}/loop"), &clock)
    };
    let (_, error) = call("openai:gpt-4o-mini", &options).await;
    assert_eq!(error.kind, ModelErrorKind::Network, "{error:?}");
    let shown = format!("{error} {error:?}");
    for secret in ["QUERYKEY123", "SIG456SIG", "key=", "test-key"] {
        assert!(!shown.contains(secret), "{secret:?} leaked: {shown}");
    }
    // Still useful: where the failed request went, and why.
    assert!(
        error
            .message
            .contains(&format!("{base}/loop/v1/chat/completions")),
        "{error:?}"
    );
    assert!(error.message.contains("redirect"), "{error:?}");
}

#[test]
fn options_debug_hides_the_key_and_url_credentials() {
    let options = ProviderOptions {
        base_url: Some("http://alice:PASSW0RD@127.0.0.1:9/v1?key=QUERYKEY".into()),
        api_key: Some("sk-live-SECRETKEY0123456789".into()),
        ..ProviderOptions::default()
    };
    let shown = format!("{options:?}");
    for secret in ["SECRETKEY0123456789", "PASSW0RD", "QUERYKEY", "alice"] {
        assert!(!shown.contains(secret), "{secret:?} leaked: {shown}");
    }
    assert!(shown.contains("[REDACTED]"), "{shown}");
    assert!(shown.contains("http://127.0.0.1:9/v1"), "{shown}");
}

#[test]
fn config_errors_do_not_show_url_credentials() {
    let refused = ProviderOptions {
        base_url: Some("https://bob:HUNTER2@api.example.com/v1?api_key=QS123".into()),
        api_key: Some("k".into()),
        loopback_only: true,
        ..ProviderOptions::default()
    };
    let Err(error) = model_from_spec_with_env("openai:gpt-4o", &refused, &|_| None) else {
        panic!("a non-loopback URL was accepted in loopback-only mode");
    };
    assert!(matches!(
        error,
        ProviderConfigError::NonLoopbackRefused { .. }
    ));
    let invalid = ProviderOptions {
        base_url: Some("ftp://bob:HUNTER2@host/x?api_key=QS123".into()),
        ..refused.clone()
    };
    let Err(invalid) = model_from_spec_with_env("openai:gpt-4o", &invalid, &|_| None) else {
        panic!("an ftp:// base URL was accepted");
    };
    assert!(matches!(
        invalid,
        ProviderConfigError::InvalidBaseUrl { .. }
    ));
    for error in [error, invalid] {
        let shown = format!("{error} {error:?}");
        for secret in ["HUNTER2", "QS123", "bob"] {
            assert!(!shown.contains(secret), "{secret:?} leaked: {shown}");
        }
    }
}
