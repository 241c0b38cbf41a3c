//! The API's surface: health, readiness, metrics, the OpenAPI document and docs page,
//! JSON errors naming the field, body limits, unknown routes, thread fork/delete, and a
//! graceful stop that lets a run in progress finish.

use serde_json::json;

use crate::common::{Backend, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_routes_and_the_openapi_document() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hi"}]}), "").await;
    let key = h.key("alpha").await;
    let (status, _, body) = h.send("GET", "/healthz", "", None).await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    let (status, _, body) = h.send("GET", "/readyz", "", None).await;
    assert_eq!((status, body), (200, json!({"status": "ready"})));
    let (status, _, _) = h.send("GET", "/metrics", "", None).await;
    assert_eq!(status, 401, "metrics need a key");
    // The figures are every tenant's: a tenant's key is refused, an operator's reads them.
    let (status, _, body) = h.send("GET", "/metrics", &key, None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "operator_only", "{body}");
    assert!(body.to_string().contains("[server] operators"), "{body}");
    let ops = h.key("ops").await;
    h.send("GET", "/v1/threads", &key, None).await;
    let text = h
        .request("GET", "/metrics", &ops)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(
            "keel_server_requests_total{route=\"/v1/threads\",method=\"GET\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("keel_queue_jobs{state=\"queued\"} 0"),
        "{text}"
    );
    let paths = h.openapi["paths"].as_object().unwrap();
    for path in [
        "/v1/chat",
        "/v1/threads",
        "/v1/threads/{thread_id}",
        "/v1/threads/{thread_id}/fork",
        "/v1/threads/{thread_id}/events",
        "/v1/threads/{thread_id}/runs/{run_id}",
        "/v1/threads/{thread_id}/runs/{run_id}/cancel",
        "/v1/threads/{thread_id}/approvals/{call_id}",
        "/v1/threads/{thread_id}/reply",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from /openapi.json"
        );
    }
    assert!(h.openapi["paths"]["/v1/chat"]["post"]["security"].is_array());
    // A chat on a paused thread is a documented 409 naming how to answer it.
    let conflict = h.openapi["paths"]["/v1/chat"]["post"]["responses"]["409"]["description"]
        .as_str()
        .unwrap();
    assert!(conflict.contains("thread_paused"), "{conflict}");
    assert!(conflict.contains("/approvals/"), "{conflict}");
    assert!(h.openapi["components"]["schemas"]["ChatRequest"].is_object());
    let served = h
        .client
        .get(h.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&served).unwrap(),
        h.openapi
    );
    let page = h
        .client
        .get(h.url("/docs"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("/openapi.json"));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_json_error_naming_the_field() {
    let h = Harness::start(
        Backend::Sqlite,
        json!({"turns": [{"text": "hi"}]}),
        "max_body_bytes = 2048\n",
    )
    .await;
    let key = h.key("alpha").await;
    let cases = [
        (json!({"message": "hi"}), "missing field `agent`"),
        (
            json!({"agent": "bot", "message": "hi", "temperature": 1}),
            "unknown field `temperature`",
        ),
        (json!({"agent": "nope", "message": "hi"}), "use one of: bot"),
        (json!({"agent": "bot"}), "missing `message`"),
        (
            json!({"agent": "bot", "message": "a", "messages": []}),
            "not both",
        ),
        (
            json!({"agent": "bot", "messages": [{"role": "assistant", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"agent": "bot", "message": "hi", "thread_id": "a.b"}),
            "thread_id \"a.b\" is not valid",
        ),
    ];
    for (body, expected) in cases {
        let (status, _, answer) = h.send("POST", "/v1/chat", &key, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let (status, _, answer) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "x".repeat(4096)})),
        )
        .await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_body_bytes")
    );
    let (status, _, answer) = h.send("GET", "/v1/threads?limit=0", &key, None).await;
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("limit:")
    );
    let (status, _, answer) = h.send("GET", "/v1/threads?status=nope", &key, None).await;
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("status:")
    );
    let (status, _, answer) = h.send("GET", "/v1/nothing", &key, None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _, answer) = h.send("PUT", "/v1/chat", &key, None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_and_delete_threads() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hi"}]}), "").await;
    let key = h.key("alpha").await;
    let (_, _, outcome) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "hi"})),
        )
        .await;
    let thread = outcome["thread_id"].as_str().unwrap();
    let (status, _, fork) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/fork"),
            &key,
            Some(json!({"at_seq": 1})),
        )
        .await;
    assert_eq!(status, 201, "{fork}");
    assert_eq!(fork["events"], 2);
    let forked = fork["thread_id"].as_str().unwrap();
    assert!(!forked.contains('.'));
    assert_eq!(h.events(&key, forked).await.len(), 2);
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/fork"),
            &key,
            Some(json!({"at_seq": 999})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "no_such_event", "{body}");
    // A fork of a run's middle has that run in progress: deleting waits for a cancel.
    let (status, _, body) = h
        .send("DELETE", &format!("/v1/threads/{forked}"), &key, None)
        .await;
    assert_eq!(status, 409, "{body}");
    let run = outcome["run_id"].as_str().unwrap();
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{forked}/runs/{run}/cancel"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        h.wait_run(&key, forked, run).await["end_state"],
        "cancelled"
    );
    let (status, _, _) = h
        .send("DELETE", &format!("/v1/threads/{forked}"), &key, None)
        .await;
    assert_eq!(status, 200);
    let (status, _, _) = h
        .send("GET", &format!("/v1/threads/{forked}"), &key, None)
        .await;
    assert_eq!(status, 404);
    h.stop().await;
}

