//! The durable records of a run. A thread's history is nothing but its events; the run
//! state, the conversation, traces, metrics and evaluations are all folds over them.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::Budget;
use crate::decide::EndState;
use crate::definition::AgentDefinition;
use crate::message::{Message, ToolCall, ToolResult, Usage};
use crate::model::{ModelErrorKind, StopReason};
use crate::tool::Effect;

fn is_false(value: &bool) -> bool {
    !*value
}

/// The version of the event schema written by this build. Readers accept older versions.
pub const EVENT_SCHEMA_VERSION: u16 = 1;

/// One durable record in a thread's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Event schema version.
    pub v: u16,
    /// Position in the thread's log, starting at 0, without gaps.
    pub seq: u64,
    /// When it was recorded.
    pub ts: DateTime<Utc>,
    /// The thread (conversation). Shared by the events of a run (one allocation, not one
    /// per event), like `run_id` and `trace_id`.
    pub thread_id: Arc<str>,
    /// The run that produced it.
    pub run_id: Arc<str>,
    /// The run's W3C trace id (32 hex digits).
    pub trace_id: Arc<str>,
    /// The span this event belongs to (16 hex digits).
    pub span_id: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// A record of a model failure, kept in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFailure {
    /// Error class.
    pub kind: ModelErrorKind,
    /// Message.
    pub message: String,
    /// HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// The next step a critic recommends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CriticNext {
    /// Carry on.
    Continue,
    /// Make a new plan.
    Replan,
    /// Ask the user.
    Clarify,
    /// Stop the run.
    Stop,
}

