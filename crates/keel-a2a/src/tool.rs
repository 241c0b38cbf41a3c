//! A remote A2A agent as a Keel tool: `{message, task_id?}` in, the agent's reply with
//! its task id and state out.
//!
//! The tool streams when the agent's card says it can, else sends without blocking and
//! polls the task. Remote failures become typed tool errors (`failed` → `retryable_server`,
//! `rejected` → `forbidden`, `auth-required` → `unauthorized`, HTTP and JSON-RPC errors
//! by their status and code); `input-required` is a result telling the model what the
//! remote agent asked and how to answer (call again with `task_id`). When the call is
//! cancelled, times out, or is dropped while the remote task runs, the tool sends
//! `CancelTask` / `tasks/cancel` for it.
//!
//! Credentials (`auth`'s variables) are asked of the call's credential source first
//! ([`ToolContext::lookup_credential`]; in `keel serve`, the tenant's own secrets): when it
//! answers, the call talks through a client of its own holding those secrets; when it
//! decides the call's credentials and has none, the call fails with `unauthorized` before
//! anything is sent — the process environment is read only for credentials the source
//! leaves to the tool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use keel_core::tool::CredentialLookup;
use keel_core::{Effect, RetryPolicy, Tool, ToolContext, ToolError, ToolErrorCode, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::client::{A2aClient, Auth, ClientError, ClientOptions, EnvLookup, process_env};
use crate::jsonrpc;
use crate::types::{Message, SendResult, StreamEvent, Task, TaskState};

/// Extra time the executor allows beyond the tool's own deadline, so the tool answers (and
/// cancels the remote task) before the executor gives up on it.
const EXECUTOR_MARGIN: Duration = Duration::from_secs(5);
/// Longest wait for the remote `CancelTask` answer when cancelling.
const CANCEL_WAIT: Duration = Duration::from_millis(400);

/// A remote agent to offer as a tool (keel.toml `[[a2a.agents]]`).
#[derive(Clone)]
pub struct RemoteAgent {
    /// The tool's name (`lowercase_snake_case`).
    pub name: String,
    /// The agent's base URL or its card's URL.
    pub url: String,
    /// When to use it (default: a sentence naming the agent).
    pub description: Option<String>,
    /// Credentials, by environment variable.
    pub auth: Auth,
    /// Longest a call may take, end to end.
    pub timeout: Duration,
    /// Where credentials are looked up.
    pub env: EnvLookup,
    /// The outbound policy of its calls; `None`: public addresses and the host of `url`
    /// (see [`A2aClient::with_outbound`]).
    pub outbound: Option<keel_outbound::OutboundPolicy>,
    /// Origins besides its card's that the card may name for its interface (the
    /// credentials are sent there); see [`A2aClient::trusting_origins`].
    pub interface_origins: Vec<String>,
}

impl std::fmt::Debug for RemoteAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAgent")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("auth", &self.auth)
            .field("timeout", &self.timeout)
            .field("outbound", &self.outbound)
            .field("interface_origins", &self.interface_origins)
            .finish_non_exhaustive()
    }
}

impl RemoteAgent {
    /// A remote agent with no credentials and a 120 s deadline.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            description: None,
            auth: Auth::default(),
            timeout: Duration::from_secs(120),
            env: process_env(),
            outbound: None,
            interface_origins: Vec::new(),
        }
    }
}

/// The arguments of an A2A tool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct A2aToolArgs {
    /// The message for the remote agent, in plain language.
    pub message: String,
    /// To answer a question the remote agent asked (state `input_required`): the
    /// `task_id` of that answer. Omit to start a new task.
    #[serde(default)]
    pub task_id: Option<String>,
}

/// The output of an A2A tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct A2aToolOutput {
    /// The remote agent's reply (its artifacts' text, else its status message) — for
    /// `input_required`, its question.
    pub reply: String,
    /// `completed`, or `input_required` when the remote agent waits for an answer.
    pub state: String,
    /// The remote task (absent when the agent answered with a plain message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The remote conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// What to do next, when the remote agent waits for input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A remote A2A agent offered as a tool.
