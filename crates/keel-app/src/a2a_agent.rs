//! [`A2aAgent`]: an agent whose turns a remote agent answers over the Agent2Agent protocol
//! (seed 003's `A2AAgent`). keel.toml:
//!
//! ```toml
//! [[a2a.agents]]
//! name = "researcher"
//! url = "https://agents.example/a2a/research"
//! auth = { bearer_env = "RESEARCHER_TOKEN" }
//!
//! [agents.researcher]
//! a2a = "researcher"          # the [[a2a.agents]] entry; makes the agent kind = "a2a"
//! description = "Finds sources."   # optional (shown to agents that hand off to it)
//! ```
//!
//! It runs wherever an agent runs — `keel run --agent`, `keel chat`, `keel reply`/`resume`,
//! handoffs, `agents_as_tools`, workflow steps, `keel serve` — and journals a Keel run like
//! any other: `run_started` (with the recipe that rebuilds it), the user message, a
//! `notice` `a2a_task` once the remote agent names its task, then the reply as an
//! `agent_message` with `run_ended` (one append). Each run sends the run's new messages (a handoff's: the
//! request handed off) through keel-a2a's client ([`keel_a2a::agent::turn`]): streaming
//! text deltas to observers when the agent's card says it streams, else polling.
//!
//! - The reply message carries a marker (a `ProviderItem` of provider `a2a` that models
//!   never see) with the remote task and context, so the next run continues the remote
//!   conversation (same `contextId`).
//! - **input-required**: the run's user-input source is asked the agent's question (an
//!   interactive surface answers at once: `user_answered`, and the answer goes to the same
//!   task); the question is recorded as the agent's message and as `user_asked`, together
//!   with the answer or with the run's end — without an answer the run ends
//!   `clarify_needed`, and the next message on the thread (`keel reply`, `POST …/reply`)
//!   answers the same remote task.
//! - **Cancellation**: a cancelled run records `a2a_cancel` and sends
//!   `CancelTask` / `tasks/cancel` for the remote task, then ends `cancelled` naming what
//!   the remote agent answered. A run whose journal refuses the write (a worker that lost
//!   its lease at shutdown) leaves the remote task alone: the worker that resumes the run
//!   follows it again from the recorded task id.
//! - **Deadlines**: every request has the entry's `timeout_ms`, and so has the whole turn
//!   (then the remote task is cancelled and the run ends `failed`).
//! - Failures of the remote task (`failed`, `rejected`, `auth-required`, a transport or
//!   protocol error) end the run `failed` with the reason; a remote `canceled` ends it
//!   `cancelled`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use keel_a2a::agent::TurnEvent;
use keel_a2a::{A2aClient, ClientError, ClientOptions, SendResult, TaskState};
use keel_config::{AgentKind, DiagnosticCode};
use keel_core::definition::{AgentDefinition, AgentFingerprint, sha256_hex};
use keel_core::{CredentialLookup, EndState, EventKind, Message, Part, Role, StreamEvent};
use keel_runtime::{Agent, RunContext, RunError, RunOutcome, RunRecorder, Thread};
use serde_json::{Value, json};

use crate::App;
use crate::build::{AgentRequest, Resolution};
use crate::definition::{AgentRef, Resolved};
use crate::error::AppError;

/// The provider name of the marker a reply carries (a `ProviderItem` no model is sent).
pub const MARKER_PROVIDER: &str = "a2a";
/// The notice recorded when the remote agent names its task (`data`: agent, remote,
/// task_id, context_id, state).
pub const TASK_NOTICE: &str = "a2a_task";
/// The notice recorded before the remote task is cancelled.
pub const CANCEL_NOTICE: &str = "a2a_cancel";
/// Longest wait for the remote agent's answer to a cancellation, and for it to name a
/// task it had not named when the run was cancelled.
const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// An agent answered by a remote A2A agent (see the [module documentation](self)).
pub struct A2aAgent {
    name: String,
    description: String,
    remote: String,
    options: ClientOptions,
    client: A2aClient,
    timeout: Duration,
    recipe: Value,
}

