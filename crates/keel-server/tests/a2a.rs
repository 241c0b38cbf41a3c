//! A2A over `keel serve`: agent cards, blocking send and get, a stream of status and
//! artifact updates, an approval answered by a follow-up message, cancel, tenant
//! isolation, the Keel A2A client end to end, the official Python SDK's client with an API
//! key, and a remote A2A agent (`[agents.<name>] a2a = "…"`) served as a Keel agent.

use std::sync::Arc;

use keel_a2a::{A2aClient, Auth, ClientOptions, Message, SendResult, StreamEvent, TaskState};
use serde_json::{Value, json};

use crate::common::{Backend, DEADLINE, Harness, SseReader};

fn text_turns(texts: &[&str]) -> Value {
    json!({"turns": texts.iter().map(|t| json!({"text": t})).collect::<Vec<_>>()})
}

/// A 0.3 user message (`extra` merged in: `taskId`, `contextId`, other parts).
fn message_03(text: &str, extra: Value) -> Value {
    let mut message = json!({
        "kind": "message",
        "role": "user",
        "messageId": uuid::Uuid::new_v4().to_string(),
        "parts": [{"kind": "text", "text": text}],
    });
    if let (Some(map), Some(more)) = (message.as_object_mut(), extra.as_object()) {
        for (k, v) in more {
            map.insert(k.clone(), v.clone());
        }
    }
    message
}

/// A JSON-RPC call to `/a2a/bot`; answers the HTTP status and the body.
async fn rpc(h: &Harness, key: &str, method: &str, params: Value, v1: bool) -> (u16, Value) {
    let mut request = h
        .request("POST", "/a2a/bot", key)
        .header("content-type", "application/json")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string());
    if v1 {
        request = request.header("A2A-Version", "1.0");
    }
    let response = tokio::time::timeout(DEADLINE, request.send())
        .await
        .unwrap()
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn a2a_card_send_get_and_tenants(backend: Backend) {
    let h = Harness::start(backend, text_turns(&["Hello over A2A."]), "").await;
    // Cards are public, name the JSON-RPC endpoint and declare bearer auth.
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/bot/.well-known/agent-card.json",
    ] {
        let response = h.client.get(h.url(path)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let card: Value = response.json().await.unwrap();
        assert_eq!(card["name"], "bot");
        assert_eq!(card["url"], h.url("/a2a/bot"));
        assert_eq!(card["securitySchemes"]["bearer"]["scheme"], "bearer");
        // Required, in both versions' shapes (what the SDK's auth interceptor reads).
        assert!(
            card["securityRequirements"][0]["schemes"]["bearer"].is_object(),
            "{card}"
        );
        assert_eq!(card["security"][0]["bearer"], json!([]), "{card}");
    }
    // JSON-RPC needs a key.
    let (status, _) = rpc(&h, "nope", "tasks/get", json!({"id": "x.y"}), false).await;
    assert_eq!(status, 401);

    let alpha = h.key("alpha").await;
    let params = json!({"message": {
        "role": "ROLE_USER",
        "messageId": "m1",
        "parts": [{"text": "hi"}],
    }});
    let (status, body) = rpc(&h, &alpha, "SendMessage", params, true).await;
    assert_eq!(status, 200, "{body}");
    let task = &body["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"], "Hello over A2A.",
        "{body}"
    );
    let task_id = task["id"].as_str().unwrap().to_string();
    let context = task["contextId"].as_str().unwrap().to_string();
    assert_eq!(task["metadata"]["keel"]["thread_id"], context);
    // The context is the client thread; the run is the thread's.
    let run_id = task["metadata"]["keel"]["run_id"].as_str().unwrap();
    let (status, _, run) = h
        .send(
            "GET",
            &format!("/v1/threads/{context}/runs/{run_id}"),
            &alpha,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(run["final_text"], "Hello over A2A.");

    let (_, got) = rpc(&h, &alpha, "tasks/get", json!({"id": task_id}), false).await;
    assert_eq!(got["result"]["status"]["state"], "completed", "{got}");
    assert_eq!(got["result"]["kind"], "task");

    // Tenant B sees none of it.
    let beta = h.key("beta").await;
    for (method, params) in [
        ("tasks/get", json!({"id": task_id})),
        ("tasks/cancel", json!({"id": task_id})),
        (
            "message/send",
            json!({"message": message_03("approve", json!({"taskId": task_id, "contextId": context}))}),
        ),
    ] {
        let (status, body) = rpc(&h, &beta, method, params, false).await;
        assert_eq!(status, 200, "{method}: {body}");
        assert_eq!(body["error"]["code"], -32001, "{method}: {body}");
    }
    // A message on a finished task is refused; a new one in its context continues it.
    let (_, body) = rpc(
        &h,
        &alpha,
        "message/send",
        json!({"message": message_03("more", json!({"taskId": task_id}))}),
        false,
    )
    .await;
    assert_eq!(body["error"]["code"], -32004, "{body}");
    h.stop().await;
}

