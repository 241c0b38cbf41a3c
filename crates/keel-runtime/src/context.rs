//! The run context: where events go (store and observers), who answers approvals and
//! questions, and the cancellation token of the run (seed 003's "run context").

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::tool::CredentialSource;
use keel_core::{CancellationToken, Event, EventStore, MemoryStore, StreamEvent, ToolCall};
use tokio::sync::mpsc;

/// Sees every event of a run as it is appended, and the model's stream as it arrives.
/// Called inline by the runner: implementations must be quick and must not block (hand
/// heavy work to a channel or a background task).
pub trait RunObserver: Send + Sync {
    /// An event was appended (durable) — or, for a [`RunObserver::live`] observer, folded
    /// into the run's state (it may still be staged: see the journal's durability rule).
    fn on_event(&self, event: &Event);

    /// Whether this observer hears of each event as soon as the run folds it, before it is
    /// durable (a terminal printing a run's progress, an in-process stream), instead of when
    /// it is written (telemetry, anything another process reads back). Under the default
    /// durability a read-only step is written only with the next durable point; a live
    /// observer still sees each of its events as it happens, once. Default: `false`.
    fn live(&self) -> bool {
        false
    }

    /// A streamed piece of a model answer (text deltas, tool-call fragments, retries).
    fn on_stream(&self, _thread_id: &str, _run_id: &str, _event: &StreamEvent) {}
}

/// What an observer channel carries.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunUpdate {
    /// An event of the run, as the run folds it (the channel observer is
    /// [`RunObserver::live`]: a staged event arrives before it is durable).
    Event(Arc<Event>),
    /// A stream fragment.
    Stream(StreamEvent),
}

/// An observer that forwards everything to an unbounded channel (nothing is dropped).
///
/// ```
/// use std::sync::Arc;
/// use keel_core::{EventKind, Message};
/// use keel_runtime::context::RunUpdate;
/// use keel_runtime::{ChannelObserver, RunContext, Thread, ToolAgent};
/// use keel_testkit::{ScriptStep, ScriptedModel};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel_runtime::RunError> {
/// let (observer, mut updates) = ChannelObserver::new();
/// let context = RunContext::default().with_observer(Arc::new(observer));
/// let agent = ToolAgent::builder("a", Arc::new(ScriptedModel::new(vec![ScriptStep::text("hi")]))).build();
/// agent.run(vec![Message::user("hello")], &mut Thread::new(), &context).await?;
/// let mut kinds = Vec::new();
/// while let Ok(update) = updates.try_recv() {
///     if let RunUpdate::Event(event) = update {
///         kinds.push(event.kind.clone());
///     }
/// }
/// assert!(matches!(kinds.first(), Some(EventKind::RunStarted { .. })));
/// assert!(matches!(kinds.last(), Some(EventKind::RunEnded { .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ChannelObserver {
    sender: mpsc::UnboundedSender<RunUpdate>,
}

impl ChannelObserver {
    /// A new observer and the receiving end.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<RunUpdate>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self { sender }, receiver)
    }
}

impl RunObserver for ChannelObserver {
    fn on_event(&self, event: &Event) {
        // A closed receiver only means nobody listens any more.
        let _ = self.sender.send(RunUpdate::Event(Arc::new(event.clone())));
    }

    /// A stream of a run in this process shows each step as it happens.
    fn live(&self) -> bool {
        true
    }

    fn on_stream(&self, _thread_id: &str, _run_id: &str, event: &StreamEvent) {
        let _ = self.sender.send(RunUpdate::Stream(event.clone()));
    }
}

/// Which calls need a human decision and how they are answered by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Only tools declared `approval: always` need approval; the handler decides.
    #[default]
    Auto,
    /// Every tool call needs approval; the handler decides.
    Ask,
    /// Calls that need approval are denied without asking.
    Deny,
}