impl std::fmt::Debug for A2aAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aAgent")
            .field("name", &self.name)
            .field("remote", &self.remote)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the thread says about the remote conversation: the last reply marker of this
/// agent.
#[derive(Debug, Clone, Default, PartialEq)]
struct Marker {
    task_id: Option<String>,
    context_id: Option<String>,
    state: Option<String>,
}

/// How a turn with the remote agent ended.
enum TurnEnd {
    /// The agent answered (a completed task or a message).
    Answered { reply: String, marker: Marker },
    /// The agent asked a question and waits on the task.
    InputRequired { question: String, marker: Marker },
    /// The run ends now (failed, cancelled, timed out).
    End { end_state: EndState, reason: String },
}

impl A2aAgent {
    /// An agent `name` answered by the remote agent `remote` (the `[[a2a.agents]]` name)
    /// at `url`, with `options` (credentials, the per-request deadline, which also bounds
    /// the whole turn). Fails on an unusable URL; nothing is fetched until the first run.
    pub fn new(
        name: impl Into<String>,
        remote: impl Into<String>,
        url: impl Into<String>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let url = url.into();
        let client = A2aClient::new(&url, options.clone())?;
        Ok(Self {
            name: name.into(),
            description: String::new(),
            remote: remote.into(),
            timeout: options.timeout,
            options,
            client,
            recipe: Value::Null,
        })
    }

    /// What the agent does (shown to agents offered it as a tool or handoff target).
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Calls the remote agent under `policy`, trusting `interface_origins` for its card's
    /// interface (see [`A2aClient::with_outbound`], [`A2aClient::trusting_origins`]).
    pub fn outbound(
        mut self,
        policy: keel_outbound::OutboundPolicy,
        interface_origins: &[String],
    ) -> Result<Self, ClientError> {
        self.client = self
            .client
            .with_outbound(policy)?
            .trusting_origins(interface_origins)?;
        Ok(self)
    }

    /// How the application rebuilds the agent, recorded in each run's `run_started`.
    #[must_use]
    pub fn recipe(mut self, recipe: Value) -> Self {
        self.recipe = recipe;
        self
    }

    /// The `[[a2a.agents]]` entry that answers.
    pub fn remote(&self) -> &str {
        &self.remote
    }

    /// `a2a:<remote>`: what answers, as runs record it.
    pub fn model_id(&self) -> String {
        format!("a2a:{}", self.remote)
    }

    /// The client this agent talks through (the run's credentials may give it another).
    pub fn client(&self) -> &A2aClient {
        &self.client
    }

    fn definition(&self) -> AgentDefinition {
        AgentDefinition {
            recipe: self.recipe.clone(),
            fingerprint: AgentFingerprint {
                model: self.model_id(),
                system_prompt_sha256: sha256_hex(""),
                tools: Vec::new(),
                planner: Default::default(),
                observation: Default::default(),
                critic: false,
                context_strategy: None,
                context_window: None,
                max_output_tokens: None,
                settings: Default::default(),
            },
        }
    }

    /// Whether this agent can continue `thread`'s run in progress (it must be this
    /// agent's); answers the notices to show (none).
    pub fn check_resumable(&self, thread: &Thread) -> Result<Vec<String>, RunError> {
        match thread.state().run() {
            Some(run) if run.agent != self.name => Err(RunError::IncompatibleAgent {
                thread_id: thread.id().to_string(),
                problems: vec![format!(
                    "the run belongs to agent `{}`, not to the remote A2A agent `{}`",
                    run.agent, self.name
                )],
            }),
            _ => Ok(Vec::new()),
        }
    }

    /// The client of one run: with the run's credential source (a server's tenant), a
    /// client whose credentials come from it first; else the agent's own.
    fn client_for(&self, context: &RunContext) -> A2aClient {
        let Some(credentials) = context.credentials.clone() else {
            return self.client.clone();
        };
        let fallback = Arc::clone(&self.options.env);
        let remote = self.remote.clone();
        self.client.with_env(Arc::new(move |var: &str| {
            match credentials.lookup(&remote, var) {
                CredentialLookup::Found(secret) => Some(secret),
                CredentialLookup::Missing { .. } => None,
                CredentialLookup::Unmanaged => fallback(var),
            }
        }))
    }

