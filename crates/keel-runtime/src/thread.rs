//! A thread: one conversation, made of the runs on it. Holds the folded state so a run
//! continues where the last one stopped; the log itself lives in the store.
//!
//! Human input that arrives out of band — an approval decided with `keel approve`, a
//! reply to a question — is recorded here ([`Thread::approve`], [`Thread::deny`],
//! [`Thread::answer_user`]) through the journal, like every other event; the caller then
//! continues the run with [`crate::ToolAgent::resume`].

use std::sync::Arc;

use keel_core::planner::ASK_USER;
use keel_core::{Event, EventKind, EventStore, Message, Part, RunState, StoreError, new_id};

use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::RunError;
use crate::runner::{ok_outcome, tool_finished};

/// A conversation the caller owns. Fork or reset it by loading another one from the store
/// (reset = a new thread, e.g. [`Thread::new`], run by the same agent).
///
/// Besides the folded state it keeps the events of its latest run, so continuing that run
/// (resume, approve, deny, reply) needs no second read of the log.
///
/// ```
/// use std::sync::Arc;
/// use keel_core::Message;
/// use keel_runtime::{RunContext, Thread, ToolAgent};
/// use keel_testkit::{ScriptStep, ScriptedModel};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let model = Arc::new(ScriptedModel::new(vec![
///     ScriptStep::text("Hello, Ada."),
///     ScriptStep::text("Your name is Ada."),
/// ]));
/// let agent = ToolAgent::builder("assistant", model.clone()).build();
/// let context = RunContext::default();
/// let mut thread = Thread::new();
/// agent.run(vec![Message::user("I am Ada.")], &mut thread, &context).await?;
///
/// // Later — another process, after a restart — the thread is rebuilt from the store.
/// let mut thread = Thread::load(context.store.as_ref(), thread.id()).await?;
/// agent.run(vec![Message::user("What is my name?")], &mut thread, &context).await?;
/// // The second request carried the whole conversation.
/// assert_eq!(model.requests()[1].messages.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    state: RunState,
    run_events: Vec<Arc<Event>>,
    /// The folded state holds events the store does not (an append failed after events
    /// were staged): the next run or resume reloads the thread first.
    diverged: bool,
}

/// Why a human decision or answer could not be recorded on a thread.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HumanInputError {
    /// Appending failed (a `Conflict` means another process is driving the thread).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The thread has no run in progress.
    #[error("thread {0} has no run in progress (it is empty or its last run ended)")]
    NoRunInProgress(String),
    /// The call is not waiting for an approval decision.
    #[error("call {call_id} on thread {thread_id} is not awaiting approval: {why}")]
    NotAwaitingApproval {
        /// Thread.
        thread_id: String,
        /// Call.
        call_id: String,
        /// What is the matter (unknown call, already decided, already finished…).
        why: String,
    },
    /// The run in progress is not waiting for the user.
    #[error("thread {0} is not waiting for a user's answer")]
    NotAwaitingUser(String),
}

impl HumanInputError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Run(RunError::Store(StoreError::Conflict { .. })) => "conflict",
            Self::Run(_) => "store",
            Self::NoRunInProgress(_) => "no_run_in_progress",
            Self::NotAwaitingApproval { .. } => "not_awaiting_approval",
            Self::NotAwaitingUser(_) => "not_awaiting_user",
        }
    }
}

impl Default for Thread {
    fn default() -> Self {
        Self::new()
    }
}

impl Thread {
    /// A new, empty thread with a fresh id.
    pub fn new() -> Self {
        Self::with_id(new_id("thr"))
    }

    /// A new, empty thread with this id.
    pub fn with_id(id: impl Into<String>) -> Self {
        Self {
            state: RunState::new(id),
            run_events: Vec::new(),
            diverged: false,
        }
    }

    /// Loads a thread from its log (empty if it does not exist yet).
    pub async fn load(store: &dyn EventStore, id: &str) -> Result<Self, StoreError> {
        let events = store.load(id).await?;
        Ok(Self::from_events(id, events))
    }