/// A human's (or policy's) answer to an approval request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    /// Run the call.
    Approve,
    /// Do not run it; the model is told why.
    Deny {
        /// Why.
        reason: Option<String>,
    },
    /// No answer now: the run pauses and can be resumed once someone decides.
    Defer,
}

/// Answers approval requests.
#[async_trait]
pub trait ApprovalHandler: Send + Sync {
    /// Decides on one call.
    async fn decide(&self, thread_id: &str, call: &ToolCall) -> ApprovalDecision;
}

/// Approves everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApproveAll;

#[async_trait]
impl ApprovalHandler for ApproveAll {
    async fn decide(&self, _thread_id: &str, _call: &ToolCall) -> ApprovalDecision {
        ApprovalDecision::Approve
    }
}

/// Defers every decision: the run pauses until approved out of band.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeferAll;

#[async_trait]
impl ApprovalHandler for DeferAll {
    async fn decide(&self, _thread_id: &str, _call: &ToolCall) -> ApprovalDecision {
        ApprovalDecision::Defer
    }
}

/// Answers the agent's questions to the user.
#[async_trait]
pub trait UserInputSource: Send + Sync {
    /// The answer, or `None` to pause the run until an answer arrives out of band.
    async fn answer(
        &self,
        thread_id: &str,
        question: &str,
        missing_fields: &[String],
    ) -> Option<String>;
}

/// Never answers: runs that ask the user pause.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoUserInput;

#[async_trait]
impl UserInputSource for NoUserInput {
    async fn answer(
        &self,
        _thread_id: &str,
        _question: &str,
        _fields: &[String],
    ) -> Option<String> {
        None
    }
}

/// Everything a run needs from its surroundings.
///
/// ```
/// use std::sync::Arc;
/// use keel_runtime::{RunApprovalMode, RunContext};
///
/// let context = RunContext::new(Arc::new(keel_core::MemoryStore::new()))
///     .with_approval_mode(RunApprovalMode::Auto)
///     .with_tool_approval_mode("delete_release", RunApprovalMode::Ask);
/// assert!(context.requires_approval("delete_release", false));
/// assert!(!context.requires_approval("calculator", false));
/// assert!(context.requires_approval("deploy", true)); // declared `approval: always`
/// ```
#[derive(Clone)]
pub struct RunContext {
    /// Where events are persisted before they are acted on.
    pub store: Arc<dyn EventStore>,
    /// Who sees events as they happen.
    pub observers: Vec<Arc<dyn RunObserver>>,
    /// Who answers approvals.
    pub approvals: Arc<dyn ApprovalHandler>,
    /// How approvals are required and defaulted.
    pub approval_mode: ApprovalMode,
    /// Per-tool approval modes (tool name → mode), over [`approval_mode`](Self::approval_mode).
    pub tool_approval_modes: BTreeMap<String, ApprovalMode>,
    /// Who answers questions.
    pub user_input: Arc<dyn UserInputSource>,
    /// Cancels the run (Ctrl-C).
    pub cancel: CancellationToken,
    /// Where the runs started with this context nest in a trace: set when another run
    /// starts them (an agent called as a tool, a handoff, a workflow step).
    pub parent: Option<SpanParent>,
    /// Where the run's tools resolve their credentials, over the executor's own source
    /// (`None`: the executor's, by default none — tools read their environment). A server
    /// sets the tenant's; runs started with this context (agents called as tools,
    /// handoffs, workflow steps) inherit it.
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// Re-run, on resume, a call that started as not repeatable (mutating without a key
    /// its tool honours) when its tool has since been relaxed so that it would be — the
    /// forced, unsafe choice behind `keel resume --rerun-relaxed-calls`: the call may
    /// already have taken effect, so its effect may happen twice. Off by default: the
    /// effect its start recorded governs and the call is settled as `may_have_run`.
    pub rerun_relaxed_calls: bool,
}

