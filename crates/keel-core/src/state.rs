//! The folded state of a thread: its conversation context and the state of the current
//! run. [`RunState::apply`] costs O(1) per event (plus the size of the event itself), so
//! rebuilding from a stored log and stepping a live run are the same fold.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::budget::{Budget, Spent};
use crate::decide::EndState;
use crate::event::{Event, EventKind, ModelFailure};
use crate::message::{Message, Part, Role, ToolCall, ToolResult, Usage};
use crate::tool::Effect;

/// `Notice` code recording a structured-planner answer that was not a valid action.
pub const INVALID_ACTION_NOTICE: &str = "invalid_action";
/// `Notice` code recording a valid structured-planner action (resets the re-ask count).
pub const VALID_ACTION_NOTICE: &str = "valid_action";

/// How many observations and decisions the working memory keeps.
pub const WORKING_MEMORY_SIZE: usize = 8;

/// The working-memory digest of seed 000 §7: the last K normalized observations and a
/// short decision log, folded from events.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkingMemory {
    /// One-line summaries of the latest tool observations, oldest first.
    pub observations: std::collections::VecDeque<String>,
    /// The latest decisions (policy, replans, critiques), oldest first.
    pub decisions: std::collections::VecDeque<String>,
}

impl WorkingMemory {
    fn push(list: &mut std::collections::VecDeque<String>, entry: String) {
        if list.len() >= WORKING_MEMORY_SIZE {
            list.pop_front();
        }
        list.push_back(entry);
    }

    /// Records an observation.
    pub fn observe(&mut self, summary: String) {
        Self::push(&mut self.observations, summary);
    }

    /// Records a decision.
    pub fn decide(&mut self, decision: String) {
        Self::push(&mut self.decisions, decision);
    }

    /// A bullet-list digest for prompts and summaries.
    pub fn digest(&self) -> String {
        let mut out = String::new();
        if !self.observations.is_empty() {
            out.push_str("Recent observations:\n");
            for line in &self.observations {
                out.push_str(&format!("- {line}\n"));
            }
        }
        if !self.decisions.is_empty() {
            out.push_str("Decision log:\n");
            for line in &self.decisions {
                out.push_str(&format!("- {line}\n"));
            }
        }
        out
    }
}

/// A tool call of the latest model answer that is not settled yet.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCall {
    /// The call.
    pub call: ToolCall,
    /// Whether it waits for human approval.
    pub requires_approval: bool,
    /// `Some(true)` approved, `Some(false)` denied, `None` undecided.
    pub approval: Option<bool>,
    /// Denial reason.
    pub denial_reason: Option<String>,
    /// Whether an approval request was recorded.
    pub approval_requested: bool,
    /// Whether execution started (a start without a finish means it was interrupted).
    pub started: bool,
    /// Whether its result is in the conversation.
    pub finished: bool,
    /// The tool's effect as recorded: at the request, then at the start (what governs a
    /// resume). `None` for unknown tools and logs that predate recording it.
    pub effect: Option<Effect>,
    /// What the call's `ToolCallStarted` recorded about repeating it and its key (`None`
    /// before it started, or when the log predates recording them).
    pub start: Option<RecordedStart>,
    /// The fallback call the policy started in place of this one, when it did.
    pub fallback: Option<RecordedFallback>,
}

/// What a `ToolCallStarted` recorded about a call, fixed for every later attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedStart {
    /// The effect the call started with.
    pub effect: Effect,
    /// Whether running it again after an interruption was harmless when it started.
    pub repeatable: bool,
    /// The idempotency key it was given.
    pub idempotency_key: Option<String>,
}

/// A fallback call that started (its own `ToolCallStarted`, `fallback_for` naming the
/// call it stands in for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedFallback {
    /// The fallback call's own id.
    pub call_id: String,
    /// The fallback tool.
    pub name: String,
    /// What its start recorded (`None` in a log that predates recording it).
    pub start: Option<RecordedStart>,
}

impl PendingCall {
    /// Whether it may run now.
    pub fn is_runnable(&self) -> bool {
        !self.finished && (!self.requires_approval || self.approval.is_some())
    }
}

