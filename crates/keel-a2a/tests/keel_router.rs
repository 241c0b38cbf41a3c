//! The Keel server router (over the in-memory `EchoBackend`) on a loopback port, driven by
//! the Keel client in both protocol versions and by raw JSON-RPC for the negotiation
//! rules.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;

use futures::StreamExt;
use keel_a2a::testing::EchoBackend;
use keel_a2a::tool::{A2aTool, RemoteAgent};
use keel_a2a::{AgentCard, Message, ProtocolVersion, SendResult, StreamEvent, TaskState};
use keel_core::{DynTool, ToolErrorCode, TypedTool};
use serde_json::{Value, json};

use crate::common::{DEADLINE, client, ctx, serve};

async fn echo_router() -> (String, Arc<EchoBackend>) {
    let backend = EchoBackend::new();
    let url = serve(|url| keel_a2a::router(Arc::new(Arc::clone(&backend)), url).build()).await;
    (url, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_advertise_both_versions_at_the_well_known_and_per_agent_paths() {
    let (url, _) = echo_router().await;
    let http = reqwest::Client::new();
    for path in [
        "/.well-known/agent-card.json",
        "/a2a/echo/.well-known/agent-card.json",
    ] {
        let card: AgentCard = http
            .get(format!("{url}{path}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(card.name, "echo");
        let versions: Vec<&str> = card
            .supported_interfaces
            .iter()
            .map(|i| i.protocol_version.as_str())
            .collect();
        assert_eq!(versions, ["1.0", "0.3"]);
        assert_eq!(
            card.url.as_deref(),
            Some(format!("{url}/a2a/echo").as_str())
        );
        assert!(card.streams());
    }
    let missing = http
        .get(format!("{url}/a2a/nobody/.well-known/agent-card.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

async fn round_trip(version: ProtocolVersion) {
    let (url, backend) = echo_router().await;
    let client = client(&format!("{url}/a2a/echo"), Some(version));
    assert_eq!(client.endpoint().await.unwrap().version, version);

    let SendResult::Task(task) = client.send(&Message::user("hello"), true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.reply_text(), "echo: hello");
    assert_eq!(task.history.len(), 1);

    let mut stream = client.stream(&Message::user("streamed")).await.unwrap();
    let mut states = Vec::new();
    let mut snapshot = None;
    while let Some(event) = stream.next().await {
        match event.unwrap() {
            StreamEvent::Task(task) => snapshot = Some(task),
            other => {
                let event = other.as_task_event().unwrap();
                states.extend(event.state());
                snapshot.as_mut().unwrap().apply(&event);
            }
        }
    }
    assert_eq!(states, [TaskState::Working, TaskState::Completed]);
    assert_eq!(snapshot.unwrap().reply_text(), "echo: streamed");

    let SendResult::Task(asked) = client.send(&Message::user("ask"), true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(asked.status.state, TaskState::InputRequired);
    let mut answer = Message::user("Grace");
    answer.task_id = Some(asked.id.clone());
    let SendResult::Task(done) = client.send(&answer, true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(done.reply_text(), "Nice to meet you, Grace.");
    assert_eq!(
        done.history.len(),
        2,
        "both user messages are in the history"
    );
    let trimmed = client.get_task(&done.id, Some(1)).await.unwrap();
    assert_eq!(
        trimmed.history.len(),
        1,
        "historyLength keeps the last ones"
    );

    // Non-blocking send answers at once; the slow task is then cancelled.
    let SendResult::Task(slow) = client.send(&Message::user("slow"), false).await.unwrap() else {
        panic!("expected a task")
    };
    assert!(!slow.status.state.ends_turn());
    backend
        .wait_for_status_message("working until cancelled")
        .await;
    assert_eq!(
        client.cancel_task(&slow.id).await.unwrap().status.state,
        TaskState::Canceled
    );
    assert_eq!(backend.state(&slow.id), Some(TaskState::Canceled));

    let SendResult::Task(failed) = client.send(&Message::user("fail"), true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(failed.status.state, TaskState::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_client_and_router_speak_1_0() {
    round_trip(ProtocolVersion::V1_0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_client_and_router_speak_0_3() {
    round_trip(ProtocolVersion::V0_3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_tool_call_cancels_the_task_on_the_router() {
    let (url, backend) = echo_router().await;
    let mut agent = RemoteAgent::new("echo_agent", format!("{url}/a2a/echo"));
    agent.timeout = DEADLINE;
    let tool = TypedTool::new(A2aTool::new(agent).unwrap());
    let (context, token) = ctx("k1");
    let call = tokio::spawn(async move { tool.call(json!({"message": "slow"}), &context).await });
    let id = backend
        .wait_for_status_message("working until cancelled")
        .await;
    token.cancel();
    let error = tokio::time::timeout(DEADLINE, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Cancelled);
    tokio::time::timeout(DEADLINE, backend.wait_for_state(&id, TaskState::Canceled))
        .await
        .expect("the remote task was cancelled");
}

async fn rpc(url: &str, version_header: Option<&str>, body: Value) -> Value {
    let mut request = reqwest::Client::new()
        .post(format!("{url}/a2a/echo"))
        .json(&body);
    if let Some(version) = version_header {
        request = request.header("A2A-Version", version);
    }
    request.send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_negotiated_by_method_name_and_header() {
    let (url, _) = echo_router().await;
    let v1 = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}});
    let answer = rpc(&url, Some("1.0"), v1.clone()).await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    let no_header = rpc(&url, None, v1.clone()).await;
    assert_eq!(no_header["error"]["code"], -32009, "{no_header}");
    assert!(
        no_header["error"]["message"]
            .as_str()
            .unwrap()
            .contains("A2A-Version: 1.0")
    );
    let unknown = rpc(&url, Some("0.5"), v1).await;
    assert_eq!(unknown["error"]["code"], -32009);

    let v03 = json!({"jsonrpc": "2.0", "id": "x", "method": "message/send", "params": {
        "message": {"kind": "message", "messageId": "m2", "role": "user",
                    "parts": [{"kind": "text", "text": "hi"}]}}});
    let answer = rpc(&url, None, v03).await;
    assert_eq!(answer["id"], "x");
    assert_eq!(answer["result"]["kind"], "task");
    assert_eq!(answer["result"]["status"]["state"], "completed");
    assert_eq!(answer["result"]["artifacts"][0]["parts"][0]["kind"], "text");

    let missing = rpc(
        &url,
        None,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": "nope"}}),
    )
    .await;
    assert_eq!(missing["error"]["code"], -32001);
    let unknown_method = rpc(
        &url,
        None,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/list"}),
    )
    .await;
    assert_eq!(unknown_method["error"]["code"], -32601);
    let bad_params = rpc(
        &url,
        Some("1.0"),
        json!({"jsonrpc": "2.0", "id": 4, "method": "SendMessage", "params": {}}),
    )
    .await;
    assert_eq!(bad_params["error"]["code"], -32602);
    let not_json = reqwest::Client::new()
        .post(format!("{url}/a2a/echo"))
        .body("{")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(not_json["error"]["code"], -32700);
}
