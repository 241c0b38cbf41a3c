//! The A2A server of `keel serve`: [`KeelA2a`] implements keel-a2a's [`A2aBackend`] over
//! the server's threads and queued runs, and [`routes`] mounts keel-a2a's router (agent
//! cards and JSON-RPC, A2A 1.0 and 0.3) next to the `/v1` API.
//!
//! - The agents are the ones the server offers (`[server] agents`, else every keel.toml
//!   agent); the first is the default card's. Cards are public and declare bearer auth;
//!   JSON-RPC needs `Authorization: Bearer <key>` like `/v1`, and acts for the key's
//!   tenant.
//! - A context is a client thread id (a new thread when the message names none; a
//!   context id the tenant has no thread under starts a thread of that id). A task is the
//!   run a message queued: its id is `<context id>.<submission id>` (the submission id the
//!   run records), known as soon as the run is queued; its metadata `keel.run_id` names
//!   the run once a worker started it.
//! - States: queued = `submitted`, driven = `working`, ended `done` = `completed` with the
//!   final answer as the artifact `answer`, `cancelled` = `canceled`, other ends =
//!   `failed`; paused for an approval, or ended `clarify_needed` (`ask_user` with nobody
//!   to answer at once), = `input-required`, whose status message is the question. The next message on the same task answers it: for an
//!   approval, a data part `{"decision": "approve"}` / `{"decision": "deny", "reason":
//!   "..."}` or a text starting with `approve` / `deny` (the rest of a deny is its
//!   reason); for `ask_user`, the message's text. The decision or answer is journaled here
//!   and the run continues on a worker (a queued continuation), as with `/v1`.
//! - Updates come from the journal: streams and blocking sends re-read the thread when
//!   the hub announces an append (and every poll interval), as [`follow`] does.
//! - Every id goes through [`Tenant`]: another tenant's task or context is "task not
//!   found".
//!
//! [`follow`]: crate::follow

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::Response;
use futures::StreamExt;
use futures::future::BoxFuture;
use keel_a2a::RpcError;
use keel_a2a::server::{A2aBackend, AgentDescriptor, CallContext, TaskRun};
use keel_a2a::types::{
    Artifact, Message, Part, PartContent, Role, Task, TaskArtifactUpdateEvent, TaskEvent,
    TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use keel_core::{EndState, Event, EventKind};
use keel_runtime::{RunContext, RunStatus, Thread};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::chat::{check_agent, check_run_limits, track};
use crate::api::runs::{continue_on_worker, human_error, refuse_if_paused, request_cancel};
use crate::auth;
use crate::error::ApiError;
use crate::follow::{load, load_from, open_stream, wait_for_append};
use crate::hub::ThreadSubscription;
use crate::jobs::{enqueue_new, enqueue_new_as, recipe_for, submission_of};
use crate::outcome::{RunPosition, position, run_events};
use crate::state::AppState;
use crate::streams::{KEY_CHECK, StreamPermit, key_still_active};
use crate::tenancy::Tenant;
use keel_app::recipe::Recipe;

/// Tasks queued here and not yet seen started, remembered (at most this many per tenant)
/// so a `GetTask` right after a non-blocking send answers `submitted`.
const QUEUED_MEMORY: usize = 1024;

/// The A2A routes of `keel serve`: `/.well-known/agent-card.json`,
/// `/a2a/{agent}/.well-known/agent-card.json` (public) and `POST /a2a/{agent}` (keyed).
/// The cards name `base_url` (`[server] public_url`, else the address served), never a
/// request's `Host`.
pub fn routes(state: &AppState, base_url: &str) -> Router<AppState> {
    let backend = Arc::new(Backend(Arc::new(KeelA2a {
        state: state.clone(),
        queued: Mutex::new(Vec::new()),
    })));
    let mut builder = keel_a2a::router(backend, base_url)
        .blocking_timeout(state.request_timeout())
        .security_schemes(json!({
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key of the server (`keel keys create --tenant NAME`)",
            }
        }));
    if let Some(first) = offered_agents(state).into_iter().next() {
        builder = builder.default_agent(first);
    }
    builder
        .build_for::<AppState>()
        .route_layer(from_fn_with_state(state.clone(), require_key_for_rpc))
}

/// Cards are public; everything else needs a key (and takes the tenant's rate limit).
async fn require_key_for_rpc(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return next.run(request).await;
    }
    auth::require_key(State(state), request, next).await
}

