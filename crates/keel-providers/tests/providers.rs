//! Every provider against the wire-protocol mock: streamed text, tool calls (one and
//! parallel), usage and cost, HTTP error classes, mid-stream errors, retries on a virtual
//! clock honouring Retry-After, no retries on 400/401, restarts after partial output, and
//! keep-alive noise.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::time::Duration;

use common::*;
use keel_core::model::{ResponseAssembler, complete};
use keel_core::{ModelErrorKind, ModelRequest, StopReason, StreamEvent, Usage};
use keel_providers::RetryConfig;
use keel_testkit::mock_llm::{MockError, MockFaults, MockScript, MockStreamError, MockTurn};
use serde_json::{Value, json};

fn endpoint(provider: &str) -> &'static str {
    match provider {
        "anthropic" => "/v1/messages",
        "openai" | "openrouter" => "/v1/chat/completions",
        "openai-responses" => "/v1/responses",
        _ => "/api/chat",
    }
}

async fn streamed_text(provider: &str, model: &str) {
    let h = harness(
        provider,
        model,
        vec![MockTurn::text(
            "Hello there, this answer arrives in pieces.",
        )],
    )
    .await;
    let messages = user("hi");
    let mut request = ModelRequest::new(&messages);
    request.system = Some("Be brief.");
    let (events, error) = collect(h.model.as_ref(), request).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(
        text_of(&events),
        "Hello there, this answer arrives in pieces."
    );
    let deltas = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::TextDelta(_)))
        .count();
    assert!(
        deltas > 1,
        "text should stream in several deltas, got {deltas}"
    );
    assert!(
        matches!(
            events.last(),
            Some(StreamEvent::Stop {
                reason: StopReason::EndTurn,
                ..
            })
        ),
        "{events:?}"
    );
    let requests = h.server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.path, endpoint(provider));
    assert_eq!(r.body["stream"], json!(true));
    assert_eq!(r.body["model"], json!(model));
    match provider {
        "anthropic" => {
            assert_eq!(r.header("x-api-key"), Some("test-key"));
            assert_eq!(
                r.header("anthropic-version"),
                Some(keel_providers::ANTHROPIC_VERSION)
            );
        }
        _ => assert_eq!(r.header("authorization"), Some("Bearer test-key")),
    }
    if provider == "openrouter" {
        assert_eq!(r.header("x-title"), Some("Keel"));
        assert!(r.header("http-referer").is_some());
    }
    // temperature / top_p are omitted when not set (some models reject them).
    let text = r.body.to_string();
    assert!(
        !text.contains("temperature") && !text.contains("top_p"),
        "{text}"
    );
}

async fn one_tool_call(provider: &str, model: &str) {
    let turn = MockTurn::tool_call("calculator", json!({"expression": "2*(3+4)"}));
    let h = harness(provider, model, vec![turn]).await;
    let messages = user("what is 2*(3+4)?");
    let tools = [calculator()];
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    let response = complete(h.model.as_ref(), request)
        .await
        .expect("completes");
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = response.message.tool_calls().cloned().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "calculator");
    assert!(!calls[0].id.is_empty());
    assert_eq!(
        calls[0].parse_arguments().unwrap(),
        json!({"expression": "2*(3+4)"})
    );
}

async fn parallel_tool_calls(provider: &str, model: &str) {
    let turn = MockTurn::text("Computing both.")
        .with_tool_call("calculator", json!({"expression": "1+1"}))
        .with_tool_call("clock", json!({}));
    let h = harness(provider, model, vec![turn]).await;
    let messages = user("two things");
    let tools = [calculator(), clock_tool()];
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    let (events, error) = collect(h.model.as_ref(), request).await;
    assert!(error.is_none(), "{error:?}");
    let calls = calls_of(&events);
    assert_eq!(calls.len(), 2, "{events:?}");
    assert_eq!(calls[0].name, "calculator");
    assert_eq!(
        calls[0].parse_arguments().unwrap(),
        json!({"expression": "1+1"})
    );
    assert_eq!(calls[1].name, "clock");
    assert_eq!(calls[1].parse_arguments().unwrap(), json!({}));
    assert_ne!(calls[0].id, calls[1].id);
    assert_eq!(text_of(&events), "Computing both.");
    assert!(matches!(
        events.last(),
        Some(StreamEvent::Stop {
            reason: StopReason::ToolUse,
            ..
        })
    ));
}