async fn a2a_stream_yields_working_then_completed(backend: Backend) {
    let h = Harness::start(backend, text_turns(&["Streamed over A2A."]), "").await;
    let key = h.key("alpha").await;
    let response = h
        .request("POST", "/a2a/bot", &key)
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": 7, "method": "message/stream",
                   "params": {"message": message_03("hi", json!({}))}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let mut reader = SseReader::new(response);
    let mut seen = Vec::new();
    while let Some(event) = reader.next().await {
        assert_eq!(event.data["id"], 7, "{}", event.data);
        seen.push(event.data["result"].clone());
    }
    let kinds: Vec<String> = seen
        .iter()
        .map(|r| match r["kind"].as_str().unwrap() {
            "status-update" => format!("status:{}", r["status"]["state"].as_str().unwrap()),
            other => other.to_string(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "task",
            "status:working",
            "artifact-update",
            "status:completed"
        ],
        "{seen:?}"
    );
    assert_eq!(seen[0]["status"]["state"], "submitted");
    assert_eq!(
        seen[2]["artifact"]["parts"][0]["text"], "Streamed over A2A.",
        "{seen:?}"
    );
    assert_eq!(seen[3]["final"], true);
    h.stop().await;
}

async fn a2a_approval_is_input_required_then_approved(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+3"}}]},
        {"text": "It is 5."},
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    let (_, body) = rpc(
        &h,
        &key,
        "message/send",
        json!({"message": message_03("what is 2+3?", json!({}))}),
        false,
    )
    .await;
    let task = &body["result"];
    assert_eq!(task["status"]["state"], "input-required", "{body}");
    let question = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(question.contains("calculator"), "{question}");
    assert_eq!(
        task["status"]["message"]["parts"][1]["data"]["tool"],
        "calculator"
    );
    let task_id = task["id"].as_str().unwrap().to_string();
    let context = task["contextId"].as_str().unwrap().to_string();
    // Not a decision: refused, the task still waits.
    let (_, refused) = rpc(
        &h,
        &key,
        "message/send",
        json!({"message": message_03("maybe", json!({"taskId": task_id}))}),
        false,
    )
    .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let mut approve = message_03("", json!({"taskId": task_id, "contextId": context}));
    approve["parts"] = json!([{"kind": "data", "data": {"decision": "approve"}}]);
    let (_, body) = rpc(&h, &key, "message/send", json!({"message": approve}), false).await;
    let task = &body["result"];
    assert_eq!(task["status"]["state"], "completed", "{body}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "It is 5.");
    let events = h.events(&key, &context).await;
    let granted = events
        .iter()
        .find(|e| e["type"] == "approval_granted")
        .unwrap();
    assert!(granted["by"].as_str().unwrap().starts_with("key:"));
    h.stop().await;
}

async fn a2a_cancel_stops_the_run(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "delay", "arguments": {"ms": 120000}}]},
        {"text": "never"},
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    let (_, body) = rpc(
        &h,
        &key,
        "message/send",
        json!({"message": message_03("wait", json!({})), "configuration": {"blocking": false}}),
        false,
    )
    .await;
    let task_id = body["result"]["id"].as_str().unwrap().to_string();
    assert!(
        ["submitted", "working"].contains(&body["result"]["status"]["state"].as_str().unwrap()),
        "{body}"
    );
    let (_, body) = rpc(&h, &key, "tasks/cancel", json!({"id": task_id}), false).await;
    assert_eq!(body["result"]["status"]["state"], "canceled", "{body}");
    let (_, body) = rpc(&h, &key, "tasks/get", json!({"id": task_id}), false).await;
    assert_eq!(body["result"]["status"]["state"], "canceled", "{body}");
    let (_, body) = rpc(&h, &key, "tasks/cancel", json!({"id": task_id}), false).await;
    assert_eq!(body["error"]["code"], -32002, "{body}");
    h.stop().await;
}