/// The agents the server offers, in keel.toml order.
fn offered_agents(state: &AppState) -> Vec<String> {
    let config = state.app.config();
    if !config.server.agents.is_empty() {
        return config
            .server
            .agents
            .iter()
            .filter(|a| config.agents.contains_key(*a))
            .cloned()
            .collect();
    }
    config.agents.keys().cloned().collect()
}

/// The A2A backend over Keel threads and runs (see the module docs).
pub struct KeelA2a {
    state: AppState,
    /// Tasks queued here, not yet seen started: (task id, the user's message).
    queued: Mutex<Vec<QueuedTask>>,
}

impl std::fmt::Debug for KeelA2a {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeelA2a").finish_non_exhaustive()
    }
}

/// A task queued here, not yet seen started: found only by its own tenant (task ids
/// are the tenant's context ids, which another tenant may use too).
#[derive(Debug, Clone)]
struct QueuedTask {
    tenant: String,
    store_id: String,
    task_id: String,
    message: Message,
}

impl QueuedTask {
    fn is(&self, task: &TaskRef) -> bool {
        self.task_id == task.id && self.store_id == task.store_id
    }
}

/// A task id, resolved for a tenant.
#[derive(Debug, Clone)]
struct TaskRef {
    id: String,
    client_id: String,
    store_id: String,
    submission: String,
    /// Runs the task has once what was just queued starts (0: nothing queued here).
    expect_runs: usize,
}

impl TaskRef {
    /// `<context id>.<submission id>` of `tenant`; anything else is "task not found".
    fn parse(tenant: &Tenant, id: &str) -> Result<Self, RpcError> {
        let (client, submission) = id
            .split_once('.')
            .filter(|(_, s)| !s.is_empty())
            .ok_or_else(|| RpcError::task_not_found(id))?;
        let store_id = tenant
            .store_id(client)
            .map_err(|_| RpcError::task_not_found(id))?;
        Ok(Self {
            id: id.to_string(),
            client_id: client.to_string(),
            store_id,
            submission: submission.to_string(),
            expect_runs: 0,
        })
    }
}

fn tenant_of(ctx: &CallContext) -> Result<Tenant, RpcError> {
    ctx.extensions
        .get::<Tenant>()
        .cloned()
        .ok_or_else(|| RpcError::internal("the request was not authenticated"))
}

/// An API error as an A2A error (`task_id` for "not found").
fn rpc_error(error: &ApiError, task_id: &str) -> RpcError {
    match error.status.as_u16() {
        400 => RpcError::invalid_params(error.message.clone()),
        404 => RpcError::task_not_found(task_id),
        409 => RpcError::unsupported(error.message.clone()),
        _ => RpcError::internal(error.message.clone()),
    }
}

fn status_update(task: &Task) -> TaskEvent {
    TaskEvent::Status(TaskStatusUpdateEvent {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: task.status.clone(),
        metadata: None,
    })
}

/// An agent message of `task`; `id` is stable (derived from the journal).
fn agent_message(task: &TaskRef, id: String, parts: Vec<Part>) -> Message {
    let mut message = Message::agent("");
    message.message_id = id;
    message.parts = parts;
    message.task_id = Some(task.id.clone());
    message.context_id = Some(task.client_id.clone());
    message
}

/// A user message of `task`; `id` is stable (derived from the journal).
fn user_message(task: &TaskRef, id: String, text: &str) -> Message {
    let mut message = Message::user(text);
    message.message_id = id;
    message.task_id = Some(task.id.clone());
    message.context_id = Some(task.client_id.clone());
    message
}

/// The runs of `task` in `events`, in order: the run its message started (submission
/// `<s>`), then the runs its answers to `clarify_needed` started (`<s>-r<n>`).
fn runs_of(events: &[Event], task: &TaskRef) -> Vec<String> {
    let follow_up = format!("{}-r", task.submission);
    events
        .iter()
        .filter(|e| {
            submission_of(e).is_some_and(|s| s == task.submission || s.starts_with(&follow_up))
        })
        .map(|e| e.run_id.to_string())
        .collect()
}

/// The task's current run in `events`, if it started.
fn run_of(events: &[Event], task: &TaskRef) -> Option<String> {
    runs_of(events, task).pop()
}

/// The events of `runs`, in order.
fn chain_events(events: &[Event], runs: &[String]) -> Vec<Event> {
    events
        .iter()
        .filter(|e| runs.iter().any(|run| **run == *e.run_id))
        .cloned()
        .collect()
}