#[derive(Debug, Clone)]
pub struct A2aTool {
    agent: RemoteAgent,
    client: A2aClient,
}

/// The remote task a call follows, shared by the call, its follower and its guard.
///
/// Cancellation is requested once (cancelled call, deadline, dropped call) and carried out
/// as soon as the task's id is known: if the stream has not named the task yet, the
/// follower cancels it when it does.
struct Tracker {
    client: A2aClient,
    state: Mutex<TrackerState>,
}

#[derive(Default)]
struct TrackerState {
    task_id: Option<String>,
    /// The task ended or paused: nothing to cancel.
    settled: bool,
    cancel_requested: bool,
    cancel_sent: bool,
    /// The answer of the cancel request, once it came.
    cancel_answer: Option<Result<TaskState, String>>,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records a snapshot; sends a requested cancellation now that the id is known.
    fn saw(self: &Arc<Self>, task: &Task) {
        let send = {
            let mut state = self.lock();
            state.task_id = Some(task.id.clone());
            state.settled = task.status.state.ends_turn();
            state.cancel_requested && !state.settled && !state.cancel_sent
        };
        if send {
            self.send_cancel();
        }
    }

    fn settle(&self) {
        self.lock().settled = true;
    }

    /// Asks for the remote task's cancellation (now, or when its id becomes known).
    fn request_cancel(self: &Arc<Self>) {
        let send = {
            let mut state = self.lock();
            state.cancel_requested = true;
            state.task_id.is_some() && !state.settled && !state.cancel_sent
        };
        if send {
            self.send_cancel();
        }
    }

    /// Sends `CancelTask` from a detached task, so it completes even when the call is
    /// abandoned.
    fn send_cancel(self: &Arc<Self>) {
        let task_id = {
            let mut state = self.lock();
            state.cancel_sent = true;
            state.task_id.clone()
        };
        let (Some(task_id), Ok(runtime)) = (task_id, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let tracker = Arc::clone(self);
        runtime.spawn(async move {
            let answer = tracker
                .client
                .cancel_task(&task_id)
                .await
                .map(|task| task.status.state)
                .map_err(|e| e.to_string());
            tracker.lock().cancel_answer = Some(answer);
        });
    }

    /// What became of the cancellation, for the error message.
    fn cancel_note(&self) -> String {
        let state = self.lock();
        match (&state.task_id, &state.cancel_answer) {
            (Some(id), Some(Ok(now))) => format!("; remote task `{id}` is now {now}"),
            (Some(id), Some(Err(error))) => {
                format!("; cancelling remote task `{id}` failed: {error}")
            }
            (Some(id), None) if state.cancel_sent => {
                format!("; cancellation of remote task `{id}` was requested")
            }
            _ => "; the remote task will be cancelled once the agent names it".into(),
        }
    }
}

/// Requests the remote task's cancellation when the call's future is dropped before it
/// finished (the executor abandons a call after its timeout or a cancel grace period).
struct CancelOnDrop {
    tracker: Arc<Tracker>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.tracker.lock().settled {
            self.tracker.request_cancel();
        }
    }
}

impl A2aTool {
    /// A tool for `agent`. Fails on an unusable URL; nothing is fetched until the first
    /// call.
    pub fn new(agent: RemoteAgent) -> Result<Self, ClientError> {
        let client = A2aClient::new(
            &agent.url,
            ClientOptions {
                timeout: agent.timeout,
                auth: agent.auth.clone(),
                env: Arc::clone(&agent.env),
                force_version: None,
            },
        )?
        .trusting_origins(&agent.interface_origins)?;
        let client = match &agent.outbound {
            Some(policy) => client.with_outbound(policy.clone())?,
            None => client,
        };
        Ok(Self { agent, client })
    }

    /// The client the tool calls through.
    pub fn client(&self) -> &A2aClient {
        &self.client
    }

