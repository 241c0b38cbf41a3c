//! Chat end to end: the outcome JSON, SSE with a forced disconnect and a `Last-Event-ID`
//! reconnect, approvals continuing on a worker, cancel (running and paused), the
//! concurrent-runs limit, and a graceful stop letting a run in progress finish.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::common::{Backend, Harness, SseReader};

fn text_turns(texts: &[&str]) -> Value {
    json!({"turns": texts.iter().map(|t| json!({"text": t})).collect::<Vec<_>>()})
}

async fn stream_chat(h: &Harness, key: &str, body: Value) -> SseReader {
    let response = h
        .request("POST", "/v1/chat", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    SseReader::new(response)
}

async fn chat_returns_the_outcome_and_streams(backend: Backend) {
    let h = Harness::start(
        backend,
        text_turns(&["Hello there.", "Streamed answer."]),
        "",
    )
    .await;
    let key = h.key("alpha").await;
    let (status, headers, outcome) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "hi"})),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    let keys: BTreeSet<&str> = outcome
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected: BTreeSet<&str> = [
        "thread_id",
        "run_id",
        "trace_id",
        "status",
        "end_state",
        "reason",
        "final_text",
        "turns",
        "tool_calls",
        "usage",
        "action_item",
        "alert",
        "clarification",
        "resumable",
    ]
    .into_iter()
    .collect();
    assert_eq!(keys, expected, "the `keel run --output json` keys");
    assert_eq!(outcome["status"], "ended");
    assert_eq!(outcome["end_state"], "done");
    assert_eq!(outcome["final_text"], "Hello there.");
    let thread = outcome["thread_id"].as_str().unwrap().to_string();
    assert!(
        !thread.contains('.'),
        "the client sees its own id: {thread}"
    );
    assert_eq!(headers["x-keel-thread-id"].to_str().unwrap(), thread);

    // The same thread, streamed: ids are the stored sequence numbers, consecutive.
    let mut reader = stream_chat(
        &h,
        &key,
        json!({"agent": "bot", "thread_id": thread, "messages": [{"role": "user", "content": "again"}], "stream": true}),
    )
    .await;
    let events = reader.until("outcome").await;
    assert!(
        events.iter().any(|e| e.event == "text_delta"),
        "deltas are streamed"
    );
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    let stored = h.events(&key, &thread).await;
    let first_new = stored.len() as u64 - ids.len() as u64;
    assert_eq!(ids, (first_new..stored.len() as u64).collect::<Vec<_>>());
    assert!(
        events
            .iter()
            .all(|e| e.id.is_none() || e.data["thread_id"] == thread.as_str())
    );
    let outcome = &events.last().unwrap().data;
    assert_eq!(outcome["final_text"], "Streamed answer.");
    assert_eq!(outcome["thread_id"], thread.as_str());

    let (status, _, list) = h.send("GET", "/v1/threads", &key, None).await;
    assert_eq!(status, 200);
    assert_eq!(list["threads"][0]["thread_id"], thread.as_str());
    assert_eq!(list["threads"][0]["status"], "done");
    h.stop().await;
}

async fn sse_reconnect_yields_exactly_the_missing_events(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "delay", "arguments": {"ms": 300}}]},
        {"text": "Waited."}
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    let mut reader = stream_chat(
        &h,
        &key,
        json!({"agent": "bot", "message": "wait", "stream": true}),
    )
    .await;
    let seen = reader.until("tool_call_started").await;
    let started = seen.iter().find(|e| e.event == "run_started").unwrap();
    let thread = started.data["thread_id"].as_str().unwrap().to_string();
    let run = started.data["run_id"].as_str().unwrap().to_string();
    let last = seen.iter().filter_map(|e| e.id).max().unwrap();
    assert!(seen.iter().all(|e| e.event != "run_ended"));
    drop(reader); // the client goes away mid-run

    // The run does not depend on the client: it ends on the worker.
    let outcome = h.wait_run(&key, &thread, &run).await;
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    assert_eq!(outcome["final_text"], "Waited.");

    let response = h
        .request("GET", &format!("/v1/threads/{thread}/events"), &key)
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    let mut reader = SseReader::new(response);
    let rest = reader.until("outcome").await;
    let ids: Vec<u64> = rest.iter().filter_map(|e| e.id).collect();
    let stored = h.events(&key, &thread).await;
    let expected: Vec<u64> = (last + 1..stored.len() as u64).collect();
    assert_eq!(ids, expected, "exactly the missing events, in order");
    for event in rest.iter().filter(|e| e.id.is_some()) {
        let id = event.id.unwrap() as usize;
        assert_eq!(event.data, stored[id], "event {id} as stored");
        assert_eq!(event.event, stored[id]["type"].as_str().unwrap());
    }
    assert!(
        reader.next().await.is_none(),
        "the stream ends after the outcome"
    );
    h.stop().await;
}