/// The A2A task whose current run is `run_id` (its own events `own`; `chain`: the events
/// of all the task's runs).
fn task_of_run(task: &TaskRef, run_id: &str, chain: &[Event], own: &[Event]) -> Task {
    let mut history = Vec::new();
    let mut agent = String::new();
    let id = |event: &Event| format!("{}-{}", event.run_id, event.seq);
    let last_id = own.last().map(&id).unwrap_or_default();
    let mut asked = None;
    for event in chain {
        match &event.kind {
            EventKind::RunStarted { agent: name, .. } => agent.clone_from(name),
            EventKind::UserMessage { message } => {
                history.push(user_message(task, id(event), &message.text()));
            }
            EventKind::UserAnswered { answer } => {
                history.push(user_message(task, id(event), answer));
            }
            EventKind::UserAsked { question, .. } => {
                if &*event.run_id == run_id {
                    asked = Some(question.clone());
                }
                history.push(agent_message(
                    task,
                    id(event),
                    vec![Part::text(question.clone())],
                ));
            }
            _ => {}
        }
    }
    let mut artifacts = Vec::new();
    let mut end = None;
    let status = match position(own) {
        RunPosition::Running => TaskStatus::new(TaskState::Working),
        // The worker still drives the run: with nobody to answer at once, it ends
        // `clarify_needed` (input-required, below) right after the question.
        RunPosition::AwaitingUser(_) => TaskStatus::new(TaskState::Working),
        RunPosition::Settled(RunStatus::AwaitingApproval { call_id, tool }) => {
            let arguments = own
                .iter()
                .rev()
                .find_map(|e| match &e.kind {
                    EventKind::ApprovalRequested {
                        call_id: id,
                        arguments,
                        ..
                    } if *id == call_id => Some(arguments.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            let question = format!(
                "The agent wants to call `{tool}` with {arguments}. Approve? Reply \
                 \"approve\" or \"deny\" (a text, or a data part {{\"decision\": \
                 \"approve\"}}; a deny may give a reason)."
            );
            TaskStatus::new(TaskState::InputRequired).with_message(agent_message(
                task,
                last_id.clone(),
                vec![
                    Part::text(question),
                    Part::data(json!({
                        "awaiting": "approval",
                        "call_id": call_id,
                        "tool": tool,
                        "arguments": arguments,
                        "decisions": ["approve", "deny"],
                    })),
                ],
            ))
        }
        RunPosition::Settled(RunStatus::Ended { end_state }) => {
            let (reason, final_text) = own
                .iter()
                .rev()
                .find_map(|e| match &e.kind {
                    EventKind::RunEnded {
                        reason, final_text, ..
                    } => Some((reason.clone(), final_text.clone())),
                    _ => None,
                })
                .unwrap_or_default();
            end = Some(end_state);
            if end_state == EndState::ClarifyNeeded {
                let question = asked
                    .clone()
                    .or(final_text.clone())
                    .or(reason.clone())
                    .unwrap_or_else(|| "The agent needs more information.".into());
                return with_keel(
                    task,
                    run_id,
                    &agent,
                    end,
                    TaskStatus::new(TaskState::InputRequired).with_message(agent_message(
                        task,
                        last_id,
                        vec![
                            Part::text(question.clone()),
                            Part::data(json!({"awaiting": "user", "question": question})),
                        ],
                    )),
                    artifacts,
                    history,
                );
            }
            if let Some(text) = final_text.as_ref().filter(|t| !t.is_empty()) {
                artifacts.push(Artifact {
                    artifact_id: format!("{run_id}-answer"),
                    name: Some("answer".into()),
                    description: None,
                    parts: vec![Part::text(text.clone())],
                    metadata: None,
                });
                history.push(agent_message(
                    task,
                    last_id.clone(),
                    vec![Part::text(text.clone())],
                ));
            }
            let state = match end_state {
                EndState::Done => TaskState::Completed,
                EndState::Cancelled => TaskState::Canceled,
                _ => TaskState::Failed,
            };
            let mut status = TaskStatus::new(state);
            if state != TaskState::Completed {
                let text = reason.unwrap_or_else(|| format!("the run ended {end_state}"));
                status = status.with_message(agent_message(
                    task,
                    last_id.clone(),
                    vec![Part::text(text)],
                ));
            }
            status
        }
    };
    with_keel(task, run_id, &agent, end, status, artifacts, history)
}

/// The task with its `keel` metadata (thread, run, agent, end state).
fn with_keel(
    task: &TaskRef,
    run_id: &str,
    agent: &str,
    end: Option<EndState>,
    status: TaskStatus,
    artifacts: Vec<Artifact>,
    history: Vec<Message>,
) -> Task {
    let mut keel = json!({"thread_id": task.client_id, "run_id": run_id, "agent": agent});
    if let (Some(end_state), Some(map)) = (end, keel.as_object_mut()) {
        map.insert("end_state".into(), json!(end_state));
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("keel".into(), keel);
    Task {
        id: task.id.clone(),
        context_id: task.client_id.clone(),
        status,
        artifacts,
        history,
        metadata: Some(metadata),
    }
}

/// Whether two snapshots differ in what a follower is told (state and status message).
fn same_status(a: &TaskStatus, b: &TaskStatus) -> bool {
    a.state == b.state
        && a.message.as_ref().map(Message::text) == b.message.as_ref().map(Message::text)
}

/// An approval decision from a message: a data part with `decision`, or text starting
/// with approve / deny. `Ok((approve, reason))`.
fn decision_of(message: &Message) -> Result<(bool, Option<String>), RpcError> {
    let verdict = |word: &str| -> Option<bool> {
        match word.to_ascii_lowercase().as_str() {
            "approve" | "approved" | "yes" | "y" | "ok" | "allow" => Some(true),
            "deny" | "denied" | "no" | "n" | "reject" => Some(false),
            _ => None,
        }
    };
    for part in &message.parts {
        if let PartContent::Data(data) = &part.content
            && let Some(decision) = data.get("decision").and_then(Value::as_str)
        {
            let approve = verdict(decision).ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "decision {decision:?} is not a decision: use \"approve\" or \"deny\""
                ))
            })?;
            let reason = data
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_string);
            return Ok((approve, reason));
        }
    }
    let text = message.text();
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (word, rest) = text.split_at(split);
    let approve = verdict(word).ok_or_else(|| {
        RpcError::invalid_params(
            "the task awaits an approval: reply \"approve\" or \"deny\" (optionally \"deny: \
             <reason>\"), or send a data part {\"decision\": \"approve\"}",
        )
    })?;
    let reason = rest
        .trim_start_matches(|c: char| c == ':' || c == ',' || c == '-' || c.is_whitespace())
        .trim();
    Ok((approve, (!reason.is_empty()).then(|| reason.to_string())))
}