/// The state of the run in progress (or the last one).
#[derive(Debug, Clone, PartialEq)]
pub struct RunScope {
    /// Run id.
    pub run_id: String,
    /// Agent name.
    pub agent: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its budget.
    pub budget: Budget,
    /// Model calls requested.
    pub turns: u32,
    /// Token usage summed over the run.
    pub usage: Usage,
    /// Known cost summed over the run.
    pub cost_usd: f64,
    /// Whether any cost was reported.
    pub cost_known: bool,
    /// A model call was requested and has no answer yet.
    pub model_outstanding: bool,
    /// Tool calls of the latest answer, in call order.
    pub pending: Vec<PendingCall>,
    /// An unanswered question to the user.
    pub awaiting_user: Option<(String, Vec<String>)>,
    /// A policy decided to stop the run: (end state, reason, action item).
    pub policy_stop: Option<(EndState, String, Option<String>)>,
    /// The model call that summarizes for the user after a policy stop.
    pub summary_turn: Option<u32>,
    /// Verdict on the latest final answer: `Some(satisfied)` once critiqued.
    pub answer_verdict: Option<bool>,
    /// Final answers a critic rejected in this run.
    pub critic_rejections: u32,
    /// The tool the next model call must use (set by a critic's rejection).
    pub forced_tool: Option<String>,
    /// Consecutive structured-planner answers that were not a valid action.
    pub invalid_actions: u32,
    /// The last observations and decisions, for prompts and summaries.
    pub working_memory: WorkingMemory,
    /// The model failed for good.
    pub model_failed: Option<ModelFailure>,
    /// Subgoals of the current plan.
    pub subgoals: Vec<String>,
    /// Set when the run ended.
    pub ended: Option<EndState>,
    /// The latest assistant text.
    pub final_text: Option<String>,
}

impl RunScope {
    /// What the run has spent by `now`.
    pub fn spent(&self, now: DateTime<Utc>) -> Spent {
        let elapsed = now
            .signed_duration_since(self.started_at)
            .num_milliseconds();
        Spent {
            turns: self.turns,
            tokens: self.usage.total(),
            cost_usd: self.cost_usd,
            elapsed_ms: u64::try_from(elapsed).unwrap_or(0),
        }
    }
}

/// A thread folded from its events.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunState {
    thread_id: String,
    next_seq: u64,
    messages: Vec<Message>,
    /// Index in `messages` of the tool message collecting results of the latest answer.
    open_results_message: Option<usize>,
    run: Option<RunScope>,
    /// The agent a handoff passed the conversation to, until its run starts.
    pending_handoff: Option<String>,
    /// Handoffs since the latest run that was not a take-over (one user request's chain).
    handoff_chain: u32,
}

impl RunState {
    /// An empty thread.
    pub fn new(thread_id: impl Into<String>) -> Self {
        Self {
            thread_id: thread_id.into(),
            ..Self::default()
        }
    }

