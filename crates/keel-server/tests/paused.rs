//! A thread whose run is paused (awaiting approval or the user) never stalls (issue 45): a
//! second chat message is refused with `409 thread_paused` naming what the run waits for
//! and how to answer it, and the continuation an answer queues (approve, deny, reply,
//! cancel) is leased ahead of any job already waiting on the thread — here one queued
//! the way `keel submit` queues it, which nothing refuses.

use serde_json::{Value, json};

use crate::common::{Backend, Harness};

/// The calculator call (approval-gated), its answer, then a second run's answer.
fn script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
        {"text": "It is 5."},
        {"text": "Second answer."}
    ]})
}

/// Chats until the run awaits approval: (thread, run, call).
async fn paused_chat(h: &Harness, key: &str) -> (String, String, String) {
    let (status, _, paused) = h
        .send(
            "POST",
            "/v1/chat",
            key,
            Some(json!({"agent": "bot", "message": "2+3?"})),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["status"], "awaiting_approval", "{paused}");
    (
        paused["thread_id"].as_str().unwrap().to_string(),
        paused["run_id"].as_str().unwrap().to_string(),
        paused["awaiting"]["call_id"].as_str().unwrap().to_string(),
    )
}

/// The recipe (`[approvals.tools] calculator = "ask"`, `workers = 2`): a second
/// chat while the run awaits approval is refused at once (streamed or not) with what it
/// waits for; the approval then ends the run `done` and no job stays queued.
async fn a_second_message_while_awaiting_approval_is_refused_and_never_stalls(backend: Backend) {
    let h = Harness::start(backend, script(), "").await;
    let key = h.key("alpha").await;
    let (thread, run, call) = paused_chat(&h, &key).await;

    for stream in [true, false] {
        let response = h
            .request("POST", "/v1/chat", &key)
            .header("content-type", "application/json")
            .body(
                json!({"agent": "bot", "thread_id": thread, "message": "and 3+4?", "stream": stream})
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 409, "stream: {stream}");
        let body: Value = response.json().await.unwrap();
        let error = &body["error"];
        assert_eq!(error["code"], "thread_paused", "{body}");
        let details = &error["details"];
        assert_eq!(details["thread_id"], thread.as_str(), "{body}");
        assert_eq!(details["run_id"], run.as_str(), "{body}");
        assert_eq!(details["status"], "awaiting_approval", "{body}");
        assert_eq!(details["awaiting"]["call_id"], call.as_str(), "{body}");
        assert_eq!(details["awaiting"]["tool"], "calculator", "{body}");
        let approve = format!("/v1/threads/{thread}/approvals/{call}");
        assert_eq!(
            details["answer"]["approve"]["path"],
            approve.as_str(),
            "{body}"
        );
        assert_eq!(
            details["answer"]["deny"]["path"],
            approve.as_str(),
            "{body}"
        );
        assert_eq!(
            details["answer"]["cancel"]["path"],
            format!("/v1/threads/{thread}/runs/{run}/cancel").as_str(),
            "{body}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&approve), "{message}");
        assert!(!body.to_string().contains("alpha."), "no store ids: {body}");
    }
    // Nothing was queued for the refused messages: once the chat's job is completed (its
    // worker completes it just after the run paused), no job is queued or leased.
    h.wait_jobs_done(1).await;

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
    // The chat's job and the approval's continuation; nothing left queued or leased.
    h.wait_jobs_done(2).await;

    // Once the run ended, the thread takes the next message.
    let (status, _, second) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "bot", "thread_id": thread, "message": "and then?"})),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["final_text"], "Second answer.", "{second}");
    h.wait_jobs_done(3).await;
    h.stop().await;
}

/// A job queued on the paused thread by another way in (`keel submit`'s) waits for the
/// paused run; the approval's continuation is leased ahead of it, so the run ends, and then
/// the waiting job runs: every job ends `done`.
async fn a_continuation_leases_ahead_of_a_job_waiting_on_its_run(backend: Backend) {
    let h = Harness::start(backend, script(), "").await;
    let key = h.key("alpha").await;
    let (thread, run, call) = paused_chat(&h, &key).await;

    let recipe = keel_app::recipe::Recipe {
        agent_name: Some("bot".into()),
        tenant: Some("alpha".into()),
        ..keel_app::recipe::Recipe::default()
    };
    let submitted = keel_app::worker::submit(
        h.store.events.as_ref(),
        h.store.queue.as_ref(),
        Some(format!("alpha.{thread}")),
        recipe,
        "second".into(),
    )
    .await
    .unwrap();
    assert!(submitted.run_in_progress);

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
    // The chat's job, the submitted one and the continuation.
    h.wait_jobs_done(3).await;
    let job = h.store.queue.job(submitted.job_id).await.unwrap().unwrap();
    assert_eq!(job.state, keel_store::JobState::Done, "{job:?}");
    let events = h.events(&key, &thread).await;
    let ended: Vec<&Value> = events.iter().filter(|e| e["type"] == "run_ended").collect();
    assert_eq!(ended.len(), 2, "both runs ended: {ended:?}");
    assert!(ended.iter().all(|e| e["end_state"] == "done"), "{ended:?}");
    h.stop().await;
}