async fn a2a_keel_client_end_to_end(backend: Backend) {
    let h = Harness::start(backend, text_turns(&["First.", "Second."]), "").await;
    let key = h.key("alpha").await;
    let options = ClientOptions {
        auth: Auth {
            bearer_env: Some("KEEL_TEST_KEY".into()),
            ..Auth::default()
        },
        env: Arc::new(move |name: &str| (name == "KEEL_TEST_KEY").then(|| key.clone())),
        ..ClientOptions::default()
    };
    let client = A2aClient::new(&h.url("/a2a/bot"), options).unwrap();
    let card = client.card().await.unwrap();
    assert_eq!(card.name, "bot");
    let SendResult::Task(task) = client.send(&Message::user("hi"), true).await.unwrap() else {
        panic!("expected a task");
    };
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.reply_text(), "First.");
    // A second message in the same context streams on the same thread.
    let mut next = Message::user("again");
    next.context_id = Some(task.context_id.clone());
    let mut stream = client.stream(&next).await.unwrap();
    let mut last = None;
    let mut text = String::new();
    while let Some(event) = futures::StreamExt::next(&mut stream).await {
        match event.unwrap() {
            StreamEvent::Status(update) => last = Some(update.status.state),
            StreamEvent::Artifact(update) => {
                text = keel_a2a::types::parts_text(&update.artifact.parts);
            }
            StreamEvent::Task(task) => {
                assert_eq!(task.context_id, next.context_id.clone().unwrap())
            }
            StreamEvent::Message(_) => {}
        }
    }
    assert_eq!(last, Some(TaskState::Completed));
    assert_eq!(text, "Second.");
    let got = client.get_task(&task.id, None).await.unwrap();
    assert_eq!(got.status.state, TaskState::Completed);
    h.stop().await;
}

async fn a2a_ask_user_is_input_required_then_answered(backend: Backend) {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which city?"}}]},
        {"text": "Paris it is."},
    ]});
    let h = Harness::start(backend, script, "").await;
    let key = h.key("alpha").await;
    let (_, body) = rpc(
        &h,
        &key,
        "message/send",
        json!({"message": message_03("weather?", json!({}))}),
        false,
    )
    .await;
    let task = &body["result"];
    assert_eq!(task["status"]["state"], "input-required", "{body}");
    assert_eq!(
        task["status"]["message"]["parts"][0]["text"], "Which city?",
        "{body}"
    );
    let task_id = task["id"].as_str().unwrap().to_string();
    let (_, body) = rpc(
        &h,
        &key,
        "message/send",
        json!({"message": message_03("Paris", json!({"taskId": task_id}))}),
        false,
    )
    .await;
    let task = &body["result"];
    assert_eq!(task["id"], task_id.as_str(), "{body}");
    assert_eq!(task["status"]["state"], "completed", "{body}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "Paris it is.");
    let texts: Vec<&str> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        ["weather?", "Which city?", "Paris", "Paris it is."],
        "{body}"
    );
    h.stop().await;
}