/// Deleting a thread deletes the threads its agents-as-tools ran on (`<id>.sub.<digest>`,
/// and theirs) — they hold the same user's conversation — and nothing else: not a
/// thread whose id merely starts the same, not another tenant's. Before, they stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_thread_deletes_its_sub_agent_threads() {
    let h = Harness::start(Backend::Sqlite, json!({"turns": [{"text": "hi"}]}), "").await;
    let key = h.key("alpha").await;
    let (_, _, outcome) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "hi"})),
        )
        .await;
    let thread = outcome["thread_id"].as_str().unwrap().to_string();
    let store_id = format!("alpha.{thread}");
    let events = h.store.events.clone();
    let child = format!("{store_id}.sub.0123456789abcdef");
    let grandchild = format!("{child}.sub.fedcba9876543210");
    let lookalike = format!("{store_id}x.sub.0123456789abcdef");
    let other_tenant = format!("beta.{thread}.sub.0123456789abcdef");
    for id in [&child, &grandchild, &lookalike, &other_tenant] {
        events.fork_thread(&store_id, 0, id).await.unwrap();
    }
    let (status, _, body) = h
        .send("DELETE", &format!("/v1/threads/{thread}"), &key, None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sub_threads_deleted"], 2, "{body}");
    for gone in [&store_id, &child, &grandchild] {
        assert!(
            events.load(gone).await.unwrap().is_empty(),
            "{gone} is left"
        );
    }
    for kept in [&lookalike, &other_tenant] {
        assert!(
            !events.load(kept).await.unwrap().is_empty(),
            "{kept} was deleted"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_the_run_in_progress_finish() {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "delay", "arguments": {"ms": 200}}]},
        {"text": "Finished."}
    ]});
    let h = Harness::start(Backend::Sqlite, script, "shutdown_grace_ms = 60000\n").await;
    let key = h.key("alpha").await;
    let response = h
        .request("POST", "/v1/chat", &key)
        .header("content-type", "application/json")
        .body(json!({"agent": "bot", "message": "wait", "stream": true}).to_string())
        .send()
        .await
        .unwrap();
    let mut reader = crate::common::SseReader::new(response);
    let seen = reader.until("tool_call_started").await;
    let thread = seen[0].data["thread_id"].as_str().unwrap().to_string();
    let store = h.store.events.clone();
    h.stop().await; // stops accepting; the run in progress finishes within the grace
    let events = store.load(&format!("alpha.{thread}")).await.unwrap();
    let last = events.last().unwrap();
    assert!(
        matches!(&last.kind, keel_core::EventKind::RunEnded { end_state, .. } if end_state.as_str() == "done"),
        "{:?}",
        last.kind
    );
}