async fn approval_over_http_continues_on_a_worker(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
        {"text": "It is 5."}
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    let (status, _, paused) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "2+3?"})),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["status"], "awaiting_approval");
    let thread = paused["thread_id"].as_str().unwrap().to_string();
    let run = paused["run_id"].as_str().unwrap().to_string();
    let call = paused["awaiting"]["call_id"].as_str().unwrap().to_string();
    assert_eq!(paused["awaiting"]["tool"], "calculator");

    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/approvals/{call}"),
            &key,
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let outcome = h.wait_run(&key, &thread, &run).await;
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    assert_eq!(outcome["final_text"], "It is 5.");
    assert_eq!(outcome["tool_calls"][0]["ok"], true);
    // A second job (the continuation) was leased and completed by a worker.
    h.wait_jobs_done(2).await;
    let events = h.events(&key, &thread).await;
    let granted = events
        .iter()
        .find(|e| e["type"] == "approval_granted")
        .unwrap();
    assert!(granted["by"].as_str().unwrap().starts_with("key:"));

    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/approvals/{call}"),
            &key,
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(!body.to_string().contains("alpha."), "no store ids: {body}");

    // Cancelling a paused run ends it `cancelled` (on a worker).
    let (_, _, paused) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "2+3 again?"})),
        )
        .await;
    assert_eq!(paused["status"], "awaiting_approval", "{paused}");
    let (thread, run) = (
        paused["thread_id"].as_str().unwrap(),
        paused["run_id"].as_str().unwrap(),
    );
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/runs/{run}/cancel"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let outcome = h.wait_run(&key, thread, run).await;
    assert_eq!(outcome["end_state"], "cancelled", "{outcome}");
    h.stop().await;
}

/// The log records a decision as the key that made it: a client may add a name, never
/// pose as another key (before, `by` replaced the identity and a denial recorded none).
async fn a_decision_is_recorded_as_the_key_that_made_it(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
        {"text": "Denied, then."},
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "4+4"}}]},
        {"text": "It is 8."}
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    for (decision, kind) in [("deny", "approval_denied"), ("approve", "approval_granted")] {
        let (status, _, paused) = h
            .send(
                "POST",
                "/v1/chat",
                &key,
                Some(json!({"agent": "bot", "message": "add"})),
            )
            .await;
        assert_eq!(status, 200, "{paused}");
        assert_eq!(paused["status"], "awaiting_approval", "{paused}");
        let thread = paused["thread_id"].as_str().unwrap().to_string();
        let run = paused["run_id"].as_str().unwrap().to_string();
        let call = paused["awaiting"]["call_id"].as_str().unwrap().to_string();
        let (status, _, body) = h
            .send(
                "POST",
                &format!("/v1/threads/{thread}/approvals/{call}"),
                &key,
                Some(json!({"decision": decision, "by": "key:root\u{0007}", "reason": "no"})),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        h.wait_run(&key, &thread, &run).await;
        let events = h.events(&key, &thread).await;
        let recorded = events.iter().find(|e| e["type"] == kind).unwrap();
        let by = recorded["by"].as_str().unwrap();
        assert!(
            by.starts_with("key:") && !by.starts_with("key:root"),
            "{recorded}"
        );
        assert!(by.ends_with(" for key:root"), "{recorded}");
    }
    h.stop().await;
}

async fn cancel_and_the_concurrent_runs_limit(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "delay", "arguments": {"ms": 120000}}]},
        {"text": "never"}
    ]});
    let h = Harness::start(
        backend,
        script,
        "[server.tenants.solo]\nconcurrent_runs = 1\n",
    )
    .await;
    let key = h.key("solo").await;
    let mut reader = stream_chat(
        &h,
        &key,
        json!({"agent": "bot", "message": "wait", "stream": true}),
    )
    .await;
    let seen = reader.until("tool_call_started").await;
    let started = seen.iter().find(|e| e.event == "run_started").unwrap();
    let thread = started.data["thread_id"].as_str().unwrap().to_string();
    let run = started.data["run_id"].as_str().unwrap().to_string();

    let (status, headers, body) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "message": "another"})),
        )
        .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "concurrent_runs");
    assert!(
        headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );

    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/runs/{run}/cancel"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let rest = reader.until("outcome").await;
    let ended = rest.iter().find(|e| e.event == "run_ended").unwrap();
    assert_eq!(ended.data["end_state"], "cancelled");
    assert_eq!(rest.last().unwrap().data["end_state"], "cancelled");
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{thread}/runs/{run}/cancel"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "run_ended");
    h.stop().await;
}

crate::on_both_stores!(
    chat_returns_the_outcome_and_streams,
    sse_reconnect_yields_exactly_the_missing_events,
    approval_over_http_continues_on_a_worker,
    cancel_and_the_concurrent_runs_limit,
    a_decision_is_recorded_as_the_key_that_made_it,
);
