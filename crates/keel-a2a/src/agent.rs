//! One turn of a conversation with a remote agent, for callers that let a remote A2A agent
//! answer in their place (keel-app's `A2aAgent`, keel.toml `[agents.<name>] a2a = "…"`):
//! [`turn`] sends a message — starting a task, or answering one waiting in
//! `input-required` — and follows the task until it ends its turn; [`follow`] picks up a
//! task already sent (after a crash). Both are a stream of [`TurnEvent`]s: the task as
//! soon as the agent names it, reply text as it arrives, and the end.
//!
//! The turn streams (`SendStreamingMessage` / `message/stream`) when the agent's card says
//! it can, else sends without blocking and polls the task; a stream that closes before the
//! turn ended is continued by polling. Every request has the client's deadline (also the
//! longest gap between two streamed events); the caller bounds the whole turn, and cancels
//! the remote task when it gives up ([`A2aClient::cancel_task`]). Dropping the stream stops
//! following (the remote task is not cancelled by that alone).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;

use crate::client::{A2aClient, ClientError};
use crate::types::{Message, SendResult, StreamEvent, Task, TaskEvent};

/// What happens during a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEvent {
    /// The agent named the task (its first snapshot): from here on it can be cancelled or
    /// followed again by id.
    Started(Task),
    /// More reply text (of the task's artifacts, as they stream).
    Text(String),
    /// The turn ended: the agent answered with a message, or the task reached a state
    /// that ends a turn (terminal, `input-required`, `auth-required`). The last event.
    Finished(SendResult),
}

/// The first poll interval; it doubles up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(100);
/// The longest poll interval.
const POLL_MAX: Duration = Duration::from_secs(2);

/// Sends `message` to the agent and follows the task to the end of its turn.
pub fn turn(
    client: A2aClient,
    message: Message,
) -> BoxStream<'static, Result<TurnEvent, ClientError>> {
    spawn_follower(move |events| async move {
        let card = client.card().await?;
        if card.streams() {
            stream_turn(&client, &message, &events).await
        } else {
            match client.send(&message, false).await? {
                SendResult::Message(reply) => Ok(SendResult::Message(reply)),
                SendResult::Task(task) => {
                    emit(&events, TurnEvent::Started(task.clone()))?;
                    poll(&client, task).await.map(SendResult::Task)
                }
            }
        }
    })
}

/// Follows task `task_id`, already sent, to the end of its turn (by polling; a task whose
/// turn already ended finishes at once).
pub fn follow(
    client: A2aClient,
    task_id: String,
) -> BoxStream<'static, Result<TurnEvent, ClientError>> {
    spawn_follower(move |events| async move {
        let task = client.get_task(&task_id, Some(0)).await?;
        emit(&events, TurnEvent::Started(task.clone()))?;
        poll(&client, task).await.map(SendResult::Task)
    })
}

type Events = mpsc::UnboundedSender<Result<TurnEvent, ClientError>>;

/// Sends `event` to the turn's reader; fails (ending the follower) once the reader is gone.
fn emit(events: &Events, event: TurnEvent) -> Result<(), ClientError> {
    events.send(Ok(event)).map_err(|_| ClientError::Cancelled)
}

/// Aborts the follower when the turn's stream is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `follower` on its own task; its events, then its result as
/// [`TurnEvent::Finished`] (or its error), are the stream.
fn spawn_follower<F, Fut>(follower: F) -> BoxStream<'static, Result<TurnEvent, ClientError>>
where
    F: FnOnce(Events) -> Fut + Send + 'static,
    Fut: Future<Output = Result<SendResult, ClientError>> + Send + 'static,
{
    let (sender, receiver) = mpsc::unbounded_channel();
    let handle = tokio::spawn(async move {
        let result = follower(sender.clone()).await;
        let _ = sender.send(result.map(TurnEvent::Finished));
    });
    let guard = AbortOnDrop(handle);
    futures::stream::unfold((receiver, guard), |(mut receiver, guard)| async move {
        receiver.recv().await.map(|item| (item, (receiver, guard)))
    })
    .boxed()
}

/// The text of `task`'s artifacts (what the reply grows from while it streams).
fn artifact_text(task: &Task) -> String {
    task.artifacts
        .iter()
        .map(|a| crate::types::parts_text(&a.parts))
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn stream_turn(
    client: &A2aClient,
    message: &Message,
    events: &Events,
) -> Result<SendResult, ClientError> {
    let mut stream = client.stream(message).await?;
    let mut snapshot: Option<Task> = None;
    while let Some(event) = stream.next().await {
        match event? {
            StreamEvent::Message(reply) => return Ok(SendResult::Message(reply)),
            StreamEvent::Task(task) => {
                let first = snapshot.is_none();
                let before = snapshot.as_ref().map(artifact_text).unwrap_or_default();
                let now = artifact_text(&task);
                if first {
                    emit(events, TurnEvent::Started(task.clone()))?;
                }
                if let Some(more) = now.strip_prefix(&before).filter(|m| !m.is_empty()) {
                    emit(events, TurnEvent::Text(more.to_string()))?;
                }
                snapshot = Some(task);
            }
            StreamEvent::Status(update) if snapshot.is_none() => {
                // An agent that starts with an update instead of the task.
                let task = Task {
                    id: update.task_id,
                    context_id: update.context_id,
                    status: update.status,
                    artifacts: Vec::new(),
                    history: Vec::new(),
                    metadata: None,
                };
                emit(events, TurnEvent::Started(task.clone()))?;
                snapshot = Some(task);
            }
            StreamEvent::Artifact(update) if snapshot.is_none() => {
                let task = Task {
                    id: update.task_id.clone(),
                    context_id: update.context_id.clone(),
                    status: crate::types::TaskStatus::new(crate::types::TaskState::Working),
                    artifacts: Vec::new(),
                    history: Vec::new(),
                    metadata: None,
                };
                emit(events, TurnEvent::Started(task.clone()))?;
                let mut task = task;
                task.apply(&TaskEvent::Artifact(update));
                let text = artifact_text(&task);
                if !text.is_empty() {
                    emit(events, TurnEvent::Text(text))?;
                }
                snapshot = Some(task);
            }
            other => {
                if let (Some(task), Some(event)) = (&mut snapshot, other.as_task_event()) {
                    let before = artifact_text(task);
                    task.apply(&event);
                    let now = artifact_text(task);
                    // Appended text streams; a replaced artifact shows in the final reply.
                    if let Some(more) = now.strip_prefix(&before).filter(|m| !m.is_empty()) {
                        emit(events, TurnEvent::Text(more.to_string()))?;
                    }
                }
            }
        }
        if snapshot
            .as_ref()
            .is_some_and(|t| t.status.state.ends_turn())
        {
            break;
        }
    }
    let Some(task) = snapshot else {
        return Err(ClientError::Protocol(
            "the event stream ended before naming a task".into(),
        ));
    };
    if task.status.state.ends_turn() {
        return Ok(SendResult::Task(task));
    }
    // The stream closed early: poll the task to the end of its turn.
    poll(client, task).await.map(SendResult::Task)
}

/// Polls `task` until its turn ends (every request under the client's deadline).
async fn poll(client: &A2aClient, mut task: Task) -> Result<Task, ClientError> {
    let mut wait = POLL_FIRST;
    while !task.status.state.ends_turn() {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(POLL_MAX);
        task = client.get_task(&task.id, Some(0)).await?;
    }
    Ok(task)
}