    /// Why the run's credential source cannot give this agent's credentials (a server's
    /// tenant that has not configured one), naming the setting to add.
    fn missing_credential(&self, context: &RunContext) -> Option<String> {
        let credentials = context.credentials.as_ref()?;
        let auth = &self.options.auth;
        auth.bearer_env
            .iter()
            .chain(auth.headers.values())
            .find_map(|var| match credentials.lookup(&self.remote, var) {
                CredentialLookup::Missing { fix } => Some(format!(
                    "remote agent `{}` needs the credential `{var}`, which this run cannot \
                     use: {fix}",
                    self.remote
                )),
                _ => None,
            })
    }

    /// The last reply marker of this agent in `messages`, and whether it is the last
    /// answer of the conversation (nothing answered since).
    fn last_marker(&self, messages: &[Message]) -> (Marker, bool) {
        let mut latest_answer = true;
        for message in messages.iter().rev() {
            let found = message.parts.iter().find_map(|part| match part {
                Part::ProviderItem { provider, item }
                    if provider == MARKER_PROVIDER
                        && item.get("agent").and_then(Value::as_str) == Some(&self.name) =>
                {
                    let text =
                        |key: &str| item.get(key).and_then(Value::as_str).map(str::to_string);
                    Some(Marker {
                        task_id: text("task_id"),
                        context_id: text("context_id"),
                        state: text("state"),
                    })
                }
                _ => None,
            });
            if let Some(marker) = found {
                return (marker, latest_answer);
            }
            if message.role != Role::User {
                latest_answer = false;
            }
        }
        (Marker::default(), false)
    }

    fn marker_part(&self, marker: &Marker) -> Part {
        Part::ProviderItem {
            provider: MARKER_PROVIDER.to_string(),
            item: json!({
                "agent": self.name,
                "remote": self.remote,
                "task_id": marker.task_id,
                "context_id": marker.context_id,
                "state": marker.state,
            }),
        }
    }