async fn usage_mapped(provider: &str, model: &str) {
    let mut turn = MockTurn::text("ok");
    let cached = if provider == "ollama" { 0 } else { 20 };
    turn.usage = Some(Usage {
        input_tokens: 120,
        output_tokens: 30,
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    });
    turn.cost = Some(0.0042);
    let h = harness(provider, model, vec![turn]).await;
    let messages = user("hi");
    let response = complete(h.model.as_ref(), ModelRequest::new(&messages))
        .await
        .unwrap();
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 120,
            output_tokens: 30,
            cache_read_tokens: cached,
            cache_write_tokens: 0
        }
    );
    let cost = response
        .cost_usd
        .expect("cost is known for every test model");
    let expected = match provider {
        // OpenRouter reports the cost itself; it wins over the table.
        "openrouter" => 0.0042,
        // Local models cost nothing.
        "ollama" => 0.0,
        // claude-sonnet-4-5: 100 uncached * $3 + 20 cached * $0.30 + 30 out * $15 per Mtok.
        "anthropic" => (100.0 * 3.0 + 20.0 * 0.3 + 30.0 * 15.0) / 1e6,
        // gpt-4o-mini: 100 * $0.15 + 20 * $0.075 + 30 * $0.60 per Mtok.
        _ => (100.0 * 0.15 + 20.0 * 0.075 + 30.0 * 0.6) / 1e6,
    };
    assert!(
        (cost - expected).abs() < 1e-12,
        "{provider}: cost {cost} != {expected}"
    );
}

