//! The Keel client and tool against a real A2A server: the official Python SDK (a2a-sdk,
//! installed by `./scripts/install-a2a-peers`) running `tests/peers/a2a_peer.py` on
//! 127.0.0.1 — protocol 1.0, and 0.3 through the SDK's compatibility layer, each chosen
//! from the card the peer publishes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use futures::StreamExt;
use keel_a2a::client::ClientError;
use keel_a2a::tool::{A2aTool, RemoteAgent};
use keel_a2a::{Auth, Message, ProtocolVersion, SendResult, StreamEvent, TaskState};
use keel_core::{DynTool, ToolErrorCode, TypedTool};
use serde_json::json;

use crate::common::{DEADLINE, Peer, client, client_with, ctx, env_of};

async fn client_round_trip(versions: &str, expected: ProtocolVersion) {
    let peer = Peer::start(&["--versions", versions], &[]).await;
    let client = client(&peer.url, None);
    let endpoint = client.endpoint().await.unwrap();
    assert_eq!(endpoint.version, expected, "chosen from the card");
    assert!(endpoint.url.ends_with("/a2a/jsonrpc"));

    // Blocking send.
    let SendResult::Task(task) = client.send(&Message::user("hello"), true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.reply_text(), "echo: hello");

    // Stream: the task first, then updates, ending completed.
    let mut stream = client.stream(&Message::user("streamed")).await.unwrap();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.unwrap());
    }
    let StreamEvent::Task(mut task) = events[0].clone() else {
        panic!("the stream starts with the task: {events:?}")
    };
    for event in &events[1..] {
        task.apply(&event.as_task_event().unwrap());
    }
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.reply_text(), "echo: streamed");

    // Input required, answered on the same task.
    let SendResult::Task(asked) = client.send(&Message::user("ask me"), true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(asked.status.state, TaskState::InputRequired);
    assert_eq!(asked.reply_text(), "What is your name?");
    let mut answer = Message::user("Ada");
    answer.task_id = Some(asked.id.clone());
    let SendResult::Task(done) = client.send(&answer, true).await.unwrap() else {
        panic!("expected a task")
    };
    assert_eq!(done.id, asked.id);
    assert_eq!(done.status.state, TaskState::Completed);
    assert!(done.reply_text().contains("Nice to meet you, Ada."));

    // Cancel a slow task mid-stream; the stream ends canceled, get agrees.
    let mut stream = client.stream(&Message::user("slow work")).await.unwrap();
    let StreamEvent::Task(slow) = stream.next().await.unwrap().unwrap() else {
        panic!("the stream starts with the task")
    };
    loop {
        let event = stream.next().await.expect("working update").unwrap();
        if let StreamEvent::Status(update) = event
            && update.status.message.as_ref().map(Message::text).as_deref()
                == Some("working until cancelled")
        {
            break;
        }
    }
    let cancelled = client.cancel_task(&slow.id).await.unwrap();
    assert_eq!(cancelled.status.state, TaskState::Canceled);
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = event
            .unwrap()
            .as_task_event()
            .and_then(|e| e.state())
            .or(last);
    }
    assert_eq!(last, Some(TaskState::Canceled));
    assert_eq!(
        client.get_task(&slow.id, None).await.unwrap().status.state,
        TaskState::Canceled
    );

    // Errors are typed.
    match client.get_task("no-such-task", None).await {
        Err(ClientError::Rpc(error)) => assert_eq!(error.code, keel_a2a::jsonrpc::TASK_NOT_FOUND),
        other => panic!("expected TaskNotFoundError, got {other:?}"),
    }
    match client.cancel_task(&slow.id).await {
        Err(ClientError::Rpc(error)) => {
            assert_eq!(error.code, keel_a2a::jsonrpc::TASK_NOT_CANCELABLE)
        }
        other => panic!("expected TaskNotCancelableError, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_speaks_1_0_to_the_python_sdk() {
    client_round_trip("1.0,0.3", ProtocolVersion::V1_0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_speaks_0_3_when_the_card_offers_only_0_3() {
    client_round_trip("0.3", ProtocolVersion::V0_3).await;
}

fn tool(url: &str, name: &str) -> TypedTool<A2aTool> {
    let mut agent = RemoteAgent::new(name, url);
    agent.timeout = DEADLINE;
    TypedTool::new(A2aTool::new(agent).unwrap())
}

async fn tool_round_trip(extra: &[&str]) {
    let mut peer = Peer::start(extra, &[]).await;
    let tool = tool(&peer.url, "python_peer");
    assert_eq!(tool.spec().name, "python_peer");

    let (context, _) = ctx("c1");
    let output = tool
        .call(json!({"message": "hello"}), &context)
        .await
        .unwrap();
    assert_eq!(output["reply"], "echo: hello");
    assert_eq!(output["state"], "completed");
    assert!(output["task_id"].is_string());

    let (context, _) = ctx("c2");
    let asked = tool
        .call(json!({"message": "ask me"}), &context)
        .await
        .unwrap();
    assert_eq!(asked["state"], "input_required");
    assert_eq!(asked["reply"], "What is your name?");
    let next = asked["next"].as_str().unwrap();
    let task_id = asked["task_id"].as_str().unwrap();
    assert!(
        next.contains(task_id) && next.contains("python_peer"),
        "{next}"
    );
    let (context, _) = ctx("c3");
    let answered = tool
        .call(json!({"message": "Ada", "task_id": task_id}), &context)
        .await
        .unwrap();
    assert_eq!(answered["state"], "completed");
    assert!(
        answered["reply"]
            .as_str()
            .unwrap()
            .contains("Nice to meet you, Ada.")
    );

    let (context, _) = ctx("c4");
    let failed = tool
        .call(json!({"message": "fail now"}), &context)
        .await
        .unwrap_err();
    assert_eq!(failed.code, ToolErrorCode::RetryableServer);
    assert!(
        failed.message.contains("failure requested"),
        "{}",
        failed.message
    );

    // Cancelling the call cancels the remote task.
    let (context, token) = ctx("c5");
    let call = tokio::spawn({
        let tool = tool;
        async move { tool.call(json!({"message": "slow one"}), &context).await }
    });
    let slow_id = peer.line("SLOW ").await;
    token.cancel();
    let error = tokio::time::timeout(DEADLINE, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Cancelled);
    let checker = client(&peer.url, None);
    wait_for_state(&checker, &slow_id, TaskState::Canceled).await;
}

/// Waits (by asking, with a generous deadline) until the remote task reaches `state`.
async fn wait_for_state(client: &keel_a2a::A2aClient, id: &str, state: TaskState) {
    let reached = tokio::time::timeout(DEADLINE, async {
        loop {
            if client.get_task(id, Some(0)).await.unwrap().status.state == state {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "task {id} never reached {state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_streams_asks_fails_and_cancels_against_the_python_sdk() {
    tool_round_trip(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_polls_an_agent_that_does_not_stream() {
    tool_round_trip(&["--no-streaming", "--versions", "0.3"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_times_out_and_cancels_the_remote_task() {
    let mut peer = Peer::start(&[], &[]).await;
    let mut agent = RemoteAgent::new("python_peer", peer.url.as_str());
    // The slow task never ends: the tool's own deadline is what stops the call.
    agent.timeout = std::time::Duration::from_millis(500);
    let tool = TypedTool::new(A2aTool::new(agent).unwrap());
    assert_eq!(
        tool.spec().timeout_ms,
        5_500,
        "the executor allows a margin"
    );
    let (context, _) = ctx("t1");
    let error = tool
        .call(json!({"message": "slow"}), &context)
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout);
    let slow_id = peer.line("SLOW ").await;
    wait_for_state(&client(&peer.url, None), &slow_id, TaskState::Canceled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_comes_from_the_environment() {
    let peer = Peer::start(&["--bearer-env", "PEER_TOKEN"], &[("PEER_TOKEN", "s3cret")]).await;
    let with_auth = |env| {
        let mut agent = RemoteAgent::new("secured", peer.url.as_str());
        agent.timeout = DEADLINE;
        agent.auth = Auth {
            bearer_env: Some("SECURED_TOKEN".into()),
            ..Auth::default()
        };
        agent.env = env;
        TypedTool::new(A2aTool::new(agent).unwrap())
    };
    let (context, _) = ctx("a1");
    let ok = with_auth(env_of(&[("SECURED_TOKEN", "s3cret")]))
        .call(json!({"message": "hello"}), &context)
        .await
        .unwrap();
    assert_eq!(ok["reply"], "echo: hello");

    let wrong = with_auth(env_of(&[("SECURED_TOKEN", "nope")]))
        .call(json!({"message": "hello"}), &context)
        .await
        .unwrap_err();
    assert_eq!(wrong.code, ToolErrorCode::Unauthorized, "{}", wrong.message);
    assert!(!wrong.message.contains("nope"), "no secret in errors");

    let missing = with_auth(env_of(&[]))
        .call(json!({"message": "hello"}), &context)
        .await
        .unwrap_err();
    assert_eq!(missing.code, ToolErrorCode::Unauthorized);
    assert!(
        missing.message.contains("SECURED_TOKEN"),
        "{}",
        missing.message
    );

    // The client alone, same rule.
    let plain = client_with(&peer.url, None, env_of(&[]));
    assert!(matches!(
        plain.send(&Message::user("hi"), true).await,
        Err(ClientError::Http { status: 401, .. })
    ));
}