    /// The client of one call: the tool's own, unless the call's credential source
    /// answers for the agent's credentials — then a client holding the secrets it gave
    /// (variables it leaves to the tool are read from the agent's environment). A
    /// credential the source decides and lacks fails the call with `unauthorized`.
    fn client_for(&self, ctx: &ToolContext) -> Result<A2aClient, ToolError> {
        let name = &self.agent.name;
        let auth = &self.agent.auth;
        let declared = auth
            .bearer_env
            .iter()
            .map(|var| (var, "auth.bearer_env".to_string()))
            .chain(
                auth.headers
                    .iter()
                    .map(|(header, var)| (var, format!("auth.headers.{header}"))),
            );
        let mut given: BTreeMap<String, String> = BTreeMap::new();
        for (var, field) in declared {
            match ctx.lookup_credential(name, var) {
                CredentialLookup::Found(secret) => {
                    given.insert(var.clone(), secret);
                }
                CredentialLookup::Missing { fix } => {
                    return Err(ToolError::new(
                        ToolErrorCode::Unauthorized,
                        format!(
                            "remote agent `{name}` needs the credential `{var}` ({field}): {fix}"
                        ),
                    )
                    .with_details(json!({"credential": var, "field": field})));
                }
                CredentialLookup::Unmanaged => {}
            }
        }
        if given.is_empty() {
            return Ok(self.client.clone());
        }
        let fallback = Arc::clone(&self.agent.env);
        let env: EnvLookup =
            Arc::new(move |var: &str| given.get(var).cloned().or_else(|| fallback(var)));
        Ok(self.client.with_env(env))
    }