impl KeelA2a {
    fn queued(&self) -> std::sync::MutexGuard<'_, Vec<QueuedTask>> {
        match self.queued.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Remembers a task this process queued (each tenant's oldest is forgotten first,
    /// so one tenant's flood cannot push out another's).
    fn remember(&self, task: &TaskRef, message: Message) {
        let tenant = crate::tenancy::tenant_of(&task.store_id)
            .unwrap_or_default()
            .to_string();
        let mut queued = self.queued();
        let theirs = queued.iter().filter(|q| q.tenant == tenant).count();
        if theirs >= QUEUED_MEMORY
            && let Some(oldest) = queued.iter().position(|q| q.tenant == tenant)
        {
            queued.remove(oldest);
        }
        queued.push(QueuedTask {
            tenant,
            store_id: task.store_id.clone(),
            task_id: task.id.clone(),
            message,
        });
    }

    /// The message of a task queued here, if `task` (as its tenant names it) is one.
    fn queued_message(&self, task: &TaskRef) -> Option<Message> {
        self.queued()
            .iter()
            .find(|q| q.is(task))
            .map(|q| q.message.clone())
    }

    /// The task now (`submitted` while queued here and not started).
    async fn snapshot(&self, task: &TaskRef) -> Result<Task, RpcError> {
        let events = self
            .state
            .events
            .load(&task.store_id)
            .await
            .map_err(|e| RpcError::internal(format!("cannot load the task's thread: {e}")))?;
        self.snapshot_of(task, &events)
    }

    fn snapshot_of(&self, task: &TaskRef, events: &[Event]) -> Result<Task, RpcError> {
        let runs = runs_of(events, task);
        if let Some(run_id) = runs.last() {
            self.queued().retain(|q| !q.is(task));
            let chain = chain_events(events, &runs);
            let mut now = task_of_run(task, run_id, &chain, &run_events(events, run_id));
            if runs.len() < task.expect_runs {
                // The answer's run is queued, not started yet.
                now.status = TaskStatus::new(TaskState::Submitted);
                now.artifacts.clear();
            }
            return Ok(now);
        }
        let message = self
            .queued_message(task)
            .ok_or_else(|| RpcError::task_not_found(&task.id))?;
        Ok(Task {
            id: task.id.clone(),
            context_id: task.client_id.clone(),
            status: TaskStatus::new(TaskState::Submitted),
            artifacts: Vec::new(),
            history: vec![message],
            metadata: None,
        })
    }

    /// `last` and the task's updates after it, from the journal, until its turn ends (or
    /// the stream timeout, shutdown, or the reader leaving). `hub` was subscribed before
    /// `last` was read.
    fn follow(
        self: &Arc<Self>,
        task: TaskRef,
        last: Task,
        hub: ThreadSubscription,
        tenant: &Tenant,
        permit: StreamPermit,
    ) -> TaskRun {
        let (tx, rx) = mpsc::channel::<TaskEvent>(64);
        let this = Arc::clone(self);
        let snapshot = last.clone();
        let tenant = tenant.clone();
        tokio::spawn(async move {
            this.pump(task, last, hub, &tenant, tx).await;
            drop(permit);
        });
        let events = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|event| (event, rx))
        })
        .boxed();
        TaskRun {
            task: snapshot,
            events,
        }
    }

    async fn pump(
        &self,
        task: TaskRef,
        mut last: Task,
        mut hub: ThreadSubscription,
        tenant: &Tenant,
        tx: mpsc::Sender<TaskEvent>,
    ) {
        let state = &self.state;
        let deadline = crate::state::deadline_after(state.stream_timeout());
        let mut next_key_check = tokio::time::Instant::now() + KEY_CHECK;
        // The log's length when last read whole: a wake-up reads only the tail past it
        // (nothing while the task waits), and the whole log only when it grew.
        let mut read_upto: Option<u64> = None;
        loop {
            if !tenant.key_sha256.is_empty() && tokio::time::Instant::now() >= next_key_check {
                next_key_check = tokio::time::Instant::now() + KEY_CHECK;
                if !key_still_active(state, &tenant.name, &tenant.key_id, &tenant.key_sha256).await
                {
                    // The key was revoked: the stream ends, with nothing more of the task.
                    return;
                }
            }
            let grown = match read_upto {
                None => true,
                Some(upto) => load_from(state, &task.store_id, upto)
                    .await
                    .is_some_and(|tail| !tail.is_empty()),
            };
            if grown
                && let Some(events) = load(state, &task.store_id).await
                && let Ok(now) = self.snapshot_of(&task, &events)
            {
                read_upto = Some(events.last().map_or(0, |e| e.seq + 1));
                // A run that ended (or paused) between two reads still worked first.
                if last.status.state == TaskState::Submitted
                    && now.status.state != TaskState::Submitted
                    && now.status.state != TaskState::Working
                {
                    let mut working = now.clone();
                    working.status = TaskStatus::new(TaskState::Working);
                    if tx.send(status_update(&working)).await.is_err() {
                        return;
                    }
                }
                for artifact in &now.artifacts {
                    if last.artifacts.contains(artifact) {
                        continue;
                    }
                    let update = TaskEvent::Artifact(TaskArtifactUpdateEvent {
                        task_id: now.id.clone(),
                        context_id: now.context_id.clone(),
                        artifact: artifact.clone(),
                        append: false,
                        last_chunk: true,
                        metadata: None,
                    });
                    if tx.send(update).await.is_err() {
                        return;
                    }
                }
                if !same_status(&now.status, &last.status)
                    && tx.send(status_update(&now)).await.is_err()
                {
                    return;
                }
                let done = now.status.state.ends_turn();
                last = now;
                if done {
                    return;
                }
            }
            tokio::select! {
                () = wait_for_append(hub.receiver(), &task.store_id, state.poll) => {}
                () = tokio::time::sleep_until(deadline) => return,
                () = state.shutdown.cancelled() => return,
                () = tx.closed() => return,
            }
        }
    }

    async fn start(
        self: &Arc<Self>,
        ctx: &CallContext,
        tenant: &Tenant,
        mut message: Message,
    ) -> Result<TaskRun, RpcError> {
        let state = &self.state;
        check_agent(state, &ctx.agent).map_err(|e| RpcError::invalid_params(e.message))?;
        if state.shutdown.is_cancelled() {
            return Err(RpcError::internal(
                "the server is shutting down and accepts no new tasks; retry on another instance",
            ));
        }
        let text = message.text();
        if text.trim().is_empty() {
            return Err(RpcError::invalid_params(
                "the message has no text: send the user's text in a text part",
            ));
        }
        let (client_id, thread) = match message.context_id.clone() {
            Some(client) => {
                let store = tenant
                    .store_id(&client)
                    .map_err(|e| RpcError::invalid_params(format!("contextId: {e}")))?;
                let thread = Thread::load(state.events.as_ref(), &store)
                    .await
                    .map_err(|e| {
                        RpcError::internal(format!("cannot load context {client}: {e}"))
                    })?;
                // A paused run takes its answer on its own task, not a new one.
                refuse_if_paused(&thread, &client).map_err(|e| {
                    RpcError::unsupported(e.message)
                        .with_reason("THREAD_PAUSED", e.details.map(|d| *d).unwrap_or_default())
                })?;
                (client, thread)
            }
            None => {
                let (client, store) = tenant.new_thread();
                (client, Thread::with_id(store))
            }
        };
        let admission = check_run_limits(state, tenant).await.map_err(limit_error)?;
        // The stream's slot is taken before the run is queued: a refusal queues nothing.
        let permit = open_stream(state, tenant).map_err(limit_error)?;
        // Subscribed before the run is queued: a worker here may start it at once.
        let hub = state.hub.subscribe_thread(thread.id());
        let queued = enqueue_new(state.queue.as_ref(), &thread, recipe_for(&ctx.agent), text)
            .await
            .map_err(RpcError::internal)?;
        state
            .metrics
            .runs_queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        track(state, tenant, thread.id(), queued.job_id);
        drop(admission);
        let task = TaskRef {
            id: format!("{client_id}.{}", queued.submission),
            client_id: client_id.clone(),
            store_id: thread.id().to_string(),
            submission: queued.submission,
            expect_runs: 0,
        };
        message.task_id = Some(task.id.clone());
        message.context_id = Some(client_id);
        self.remember(&task, message.clone());
        let snapshot = Task {
            id: task.id.clone(),
            context_id: task.client_id.clone(),
            status: TaskStatus::new(TaskState::Submitted),
            artifacts: Vec::new(),
            history: vec![message],
            metadata: None,
        };
        Ok(self.follow(task, snapshot, hub, tenant, permit))
    }

    /// The next message of a task waiting for input: its approval decision or answer.
    async fn answer(
        self: &Arc<Self>,
        tenant: &Tenant,
        task_id: &str,
        message: &Message,
    ) -> Result<TaskRun, RpcError> {
        let state = &self.state;
        let task = TaskRef::parse(tenant, task_id)?;
        // A run that just asked the user is still being driven (it ends `clarify_needed`
        // next): answer it once it settled.
        let settled = |events: &[Event]| {
            run_of(events, &task).is_none_or(|run| {
                !matches!(
                    position(&run_events(events, &run)),
                    RunPosition::AwaitingUser(_)
                )
            })
        };
        let events =
            match self.wait_for(&task, settled).await {
                Some(events) => events,
                None => state.events.load(&task.store_id).await.map_err(|e| {
                    RpcError::internal(format!("cannot load the task's thread: {e}"))
                })?,
            };
        let run_id = run_of(&events, &task).ok_or_else(|| {
            if self.queued_message(&task).is_none() {
                RpcError::task_not_found(task_id)
            } else {
                RpcError::unsupported(format!(
                    "task `{task_id}` has not started yet and waits for no input"
                ))
            }
        })?;
        let mut thread = Thread::load(state.events.as_ref(), &task.store_id)
            .await
            .map_err(|e| RpcError::internal(format!("cannot load the task's thread: {e}")))?;
        let current = thread.state().run().map(|r| r.run_id.clone());
        let own = run_events(&events, &run_id);
        let context = RunContext::new(state.events.clone());
        let human = |e| rpc_error(&human_error(e, &task.store_id, &task.client_id), task_id);
        match (current.as_deref() == Some(run_id.as_str()), position(&own)) {
            (true, RunPosition::Settled(RunStatus::AwaitingApproval { call_id, .. })) => {
                let (approve, reason) = decision_of(message)?;
                if approve {
                    let by = Some(format!("key:{}", tenant.key_id));
                    thread
                        .approve(&context, &call_id, by)
                        .await
                        .map_err(human)?;
                } else {
                    let by = Some(format!("key:{}", tenant.key_id));
                    thread
                        .deny_by(&context, &call_id, reason, by)
                        .await
                        .map_err(human)?;
                }
            }
            (true, RunPosition::AwaitingUser(_)) => {
                let text = message.text();
                if text.trim().is_empty() {
                    return Err(RpcError::invalid_params(
                        "the task awaits the user's answer: send it as text",
                    ));
                }
                thread.answer_user(&context, &text).await.map_err(human)?;
            }
            (
                true,
                RunPosition::Settled(RunStatus::Ended {
                    end_state: EndState::ClarifyNeeded,
                }),
            ) => return self.clarify(tenant, task, &events, &thread, message).await,
            _ => {
                let runs = runs_of(&events, &task);
                let now = task_of_run(&task, &run_id, &chain_events(&events, &runs), &own);
                return Err(RpcError::unsupported(format!(
                    "task `{task_id}` is {} and takes no more messages; send a new message \
                     with contextId `{}` to continue the conversation",
                    now.status.state, task.client_id
                )));
            }
        }
        let permit = open_stream(state, tenant).map_err(limit_error)?;
        // Subscribed before the continuation is queued.
        let hub = state.hub.subscribe_thread(&task.store_id);
        continue_on_worker(state, &thread)
            .await
            .map_err(|e| rpc_error(&e, task_id))?;
        let snapshot = self.snapshot(&task).await?;
        Ok(self.follow(task, snapshot, hub, tenant, permit))
    }

    /// The answer to a task whose run ended `clarify_needed` (`ask_user` in a run no one
    /// could answer then): a new run of the same agent on the thread, the answer as its
    /// message, recorded under the task's submission id plus `-r<n>` so the task follows
    /// it — as `POST /v1/threads/{thread}/reply` does, through the queue.
    async fn clarify(
        self: &Arc<Self>,
        tenant: &Tenant,
        mut task: TaskRef,
        events: &[Event],
        thread: &Thread,
        message: &Message,
    ) -> Result<TaskRun, RpcError> {
        let state = &self.state;
        let text = message.text();
        if text.trim().is_empty() {
            return Err(RpcError::invalid_params(
                "the task awaits the user's answer: send it as text",
            ));
        }
        let recipe = Recipe::recorded(thread.run_events())
            .map_err(|e| RpcError::internal(e.to_string()))?
            .ok_or_else(|| RpcError::unsupported("the task's run recorded no agent"))?;
        let admission = check_run_limits(state, tenant).await.map_err(limit_error)?;
        let permit = open_stream(state, tenant).map_err(limit_error)?;
        let runs = runs_of(events, &task).len();
        let submission = format!("{}-r{}", task.submission, runs + 1);
        let hub = state.hub.subscribe_thread(thread.id());
        let queued = enqueue_new_as(
            state.queue.as_ref(),
            thread,
            Recipe {
                submission: None,
                ..recipe
            },
            text,
            submission,
        )
        .await
        .map_err(RpcError::internal)?;
        state
            .metrics
            .runs_queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        track(state, tenant, thread.id(), queued.job_id);
        drop(admission);
        task.expect_runs = runs + 1;
        let mut snapshot = self.snapshot_of(&task, events)?;
        snapshot.history.push(user_message(
            &task,
            message.message_id.clone(),
            &message.text(),
        ));
        Ok(self.follow(task, snapshot, hub, tenant, permit))
    }

    /// Waits (bounded by the request timeout) until `until` holds of the task's events.
    async fn wait_for(
        &self,
        task: &TaskRef,
        until: impl Fn(&[Event]) -> bool,
    ) -> Option<Vec<Event>> {
        let state = &self.state;
        let deadline = crate::state::deadline_after(state.request_timeout());
        let mut hub = state.hub.subscribe_thread(&task.store_id);
        loop {
            if let Some(events) = load(state, &task.store_id).await
                && until(&events)
            {
                return Some(events);
            }
            tokio::select! {
                () = wait_for_append(hub.receiver(), &task.store_id, state.poll) => {}
                () = tokio::time::sleep_until(deadline) => return None,
                () = state.shutdown.cancelled() => return None,
            }
        }
    }

    async fn cancel(&self, tenant: &Tenant, task_id: &str) -> Result<Task, RpcError> {
        let task = TaskRef::parse(tenant, task_id)?;
        let now = self.snapshot(&task).await?;
        if now.status.state.is_terminal() {
            return Err(RpcError::not_cancelable(task_id, now.status.state.as_v03()));
        }
        // A queued task is cancelled once a worker started its run.
        let events = self
            .wait_for(&task, |events| run_of(events, &task).is_some())
            .await
            .ok_or_else(|| {
                RpcError::internal(format!(
                    "task `{task_id}` did not start in time to be cancelled; retry"
                ))
            })?;
        let run_id = run_of(&events, &task).unwrap_or_default();
        request_cancel(&self.state, tenant, &task.client_id, &run_id)
            .await
            .map_err(|e| match e.status.as_u16() {
                409 => RpcError::not_cancelable(task_id, TaskState::Completed.as_v03()),
                _ => rpc_error(&e, task_id),
            })?;
        let ended = |events: &[Event]| {
            matches!(
                position(&run_events(events, &run_id)),
                RunPosition::Settled(RunStatus::Ended { .. })
            )
        };
        match self.wait_for(&task, ended).await {
            Some(events) => self.snapshot_of(&task, &events),
            None => self.snapshot(&task).await,
        }
    }
}