    /// A thread from its already loaded log (`events` in sequence order), for callers
    /// that read the log themselves and must not read it twice.
    pub fn from_events(id: &str, mut events: Vec<Event>) -> Self {
        let state = RunState::from_events(id, &events);
        let latest_run = events
            .iter()
            .rposition(|e| matches!(e.kind, EventKind::RunStarted { .. }))
            .unwrap_or(events.len());
        Self {
            state,
            run_events: events
                .split_off(latest_run)
                .into_iter()
                .map(Arc::new)
                .collect(),
            diverged: false,
        }
    }

    /// The events of the thread's latest run, in order (empty before the first run).
    pub fn run_events(&self) -> &[Arc<Event>] {
        &self.run_events
    }

    pub(crate) fn run_events_mut(&mut self) -> &mut Vec<Arc<Event>> {
        &mut self.run_events
    }

    /// The folded state and the latest run's events, to change both at once.
    pub(crate) fn parts_mut(&mut self) -> (&mut RunState, &mut Vec<Arc<Event>>) {
        (&mut self.state, &mut self.run_events)
    }

    /// Records that the folded state went ahead of the stored log.
    pub(crate) fn mark_diverged(&mut self) {
        self.diverged = true;
    }

    /// Reloads the thread from `store` when its state went ahead of the log (an append
    /// failed after events had been folded); otherwise does nothing.
    pub(crate) async fn reload_if_diverged(
        &mut self,
        store: &dyn EventStore,
    ) -> Result<(), StoreError> {
        if self.diverged {
            *self = Self::load(store, self.id()).await?;
        }
        Ok(())
    }

    /// The id.
    pub fn id(&self) -> &str {
        self.state.thread_id()
    }

    /// The folded state.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// Forks the stored thread at `at_seq` into a new thread and loads it.
    pub async fn fork(store: &dyn EventStore, id: &str, at_seq: u64) -> Result<Self, StoreError> {
        let target = new_id("thr");
        store.fork_thread(id, at_seq, &target).await?;
        Self::load(store, &target).await
    }

    /// Whether the stored log has no events.
    pub fn is_empty(&self) -> bool {
        self.state.next_seq() == 0
    }

    /// Records a human's approval of `call_id` (which must be awaiting approval in the
    /// run in progress). Continue the run with [`crate::ToolAgent::resume`].
    pub async fn approve(
        &mut self,
        ctx: &RunContext,
        call_id: &str,
        by: Option<String>,
    ) -> Result<(), HumanInputError> {
        self.reload_if_diverged(ctx.store.as_ref())
            .await
            .map_err(RunError::from)?;
        self.check_awaiting_approval(call_id)?;
        let kind = EventKind::ApprovalGranted {
            call_id: call_id.to_string(),
            by,
        };
        self.append_to_run(ctx, kind).await
    }

    /// Records a human's denial of `call_id`; the model is told (as a `denied` tool
    /// result) when the run continues.
    pub async fn deny(
        &mut self,
        ctx: &RunContext,
        call_id: &str,
        reason: Option<String>,
    ) -> Result<(), HumanInputError> {
        self.deny_by(ctx, call_id, reason, None).await
    }

    /// [`Thread::deny`] recording who denied (`by`, e.g. `key:<key id>`).
    pub async fn deny_by(
        &mut self,
        ctx: &RunContext,
        call_id: &str,
        reason: Option<String>,
        by: Option<String>,
    ) -> Result<(), HumanInputError> {
        self.reload_if_diverged(ctx.store.as_ref())
            .await
            .map_err(RunError::from)?;
        self.check_awaiting_approval(call_id)?;
        let kind = EventKind::ApprovalDenied {
            call_id: call_id.to_string(),
            reason,
            by,
        };
        self.append_to_run(ctx, kind).await
    }