async fn http_error_classes(provider: &str, model: &str) {
    let cases: Vec<(MockError, ModelErrorKind)> = vec![
        (
            MockError {
                status: Some(400),
                ..Default::default()
            },
            ModelErrorKind::InvalidRequest,
        ),
        (
            MockError {
                status: Some(401),
                ..Default::default()
            },
            ModelErrorKind::Authentication,
        ),
        (
            MockError {
                status: Some(403),
                ..Default::default()
            },
            ModelErrorKind::Permission,
        ),
        (
            MockError {
                status: Some(404),
                ..Default::default()
            },
            ModelErrorKind::NotFound,
        ),
        (
            MockError {
                status: Some(408),
                ..Default::default()
            },
            ModelErrorKind::Timeout,
        ),
        (
            MockError {
                status: Some(429),
                ..Default::default()
            },
            ModelErrorKind::RateLimited,
        ),
        (
            MockError {
                status: Some(429),
                quota: true,
                ..Default::default()
            },
            ModelErrorKind::QuotaExceeded,
        ),
        (
            MockError {
                status: Some(402),
                ..Default::default()
            },
            ModelErrorKind::QuotaExceeded,
        ),
        (
            MockError {
                kind: Some(ModelErrorKind::ContextOverflow),
                ..Default::default()
            },
            ModelErrorKind::ContextOverflow,
        ),
        (
            MockError {
                status: Some(500),
                ..Default::default()
            },
            ModelErrorKind::Server,
        ),
        (
            MockError {
                status: Some(502),
                ..Default::default()
            },
            ModelErrorKind::Server,
        ),
        (
            MockError {
                status: Some(503),
                ..Default::default()
            },
            ModelErrorKind::Overloaded,
        ),
        (
            MockError {
                status: Some(529),
                ..Default::default()
            },
            ModelErrorKind::Overloaded,
        ),
    ];
    let turns = cases
        .iter()
        .map(|(e, _)| MockTurn {
            error: Some(MockError {
                retry_after: Some(7),
                ..e.clone()
            }),
            ..MockTurn::default()
        })
        .collect();
    let h = harness_with(provider, model, MockScript::new(turns), RetryConfig::none()).await;
    let messages = user("hi");
    for (i, (case, expected)) in cases.iter().enumerate() {
        let (events, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
        let error = error.unwrap_or_else(|| panic!("{provider}: case {case:?} should fail"));
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(error.kind, *expected, "{provider}: {case:?} → {error:?}");
        assert_eq!(error.status, Some(case.status()), "{error:?}");
        assert_eq!(error.retry_after_ms, Some(7000), "{error:?}");
        assert_eq!(
            error.request_id.as_deref(),
            Some(format!("req_mock_{}", i + 1).as_str())
        );
        assert!(error.body.as_deref().is_some_and(|b| !b.is_empty()));
        if provider != "ollama" {
            assert!(error.provider_error_type.is_some(), "{provider}: {error:?}");
        }
    }
    assert!(h.clock.waits().is_empty());
}

async fn mid_stream_error(provider: &str, model: &str) {
    let faults = MockFaults {
        stream_error: Some(MockStreamError {
            error_type: Some("invalid_request_error".into()),
            message: Some("the answer broke off".into()),
        }),
        ..MockFaults::default()
    };
    let turns = vec![MockTurn::text("partial answer that never ends").with_faults(faults)];
    // Ollama's error lines carry no type and count as retryable server errors.
    let retry = if provider == "ollama" {
        RetryConfig::none()
    } else {
        retry_config()
    };
    let h = harness_with(provider, model, MockScript::new(turns), retry).await;
    let messages = user("hi");
    let (events, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    let error = error.expect("a mid-stream error is an error, not a truncated answer");
    assert!(
        !text_of(&events).is_empty(),
        "text arrived before the error"
    );
    assert!(!events.iter().any(|e| matches!(e, StreamEvent::Stop { .. })));
    assert!(error.message.contains("the answer broke off"), "{error:?}");
    assert_eq!(error.status, None);
    // Ollama's error lines carry no type; the others say invalid_request_error (not retried).
    if provider == "ollama" {
        assert_eq!(error.kind, ModelErrorKind::Server, "{error:?}");
    } else {
        assert_eq!(error.kind, ModelErrorKind::InvalidRequest, "{error:?}");
        assert_eq!(
            h.server.requests().len(),
            1,
            "a non-retryable error is not retried"
        );
    }
}

async fn mid_stream_overload_restarts(provider: &str, model: &str) {
    let faults = MockFaults {
        stream_error: Some(MockStreamError::default()),
        ..MockFaults::default()
    };
    let turns = vec![
        MockTurn::text("first try that will be discarded").with_faults(faults),
        MockTurn::text("second try"),
    ];
    let h = harness(provider, model, turns).await;
    let messages = user("hi");
    let (events, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    assert!(error.is_none(), "{error:?}");
    let retry = events
        .iter()
        .position(|e| matches!(e, StreamEvent::Retry { .. }))
        .expect("retry event");
    assert!(
        matches!(events[retry + 1], StreamEvent::Restart),
        "{events:?}"
    );
    let mut assembler = ResponseAssembler::new();
    events.iter().for_each(|e| assembler.push(e));
    let response = assembler.finish();
    assert_eq!(response.message.text(), "second try");
    assert_eq!(response.retries, 1);
    assert_eq!(h.server.requests().len(), 2);
}

async fn dropped_connection(provider: &str, model: &str) {
    let faults = MockFaults {
        drop_after: Some(3),
        ..MockFaults::default()
    };
    let turns =
        vec![MockTurn::text("one two three four five six seven eight").with_faults(faults.clone())];
    let h = harness_with(provider, model, MockScript::new(turns), RetryConfig::none()).await;
    let messages = user("hi");
    let (_, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    let error = error.expect("a dropped connection is an error");
    assert_eq!(error.kind, ModelErrorKind::StreamInterrupted, "{error:?}");

    // With retries, the dropped attempt is retried from scratch after a backoff.
    let turns = vec![
        MockTurn::text("one two three four five six seven eight").with_faults(faults),
        MockTurn::text("complete"),
    ];
    let h = harness(provider, model, turns).await;
    let response = complete(h.model.as_ref(), ModelRequest::new(&messages))
        .await
        .unwrap();
    assert_eq!(response.message.text(), "complete");
    assert_eq!(h.clock.waits(), vec![Duration::from_millis(200)]);
}

async fn malformed_chunk(provider: &str, model: &str) {
    let faults = MockFaults {
        malformed_after: Some(2),
        ..MockFaults::default()
    };
    let turns = vec![MockTurn::text("some text here").with_faults(faults)];
    let h = harness_with(provider, model, MockScript::new(turns), RetryConfig::none()).await;
    let messages = user("hi");
    let (_, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    let error = error.expect("a malformed chunk is an error");
    assert_eq!(error.kind, ModelErrorKind::StreamInterrupted, "{error:?}");
    assert!(error.message.contains("malformed"), "{error:?}");
}

async fn retry_honours_retry_after(provider: &str, model: &str) {
    let turns = vec![
        MockTurn {
            error: Some(MockError {
                status: Some(429),
                retry_after_ms: Some(1500),
                ..Default::default()
            }),
            ..MockTurn::default()
        },
        MockTurn {
            error: Some(MockError {
                status: Some(503),
                retry_after: Some(2),
                ..Default::default()
            }),
            ..MockTurn::default()
        },
        MockTurn::text("finally"),
    ];
    let h = harness(provider, model, turns).await;
    let messages = user("hi");
    let (events, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    assert!(error.is_none(), "{error:?}");
    let retries: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Retry {
                attempt,
                error,
                wait_ms,
                ..
            } => Some((*attempt, *error, *wait_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(
        retries,
        vec![
            (1, ModelErrorKind::RateLimited, 1500),
            (2, ModelErrorKind::Overloaded, 2000)
        ]
    );
    // The virtual clock waited exactly what the server asked, and nothing else.
    assert_eq!(
        h.clock.waits(),
        vec![Duration::from_millis(1500), Duration::from_millis(2000)]
    );
    // The mock saw three identical requests, one per attempt.
    let requests = h.server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].body, requests[2].body);
    assert_eq!(
        requests.iter().map(|r| r.turn).collect::<Vec<_>>(),
        vec![Some(0), Some(1), Some(2)]
    );
    assert_eq!(text_of(&events), "finally");
}

async fn no_retry_on_400_401_and_quota(provider: &str, model: &str) {
    for error in [
        MockError {
            status: Some(400),
            ..Default::default()
        },
        MockError {
            status: Some(401),
            ..Default::default()
        },
        MockError {
            status: Some(429),
            quota: true,
            retry_after: Some(1),
            ..Default::default()
        },
    ] {
        let turns = vec![
            MockTurn {
                error: Some(error.clone()),
                ..MockTurn::default()
            },
            MockTurn::text("must not be reached"),
        ];
        let h = harness(provider, model, turns).await;
        let messages = user("hi");
        let (events, failure) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
        assert!(failure.is_some(), "{error:?}");
        assert!(
            events
                .iter()
                .all(|e| !matches!(e, StreamEvent::Retry { .. }))
        );
        assert_eq!(
            h.server.requests().len(),
            1,
            "{provider}: {error:?} was retried"
        );
        assert!(h.clock.waits().is_empty());
    }
}

async fn noise_is_ignored(provider: &str, model: &str) {
    let faults = MockFaults {
        keepalive: true,
        pings: true,
        unknown_events: true,
        ..MockFaults::default()
    };
    let turn = MockTurn::text("noise does not matter at all")
        .with_tool_call("calculator", json!({"expression": "1"}))
        .with_faults(faults);
    let h = harness(provider, model, vec![turn]).await;
    let messages = user("hi");
    let (events, error) = collect(h.model.as_ref(), ModelRequest::new(&messages)).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&events), "noise does not matter at all");
    assert_eq!(calls_of(&events).len(), 1);
}

macro_rules! provider_tests {
    ($($module:ident => $index:expr),* $(,)?) => {$(
        mod $module {
            use super::*;
            fn spec() -> (&'static str, &'static str) { PROVIDERS[$index] }
            #[tokio::test] async fn streamed_text() { let (p, m) = spec(); super::streamed_text(p, m).await }
            #[tokio::test] async fn one_tool_call() { let (p, m) = spec(); super::one_tool_call(p, m).await }
            #[tokio::test] async fn parallel_tool_calls() { let (p, m) = spec(); super::parallel_tool_calls(p, m).await }
            #[tokio::test] async fn usage_mapped() { let (p, m) = spec(); super::usage_mapped(p, m).await }
            #[tokio::test] async fn http_error_classes() { let (p, m) = spec(); super::http_error_classes(p, m).await }
            #[tokio::test] async fn mid_stream_error() { let (p, m) = spec(); super::mid_stream_error(p, m).await }
            #[tokio::test] async fn mid_stream_overload_restarts() { let (p, m) = spec(); super::mid_stream_overload_restarts(p, m).await }
            #[tokio::test] async fn dropped_connection() { let (p, m) = spec(); super::dropped_connection(p, m).await }
            #[tokio::test] async fn malformed_chunk() { let (p, m) = spec(); super::malformed_chunk(p, m).await }
            #[tokio::test] async fn retry_honours_retry_after() { let (p, m) = spec(); super::retry_honours_retry_after(p, m).await }
            #[tokio::test] async fn no_retry_on_400_401_and_quota() { let (p, m) = spec(); super::no_retry_on_400_401_and_quota(p, m).await }
            #[tokio::test] async fn noise_is_ignored() { let (p, m) = spec(); super::noise_is_ignored(p, m).await }
        }
    )*};
}

provider_tests! {
    anthropic => 0,
    openai => 1,
    openai_responses => 2,
    openrouter => 3,
    ollama => 4,
}

#[tokio::test]
async fn openai_non_streaming_endpoint_answers_json() {
    let server = keel_testkit::mock_llm::MockLlmServer::start(MockScript::new(vec![
        MockTurn::text("plain json").with_tool_call("calculator", json!({"expression": "3"})),
    ]))
    .await
    .unwrap();
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    let response = reqwest_post(&format!("{}/v1/chat/completions", server.base_url()), &body).await;
    assert_eq!(response["object"], "chat.completion");
    assert_eq!(response["choices"][0]["message"]["content"], "plain json");
    assert_eq!(response["choices"][0]["finish_reason"], "tool_calls");
    let args: Value = serde_json::from_str(
        response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"expression": "3"}));
}

async fn reqwest_post(url: &str, body: &Value) -> Value {
    // A plain HTTP/1.1 POST over a TCP socket, to test the mock without a provider.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let payload = body.to_string();
    let mut socket = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    socket.read_to_string(&mut out).await.unwrap();
    let (_, body) = out.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap()
}

#[tokio::test]
async fn idle_timeout_between_chunks_is_a_timeout() {
    use std::sync::Arc;
    let faults = MockFaults {
        chunk_delay_ms: 400,
        ..MockFaults::default()
    };
    let slow = MockTurn::text("slow text").with_faults(faults);
    let script = MockScript::new(vec![slow.clone(), slow]);
    let server = keel_testkit::mock_llm::MockLlmServer::start(script)
        .await
        .unwrap();
    for provider in ["anthropic:claude-sonnet-4-5", "ollama:llama3.1"] {
        let options = keel_providers::ProviderOptions {
            base_url: Some(server.base_url()),
            api_key: Some("k".into()),
            retry: RetryConfig::none(),
            idle_timeout: Duration::from_millis(100),
            loopback_only: true,
            sleeper: Some(Arc::new(keel_providers::RecordingSleeper::new())),
            ..Default::default()
        };
        let model =
            keel_providers::model_from_spec_with_env(provider, &options, &|_| None).unwrap();
        let messages = user("hi");
        let (_, error) = collect(model.as_ref(), ModelRequest::new(&messages)).await;
        let error = error.expect("idle stream times out");
        assert_eq!(error.kind, ModelErrorKind::Timeout, "{provider}: {error:?}");
        assert!(error.is_retryable());
    }
}
