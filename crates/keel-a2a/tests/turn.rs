//! `keel_a2a::agent`: one turn with a remote agent as a stream of events — the task once
//! named, streamed text, the end — against the Keel router's `EchoBackend` (streaming and
//! not), an answer to `input-required` on the same task, and following a task by id.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use futures::StreamExt;
use keel_a2a::agent::{TurnEvent, follow, turn};
use keel_a2a::testing::EchoBackend;
use keel_a2a::{Message, SendResult, Task, TaskState};

use crate::common::{DEADLINE, client};

async fn events_of(
    stream: futures::stream::BoxStream<'static, Result<TurnEvent, keel_a2a::ClientError>>,
) -> Vec<TurnEvent> {
    tokio::time::timeout(DEADLINE, stream.map(Result::unwrap).collect::<Vec<_>>())
        .await
        .expect("the turn ended in time")
}

fn finished(events: &[TurnEvent]) -> Task {
    match events.last() {
        Some(TurnEvent::Finished(SendResult::Task(task))) => task.clone(),
        other => panic!("the turn did not finish with a task: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_names_the_task_streams_text_and_ends() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let events = events_of(turn(client(&url, None), Message::user("hello"))).await;
    let TurnEvent::Started(started) = &events[0] else {
        panic!("the task comes first: {events:?}")
    };
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "echo: hello");
    let task = finished(&events);
    assert_eq!(task.id, started.id);
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.reply_text(), "echo: hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_turn_names_the_task_and_ends_without_streamed_text() {
    let url = keel_a2a::testing::serve(EchoBackend::without_streaming())
        .await
        .unwrap();
    let events = events_of(turn(client(&url, None), Message::user("hello"))).await;
    assert!(matches!(events[0], TurnEvent::Started(_)), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, TurnEvent::Text(_))));
    assert_eq!(finished(&events).reply_text(), "echo: hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_continues_the_task_that_asked() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let asked = finished(&events_of(turn(client(&url, None), Message::user("ask me"))).await);
    assert_eq!(asked.status.state, TaskState::InputRequired);
    assert_eq!(asked.reply_text(), "What is your name?");
    let mut answer = Message::user("Ada");
    answer.task_id = Some(asked.id.clone());
    answer.context_id = Some(asked.context_id.clone());
    let done = finished(&events_of(turn(client(&url, None), answer)).await);
    assert_eq!(done.id, asked.id);
    assert_eq!(done.status.state, TaskState::Completed);
    assert_eq!(done.reply_text(), "Nice to meet you, Ada.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_picks_up_a_task_by_id_until_its_turn_ends() {
    let (url, backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let client = client(&url, None);
    let SendResult::Task(slow) = client.send(&Message::user("slow"), false).await.unwrap() else {
        panic!("expected a task")
    };
    let mut followed = follow(client.clone(), slow.id.clone());
    let Some(Ok(TurnEvent::Started(task))) = followed.next().await else {
        panic!("the followed task comes first")
    };
    assert_eq!(task.id, slow.id);
    backend
        .wait_for_status_message("working until cancelled")
        .await;
    client.cancel_task(&slow.id).await.unwrap();
    let rest = events_of(followed).await;
    assert_eq!(finished(&rest).status.state, TaskState::Canceled);
}