/// The span a run nests under: its runs join `trace_id` and record `span_id` as their
/// parent (`RunStarted.parent_span_id`), so traces show them as children of the call,
/// handoff or step that started them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanParent {
    /// The W3C trace id (32 hex digits) the run joins.
    pub trace_id: String,
    /// The parent span's id (16 hex digits).
    pub span_id: String,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("observers", &self.observers.len())
            .field("approval_mode", &self.approval_mode)
            .field("tool_approval_modes", &self.tool_approval_modes)
            .field("cancelled", &self.cancel.is_cancelled())
            .field("parent", &self.parent)
            .field("credentials", &self.credentials.is_some())
            .field("rerun_relaxed_calls", &self.rerun_relaxed_calls)
            .finish_non_exhaustive()
    }
}

impl Default for RunContext {
    fn default() -> Self {
        Self::new(Arc::new(MemoryStore::new()))
    }
}

impl RunContext {
    /// A context over a store, with no observers, approving nothing interactively
    /// (approvals defer), no user input, and a fresh cancellation token.
    pub fn new(store: Arc<dyn EventStore>) -> Self {
        Self {
            store,
            observers: Vec::new(),
            approvals: Arc::new(DeferAll),
            approval_mode: ApprovalMode::Auto,
            tool_approval_modes: BTreeMap::new(),
            user_input: Arc::new(NoUserInput),
            cancel: CancellationToken::new(),
            parent: None,
            credentials: None,
            rerun_relaxed_calls: false,
        }
    }

    /// Sets [`rerun_relaxed_calls`](Self::rerun_relaxed_calls): a started call whose tool
    /// was relaxed since is run again on resume, at the risk of a second effect.
    pub fn with_rerun_relaxed_calls(mut self, rerun: bool) -> Self {
        self.rerun_relaxed_calls = rerun;
        self
    }

    /// Resolves the credentials of the run's tools through `credentials` (see
    /// [`credentials`](Self::credentials)).
    pub fn with_credentials(mut self, credentials: Arc<dyn CredentialSource>) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Nests the runs started with this context under `span_id` of trace `trace_id` (see
    /// [`SpanParent`]).
    pub fn with_parent_span(
        mut self,
        trace_id: impl Into<String>,
        span_id: impl Into<String>,
    ) -> Self {
        self.parent = Some(SpanParent {
            trace_id: trace_id.into(),
            span_id: span_id.into(),
        });
        self
    }

    /// Adds an observer.
    pub fn with_observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Sets the approval handler.
    pub fn with_approvals(mut self, handler: Arc<dyn ApprovalHandler>) -> Self {
        self.approvals = handler;
        self
    }

    /// Sets the approval mode.
    pub fn with_approval_mode(mut self, mode: ApprovalMode) -> Self {
        self.approval_mode = mode;
        self
    }

    /// Sets the approval mode of one tool's calls (over the run's mode).
    pub fn with_tool_approval_mode(mut self, tool: impl Into<String>, mode: ApprovalMode) -> Self {
        self.tool_approval_modes.insert(tool.into(), mode);
        self
    }

    /// The approval mode of `tool`'s calls: its own mode when set, else the run's.
    pub fn approval_mode_for(&self, tool: &str) -> ApprovalMode {
        self.tool_approval_modes
            .get(tool)
            .copied()
            .unwrap_or(self.approval_mode)
    }

    /// Whether a call of `tool` (declared `approval: always` or not) needs a decision: the
    /// tool's own mode `ask` or `deny` says yes (`deny` then denies it), `auto` leaves it to
    /// the declaration; without one, the run's mode `ask` says yes for every tool.
    pub fn requires_approval(&self, tool: &str, declared_always: bool) -> bool {
        match self.tool_approval_modes.get(tool) {
            Some(ApprovalMode::Ask | ApprovalMode::Deny) => true,
            Some(ApprovalMode::Auto) => declared_always,
            None => declared_always || self.approval_mode == ApprovalMode::Ask,
        }
    }

    /// Sets the user-input source.
    pub fn with_user_input(mut self, source: Arc<dyn UserInputSource>) -> Self {
        self.user_input = source;
        self
    }

    /// Sets the cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}