    /// Records the user's answer to the question the run in progress is waiting on (an
    /// unanswered `ask_user` call, or a pending question). Continue the run with
    /// [`crate::ToolAgent::resume`]. When no run waits (e.g. it ended `clarify_needed`), start
    /// a new run with the answer as its user message instead.
    pub async fn answer_user(
        &mut self,
        ctx: &RunContext,
        answer: &str,
    ) -> Result<(), HumanInputError> {
        self.reload_if_diverged(ctx.store.as_ref())
            .await
            .map_err(RunError::from)?;
        if !self.state.run_in_progress() {
            return Err(HumanInputError::NoRunInProgress(self.id().to_string()));
        }
        let ask_call = self
            .state
            .unanswered_calls()
            .find(|p| p.call.name == ASK_USER)
            .map(|p| p.call.clone());
        let awaiting = self
            .state
            .run()
            .is_some_and(|run| run.awaiting_user.is_some());
        let thread_id = self.id().to_string();
        let mut journal = Journal::resume(self, ctx);
        match ask_call {
            Some(call) => {
                let outcome = ok_outcome(&journal, &call, serde_json::json!({ "answer": answer }));
                let span = journal.run_span().to_string();
                journal
                    .append_batch(vec![(tool_finished(call, outcome, None), span)])
                    .await?;
            }
            None if awaiting => {
                journal
                    .append(EventKind::UserAnswered {
                        answer: answer.to_string(),
                    })
                    .await?;
            }
            None => return Err(HumanInputError::NotAwaitingUser(thread_id)),
        }
        Ok(())
    }

    fn check_awaiting_approval(&self, call_id: &str) -> Result<(), HumanInputError> {
        if !self.state.run_in_progress() {
            return Err(HumanInputError::NoRunInProgress(self.id().to_string()));
        }
        let not_awaiting = |why: &str| HumanInputError::NotAwaitingApproval {
            thread_id: self.id().to_string(),
            call_id: call_id.to_string(),
            why: why.to_string(),
        };
        let Some(pending) = self.state.pending_call(call_id) else {
            let waiting: Vec<&str> = self
                .state
                .unanswered_calls()
                .filter(|p| p.requires_approval && p.approval.is_none())
                .map(|p| p.call.id.as_str())
                .collect();
            return Err(not_awaiting(&if waiting.is_empty() {
                "no such pending call, and no call waits for approval".to_string()
            } else {
                format!("no such pending call; waiting: {}", waiting.join(", "))
            }));
        };
        if pending.finished {
            return Err(not_awaiting("it already has a result"));
        }
        if !pending.requires_approval {
            return Err(not_awaiting("it does not need approval"));
        }
        match pending.approval {
            Some(true) => Err(not_awaiting("it was already approved")),
            Some(false) => Err(not_awaiting("it was already denied")),
            None => Ok(()),
        }
    }

    async fn append_to_run(
        &mut self,
        ctx: &RunContext,
        kind: EventKind,
    ) -> Result<(), HumanInputError> {
        let mut journal = Journal::resume(self, ctx);
        journal.append(kind).await?;
        Ok(())
    }
}

/// The `provider` of the message part that records where a thread's conversation lives
/// ([`ThreadHome::marker`]). No model adapter sends it: each echoes only its own items.
pub const THREAD_HOME_ITEM: &str = "keel.thread_home";

/// Where a thread's conversation lives (seed 003's thread–agent compatibility).
///
/// A thread is [`Local`](ThreadHome::Local) until an agent backed by a provider's service
/// answers in it; that agent adds a [`marker`](ThreadHome::marker) to each answer naming
/// the provider and the stored conversation (e.g. the OpenAI Responses id to continue
/// from). From then on the thread is [`Provider`](ThreadHome::Provider)-homed: the log
/// still holds a copy of every message, but the conversation the model sees is the
/// provider's, so only an agent of that provider can continue it — a local agent is
/// refused with [`RunError::IncompatibleThread`] before anything is appended, and so is a
/// provider-backed agent on a thread where a local agent has answered. A fork of a
/// provider-homed thread continues from the last response before the fork point.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ThreadHome {
    /// The conversation is the thread's own log.
    Local,
    /// The conversation is stored by a provider.
    Provider {
        /// The provider (`openai-responses`).
        provider: String,
        /// The provider's handle on the conversation (the last response id).
        conversation: String,
    },
}

impl ThreadHome {
    /// The message part a provider-backed agent adds to each answer it records, saying
    /// the thread now lives on `provider` as `conversation`.
    pub fn marker(provider: &str, conversation: &str) -> Part {
        Part::ProviderItem {
            provider: THREAD_HOME_ITEM.to_string(),
            item: serde_json::json!({ "provider": provider, "conversation": conversation }),
        }
    }