/// A chat names its job; the job view shows it queued, its tenant can cancel it while no
/// worker holds it (another tenant sees a 404), and a dead-lettered job shows its last
/// error — in the view and in `/metrics`.
async fn a_job_is_shown_cancelled_while_queued_and_shows_its_last_error(backend: Backend) {
    let h = Harness::start_with_workers(backend, script(), "", 0).await;
    let key = h.key("alpha").await;
    let other = h.key("beta").await;
    let response = h
        .request("POST", "/v1/chat", &key)
        .header("content-type", "application/json")
        .body(json!({"agent": "bot", "message": "hi", "stream": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_string();
    let (job, thread) = (header("x-keel-job-id"), header("x-keel-thread-id"));
    drop(response);

    let (status, _, view) = h.send("GET", &format!("/v1/jobs/{job}"), &key, None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "queued", "{view}");
    assert_eq!(view["thread_id"], thread.as_str(), "{view}");
    assert_eq!(view["attempts"], 0, "{view}");
    for (method, path) in [
        ("GET", format!("/v1/jobs/{job}")),
        ("POST", format!("/v1/jobs/{job}/cancel")),
    ] {
        let (status, _, body) = h.send(method, &path, &other, None).await;
        assert_eq!(status, 404, "another tenant's job: {body}");
    }
    let (status, _, view) = h
        .send("POST", &format!("/v1/jobs/{job}/cancel"), &key, None)
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "cancelled", "{view}");
    assert!(
        view["error"]
            .as_str()
            .unwrap()
            .contains("cancelled by key:"),
        "{view}"
    );
    let (status, _, body) = h
        .send("POST", &format!("/v1/jobs/{job}/cancel"), &key, None)
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "job_not_queued", "{body}");

    // A job out of attempts, dead-lettered by a worker, shows why.
    let queue = &h.store.queue;
    let dead = queue
        .enqueue(&format!("alpha.{thread}"), &json!({}))
        .await
        .unwrap();
    let lease = queue
        .acquire("w", std::time::Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.job_id, dead);
    queue
        .dead_letter(
            &lease,
            "store unreachable (attempt 20 of 20: dead-lettered)",
        )
        .await
        .unwrap();
    let (status, _, view) = h.send("GET", &format!("/v1/jobs/{dead}"), &key, None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "dead", "{view}");
    assert!(
        view["error"]
            .as_str()
            .unwrap()
            .contains("store unreachable"),
        "{view}"
    );
    let ops = h.key("ops").await;
    let metrics = h
        .request("GET", "/metrics", &ops)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("keel_queue_jobs{state=\"dead\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keel_queue_jobs{state=\"cancelled\"} 1"),
        "{metrics}"
    );
    h.stop().await;
}

/// A chat waiting for its run learns when its job ends before any run started (here dead-
/// lettered, as a worker does when the agent cannot be built on any attempt) — at once,
/// with the reason, not a `202 queued` once the request times out.
async fn a_chat_whose_job_dies_before_its_run_answers_with_the_reason(backend: Backend) {
    let h = Harness::start_with_workers(backend, script(), "", 0).await;
    let key = h.key("alpha").await;
    let chat = tokio::spawn({
        let request = h
            .request("POST", "/v1/chat", &key)
            .header("content-type", "application/json")
            .body(json!({"agent": "bot", "message": "hi"}).to_string());
        async move { request.send().await.unwrap() }
    });
    let queue = &h.store.queue;
    let start = std::time::Instant::now();
    let lease = loop {
        if let Some(lease) = queue
            .acquire("w", std::time::Duration::from_secs(60))
            .await
            .unwrap()
        {
            break lease;
        }
        assert!(
            start.elapsed() < crate::common::DEADLINE,
            "the chat queued no job"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    queue
        .dead_letter(
            &lease,
            "cannot build the agent: store unreachable (attempt 20 of 20: dead-lettered)",
        )
        .await
        .unwrap();
    let response = tokio::time::timeout(crate::common::DEADLINE, chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "job_dead", "{body}");
    assert_eq!(body["error"]["details"]["job_id"], lease.job_id, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("store unreachable"),
        "{body}"
    );
    assert!(!body.to_string().contains("alpha."), "no store ids: {body}");
    h.stop().await;
}

crate::on_both_stores!(
    a_chat_whose_job_dies_before_its_run_answers_with_the_reason,
    a_second_message_while_awaiting_approval_is_refused_and_never_stalls,
    a_continuation_leases_ahead_of_a_job_waiting_on_its_run,
    a_job_is_shown_cancelled_while_queued_and_shows_its_last_error,
);