    /// Folds a whole log.
    pub fn from_events<'e>(
        thread_id: impl Into<String>,
        events: impl IntoIterator<Item = &'e Event>,
    ) -> Self {
        let mut state = Self::new(thread_id);
        for event in events {
            state.apply(event);
        }
        state
    }

    /// The thread id.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The sequence number the next event must have.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The conversation context the model sees (after any compaction).
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The current or last run.
    pub fn run(&self) -> Option<&RunScope> {
        self.run.as_ref()
    }

    /// The agent the latest run handed the conversation to, while its run has not started:
    /// that agent takes over the thread with no new message.
    pub fn pending_handoff(&self) -> Option<&str> {
        self.pending_handoff.as_deref()
    }

    /// Handoffs in the current chain: since the latest run that was not a take-over after
    /// a handoff (so, for one user request).
    pub fn handoff_chain(&self) -> u32 {
        self.handoff_chain
    }

    /// Whether a run is in progress (started and not ended).
    pub fn run_in_progress(&self) -> bool {
        self.run.as_ref().is_some_and(|run| run.ended.is_none())
    }

    /// Calls of the latest answer that have no result yet, in call order.
    pub fn unanswered_calls(&self) -> impl Iterator<Item = &PendingCall> {
        self.run
            .iter()
            .flat_map(|run| run.pending.iter())
            .filter(|p| !p.finished)
    }

    /// The pending call with this id.
    pub fn pending_call(&self, call_id: &str) -> Option<&PendingCall> {
        self.run
            .as_ref()?
            .pending
            .iter()
            .find(|p| p.call.id == call_id)
    }

    /// Folds one event. Events must come in sequence order; a result for a call that is not
    /// pending, or a second result for the same call, is ignored so the context never holds
    /// an orphan or a duplicate tool result.
    pub fn apply(&mut self, event: &Event) {
        self.next_seq = event.seq.saturating_add(1);
        match &event.kind {
            EventKind::RunStarted { agent, budget, .. } => {
                if self.pending_handoff.take().is_none() {
                    self.handoff_chain = 0;
                }
                self.run = Some(RunScope {
                    run_id: event.run_id.to_string(),
                    agent: agent.clone(),
                    started_at: event.ts,
                    budget: *budget,
                    turns: 0,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    cost_known: false,
                    model_outstanding: false,
                    pending: Vec::new(),
                    awaiting_user: None,
                    policy_stop: None,
                    summary_turn: None,
                    answer_verdict: None,
                    critic_rejections: 0,
                    forced_tool: None,
                    invalid_actions: 0,
                    working_memory: WorkingMemory::default(),
                    model_failed: None,
                    subgoals: Vec::new(),
                    ended: None,
                    final_text: None,
                });
            }
            EventKind::UserMessage { message } => {
                self.open_results_message = None;
                self.messages.push(message.clone());
            }
            EventKind::ModelRequested { turn, .. } => {
                if let Some(run) = &mut self.run {
                    run.turns = run.turns.max(*turn);
                    run.model_outstanding = true;
                    if run.policy_stop.is_some() && run.summary_turn.is_none() {
                        run.summary_turn = Some(*turn);
                    }
                }
            }
            EventKind::ModelResponded {
                message,
                usage,
                cost_usd,
                ..
            } => {
                self.open_results_message = None;
                self.messages.push(message.clone());
                if let Some(run) = &mut self.run {
                    run.model_outstanding = false;
                    run.answer_verdict = None;
                    run.forced_tool = None;
                    run.usage.add(usage);
                    if let Some(cost) = cost_usd {
                        run.cost_usd += cost;
                        run.cost_known = true;
                    }
                    run.pending = message
                        .tool_calls()
                        .map(|call| PendingCall {
                            call: call.clone(),
                            requires_approval: false,
                            approval: None,
                            denial_reason: None,
                            approval_requested: false,
                            started: false,
                            finished: false,
                            effect: None,
                            start: None,
                            fallback: None,
                        })
                        .collect();
                    let text = message.text();
                    if !text.is_empty() {
                        run.final_text = Some(text);
                    }
                }
            }
            EventKind::ModelFailed { error, .. } => {
                if let Some(run) = &mut self.run {
                    run.model_outstanding = false;
                    run.model_failed = Some(error.clone());
                }
            }
            EventKind::ToolCallRequested {
                call,
                requires_approval,
                effect,
            } => {
                if let Some(pending) = self.pending_mut(&call.id) {
                    pending.requires_approval = *requires_approval;
                    pending.effect = *effect;
                }
            }
            EventKind::ToolCallStarted {
                call_id,
                name,
                effect,
                repeatable,
                idempotency_key,
                fallback_for,
            } => {
                let start = effect.map(|effect| RecordedStart {
                    effect,
                    repeatable: *repeatable,
                    idempotency_key: idempotency_key.clone(),
                });
                match fallback_for {
                    Some(original) => {
                        if let Some(pending) = self.pending_mut(original) {
                            pending.fallback = Some(RecordedFallback {
                                call_id: call_id.clone(),
                                name: name.clone(),
                                start,
                            });
                        }
                    }
                    None => {
                        if let Some(pending) = self.pending_mut(call_id) {
                            pending.started = true;
                            if let Some(start) = start {
                                pending.effect = Some(start.effect);
                                pending.start = Some(start);
                            }
                        }
                    }
                }
            }
            EventKind::ApprovalGranted { call_id, .. } => {
                if let Some(pending) = self.pending_mut(call_id) {
                    pending.approval = Some(true);
                }
            }
            EventKind::ApprovalDenied {
                call_id, reason, ..
            } => {
                if let Some(pending) = self.pending_mut(call_id) {
                    pending.approval = Some(false);
                    pending.denial_reason.clone_from(reason);
                }
            }
            EventKind::ToolCallFinished { result } => self.record_result(result),
            EventKind::UserAsked {
                question,
                missing_fields,
            } => {
                if let Some(run) = &mut self.run {
                    run.awaiting_user = Some((question.clone(), missing_fields.clone()));
                }
            }
            EventKind::UserAnswered { answer } => {
                if let Some(run) = &mut self.run {
                    run.awaiting_user = None;
                }
                self.open_results_message = None;
                self.messages.push(Message::user(answer.clone()));
            }
            EventKind::Replanned { subgoals } => {
                if let Some(run) = &mut self.run {
                    run.working_memory
                        .decide(format!("replanned: {}", subgoals.join("; ")));
                    run.subgoals.clone_from(subgoals);
                }
            }
            EventKind::Compacted { messages, .. } => {
                self.messages.clone_from(messages);
                self.open_results_message = match self.messages.last() {
                    Some(last) if last.role == Role::Tool => self.messages.len().checked_sub(1),
                    _ => None,
                };
            }
            EventKind::RunEnded {
                end_state,
                final_text,
                ..
            } => {
                if let Some(run) = &mut self.run {
                    run.ended = Some(*end_state);
                    if final_text.is_some() {
                        run.final_text.clone_from(final_text);
                    }
                }
            }
            EventKind::ApprovalRequested { call_id, .. } => {
                if let Some(pending) = self.pending_mut(call_id) {
                    pending.approval_requested = true;
                }
            }
            EventKind::Critique {
                satisfied,
                next_tool,
                ..
            } => {
                let is_final_answer = self
                    .messages
                    .last()
                    .is_some_and(|m| m.role == Role::Assistant && m.tool_calls().next().is_none());
                if let Some(run) = &mut self.run
                    && is_final_answer
                {
                    run.working_memory.decide(format!(
                        "critic: final answer {}",
                        if *satisfied { "accepted" } else { "rejected" }
                    ));
                    run.answer_verdict = Some(*satisfied);
                    if !satisfied {
                        run.forced_tool.clone_from(next_tool);
                    }
                    if !satisfied {
                        run.critic_rejections = run.critic_rejections.saturating_add(1);
                    }
                }
            }
            EventKind::PolicyApplied {
                decision,
                tool,
                error_code,
                ..
            } => {
                if let Some(run) = &mut self.run {
                    let action = match decision {
                        crate::policy::PolicyDecision::Fallback { tool } => {
                            format!("fall back to `{tool}`")
                        }
                        crate::policy::PolicyDecision::AskUser { .. } => "ask the user".to_string(),
                        crate::policy::PolicyDecision::ReturnToModel => {
                            "return the error to the model".to_string()
                        }
                        crate::policy::PolicyDecision::Stop { end_state, .. } => {
                            format!("stop ({end_state})")
                        }
                    };
                    run.working_memory
                        .decide(format!("`{tool}` failed with {error_code}: {action}"));
                }
                if let Some(run) = &mut self.run
                    && let crate::policy::PolicyDecision::Stop {
                        end_state,
                        reason,
                        action_item,
                        ..
                    } = decision
                    && run.policy_stop.is_none()
                {
                    run.policy_stop = Some((*end_state, reason.clone(), action_item.clone()));
                }
            }
            EventKind::Notice { code, .. } => {
                if let Some(run) = &mut self.run {
                    if code == INVALID_ACTION_NOTICE {
                        run.invalid_actions = run.invalid_actions.saturating_add(1);
                    } else if code == VALID_ACTION_NOTICE {
                        run.invalid_actions = 0;
                    }
                }
            }
            EventKind::Retry { .. } => {}
            // Workflow bookkeeping: the steps' conversations live on their own threads.
            EventKind::WorkflowStepStarted { .. } | EventKind::WorkflowStepFinished { .. } => {}
            EventKind::AgentMessage { message, .. } => {
                self.open_results_message = None;
                self.messages.push(message.clone());
            }
            EventKind::Handoff { to, .. } => {
                self.pending_handoff = Some(to.clone());
                self.handoff_chain = self.handoff_chain.saturating_add(1);
            }
        }
    }

    fn pending_mut(&mut self, call_id: &str) -> Option<&mut PendingCall> {
        self.run
            .as_mut()?
            .pending
            .iter_mut()
            .find(|p| p.call.id == call_id)
    }

    fn record_result(&mut self, result: &Arc<ToolResult>) {
        let Some(pending) = self.pending_mut(&result.call_id) else {
            return;
        };
        if pending.finished {
            return;
        }
        pending.finished = true;
        if let Some(run) = &mut self.run {
            if result.name == crate::planner::ASK_USER {
                run.awaiting_user = None;
            }
            use crate::observation::ObservationNormalizer;
            let observation = crate::observation::DefaultNormalizer.normalize(&result.outcome);
            run.working_memory.observe(observation.summary);
        }
        let part = Part::ToolResult(Arc::clone(result));
        match self
            .open_results_message
            .and_then(|index| self.messages.get_mut(index))
        {
            Some(message) => message.parts.push(part),
            None => {
                self.messages.push(Message {
                    role: Role::Tool,
                    parts: vec![part],
                });
                self.open_results_message = self.messages.len().checked_sub(1);
            }
        }
        if let Some(run) = &mut self.run
            && run.pending.iter().all(|p| p.finished)
        {
            run.pending.clear();
        }
    }
}
