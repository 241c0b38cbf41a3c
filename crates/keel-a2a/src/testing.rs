//! [`EchoBackend`]: an in-memory [`A2aBackend`] for tests, examples and trying the
//! router with curl. It serves one agent, `echo`, whose behaviour the message picks:
//!
//! | message | what the task does |
//! | --- | --- |
//! | `ask …` | pauses in `input-required` asking "What is your name?"; the answer (same task id) completes it with "Nice to meet you, <answer>." |
//! | `slow …` | works until cancelled (then `canceled`) |
//! | `fail …` | fails with "failure requested" |
//! | anything else | completes with an artifact `echo: <message>` |
//!
//! Nothing depends on time: a `slow` task waits for its cancellation, not a timer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use keel_core::CancellationToken;
use tokio::sync::mpsc;

use crate::jsonrpc::RpcError;
use crate::server::{A2aBackend, AgentDescriptor, CallContext, TaskRun};
use crate::types::{
    Artifact, Message, Part, Task, TaskArtifactUpdateEvent, TaskEvent, TaskState, TaskStatus,
    TaskStatusUpdateEvent,
};

struct Entry {
    task: Task,
    events: Option<mpsc::UnboundedSender<TaskEvent>>,
    cancel: CancellationToken,
}

/// The in-memory test backend (see the module docs).
pub struct EchoBackend {
    tasks: Mutex<HashMap<String, Entry>>,
    streaming: bool,
    changed: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for EchoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EchoBackend").finish_non_exhaustive()
    }
}

enum Behaviour {
    Echo(String),
    Ask,
    Answer(String),
    Slow,
    Fail,
}