    /// One turn: sends `message` (or, with `follow`, follows that task already sent)
    /// until the remote agent answers, asks, fails, or the run is cancelled or times out.
    async fn turn(
        &self,
        run: &mut RunRecorder<'_>,
        client: &A2aClient,
        message: keel_a2a::Message,
        follow: Option<String>,
        known_task: &mut Option<keel_a2a::Task>,
        streamed: &mut String,
    ) -> Result<TurnEnd, RunError> {
        let mut events: BoxStream<'static, Result<TurnEvent, ClientError>> = match follow {
            Some(task_id) => keel_a2a::agent::follow(client.clone(), task_id),
            None => keel_a2a::agent::turn(client.clone(), message),
        };
        let cancel = run.context().cancel.clone();
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let result = loop {
            tokio::select! {
                next = events.next() => match next {
                    Some(Ok(TurnEvent::Started(task))) => {
                        if known_task.as_ref().map(|t| &t.id) != Some(&task.id) {
                            self.record_task(run, &task).await?;
                        }
                        *known_task = Some(task);
                    }
                    Some(Ok(TurnEvent::Text(text))) => {
                        self.stream_text(run, &text);
                        streamed.push_str(&text);
                    }
                    Some(Ok(TurnEvent::Finished(result))) => break Ok(result),
                    Some(Err(error)) => break Err(error),
                    None => break Err(ClientError::Protocol("the turn ended without an answer".into())),
                },
                () = cancel.cancelled() => {
                    self.name_task(run, &mut events, known_task).await?;
                    let open = Self::open_task(known_task);
                    let note = self.cancel_remote(run, client, open).await?;
                    return Ok(TurnEnd::End {
                        end_state: EndState::Cancelled,
                        reason: format!("cancelled by the user{note}"),
                    });
                }
                () = &mut deadline => {
                    self.name_task(run, &mut events, known_task).await?;
                    let open = Self::open_task(known_task);
                    let note = self.cancel_remote(run, client, open).await?;
                    return Ok(TurnEnd::End {
                        end_state: EndState::Failed,
                        reason: format!(
                            "remote agent `{}` did not finish its turn within {} ms{note}",
                            self.remote,
                            self.timeout.as_millis()
                        ),
                    });
                }
            }
        };
        let result = match result {
            Ok(result) => result,
            Err(error) => {
                // A task left running unobserved is cancelled (when the journal takes it).
                let open = known_task
                    .as_ref()
                    .filter(|t| !t.status.state.ends_turn())
                    .map(|t| t.id.clone());
                let note = match open {
                    Some(task_id) => self.cancel_remote(run, client, Some(task_id)).await?,
                    None => String::new(),
                };
                return Ok(TurnEnd::End {
                    end_state: EndState::Failed,
                    reason: format!("remote agent `{}`: {error}{note}", self.remote),
                });
            }
        };
        Ok(self.turn_end(result))
    }

    fn turn_end(&self, result: SendResult) -> TurnEnd {
        let task = match result {
            SendResult::Message(reply) => {
                return TurnEnd::Answered {
                    reply: reply.text(),
                    marker: Marker {
                        task_id: reply.task_id.clone(),
                        context_id: reply.context_id.clone(),
                        state: Some(TaskState::Completed.as_v03().to_string()),
                    },
                };
            }
            SendResult::Task(task) => task,
        };
        let marker = Marker {
            task_id: Some(task.id.clone()),
            context_id: Some(task.context_id.clone()).filter(|c| !c.is_empty()),
            state: Some(task.status.state.as_v03().to_string()),
        };
        let said = task
            .status
            .message
            .as_ref()
            .map(keel_a2a::Message::text)
            .filter(|t| !t.trim().is_empty());
        let failed = |what: &str| TurnEnd::End {
            end_state: EndState::Failed,
            reason: format!(
                "remote agent `{}` {what} (task `{}`){}",
                self.remote,
                task.id,
                said.as_ref().map(|s| format!(": {s}")).unwrap_or_default()
            ),
        };
        match task.status.state {
            TaskState::Completed => TurnEnd::Answered {
                reply: task.reply_text(),
                marker,
            },
            TaskState::InputRequired => TurnEnd::InputRequired {
                question: said
                    .clone()
                    .unwrap_or_else(|| format!("remote agent `{}` needs more input", self.remote)),
                marker,
            },
            TaskState::Canceled => TurnEnd::End {
                end_state: EndState::Cancelled,
                reason: format!(
                    "remote agent `{}` canceled the task `{}`{}",
                    self.remote,
                    task.id,
                    said.as_ref().map(|s| format!(": {s}")).unwrap_or_default()
                ),
            },
            TaskState::Failed => failed("failed the task"),
            TaskState::Rejected => failed("rejected the task"),
            TaskState::AuthRequired => failed(
                "needs authentication the caller did not provide (set `auth` of its \
                 [[a2a.agents]] entry)",
            ),
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => {
                failed("stopped before finishing the task")
            }
        }
    }

    /// Records that the remote agent named its task (durable before anything else
    /// happens to it: a resumed run follows it, a cancel targets it).
    async fn record_task(
        &self,
        run: &mut RunRecorder<'_>,
        task: &keel_a2a::Task,
    ) -> Result<(), RunError> {
        run.record(EventKind::Notice {
            code: TASK_NOTICE.into(),
            message: format!("remote agent `{}` works on task `{}`", self.remote, task.id),
            data: Some(json!({
                "agent": self.name,
                "remote": self.remote,
                "task_id": task.id,
                "context_id": task.context_id,
                "state": task.status.state.as_v03(),
            })),
        })
        .await
    }

    fn stream_text(&self, run: &RunRecorder<'_>, text: &str) {
        let event = StreamEvent::TextDelta(text.to_string());
        for observer in &run.context().observers {
            observer.on_stream(run.thread_id(), run.run_id(), &event);
        }
    }

    /// Waits (briefly) for the agent to name a task it had not named when the turn was
    /// given up, and records it.
    async fn name_task(
        &self,
        run: &mut RunRecorder<'_>,
        events: &mut BoxStream<'static, Result<TurnEvent, ClientError>>,
        known_task: &mut Option<keel_a2a::Task>,
    ) -> Result<(), RunError> {
        if known_task.is_some() {
            return Ok(());
        }
        let named = tokio::time::timeout(CANCEL_WAIT, async {
            while let Some(event) = events.next().await {
                match event {
                    Ok(TurnEvent::Started(task)) => return Some(task),
                    Ok(TurnEvent::Text(_)) => {}
                    Ok(TurnEvent::Finished(SendResult::Task(task))) => return Some(task),
                    Ok(TurnEvent::Finished(SendResult::Message(_))) | Err(_) => return None,
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        if let Some(task) = named {
            self.record_task(run, &task).await?;
            *known_task = Some(task);
        }
        Ok(())
    }

    /// Cancels remote task `task_id` (`None`: the agent named none): records
    /// `a2a_cancel` — only once the journal took it is `CancelTask` sent (a worker fenced at
    /// shutdown leaves the task to the worker that resumes the run) — and answers a note on
    /// the outcome for the run's reason.
    async fn cancel_remote(
        &self,
        run: &mut RunRecorder<'_>,
        client: &A2aClient,
        task_id: Option<String>,
    ) -> Result<String, RunError> {
        let Some(task_id) = task_id else {
            return Ok(" (the remote agent had not named a task to cancel)".into());
        };
        run.record(EventKind::Notice {
            code: CANCEL_NOTICE.into(),
            message: format!(
                "cancelling remote task `{task_id}` of agent `{}`",
                self.remote
            ),
            data: Some(json!({ "agent": self.name, "remote": self.remote, "task_id": task_id })),
        })
        .await?;
        // Sent from a detached task, so it completes (within the client's deadline) even
        // when the answer takes longer than this run waits for it.
        let sender = tokio::spawn({
            let (client, task_id) = (client.clone(), task_id.clone());
            async move { client.cancel_task(&task_id).await }
        });
        Ok(match tokio::time::timeout(CANCEL_WAIT, sender).await {
            Ok(Ok(Ok(task))) => format!("; remote task `{task_id}` is now {}", task.status.state),
            Ok(Ok(Err(error))) => format!("; cancelling remote task `{task_id}` failed: {error}"),
            _ => format!("; cancellation of remote task `{task_id}` was requested"),
        })
    }

    /// The task to cancel when a turn is given up: the one the agent named, unless it
    /// already ended.
    fn open_task(known_task: &Option<keel_a2a::Task>) -> Option<String> {
        known_task
            .as_ref()
            .filter(|task| !task.status.state.is_terminal())
            .map(|task| task.id.clone())
    }

    /// Drives turns from `message` until the run ends: answers are recorded and end the
    /// run `done`; a question is asked of the user (answered: the next turn; else the run
    /// ends `clarify_needed`).
    async fn drive(
        &self,
        mut run: RunRecorder<'_>,
        mut message: keel_a2a::Message,
        mut follow: Option<String>,
    ) -> Result<RunOutcome, RunError> {
        if let Some(reason) = self.missing_credential(run.context()) {
            return run.finish(EndState::Failed, Some(reason), None).await;
        }
        let client = self.client_for(run.context());
        let mut answers = 0u32;
        loop {
            let mut known_task = None;
            let mut streamed = String::new();
            let end = self
                .turn(
                    &mut run,
                    &client,
                    message.clone(),
                    follow.take(),
                    &mut known_task,
                    &mut streamed,
                )
                .await?;
            match end {
                TurnEnd::Answered { reply, marker } => {
                    // What did not stream (all of it, when the agent does not stream).
                    if let Some(rest) = reply
                        .strip_prefix(streamed.as_str())
                        .filter(|r| !r.is_empty())
                    {
                        self.stream_text(&run, rest);
                    }
                    let mut parts = Vec::new();
                    if !reply.is_empty() {
                        parts.push(Part::Text {
                            text: reply.clone(),
                        });
                    }
                    parts.push(self.marker_part(&marker));
                    let answer = EventKind::AgentMessage {
                        agent: self.name.clone(),
                        message: Message {
                            role: Role::Assistant,
                            parts,
                        },
                    };
                    let span = run.span_id().to_string();
                    return run
                        .finish_with(vec![(answer, span)], EndState::Done, None, Some(reply))
                        .await;
                }
                TurnEnd::InputRequired { question, marker } => {
                    let span = run.span_id().to_string();
                    let asked = Message {
                        role: Role::Assistant,
                        parts: vec![
                            Part::Text {
                                text: question.clone(),
                            },
                            self.marker_part(&marker),
                        ],
                    };
                    let mut batch = vec![
                        (
                            EventKind::AgentMessage {
                                agent: self.name.clone(),
                                message: asked,
                            },
                            span.clone(),
                        ),
                        (
                            EventKind::UserAsked {
                                question: question.clone(),
                                missing_fields: Vec::new(),
                            },
                            span.clone(),
                        ),
                    ];
                    // Asked before anything is recorded, so the question lands with its
                    // answer or with the run's end (no reader sees a run left waiting).
                    let Some(answer) = self.ask_user(&run, &question).await else {
                        if run.context().cancel.is_cancelled() {
                            run.record_batch(batch).await?;
                            let note = self
                                .cancel_remote(&mut run, &client, marker.task_id.clone())
                                .await?;
                            let reason = format!("cancelled by the user{note}");
                            return run.finish(EndState::Cancelled, Some(reason), None).await;
                        }
                        let reason = format!("waiting for the user's answer to: {question}");
                        return run
                            .finish_with(batch, EndState::ClarifyNeeded, Some(reason), None)
                            .await;
                    };
                    batch.push((
                        EventKind::UserAnswered {
                            answer: answer.clone(),
                        },
                        span,
                    ));
                    run.record_batch(batch).await?;
                    answers += 1;
                    message = self.outgoing(
                        answer,
                        &format!("keel-{}-{answers}", run.run_id()),
                        &marker,
                        true,
                    );
                }
                TurnEnd::End { end_state, reason } => {
                    return run.finish(end_state, Some(reason), None).await;
                }
            }
        }
    }

    /// The user's answer to `question` from the run's user-input source (`None`: none, or
    /// the run was cancelled while waiting — a person has no deadline).
    async fn ask_user(&self, run: &RunRecorder<'_>, question: &str) -> Option<String> {
        let context = run.context();
        tokio::select! {
            answer = context.user_input.answer(run.thread_id(), question, &[]) => {
                answer.filter(|a| !a.trim().is_empty())
            }
            () = context.cancel.cancelled() => None,
        }
    }

    /// The message sent to the remote agent: `text`, with id `message_id` (stable for a
    /// run, so a resumed run sends the same id and the agent can deduplicate it), in the
    /// remote conversation of `marker`, answering its task when `answer_task`.
    fn outgoing(
        &self,
        text: String,
        message_id: &str,
        marker: &Marker,
        answer_task: bool,
    ) -> keel_a2a::Message {
        let mut message = keel_a2a::Message::user(text);
        message.message_id = message_id.to_string();
        message.context_id.clone_from(&marker.context_id);
        if answer_task {
            message.task_id.clone_from(&marker.task_id);
        }
        message
    }
}

/// The text a run sends: its new messages', else (a run taking over a conversation
/// handed to it) the goal it recorded.
fn run_input(new_messages: &[Message], run_events: &[std::sync::Arc<keel_core::Event>]) -> String {
    let text: Vec<String> = new_messages
        .iter()
        .map(Message::text)
        .filter(|t| !t.trim().is_empty())
        .collect();
    if !text.is_empty() {
        return text.join("\n\n");
    }
    run_events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::RunStarted { goal, .. } => Some(goal.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[async_trait]
impl Agent for A2aAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        // Read before the run's own messages join the conversation.
        let (marker, latest) = self.last_marker(thread.state().messages());
        let answer_task =
            latest && marker.state.as_deref() == Some(TaskState::InputRequired.as_v03());
        let model = self.model_id();
        let run = RunRecorder::start_with_definition(
            &self.name,
            &model,
            self.definition(),
            new_messages.clone(),
            thread,
            context,
        )
        .await?;
        let text = run_input(&new_messages, run.run_events());
        let message = self.outgoing(
            text,
            &format!("keel-{}", run.run_id()),
            &marker,
            answer_task,
        );
        self.drive(run, message, None).await
    }

    /// Continues this agent's run in progress (interrupted — its process died, or a worker
    /// lost its lease): a question still open is asked again; a task the run had sent is
    /// followed by id to the end of its turn; a message the agent had not taken as a task
    /// yet (the run's, or the user's answer) is sent again with the same message id.
    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        self.check_resumable(thread)?;
        // The run's own user messages do not count as answers: as when it started.
        let (marker, latest) = self.last_marker(thread.state().messages());
        let answers_task =
            latest && marker.state.as_deref() == Some(TaskState::InputRequired.as_v03());
        let awaiting = thread
            .state()
            .run()
            .and_then(|run| run.awaiting_user.clone());
        let mut run = RunRecorder::resume(thread, context).await?;
        let run_id = run.run_id().to_string();
        let events = run.run_events();
        let position = |wanted: &dyn Fn(&EventKind) -> bool| {
            events.iter().rposition(|event| wanted(&event.kind))
        };
        let last_task =
            position(&|kind| matches!(kind, EventKind::Notice { code, .. } if code == TASK_NOTICE));
        let last_answer = position(&|kind| matches!(kind, EventKind::UserAnswered { .. }));
        let answers = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::UserAnswered { .. }))
            .count();
        if let Some((question, _)) = awaiting {
            let Some(answer) = self.ask_user(&run, &question).await else {
                let reason = format!("waiting for the user's answer to: {question}");
                return run
                    .finish(EndState::ClarifyNeeded, Some(reason), None)
                    .await;
            };
            run.record(EventKind::UserAnswered {
                answer: answer.clone(),
            })
            .await?;
            let id = format!("keel-{run_id}-{}", answers + 1);
            let message = self.outgoing(answer, &id, &marker, true);
            return self.drive(run, message, None).await;
        }
        let task_id = last_task
            .filter(|t| last_answer.is_none_or(|a| *t > a))
            .and_then(|t| events.get(t))
            .and_then(|event| match &event.kind {
                EventKind::Notice {
                    data: Some(data), ..
                } => data
                    .get("task_id")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                _ => None,
            });
        if let Some(task_id) = task_id {
            let unused = self.outgoing(String::new(), &format!("keel-{run_id}"), &marker, false);
            return self.drive(run, unused, Some(task_id)).await;
        }
        let answer = last_answer.and_then(|a| match &events.get(a)?.kind {
            EventKind::UserAnswered { answer } => Some(answer.clone()),
            _ => None,
        });
        let message = match answer {
            Some(answer) => {
                self.outgoing(answer, &format!("keel-{run_id}-{answers}"), &marker, true)
            }
            None => {
                let users: Vec<Message> = events
                    .iter()
                    .filter_map(|event| match &event.kind {
                        EventKind::UserMessage { message } => Some(message.clone()),
                        _ => None,
                    })
                    .collect();
                let text = run_input(&users, events);
                self.outgoing(text, &format!("keel-{run_id}"), &marker, answers_task)
            }
        };
        self.drive(run, message, None).await
    }
}