/// [`KeelA2a`] as the router's backend.
#[derive(Debug, Clone)]
pub struct Backend(pub Arc<KeelA2a>);

impl std::ops::Deref for Backend {
    type Target = Arc<KeelA2a>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl A2aBackend for Backend {
    fn agents(&self) -> Vec<AgentDescriptor> {
        let config = self.state.app.config();
        offered_agents(&self.state)
            .into_iter()
            .map(|name| {
                let description = config
                    .agents
                    .get(&name)
                    .and_then(|a| a.description.clone())
                    .unwrap_or_else(|| format!("The Keel agent `{name}`"));
                AgentDescriptor::new(name, description)
            })
            .collect()
    }

    fn send_message<'a>(
        &'a self,
        ctx: &'a CallContext,
        message: Message,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>> {
        Box::pin(async move {
            let tenant = tenant_of(ctx)?;
            if message.role == Role::Agent {
                return Err(RpcError::invalid_params(
                    "`message.role` must be the user's",
                ));
            }
            match message.task_id.clone() {
                Some(task_id) => self.answer(&tenant, &task_id, &message).await,
                None => self.start(ctx, &tenant, message).await,
            }
        })
    }

    fn get_task<'a>(
        &'a self,
        ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>> {
        Box::pin(async move {
            let tenant = tenant_of(ctx)?;
            let task = TaskRef::parse(&tenant, task_id)?;
            self.snapshot(&task).await
        })
    }

    fn cancel_task<'a>(
        &'a self,
        ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<Task, RpcError>> {
        Box::pin(async move {
            let tenant = tenant_of(ctx)?;
            self.cancel(&tenant, task_id).await
        })
    }

    fn subscribe<'a>(
        &'a self,
        ctx: &'a CallContext,
        task_id: &'a str,
    ) -> BoxFuture<'a, Result<TaskRun, RpcError>> {
        Box::pin(async move {
            let tenant = tenant_of(ctx)?;
            let task = TaskRef::parse(&tenant, task_id)?;
            let hub = self.state.hub.subscribe_thread(&task.store_id);
            let now = self.snapshot(&task).await?;
            if now.status.state.is_terminal() {
                return Err(RpcError::unsupported(format!(
                    "task `{task_id}` is {}: there is nothing to follow",
                    now.status.state
                )));
            }
            let permit = open_stream(&self.state, &tenant).map_err(limit_error)?;
            Ok(self.follow(task, now, hub, &tenant, permit))
        })
    }
}

/// JSON-RPC code of a refused admission (a per-tenant limit): in the range JSON-RPC
/// leaves to servers, beside A2A's own -32001 … -32009.
pub const LIMIT_EXCEEDED: i64 = -32029;

/// A per-tenant limit as a JSON-RPC error: the limit (`concurrent_runs`, `tokens_per_day`)
/// and when to retry, in an `ErrorInfo` detail (`reason` `RESOURCE_EXHAUSTED`, metadata
/// `limit` and `retryAfterSeconds`); other failures stay internal errors.
fn limit_error(error: crate::error::ApiError) -> RpcError {
    if error.status != axum::http::StatusCode::TOO_MANY_REQUESTS {
        return RpcError::internal(error.message);
    }
    let retry = error.retry_after.unwrap_or(1).to_string();
    RpcError::new(LIMIT_EXCEEDED, format!("{}: {}", error.code, error.message)).with_reason(
        "RESOURCE_EXHAUSTED",
        serde_json::json!({"limit": error.code, "retryAfterSeconds": retry}),
    )
}