impl EchoBackend {
    /// A backend whose agent streams.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            tasks: Mutex::new(HashMap::new()),
            streaming: true,
            changed: tokio::sync::watch::Sender::new(0),
        })
    }

    /// A backend whose agent's card says it does not stream.
    pub fn without_streaming() -> Arc<Self> {
        Arc::new(Self {
            tasks: Mutex::new(HashMap::new()),
            streaming: false,
            changed: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The task `id`'s state, if it exists.
    pub fn state(&self, id: &str) -> Option<TaskState> {
        self.lock().get(id).map(|e| e.task.status.state)
    }

    /// Waits until a task's status message reads `text` (e.g. `working until cancelled`:
    /// a `slow` task runs); answers its id. Event-driven: no polling, no timer.
    pub async fn wait_for_status_message(&self, text: &str) -> String {
        self.wait_until(|task| {
            task.status.message.as_ref().map(Message::text).as_deref() == Some(text)
        })
        .await
    }

    /// Waits until task `id` is in `state`.
    pub async fn wait_for_state(&self, id: &str, state: TaskState) {
        self.wait_until(|task| task.id == id && task.status.state == state)
            .await;
    }

    /// Waits until a task matches `predicate`; answers its id.
    async fn wait_until(&self, predicate: impl Fn(&Task) -> bool) -> String {
        let mut changes = self.changed.subscribe();
        loop {
            let found = self
                .lock()
                .values()
                .find(|e| predicate(&e.task))
                .map(|e| e.task.id.clone());
            if let Some(id) = found {
                return id;
            }
            if changes.changed().await.is_err() {
                // The sender lives as long as `self`: unreachable, but never spin.
                std::future::pending::<()>().await;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        match self.tasks.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Applies `event` to the stored task and forwards it to the task's stream; a
    /// canceled task takes no more events.
    fn emit(&self, task_id: &str, event: TaskEvent) {
        let mut tasks = self.lock();
        let Some(entry) = tasks.get_mut(task_id) else {
            return;
        };
        if entry.task.status.state.is_terminal() {
            return;
        }
        entry.task.apply(&event);
        let ends = entry.task.status.state.ends_turn();
        if let Some(sender) = &entry.events {
            let _ = sender.send(event);
        }
        if ends {
            entry.events = None;
        }
        drop(tasks);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn status(&self, task: &Task, state: TaskState, text: Option<&str>) -> TaskEvent {
        let mut status = TaskStatus::new(state);
        if let Some(text) = text {
            let mut message = Message::agent(text);
            message.task_id = Some(task.id.clone());
            message.context_id = Some(task.context_id.clone());
            status = status.with_message(message);
        }
        TaskEvent::Status(TaskStatusUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            status,
            metadata: None,
        })
    }

    fn artifact(task: &Task, text: String) -> TaskEvent {
        TaskEvent::Artifact(TaskArtifactUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            artifact: Artifact {
                artifact_id: format!("{}-reply", task.id),
                name: Some("reply".into()),
                description: None,
                parts: vec![Part::text(text)],
                metadata: None,
            },
            append: false,
            last_chunk: true,
            metadata: None,
        })
    }

    async fn work(self: Arc<Self>, task: Task, behaviour: Behaviour, cancel: CancellationToken) {
        self.emit(&task.id, self.status(&task, TaskState::Working, None));
        match behaviour {
            Behaviour::Echo(text) => {
                self.emit(&task.id, Self::artifact(&task, format!("echo: {text}")));
                self.emit(&task.id, self.status(&task, TaskState::Completed, None));
            }
            Behaviour::Ask => self.emit(
                &task.id,
                self.status(&task, TaskState::InputRequired, Some("What is your name?")),
            ),
            Behaviour::Answer(name) => {
                self.emit(
                    &task.id,
                    Self::artifact(&task, format!("Nice to meet you, {name}.")),
                );
                self.emit(&task.id, self.status(&task, TaskState::Completed, None));
            }
            Behaviour::Slow => {
                self.emit(
                    &task.id,
                    self.status(&task, TaskState::Working, Some("working until cancelled")),
                );
                cancel.cancelled().await;
            }
            Behaviour::Fail => self.emit(
                &task.id,
                self.status(&task, TaskState::Failed, Some("failure requested")),
            ),
        }
    }
}

fn events_of(
    receiver: mpsc::UnboundedReceiver<TaskEvent>,
) -> futures::stream::BoxStream<'static, TaskEvent> {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (event, receiver))
    })
    .boxed()
}

impl A2aBackend for Arc<EchoBackend> {
    fn agents(&self) -> Vec<AgentDescriptor> {
        let mut echo = AgentDescriptor::new(
            "echo",
            "Echoes messages; `ask` asks a question, `slow` works until cancelled, `fail` fails.",
        );
        echo.streaming = self.streaming;
        vec![echo]
    }

    fn send_message<'a>(
        &'a self,
        _ctx: &'a CallContext,
        mut message: Message,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>> {
        Box::pin(async move {
            let text = message.text();
            let (sender, receiver) = mpsc::unbounded_channel();
            let (task, behaviour, cancel) = if let Some(task_id) = message.task_id.clone() {
                let mut tasks = self.lock();
                let entry = tasks
                    .get_mut(&task_id)
                    .ok_or_else(|| RpcError::task_not_found(&task_id))?;
                if entry.task.status.state != TaskState::InputRequired {
                    return Err(RpcError::unsupported(format!(
                        "task `{task_id}` is {} and takes no more messages",
                        entry.task.status.state
                    )));
                }
                message.context_id = Some(entry.task.context_id.clone());
                entry.task.history.push(message);
                entry.task.status = TaskStatus::new(TaskState::Submitted);
                entry.events = Some(sender);
                (
                    entry.task.clone(),
                    Behaviour::Answer(text),
                    entry.cancel.clone(),
                )
            } else {
                let id = uuid::Uuid::new_v4().to_string();
                let context_id = message
                    .context_id
                    .clone()
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
                message.task_id = Some(id.clone());
                message.context_id = Some(context_id.clone());
                let word = text
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_lowercase();
                let behaviour = match word.as_str() {
                    "ask" => Behaviour::Ask,
                    "slow" => Behaviour::Slow,
                    "fail" => Behaviour::Fail,
                    _ => Behaviour::Echo(text),
                };
                let task = Task {
                    id: id.clone(),
                    context_id,
                    status: TaskStatus::new(TaskState::Submitted),
                    artifacts: Vec::new(),
                    history: vec![message],
                    metadata: None,
                };
                let cancel = CancellationToken::new();
                self.lock().insert(
                    id,
                    Entry {
                        task: task.clone(),
                        events: Some(sender),
                        cancel: cancel.clone(),
                    },
                );
                (task, behaviour, cancel)
            };
            tokio::spawn(Arc::clone(self).work(task.clone(), behaviour, cancel));
            Ok(TaskRun {
                task,
                events: events_of(receiver),
            })
        })
    }

    fn get_task<'a>(
        &'a self,
        _ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>> {
        Box::pin(async move {
            self.lock()
                .get(task_id)
                .map(|e| e.task.clone())
                .ok_or_else(|| RpcError::task_not_found(task_id))
        })
    }

    fn cancel_task<'a>(
        &'a self,
        _ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>> {
        Box::pin(async move {
            let (task, cancel) = {
                let tasks = self.lock();
                let entry = tasks
                    .get(task_id)
                    .ok_or_else(|| RpcError::task_not_found(task_id))?;
                if entry.task.status.state.is_terminal() {
                    return Err(RpcError::not_cancelable(
                        task_id,
                        entry.task.status.state.as_v03(),
                    ));
                }
                (entry.task.clone(), entry.cancel.clone())
            };
            self.emit(
                task_id,
                self.status(&task, TaskState::Canceled, Some("canceled")),
            );
            cancel.cancel();
            self.lock()
                .get(task_id)
                .map(|e| e.task.clone())
                .ok_or_else(|| RpcError::task_not_found(task_id))
        })
    }

    fn subscribe<'a>(
        &'a self,
        _ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>> {
        Box::pin(async move {
            let mut tasks = self.lock();
            let entry = tasks
                .get_mut(task_id)
                .ok_or_else(|| RpcError::task_not_found(task_id))?;
            if entry.task.status.state.is_terminal() {
                return Err(RpcError::unsupported(format!(
                    "task `{task_id}` is {}: there is nothing to follow",
                    entry.task.status.state
                )));
            }
            // One follower at a time: a new subscription takes the stream over.
            let (sender, receiver) = mpsc::unbounded_channel();
            entry.events = Some(sender);
            Ok(TaskRun {
                task: entry.task.clone(),
                events: events_of(receiver),
            })
        })
    }
}

/// Serves a fresh [`EchoBackend`] on `127.0.0.1` (a free port) for the life of the
/// runtime; answers the agent's URL (`http://127.0.0.1:PORT/a2a/echo`) and the backend.
pub async fn serve_echo() -> std::io::Result<(String, Arc<EchoBackend>)> {
    let backend = EchoBackend::new();
    let url = serve(Arc::clone(&backend)).await?;
    Ok((url, backend))
}

/// Serves `backend` (e.g. [`EchoBackend::without_streaming`]) on `127.0.0.1` (a free port)
/// for the life of the runtime; answers the agent's URL (`http://127.0.0.1:PORT/a2a/echo`).
pub async fn serve(backend: Arc<EchoBackend>) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let router =
        crate::server::router(Arc::new(Arc::clone(&backend)), format!("http://{address}")).build();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(format!("http://{address}/a2a/echo"))
}