impl App {
    /// Builds the remote A2A agent `request.agent` names (`a2a = "<[[a2a.agents]] name>"`,
    /// `kind = "a2a"`), recording `recipe` in its runs. Its `[[a2a.agents]]` entry gives
    /// the URL, credentials (read at each request) and deadline; keys it cannot honour
    /// (`model`, `tools`, `instructions`…) are errors at their line.
    pub fn a2a_agent(
        &self,
        request: &AgentRequest,
        recipe: Value,
    ) -> Result<(A2aAgent, Resolution), AppError> {
        let Some(reference) = &request.agent else {
            return Err(AppError::Invalid(
                "a remote A2A agent is built from a definition with `a2a = \"<name>\"`".into(),
            ));
        };
        let resolved = Resolved::load(self.loaded(), reference)?;
        let def = &resolved.definition;
        let name = agent_name(&resolved);
        let mut problems = Vec::new();
        let path = |key: &str| resolved.key_path(key);
        for (key, message) in def.a2a_problems(&self.config().a2a, &path) {
            problems.push(resolved.error(DiagnosticCode::InvalidValue, key, message));
        }
        if !request.tools.is_empty() {
            problems.push(AppError::Invalid(format!(
                "agent `{name}` is answered by a remote A2A agent and takes no tools; remove \
                 --tool {}",
                request.tools.join(", ")
            )));
        }
        let mut notices = Vec::new();
        for (flag, given) in [
            ("--model", request.model.is_some()),
            ("--instructions", request.instructions.is_some()),
            ("--max-turns", request.max_turns.is_some()),
            ("--context-strategy", request.context_strategy.is_some()),
            ("--context-window", request.context_window.is_some()),
            ("--max-output-tokens", request.max_output_tokens.is_some()),
        ] {
            if given {
                notices.push(format!(
                    "{flag} does not apply to agent `{name}`: a remote A2A agent answers it \
                     with its own model and settings"
                ));
            }
        }
        if let Some(first) = AppError::merge(problems) {
            return Err(first);
        }
        let remote_name = def.a2a.clone().unwrap_or_default();
        let Some(entry) = self
            .config()
            .a2a
            .agents
            .iter()
            .find(|a| a.name == remote_name)
        else {
            return Err(resolved.error(
                DiagnosticCode::UnknownReference,
                "a2a",
                format!("`a2a` = \"{remote_name}\" is not the name of an [[a2a.agents]] entry"),
            ));
        };
        let auth = entry.auth.clone().unwrap_or_default();
        let env: keel_a2a::EnvLookup = Arc::clone(&self.env);
        let options = ClientOptions {
            timeout: Duration::from_millis(entry.timeout_ms()),
            auth: keel_a2a::Auth {
                bearer_env: auth.bearer_env,
                headers: auth.headers,
            },
            env,
            force_version: None,
        };
        let policy = policy_of(&self.outbound_policy_or_public(), entry);
        let mut agent = A2aAgent::new(name.clone(), &entry.name, &entry.url, options)
            .and_then(|agent| agent.outbound(policy, &entry.interface_origins))
            .map_err(|e| {
                resolved.error(
                    DiagnosticCode::InvalidValue,
                    "a2a",
                    format!("[[a2a.agents]] `{}`: {e}", entry.name),
                )
            })?
            .recipe(recipe);
        if let Some(description) = def
            .description
            .clone()
            .or_else(|| entry.description.clone())
        {
            agent = agent.description(description);
        }
        let resolution = Resolution {
            name,
            agent_name: resolved.name.clone(),
            agent_file: resolved.file.clone(),
            model_spec: Some(agent.model_id()),
            tools: Vec::new(),
            approve: None,
            notices,
            definition: Some(def.clone()),
        };
        Ok((agent, resolution))
    }
}