/// What happened. Serialized with a `type` tag in snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A run began.
    RunStarted {
        /// Agent name.
        agent: String,
        /// Model identifier (`provider:model`).
        model: String,
        /// The user's goal (the first new user message of the run).
        goal: String,
        /// Constraints stated for the run.
        #[serde(default)]
        constraints: Vec<String>,
        /// The run's budget.
        budget: Budget,
        /// The agent the run belongs to: how to rebuild it and what it looked like, so
        /// the run can be continued from the log alone. Absent in logs written before
        /// it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        definition: Option<Box<AgentDefinition>>,
        /// The span this run nests under when another run started it — the tool call of
        /// an agent called as a tool, the handoff that passed it the conversation — in
        /// the same trace (the event's `trace_id`). Absent for a top-level run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_span_id: Option<String>,
    },
    /// A user message was added to the conversation.
    UserMessage {
        /// The message.
        message: Message,
    },
    /// A model call is about to be made.
    ModelRequested {
        /// 1-based model-call counter within the run.
        turn: u32,
        /// Model identifier.
        model: String,
        /// Messages sent.
        message_count: u32,
        /// Tools offered.
        tool_count: u32,
        /// Estimated input tokens.
        estimated_input_tokens: u64,
        /// Provider name (e.g. `anthropic`), when the runner knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider: Option<String>,
        /// Sampling temperature requested, when set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        temperature: Option<f32>,
        /// Output token limit requested, when set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_tokens: Option<u32>,
        /// The model's context window in tokens, when known (for utilization metrics).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_window: Option<u64>,
    },
    /// The model answered.
    ModelResponded {
        /// Turn this answers.
        turn: u32,
        /// The assistant message (text, tool calls, provider items).
        message: Message,
        /// Token usage reported (or estimated).
        usage: Usage,
        /// Wall time of the call including retries, in milliseconds.
        latency_ms: u64,
        /// Why generation stopped.
        stop_reason: StopReason,
        /// Provider response id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response_id: Option<String>,
        /// Cost in US dollars, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// Time to first token: milliseconds from the start of the call (the same origin
        /// as `latency_ms`, so retries before the answer count) to the first fragment of
        /// the answer that was kept — text, a tool call or a provider item; a restarted
        /// stream starts the count again. Absent when not measured (logs written before
        /// it was recorded, agents that do not stream).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_token_ms: Option<u64>,
    },
    /// The model call failed for good (after retries).
    ModelFailed {
        /// Turn that failed.
        turn: u32,
        /// The classified error.
        error: ModelFailure,
    },
    /// The runner accepted a tool call from the model's answer.
    ToolCallRequested {
        /// The call as the model made it.
        call: ToolCall,
        /// The tool's effect, when the tool exists.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        effect: Option<Effect>,
        /// Whether it waits for human approval.
        requires_approval: bool,
    },
    /// A tool call began executing. For a call that is not read-only this event is on
    /// stable storage before the call starts (docs/durability.md, "The durability rule"),
    /// and what it records — effect, repeatability, idempotency key — governs a resume,
    /// not the tool's spec at the time of the resume.
    ToolCallStarted {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// The tool's effect when the call started (absent in logs written before it was
        /// recorded, and for unknown tools).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        effect: Option<Effect>,
        /// Whether running the call again after an interruption was harmless when it
        /// started: not mutating, or mutating behind an idempotency key the tool honours.
        #[serde(default, skip_serializing_if = "is_false")]
        repeatable: bool,
        /// The idempotency key the call was given, fixed here for every attempt and every
        /// resume (absent for read-only calls and in older logs: then `thread:call_id`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        /// For a fallback call the policy ran in place of a failed call: that call's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fallback_for: Option<String>,
    },
    /// A tool call finished (success or typed error). Its result joins the conversation.
    ToolCallFinished {
        /// The result, including the full outcome (shared with the conversation's tool
        /// message: the largest payload of any event, it would otherwise set the size of
        /// every event in a log and be copied with each).
        result: Arc<ToolResult>,
    },
    /// A call waits for a human decision.
    ApprovalRequested {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Raw arguments.
        arguments: String,
    },
    /// A human approved a call.
    ApprovalGranted {
        /// Call id.
        call_id: String,
        /// Who approved.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// A human denied a call.
    ApprovalDenied {
        /// Call id.
        call_id: String,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Who denied (as the server authenticated them, e.g. `key:<key id>`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// The agent asked the user a question and waits for the answer.
    UserAsked {
        /// The question.
        question: String,
        /// Fields the agent cannot know.
        #[serde(default)]
        missing_fields: Vec<String>,
    },
    /// The user answered.
    UserAnswered {
        /// The answer.
        answer: String,
    },
    /// The plan changed.
    Replanned {
        /// The new subgoals.
        subgoals: Vec<String>,
    },
    /// Messages of the context were replaced (the originals stay in this log).
    Compacted {
        /// Strategy name.
        strategy: String,
        /// How many context messages were replaced.
        replaced: u32,
        /// The context after compaction.
        messages: Vec<Message>,
    },
    /// A critic's verdict.
    Critique {
        /// Whether the goal is met.
        satisfied: bool,
        /// What is still missing.
        #[serde(default)]
        known_gaps: Vec<String>,
        /// Recommended next step.
        next: CriticNext,
        /// A tool the next model call must use (a required call that is missing).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_tool: Option<String>,
    },
    /// A retry of a model call or tool call.
    Retry {
        /// `model` or `tool`.
        scope: String,
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Error class that caused it.
        class: String,
        /// How long the runner waits before the next attempt, in milliseconds.
        wait_ms: u64,
        /// Tool call id, for tool retries.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
    /// The policy engine decided what follows a failed tool call.
    PolicyApplied {
        /// The failed call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// The error code.
        error_code: crate::outcome::ToolErrorCode,
        /// The decision.
        decision: crate::policy::PolicyDecision,
    },
    /// An agent added an assistant message without a model call of this run: a custom
    /// agent's answer, a provider-hosted agent's reply, the result a handoff target
    /// returned. Folded into the conversation like a model's answer.
    AgentMessage {
        /// The agent that wrote it.
        agent: String,
        /// The assistant message.
        message: Message,
    },
    /// A workflow step began: its agent runs on `child_thread` (in the same store) with
    /// `input` as the user message. Recorded before the step's run starts, so a resumed
    /// workflow finds the step's run (the first run of `child_thread` at or after
    /// `from_seq`) and never starts it twice.
    WorkflowStepStarted {
        /// The step's name (unique within the workflow).
        step: String,
        /// The agent that runs it.
        agent: String,
        /// The thread the step's run is on.
        child_thread: String,
        /// The step's input (the user message of its run).
        input: String,
        /// The child thread's length when the step started: the step's run is the first
        /// one at or after this position.
        #[serde(default)]
        from_seq: u64,
    },
    /// A workflow step's run ended; its output is what the next steps receive.
    WorkflowStepFinished {
        /// The step's name.
        step: String,
        /// The thread the step's run is on.
        child_thread: String,
        /// The step's run (on `child_thread`).
        child_run_id: String,
        /// How the step's run ended.
        end_state: EndState,
        /// The step's final text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// Why it ended, when it did not end `done`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The run's agent handed the conversation to another agent (it called the
    /// `transfer_to_<to>` tool `call_id`): the run ends, and `to` continues the same thread
    /// in a new run whose span nests under this event's span.
    Handoff {
        /// The agent handing over.
        from: String,
        /// The agent taking over.
        to: String,
        /// Why, as the model said it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The transfer call.
        call_id: String,
    },
    /// Free-form note for things like warnings (history trimmed, stream restarted).
    Notice {
        /// Short machine-readable code.
        code: String,
        /// Human-readable text.
        message: String,
        /// Extra data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
    },
    /// The run ended.
    RunEnded {
        /// How it ended.
        end_state: EndState,
        /// Why, in words.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The final answer, when there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        final_text: Option<String>,
    },
}

impl EventKind {
    /// A `ToolCallStarted` with nothing recorded beyond the call's id and tool (as logs
    /// written before effects and keys were recorded have it).
    pub fn tool_call_started(call_id: impl Into<String>, name: impl Into<String>) -> Self {
        Self::ToolCallStarted {
            call_id: call_id.into(),
            name: name.into(),
            effect: None,
            repeatable: false,
            idempotency_key: None,
            fallback_for: None,
        }
    }

    /// The `type` tag of this event.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::UserMessage { .. } => "user_message",
            Self::ModelRequested { .. } => "model_requested",
            Self::ModelResponded { .. } => "model_responded",
            Self::ModelFailed { .. } => "model_failed",
            Self::ToolCallRequested { .. } => "tool_call_requested",
            Self::ToolCallStarted { .. } => "tool_call_started",
            Self::ToolCallFinished { .. } => "tool_call_finished",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalGranted { .. } => "approval_granted",
            Self::ApprovalDenied { .. } => "approval_denied",
            Self::UserAsked { .. } => "user_asked",
            Self::UserAnswered { .. } => "user_answered",
            Self::Replanned { .. } => "replanned",
            Self::Compacted { .. } => "compacted",
            Self::Critique { .. } => "critique",
            Self::Retry { .. } => "retry",
            Self::AgentMessage { .. } => "agent_message",
            Self::Handoff { .. } => "handoff",
            Self::WorkflowStepStarted { .. } => "workflow_step_started",
            Self::WorkflowStepFinished { .. } => "workflow_step_finished",
            Self::PolicyApplied { .. } => "policy_applied",
            Self::Notice { .. } => "notice",
            Self::RunEnded { .. } => "run_ended",
        }
    }
}

/// Generates W3C trace and span ids.
pub fn new_trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A new 16-hex-digit span id.
pub fn new_span_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id.chars().take(16).collect()
}