/// The official Python SDK's client (`keel_serve_client.py`, a2a-sdk from
/// `./scripts/install-a2a-peers`) drives a Keel agent of `keel serve` with an API key:
/// card (bearer required), 401 without the key, send, stream, get.
async fn python_sdk_client_drives_keel_serve(version: &str) {
    let h = Harness::start(
        Backend::Sqlite,
        text_turns(&["First answer.", "Second answer."]),
        "",
    )
    .await;
    let key = h.key("alpha").await;
    let python = keel_a2a::peers::python().unwrap_or_else(|e| panic!("{e}"));
    let output = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new(python)
            .arg(keel_a2a::peers::script("keel_serve_client.py"))
            .args(["--url", &h.url("/a2a/bot"), "--version", version])
            .args(["--first", "First answer.", "--second", "Second answer."])
            .env("KEEL_A2A_KEY", &key)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("keel_serve_client.py finished in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "keel_serve_client.py --version {version} failed:\n{stdout}\n{stderr}"
    );
    for step in ["card", "auth", "send", "stream", "get"] {
        assert!(
            stdout.contains(&format!("OK {step}")),
            "no `OK {step}`:\n{stdout}"
        );
    }
    // The SDK's two messages were one thread of the tenant, two runs.
    let (status, _, list) = h.send("GET", "/v1/threads", &key, None).await;
    assert_eq!(status, 200);
    let threads = list["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{list}");
    let thread = threads[0]["thread_id"].as_str().unwrap();
    let events = h.events(&key, thread).await;
    let ended: Vec<&Value> = events.iter().filter(|e| e["type"] == "run_ended").collect();
    assert_eq!(ended.len(), 2, "{events:?}");
    assert_eq!(ended[1]["final_text"], "Second answer.");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_drives_keel_serve_in_1_0() {
    python_sdk_client_drives_keel_serve("1.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_client_drives_keel_serve_in_0_3() {
    python_sdk_client_drives_keel_serve("0.3").await;
}

/// keel.toml adding the agent `researcher`, answered by the remote A2A agent at `url`.
fn remote_agent(url: &str) -> String {
    format!(
        "\n[[a2a.agents]]\nname = \"echo\"\nurl = \"{url}\"\ntimeout_ms = 60000\n\n\
         [agents.researcher]\na2a = \"echo\"\ndescription = \"Echoes over A2A.\"\n"
    )
}

async fn chat_stream(h: &Harness, key: &str, body: Value) -> SseReader {
    let response = h
        .request("POST", "/v1/chat", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    SseReader::new(response)
}

/// Waits until thread `thread` has `runs` ended runs; answers its events.
async fn ended_runs(h: &Harness, key: &str, thread: &str, runs: usize) -> Vec<Value> {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let events = h.events(key, thread).await;
            if events.iter().filter(|e| e["type"] == "run_ended").count() >= runs {
                return events;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the runs ended in time")
}

/// A remote A2A agent as an agent of `keel serve` (`POST /v1/chat {agent}`): the outcome,
/// streamed deltas, input-required answered with `POST …/reply` on the same remote task,
/// and cancel reaching the remote task — each run driven by the server's workers.
async fn a_remote_a2a_agent_is_served_by_keel_serve(backend: Backend) {
    let (url, echo) = keel_a2a::testing::serve_echo().await.unwrap();
    let h = Harness::start(backend, text_turns(&["unused"]), &remote_agent(&url)).await;
    let key = h.key("alpha").await;

    let (status, _, outcome) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "researcher", "message": "hello"})),
        )
        .await;
    assert_eq!(status, 200, "{outcome}");
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    assert_eq!(outcome["final_text"], "echo: hello");
    let thread = outcome["thread_id"].as_str().unwrap().to_string();
    let types: Vec<String> = h
        .events(&key, &thread)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        types,
        [
            "run_started",
            "user_message",
            "notice",
            "agent_message",
            "run_ended"
        ]
    );

    // Streamed, on the same thread: the reply arrives as text deltas.
    let mut reader = chat_stream(
        &h,
        &key,
        json!({"agent": "researcher", "thread_id": thread, "message": "again", "stream": true}),
    )
    .await;
    let events = reader.until("outcome").await;
    let deltas: String = events
        .iter()
        .filter(|e| e.event == "text_delta")
        .map(|e| e.data["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(deltas, "echo: again", "{events:?}");
    assert_eq!(events.last().unwrap().data["final_text"], "echo: again");

    // input-required: the run ends asking; the reply answers the same remote task.
    let (_, _, asked) = h
        .send(
            "POST",
            "/v1/chat",
            &key,
            Some(json!({"agent": "researcher", "message": "ask me"})),
        )
        .await;
    assert_eq!(asked["end_state"], "clarify_needed", "{asked}");
    assert_eq!(asked["clarification"]["question"], "What is your name?");
    let asked_thread = asked["thread_id"].as_str().unwrap().to_string();
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{asked_thread}/reply"),
            &key,
            Some(json!({"answer": "Ada"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let events = ended_runs(&h, &key, &asked_thread, 2).await;
    let ended: Vec<&Value> = events.iter().filter(|e| e["type"] == "run_ended").collect();
    assert_eq!(ended[1]["end_state"], "done", "{events:?}");
    assert_eq!(ended[1]["final_text"], "Nice to meet you, Ada.");
    let tasks: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "notice" && e["code"] == "a2a_task")
        .map(|e| &e["data"]["task_id"])
        .collect();
    assert_eq!(tasks.len(), 2, "{events:?}");
    assert_eq!(
        tasks[0], tasks[1],
        "the answer went to the same remote task"
    );

    // Cancel: the remote task is cancelled with the run.
    let mut reader = chat_stream(
        &h,
        &key,
        json!({"agent": "researcher", "message": "slow work", "stream": true}),
    )
    .await;
    let seen = reader.until("run_started").await;
    let started = seen.last().unwrap();
    let slow_thread = started.data["thread_id"].as_str().unwrap().to_string();
    let run = started.data["run_id"].as_str().unwrap().to_string();
    let task_id = tokio::time::timeout(
        DEADLINE,
        echo.wait_for_status_message("working until cancelled"),
    )
    .await
    .unwrap();
    let (status, _, body) = h
        .send(
            "POST",
            &format!("/v1/threads/{slow_thread}/runs/{run}/cancel"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let rest = reader.until("outcome").await;
    assert_eq!(rest.last().unwrap().data["end_state"], "cancelled");
    tokio::time::timeout(
        DEADLINE,
        echo.wait_for_state(&task_id, keel_a2a::TaskState::Canceled),
    )
    .await
    .expect("the remote task was cancelled");
    h.stop().await;
}

crate::on_both_stores!(
    a_remote_a2a_agent_is_served_by_keel_serve,
    a2a_card_send_get_and_tenants,
    a2a_stream_yields_working_then_completed,
    a2a_approval_is_input_required_then_approved,
    a2a_ask_user_is_input_required_then_answered,
    a2a_cancel_stops_the_run,
    a2a_keel_client_end_to_end,
);