    /// The home a [`marker`](ThreadHome::marker) part records, if `part` is one.
    pub fn from_part(part: &Part) -> Option<Self> {
        let Part::ProviderItem { provider, item } = part else {
            return None;
        };
        if provider != THREAD_HOME_ITEM {
            return None;
        }
        let field = |name: &str| item.get(name).and_then(serde_json::Value::as_str);
        Some(Self::Provider {
            provider: field("provider")?.to_string(),
            conversation: field("conversation")?.to_string(),
        })
    }

    /// Where a conversation lives: its last [`marker`](ThreadHome::marker), else
    /// [`ThreadHome::Local`].
    pub fn of(messages: &[Message]) -> Self {
        messages
            .iter()
            .rev()
            .flat_map(|message| message.parts.iter().rev())
            .find_map(Self::from_part)
            .unwrap_or(Self::Local)
    }

    /// The messages of a conversation after its last [`marker`](ThreadHome::marker): what
    /// the provider has not seen yet (all of them when there is none).
    pub fn unsent(messages: &[Message]) -> &[Message] {
        let after = messages
            .iter()
            .rposition(|m| m.parts.iter().any(|p| Self::from_part(p).is_some()))
            .map_or(0, |i| i.saturating_add(1));
        messages.get(after..).unwrap_or_default()
    }

    /// The provider, for a provider-homed thread.
    pub fn provider(&self) -> Option<&str> {
        match self {
            Self::Local => None,
            Self::Provider { provider, .. } => Some(provider),
        }
    }
}

impl std::fmt::Display for ThreadHome {
    /// `in its local log`, or `on openai-responses (response resp_…)` — as in "thread
    /// thr_… lives …".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local => f.write_str("in its local log"),
            Self::Provider {
                provider,
                conversation,
            } => write!(f, "on {provider} (response {conversation})"),
        }
    }
}

impl Thread {
    /// Where the conversation lives: the last [`ThreadHome::marker`] of the conversation,
    /// else [`ThreadHome::Local`].
    pub fn home(&self) -> ThreadHome {
        ThreadHome::of(self.state.messages())
    }

    /// Checks that agent `agent`, which keeps its threads' conversations on
    /// `agent_home` (`None`: in the thread's log, as [`crate::ToolAgent`] does), may run on
    /// this thread. A local agent cannot continue a provider-homed thread; a
    /// provider-backed agent cannot take over a thread in which any other agent answered
    /// (a thread holding only user messages — say, after its first run failed before the
    /// provider answered — is taken over: those messages are sent with the next request).
    pub fn check_home(&self, agent: &str, agent_home: Option<&str>) -> Result<(), RunError> {
        let home = self.home();
        let refuse = |hint: String| RunError::IncompatibleThread {
            thread_id: self.id().to_string(),
            home: home.clone(),
            agent: agent.to_string(),
            hint,
        };
        match (&home, agent_home) {
            (ThreadHome::Local, None) => Ok(()),
            (ThreadHome::Provider { provider, .. }, None) => {
                let last = self
                    .state
                    .run()
                    .map(|run| format!(" (such as `{}`, which ran it last)", run.agent))
                    .unwrap_or_default();
                Err(refuse(format!(
                    "continue it with an agent backed by {provider}{last}, or start a new thread"
                )))
            }
            (ThreadHome::Provider { provider, .. }, Some(wanted)) if provider == wanted => Ok(()),
            (ThreadHome::Provider { provider, .. }, Some(wanted)) => Err(refuse(format!(
                "this agent keeps its conversations on {wanted}; continue it with an agent \
                 backed by {provider}, or start a new thread"
            ))),
            (ThreadHome::Local, Some(wanted)) => {
                let answered = self
                    .state
                    .messages()
                    .iter()
                    .any(|m| m.role != keel_core::Role::User);
                if answered {
                    Err(refuse(format!(
                        "its history was written by a local agent, and this agent keeps its \
                         conversations on {wanted} (it does not replay local history); continue \
                         it with a local agent, or start a new thread"
                    )))
                } else {
                    Ok(())
                }
            }
        }
    }
}
