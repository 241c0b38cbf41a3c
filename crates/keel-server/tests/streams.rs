//! Open event streams are bounded and end with their key: `/v1` SSE, A2A streams and `/ui`
//! live pages share the tenant's `open_streams` and the key's `open_streams_per_key`
//! allowance (429 `too_many_streams` with `Retry-After` beyond; a closed stream gives its
//! slot back), and a stream whose key is revoked ends within seconds. Before, streams were
//! unbounded and a revoked key kept receiving until the stream timeout (10 minutes).

use std::time::Duration;

use keel_server::keys;
use serde_json::{Value, json};

use crate::common::{Backend, DEADLINE, Harness, SseReader};

/// A run of `key`'s tenant paused for approval; returns its thread.
async fn paused_thread(h: &Harness, key: &str) -> String {
    let (status, _, answer) = h
        .send(
            "POST",
            "/v1/chat",
            key,
            Some(json!({"agent": "bot", "message": "6*7?"})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "awaiting_approval", "{answer}");
    answer["thread_id"].as_str().unwrap().to_string()
}

fn paused_script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}]},
        {"text": "42"}
    ]})
}

async fn open_events(h: &Harness, key: &str, thread: &str) -> reqwest::Response {
    tokio::time::timeout(
        DEADLINE,
        h.request("GET", &format!("/v1/threads/{thread}/events"), key)
            .send(),
    )
    .await
    .unwrap()
    .unwrap()
}

/// A 429 `too_many_streams` naming `setting`, with `Retry-After`.
async fn assert_refused(response: reqwest::Response, setting: &str) {
    assert_eq!(response.status().as_u16(), 429);
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(setting), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_capped_per_key_and_per_tenant_across_sse_a2a_and_ui() {
    let h = Harness::start(
        Backend::Sqlite,
        paused_script(),
        "[server.limits]\nopen_streams = 3\nopen_streams_per_key = 2\n",
    )
    .await;
    let k1 = h.key("alpha").await;
    let k2 = h.key("alpha").await;
    let beta = h.key("beta").await;
    let thread = paused_thread(&h, &k1).await;
    let beta_thread = paused_thread(&h, &beta).await;

    let first = SseReader::new(open_events(&h, &k1, &thread).await);
    let _second = SseReader::new(open_events(&h, &k1, &thread).await);
    assert_refused(open_events(&h, &k1, &thread).await, "open_streams_per_key").await;
    let _third = SseReader::new(open_events(&h, &k2, &thread).await);
    // The tenant's three are open: its other key is refused too, on every kind of stream.
    assert_refused(open_events(&h, &k2, &thread).await, "open_streams in").await;
    let chat = h
        .request("POST", "/v1/chat", &k2)
        .header("content-type", "application/json")
        .body(json!({"agent": "bot", "message": "hi", "stream": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_refused(chat, "open_streams in").await;
    let a2a = h
        .request("POST", "/a2a/bot", &k2)
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": {
                "kind": "message", "role": "user", "messageId": "m-1",
                "parts": [{"kind": "text", "text": "hi"}]}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let text = a2a.text().await.unwrap();
    assert!(
        text.contains("-32029") && text.contains("too_many_streams"),
        "{text}"
    );
    // Another tenant's allowance is its own.
    let _beta_stream = SseReader::new(open_events(&h, &beta, &beta_thread).await);

    // A stream that ends gives its slot back (the server sees the client leave).
    drop(first);
    let reopened = tokio::time::timeout(DEADLINE, async {
        loop {
            let response = open_events(&h, &k1, &thread).await;
            if response.status().as_u16() == 200 {
                return response;
            }
            assert_eq!(response.status().as_u16(), 429);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the closed stream's slot never came back");
    let _reopened = SseReader::new(reopened);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_keys_sse_stream_ends() {
    let h = Harness::start(Backend::Sqlite, paused_script(), "").await;
    let created = keys::create(h.store.serving.as_ref(), "alpha", None)
        .await
        .unwrap();
    let thread = paused_thread(&h, &created.key).await;
    let mut reader = SseReader::new(open_events(&h, &created.key, &thread).await);
    // The stored events come first: the stream is live.
    assert!(reader.next().await.is_some());
    assert!(
        keys::revoke(h.store.serving.as_ref(), &created.info.key_id)
            .await
            .unwrap()
    );
    let last = tokio::time::timeout(DEADLINE, async {
        let mut last = None;
        while let Some(event) = reader.next().await {
            last = Some(event);
        }
        last
    })
    .await
    .expect("the revoked key's stream went on");
    let last = last.unwrap();
    assert_eq!(last.event, "error", "{:?}", last.data);
    assert_eq!(
        last.data["error"]["code"], "unauthorized",
        "{:?}",
        last.data
    );
    h.stop().await;
}

/// An A2A stream follows its own thread's channel of the hub, like `/v1` SSE: before, A2A
/// followers took the all-threads channel, so every append anywhere woke every open A2A
/// stream (N streams × M busy threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_stream_listens_to_its_own_thread_only() {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "delay", "arguments": {"ms": 120000}}]},
        {"text": "never"},
    ]});
    let h = Harness::start(Backend::Sqlite, script, "").await;
    let key = h.key("alpha").await;
    let baseline = h.hub.all_threads_followers();
    let response = h
        .request("POST", "/a2a/bot", &key)
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": {
                "kind": "message", "role": "user", "messageId": "m-own",
                "parts": [{"kind": "text", "text": "wait"}]}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let mut reader = SseReader::new(response);
    // The task is live (submitted, then working while the delay runs).
    reader.next().await.unwrap();
    assert!(h.hub.followed_threads() >= 1);
    assert_eq!(h.hub.all_threads_followers(), baseline);
    drop(reader);
    h.stop().await;
}