/// The agent's name: `name`, else the `[agents.<name>]` name, else the file's stem.
pub(crate) fn agent_name(resolved: &Resolved) -> String {
    resolved
        .definition
        .name
        .clone()
        .or_else(|| resolved.name.clone())
        .or_else(|| {
            resolved
                .file
                .as_ref()
                .and_then(|p| p.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "keel".into())
}

/// Whether `resolved` is answered by a remote A2A agent.
pub(crate) fn is_a2a(resolved: &Resolved) -> bool {
    resolved.definition.agent_kind() == AgentKind::A2a
}

/// Whether the agent `reference` names is answered by a remote A2A agent (a reference
/// that cannot be loaded is not: its builder reports why).
pub(crate) fn refers_to_a2a(app: &App, reference: Option<&AgentRef>) -> bool {
    reference
        .and_then(|r| Resolved::load(app.loaded(), r).ok())
        .is_some_and(|r| is_a2a(&r))
}

/// The outbound policy of an `[[a2a.agents]]` entry: `base` (`[outbound] allow_private`)
/// with the hosts its `url` and `interface_origins` name, which keel.toml configured.
pub(crate) fn policy_of(
    base: &keel_outbound::OutboundPolicy,
    entry: &keel_config::A2aAgentConfig,
) -> keel_outbound::OutboundPolicy {
    entry
        .interface_origins
        .iter()
        .fold(base.allowing_destination(&entry.url), |policy, origin| {
            policy.allowing_destination(origin)
        })
}