    /// Follows the remote task to its end (or pause): streaming when the card says the
    /// agent streams, else a non-blocking send and polling.
    async fn follow(
        client: A2aClient,
        message: Message,
        tracker: Arc<Tracker>,
    ) -> Result<SendResult, ClientError> {
        let card = client.card().await?;
        if !card.streams() {
            return match client.send(&message, false).await? {
                SendResult::Message(reply) => Ok(SendResult::Message(reply)),
                SendResult::Task(task) => {
                    tracker.saw(&task);
                    Self::poll(&client, task, &tracker)
                        .await
                        .map(SendResult::Task)
                }
            };
        }
        let mut stream = client.stream(&message).await?;
        let mut snapshot: Option<Task> = None;
        while let Some(event) = stream.next().await {
            match event? {
                StreamEvent::Message(reply) => return Ok(SendResult::Message(reply)),
                StreamEvent::Task(task) => {
                    tracker.saw(&task);
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
                    tracker.saw(&task);
                    snapshot = Some(task);
                }
                other => {
                    if let (Some(task), Some(event)) = (&mut snapshot, other.as_task_event()) {
                        task.apply(&event);
                        tracker.saw(task);
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
        // The stream ended early: poll the task to its end.
        Self::poll(&client, task, &tracker)
            .await
            .map(SendResult::Task)
    }

    async fn poll(
        client: &A2aClient,
        mut task: Task,
        tracker: &Arc<Tracker>,
    ) -> Result<Task, ClientError> {
        let mut wait = Duration::from_millis(100);
        while !task.status.state.ends_turn() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
            task = client.get_task(&task.id, Some(0)).await?;
            tracker.saw(&task);
        }
        Ok(task)
    }

    /// Requests the remote cancellation and gives the follower a moment to see it land.
    async fn cancel_and_wait(
        tracker: &Arc<Tracker>,
        follower: &mut tokio::task::JoinHandle<Result<SendResult, ClientError>>,
    ) -> String {
        tracker.request_cancel();
        let _ = tokio::time::timeout(CANCEL_WAIT, follower).await;
        tracker.cancel_note()
    }

    fn output(&self, result: SendResult) -> Result<A2aToolOutput, ToolError> {
        let name = &self.agent.name;
        let task = match result {
            SendResult::Message(reply) => {
                return Ok(A2aToolOutput {
                    reply: reply.text(),
                    state: "completed".into(),
                    task_id: None,
                    context_id: reply.context_id,
                    next: None,
                });
            }
            SendResult::Task(task) => task,
        };
        let status_text = task
            .status
            .message
            .as_ref()
            .map(Message::text)
            .unwrap_or_default();
        let details = json!({
            "task_id": task.id,
            "context_id": task.context_id,
            "state": task.status.state.as_v03(),
            "message": status_text,
        });
        let failure = |code, what: &str| {
            let said = if status_text.is_empty() {
                String::new()
            } else {
                format!(": {status_text}")
            };
            Err(
                ToolError::new(code, format!("remote agent `{name}` {what}{said}"))
                    .with_details(details.clone()),
            )
        };
        match task.status.state {
            TaskState::Completed => Ok(A2aToolOutput {
                reply: task.reply_text(),
                state: "completed".into(),
                task_id: Some(task.id),
                context_id: Some(task.context_id),
                next: None,
            }),
            TaskState::InputRequired => Ok(A2aToolOutput {
                next: Some(format!(
                    "The remote agent `{name}` is waiting for more input and asked: {status_text:?}. \
                     Find the answer (ask the user if only they can know it), then call `{name}` \
                     again with {{\"message\": <the answer>, \"task_id\": \"{}\"}}.",
                    task.id
                )),
                reply: status_text.clone(),
                state: "input_required".into(),
                task_id: Some(task.id),
                context_id: Some(task.context_id),
            }),
            TaskState::AuthRequired => failure(
                ToolErrorCode::Unauthorized,
                "needs authentication the caller did not provide",
            ),
            TaskState::Failed => failure(ToolErrorCode::RetryableServer, "failed the task"),
            TaskState::Rejected => failure(ToolErrorCode::Forbidden, "rejected the task"),
            TaskState::Canceled => failure(ToolErrorCode::Cancelled, "canceled the task"),
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => {
                failure(ToolErrorCode::Timeout, "did not finish the task")
            }
        }
    }
}

/// The tool error for a client failure of the agent `name`.
pub fn tool_error(name: &str, error: &ClientError) -> ToolError {
    let message = format!("remote agent `{name}`: {error}");
    match error {
        ClientError::Http {
            status,
            body,
            retry_after_ms,
        } => {
            let code = ToolErrorCode::from_http_status(*status).unwrap_or(ToolErrorCode::ToolBug);
            let mut error = ToolError::new(code, message)
                .with_details(json!({ "status": status, "body": body }));
            if let Some(ms) = retry_after_ms {
                error = error.with_retry_after_ms(*ms);
            }
            error
        }
        ClientError::Rpc(rpc) => {
            let code = match rpc.code {
                jsonrpc::TASK_NOT_FOUND | jsonrpc::METHOD_NOT_FOUND => ToolErrorCode::NotFound,
                jsonrpc::INVALID_PARAMS
                | jsonrpc::INVALID_REQUEST
                | jsonrpc::TASK_NOT_CANCELABLE
                | jsonrpc::UNSUPPORTED_OPERATION
                | jsonrpc::CONTENT_TYPE_NOT_SUPPORTED
                | jsonrpc::PUSH_NOTIFICATION_NOT_SUPPORTED => ToolErrorCode::InvalidInput,
                jsonrpc::INTERNAL_ERROR | jsonrpc::INVALID_AGENT_RESPONSE => {
                    ToolErrorCode::RetryableServer
                }
                _ => ToolErrorCode::ToolBug,
            };
            ToolError::new(code, message).with_details(json!({
                "jsonrpc_code": rpc.code,
                "error": jsonrpc::error_name(rpc.code),
            }))
        }
        ClientError::Timeout { .. } => ToolError::new(ToolErrorCode::Timeout, message),
        ClientError::Transport(_) => ToolError::new(ToolErrorCode::RetryableServer, message),
        ClientError::Protocol(_) => ToolError::new(ToolErrorCode::ToolBug, message),
        ClientError::Config(_) => ToolError::new(ToolErrorCode::Unauthorized, message),
        ClientError::Cancelled => ToolError::new(ToolErrorCode::Cancelled, message),
        ClientError::Refused(refused) => {
            ToolError::new(ToolErrorCode::Forbidden, message).with_details(refused.details())
        }
        ClientError::OtherOrigin { .. } => ToolError::new(ToolErrorCode::Forbidden, message)
            .with_details(json!({ "error": "other_origin_refused" })),
    }
}

impl Tool for A2aTool {
    type Args = A2aToolArgs;
    type Output = A2aToolOutput;

    fn spec(&self) -> ToolSpec {
        let name = &self.agent.name;
        let description = self.agent.description.clone().unwrap_or_else(|| {
            format!("Ask the remote agent `{name}` (over the A2A protocol) and get its reply.")
        });
        let usage = format!(
            "{name} — Usage Guide\n\n\
             Sends `message` to the remote agent `{name}` and returns its `reply`.\n\
             - Write the message as you would to a colleague: the whole request, with the \
               facts it needs; the remote agent does not see this conversation.\n\
             - When `state` is `input_required`, the remote agent asked a question (in \
               `reply`): answer it by calling `{name}` again with `task_id` set to the \
               returned `task_id`. Ask the user when only they can know the answer.\n\
             - Errors: `timeout` (no answer in time), `retryable_server` (the remote task \
               failed or the agent was unreachable), `unauthorized` (credentials missing or \
               refused), `forbidden` (the agent rejected the task)."
        );
        ToolSpec::new(name.clone(), description, usage)
            .with_effect(Effect::Mutating)
            .with_retry(RetryPolicy::none())
            .with_timeout(self.agent.timeout.saturating_add(EXECUTOR_MARGIN))
    }

    async fn call(&self, args: A2aToolArgs, ctx: &ToolContext) -> Result<A2aToolOutput, ToolError> {
        let name = &self.agent.name;
        if args.message.trim().is_empty() {
            return Err(ToolError::invalid_input(
                "`message` is empty: write what the remote agent should do",
            ));
        }
        let mut message = Message::user(args.message);
        // Stable across retries and resumes of this call: the remote agent may deduplicate.
        message.message_id = format!("keel-{}", ctx.idempotency_key);
        message.task_id = args.task_id.filter(|id| !id.is_empty());
        let client = self.client_for(ctx)?;
        let tracker = Arc::new(Tracker {
            client: client.clone(),
            state: Mutex::new(TrackerState::default()),
        });
        let _guard = CancelOnDrop {
            tracker: Arc::clone(&tracker),
        };
        // The follower is detached, bounded by the call's deadline: a cancellation
        // requested before the agent named its task is carried out when it does.
        let timeout = self.agent.timeout;
        let mut follower = tokio::spawn({
            let tracker = Arc::clone(&tracker);
            async move {
                let bound = timeout.saturating_add(EXECUTOR_MARGIN);
                tokio::time::timeout(bound, Self::follow(client, message, tracker))
                    .await
                    .unwrap_or(Err(ClientError::Timeout {
                        what: "the task".into(),
                        ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                    }))
            }
        });
        tokio::select! {
            joined = &mut follower => {
                let result = joined.unwrap_or_else(|e| {
                    Err(ClientError::Protocol(format!("the follower stopped: {e}")))
                });
                match result {
                    Ok(result) => {
                        tracker.settle();
                        self.output(result)
                    }
                    Err(error) => {
                        // The remote task (if one started) would run on unobserved.
                        tracker.request_cancel();
                        Err(tool_error(name, &error))
                    }
                }
            }
            () = ctx.cancel.cancelled() => {
                let note = Self::cancel_and_wait(&tracker, &mut follower).await;
                Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    format!("the call to remote agent `{name}` was cancelled{note}"),
                ))
            }
            () = tokio::time::sleep(timeout) => {
                let note = Self::cancel_and_wait(&tracker, &mut follower).await;
                Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!(
                        "remote agent `{name}` did not answer within {} ms{note}",
                        timeout.as_millis()
                    ),
                ))
            }
        }
    }
}
