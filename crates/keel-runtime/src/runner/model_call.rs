//! One model call: build the request from the thread's state, journal `ModelRequested`,
//! stream the answer (forwarding deltas to observers, with an idle timeout and
//! cancellation), then journal `ModelResponded` with the `ToolCallRequested` records — or
//! `ModelFailed`. In structured planner mode the answer text is parsed into one action.

use std::borrow::Cow;
use std::time::Instant;

use futures::StreamExt;
use keel_core::context::{CONTEXT_OVERFLOW_NOTICE, TokenBudget};
use keel_core::event::{ModelFailure, new_span_id};
use keel_core::model::ResponseAssembler;
use keel_core::planner::{self, PlannerAction, PlannerMode};
use keel_core::state::{INVALID_ACTION_NOTICE, VALID_ACTION_NOTICE};
use keel_core::{
    ApprovalMode as ToolApproval, EventKind, Message, ModelError, ModelErrorKind, ModelRequest,
    ModelResponse, Part, Role, RunDurability, StreamEvent, ToolCall, ToolChoice, ToolProgress,
    ToolResultKind,
};

use crate::compaction::{self, Prepared};
use crate::journal::Journal;
use crate::outcome::RunError;
use crate::tool_agent::ToolAgent;

/// Provider item kind under which the structured planner keeps the model's raw answer.
const STRUCTURED_PROVIDER: &str = "keel-structured";

static NO_TOOLS: ToolChoice = ToolChoice::None;

/// The messages sent to the model: the context, with the agent's reminder (if any)
/// added to the user's latest message as a text part of its own, after a blank line.
///
/// Inside the user's turn rather than as a system message after it: measured on
/// Qwen2.5-Coder-0.5B (docs/local-model.md), the Detective's severity criteria as a
/// system turn after the user's were quoted back as findings and did not change the
/// severity; the same text at the end of the user's turn did.
fn request_messages<'m>(agent: &ToolAgent, messages: &'m [Message]) -> Cow<'m, [Message]> {
    let rendered = rendered_messages(agent, messages);
    let Some(reminder) = &agent.reminder else {
        return rendered;
    };
    // Rendering maps messages one to one, so a position in `messages` is one in `rendered`.
    let mut with_reminder = rendered.into_owned();
    let latest_user = messages
        .iter()
        .rposition(|message| message.role == Role::User)
        .and_then(|index| with_reminder.get_mut(index));
    match latest_user {
        Some(message) => message.parts.push(Part::Text {
            text: format!("\n{reminder}"),
        }),
        None => with_reminder.push(Message::user(reminder.clone())),
    }
    Cow::Owned(with_reminder)
}

/// The context as the planner mode sends it. Native mode sends it as is (borrowed, no
/// copy). Structured mode renders it for a model without tool calling: assistant actions
/// as their raw JSON text, tool results as `Observation:` user messages.
fn rendered_messages<'m>(agent: &ToolAgent, messages: &'m [Message]) -> Cow<'m, [Message]> {
    match agent.planner_mode {
        PlannerMode::Native => Cow::Borrowed(messages),
        PlannerMode::Structured => Cow::Owned(
            messages
                .iter()
                .map(|message| match message.role {
                    Role::Assistant => {
                        let raw = message.parts.iter().find_map(|p| match p {
                            Part::ProviderItem { provider, item }
                                if provider == STRUCTURED_PROVIDER =>
                            {
                                item.get("raw").and_then(|r| r.as_str()).map(str::to_string)
                            }
                            _ => None,
                        });
                        Message::assistant(raw.unwrap_or_else(|| message.text()))
                    }
                    Role::Tool => Message::user(
                        message
                            .tool_results()
                            .map(|r| format!("Observation: {} → {}", r.name, r.content))
                            .collect::<Vec<_>>()
                            .join("\n"),
                    ),
                    Role::User | Role::System => message.clone(),
                })
                .collect(),
        ),
    }
}

fn system_prompt<'a>(
    agent: &'a ToolAgent,
    journal: &Journal<'_>,
    final_summary: bool,
) -> Option<std::borrow::Cow<'a, str>> {
    // The agent's prompt is borrowed, not copied, for every ordinary model call.
    let mut system = std::borrow::Cow::Borrowed(agent.system_prompt.as_str());
    if final_summary
        && let Some((_, reason, action_item)) =
            journal.state().run().and_then(|r| r.policy_stop.as_ref())
    {
        system.to_mut().push_str(&format!(
            "\n\nThe run is stopping: {reason}.{} Do not call any tool. In a few sentences, tell the user what happened{}.",
            action_item.as_ref().map(|item| format!(" Action item for the user: {item}")).unwrap_or_default(),
            if action_item.is_some() { " and what they need to do" } else { "" }
        ));
    }
    (!system.is_empty()).then_some(system)
}

/// The tool a critic's rejection requires the next call to use, as a tool choice.
fn forced_tool_choice(journal: &Journal<'_>) -> Option<ToolChoice> {
    journal
        .state()
        .run()
        .and_then(|r| r.forced_tool.clone())
        .map(ToolChoice::Tool)
}

/// Where the run stands with the agent's call rules: the tools they would refuse now,
/// whatever the arguments ([`ModelRequest::withheld_tools`]), the tools their declared
/// sequence still expects ([`ModelRequest::expected_tools`]), and, for a tool whose call
/// already failed in the run, what its grounded arguments may cite
/// ([`ModelRequest::grounded_arguments`]).
#[derive(Default)]
struct RuleState {
    withheld: Vec<String>,
    expected: Vec<String>,
    grounded: Vec<keel_core::GroundedArgument>,
}

fn rule_state(agent: &ToolAgent, journal: &Journal<'_>) -> RuleState {
    if agent.call_rules.is_empty() {
        return RuleState::default();
    }
    let mut requested: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let mut succeeded: Vec<&str> = Vec::new();
    let mut progress: std::collections::HashMap<&str, ToolProgress> =
        std::collections::HashMap::new();
    for event in journal.run_events() {
        match &event.kind {
            EventKind::ToolCallRequested { call, .. } => {
                requested.insert(call.id.as_str(), call.name.as_str());
            }
            EventKind::ToolCallFinished { result } => {
                let Some(tool) = requested.get(result.call_id.as_str()).copied() else {
                    continue;
                };
                let entry = progress.entry(tool).or_default();
                match &result.outcome.result {
                    ToolResultKind::Ok { .. } => {
                        succeeded.push(tool);
                        entry.succeeded = entry.succeeded.saturating_add(1);
                    }
                    // A call refused because the tool was still withheld (the reads
                    // not done yet) says nothing about the tool: not counted.
                    ToolResultKind::Error { .. }
                        if keel_core::withheld_tools(&agent.call_rules, &succeeded)
                            .iter()
                            .any(|t| t == tool) => {}
                    ToolResultKind::Error { code, .. } => entry.record_failure(*code),
                }
            }
            _ => {}
        }
    }
    let withheld = keel_core::withheld_tools(&agent.call_rules, &succeeded);
    let at = |tool: &str| progress.get(tool).copied().unwrap_or_default();
    let expected = keel_core::expected_tools(&agent.call_rules, &at, &withheld)
        .into_iter()
        .filter(|tool| agent.tool_definitions.iter().any(|t| &t.name == tool))
        .collect();
    // Only for a tool whose call already failed in this run once it was no longer
    // withheld (typically refused for citing nothing): on the Detective, a grammar
    // requiring a citation first from the start had Qwen2.5-Coder-1.5B pad its findings
    // with false ones built from real figures ("0 of 142 tests passed in payments area"),
    // while SmolLM2-135M repeats a refused filing word for word until it is constrained
    // (docs/detective.md, "Grounded findings in the grammar").
    let refused = |tool: &str| progress.get(tool).is_some_and(|p| p.failed > 0);
    let grounded = if agent
        .call_rules
        .iter()
        .any(|r| !r.grounded.is_empty() && refused(&r.tool))
    {
        let succeeded = super::tools::successful_calls(journal);
        keel_core::grounded_arguments(
            &agent.call_rules,
            &super::tools::past_calls(&succeeded),
            &withheld,
        )
        .into_iter()
        .filter(|argument| refused(&argument.tool))
        .collect()
    } else {
        Vec::new()
    };
    RuleState {
        withheld,
        expected,
        grounded,
    }
}

fn build_request<'a>(
    agent: &'a ToolAgent,
    messages: &'a [Message],
    system: Option<&'a str>,
    final_summary: bool,
    forced: Option<&'a ToolChoice>,
    rules: &'a RuleState,
) -> ModelRequest<'a> {
    ModelRequest {
        system,
        messages,
        tools: &agent.tool_definitions,
        tool_choice: if final_summary {
            &NO_TOOLS
        } else {
            forced.unwrap_or(&agent.tool_choice)
        },
        temperature: agent.temperature,
        top_p: None,
        max_output_tokens: agent.request_max_output,
        response_schema: if final_summary {
            None
        } else {
            agent.action_schema.as_ref()
        },
        withheld_tools: &rules.withheld,
        expected_tools: &rules.expected,
        grounded_arguments: &rules.grounded,
    }
}

pub(super) async fn call_model(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    turn: u32,
    final_summary: bool,
) -> Result<(), RunError> {
    let system = system_prompt(agent, journal, final_summary);
    // Set after the provider reported a context overflow: compact once more, retry once.
    let mut overflowed = false;
    loop {
        let (budget, estimated) = measure(agent, journal, system.as_deref(), final_summary);
        if let Some(message) =
            window_too_small(&budget).filter(|_| agent.context.strategy.is_some())
        {
            let failure = ModelFailure {
                kind: ModelErrorKind::ContextOverflow,
                message,
                status: None,
            };
            return journal
                .append(EventKind::ModelFailed {
                    turn,
                    error: failure,
                })
                .await;
        }
        let measured_at = journal.state().next_seq();
        match compaction::prepare(agent, journal, budget, estimated, overflowed).await? {
            Prepared::Ready => {}
            Prepared::Cancelled => return Ok(()),
            Prepared::Overflow(error) => {
                let failure = ModelFailure {
                    kind: ModelErrorKind::ContextOverflow,
                    message: error.to_string(),
                    status: None,
                };
                return journal
                    .append(EventKind::ModelFailed {
                        turn,
                        error: failure,
                    })
                    .await;
            }
        }
        // The request is measured again only when preparing the context changed it (a
        // compaction appended events): estimating can mean tokenizing the whole request.
        let (message_count, estimated) = if journal.state().next_seq() == measured_at {
            (
                request_messages(agent, journal.state().messages()).len(),
                estimated,
            )
        } else {
            let messages = request_messages(agent, journal.state().messages());
            let forced = forced_tool_choice(journal);
            let rules = rule_state(agent, journal);
            let request = build_request(
                agent,
                &messages,
                system.as_deref(),
                final_summary,
                forced.as_ref(),
                &rules,
            );
            let precise_from = compaction::precise_from(agent);
            (
                messages.len(),
                agent.model.estimate_tokens_near(&request, precise_from),
            )
        };
        let span = new_span_id();
        let window = agent
            .context
            .context_window
            .unwrap_or(agent.model.capabilities().context_window);
        let requested = vec![(
            EventKind::ModelRequested {
                turn,
                model: agent.model.id(),
                message_count: u32::try_from(message_count).unwrap_or(u32::MAX),
                tool_count: u32::try_from(agent.tool_definitions.len()).unwrap_or(u32::MAX),
                estimated_input_tokens: estimated,
                provider: agent
                    .model
                    .id()
                    .split_once(':')
                    .map(|(provider, _)| provider.to_string()),
                temperature: agent.temperature,
                max_tokens: agent.request_max_output,
                context_window: Some(u64::from(window)),
            },
            span.clone(),
        )];
        // A model call has no effect outside the process: its request rides with the next
        // durable point (the journal's module doc), unless the agent asks for every step.
        if agent.durability == RunDurability::Steps
            || journal.staged_model_calls() >= crate::journal::MAX_STAGED_MODEL_CALLS
        {
            journal.append_batch(requested).await?;
        } else {
            journal.stage(requested);
        }
        let started = Instant::now();
        let mut first_token = FirstToken::new(started);
        let mut batch = Vec::new();
        let result = stream_answer(
            agent,
            journal,
            system.as_deref(),
            final_summary,
            &span,
            &mut batch,
            &mut first_token,
        )
        .await;
        if let Err(Some(error)) = &result
            && error.kind == ModelErrorKind::ContextOverflow
        {
            let (budget, estimated) = measure(agent, journal, system.as_deref(), final_summary);
            let request_tokens = budget.corrected(estimated);
            let limit = budget.request_limit();
            if !overflowed && agent.context.strategy.is_some() {
                overflowed = true;
                batch.push((
                    EventKind::Notice {
                        code: CONTEXT_OVERFLOW_NOTICE.into(),
                        message: format!(
                            "the provider rejected a request of ~{request_tokens} estimated tokens (limit {limit}): {}; compacting and retrying once",
                            error.message
                        ),
                        data: Some(serde_json::json!({ "request_tokens": request_tokens, "limit_tokens": limit, "context_window": budget.context_window })),
                    },
                    span,
                ));
                journal.append_batch(batch).await?;
                continue;
            }
            batch.push((
                EventKind::ModelFailed {
                    turn,
                    error: ModelFailure {
                        kind: ModelErrorKind::ContextOverflow,
                        message: format!(
                            "the request (~{request_tokens} estimated tokens) does not fit the context limit of {limit} tokens (context window {}, {} reserved for output, 10% safety margin){}: {}",
                            budget.context_window,
                            budget.reserved_output,
                            if overflowed { " even after compaction" } else { "" },
                            error.message
                        ),
                        status: error.status,
                    },
                },
                span,
            ));
            return journal.append_batch(batch).await;
        }
        return finish_call(
            agent,
            journal,
            turn,
            final_summary,
            result,
            first_token,
            span,
            batch,
        )
        .await;
    }
}

/// The token budget and the estimated size of the request as it would be sent now.
/// When the fixed part of every request (system prompt and tool definitions) does not fit
/// the window once the answer's reservation and the safety margin are taken out, no
/// compaction can help: the reason, said with the numbers and the fixes.
fn window_too_small(budget: &TokenBudget) -> Option<String> {
    let fixed = budget.corrected(budget.fixed);
    let limit = budget.request_limit();
    (fixed > limit).then(|| {
        format!(
            "the context window of {} tokens is too small for this agent: the system prompt and \
             tool definitions alone need ~{fixed} tokens, but only {limit} remain after {} tokens \
             reserved for the answer and a {} token safety margin; raise --context-window, lower \
             --max-output-tokens, or offer fewer tools",
            budget.context_window,
            budget.reserved_output,
            budget.safety_margin()
        )
    })
}

fn measure(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    system: Option<&str>,
    final_summary: bool,
) -> (TokenBudget, u64) {
    let messages = request_messages(agent, journal.state().messages());
    let forced = forced_tool_choice(journal);
    let rules = rule_state(agent, journal);
    let request = build_request(
        agent,
        &messages,
        system,
        final_summary,
        forced.as_ref(),
        &rules,
    );
    (
        compaction::request_budget(agent, journal, &request),
        agent
            .model
            .estimate_tokens_near(&request, compaction::precise_from(agent)),
    )
}

/// Streams one answer, forwarding deltas to observers and collecting retry and restart
/// records into `batch`. `Err(None)` means cancelled.
async fn stream_answer(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    system: Option<&str>,
    final_summary: bool,
    span: &str,
    batch: &mut Vec<(EventKind, String)>,
    first_token: &mut FirstToken,
) -> Result<ModelResponse, Option<ModelError>> {
    let ctx = journal.ctx();
    let (thread_id, run_id) = (journal.thread_id(), journal.run_id());
    let messages = request_messages(agent, journal.state().messages());
    let forced = forced_tool_choice(journal);
    let rules = rule_state(agent, journal);
    let request = build_request(
        agent,
        &messages,
        system,
        final_summary,
        forced.as_ref(),
        &rules,
    );
    let mut stream = agent.model.stream(request);
    let mut assembler = ResponseAssembler::new();
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(agent.stream_idle_timeout, stream.next()) => next,
            () = ctx.cancel.cancelled() => return Err(None),
        };
        match next {
            Err(_) => {
                return Err(Some(ModelError::new(
                    ModelErrorKind::Timeout,
                    format!(
                        "the model stream was silent for {} s",
                        agent.stream_idle_timeout.as_secs()
                    ),
                )));
            }
            Ok(None) if assembler.is_complete() => return Ok(assembler.finish()),
            Ok(None) => {
                return Err(Some(ModelError::new(
                    ModelErrorKind::StreamInterrupted,
                    "the model stream ended before the answer was complete",
                )));
            }
            Ok(Some(Err(error))) => return Err(Some(error)),
            Ok(Some(Ok(event))) => {
                for observer in &ctx.observers {
                    observer.on_stream(thread_id, run_id, &event);
                }
                first_token.observe(&event);
                if let Some(kind) = stream_event_record(&event) {
                    batch.push((kind, span.to_string()));
                }
                assembler.push(&event);
            }
        }
    }
}

/// The event a model stream fragment leaves in the log, if any: a provider retry
/// (`retry`, scope `model`) or a restarted stream (`stream_restarted` notice). Every agent
/// that streams a model records these, so retries show in traces and stats alike.
pub fn stream_event_record(event: &StreamEvent) -> Option<EventKind> {
    match event {
        StreamEvent::Retry {
            attempt,
            error,
            wait_ms,
            ..
        } => Some(EventKind::Retry {
            scope: "model".into(),
            attempt: *attempt,
            class: error.to_string(),
            wait_ms: *wait_ms,
            call_id: None,
        }),
        StreamEvent::Restart => Some(EventKind::Notice {
            code: "stream_restarted".into(),
            message: "the model stream restarted; partial output was discarded".into(),
            data: None,
        }),
        _ => None,
    }
}

/// Measures the time to first token of one model call: from when the call started to
/// the first fragment of the answer ([`StreamEvent::is_answer_content`]); a restarted
/// stream discards what came before, so the count starts again. Every agent that streams a
/// model records it in `ModelResponded.first_token_ms`.
#[derive(Debug, Clone, Copy)]
pub struct FirstToken {
    started: Instant,
    first: Option<Instant>,
}

impl FirstToken {
    /// A call that started at `started` (the origin of its `latency_ms`).
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            first: None,
        }
    }

    /// Notes one fragment of the stream, as it arrives.
    pub fn observe(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::Restart => self.first = None,
            event if event.is_answer_content() => {
                self.first.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
    }

    /// Milliseconds from the start to the first fragment, when one came.
    pub fn millis(&self) -> Option<u64> {
        self.first.map(|first| {
            u64::try_from(first.saturating_duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX)
        })
    }
}

/// Gives each tool call of an answer an id of its own. Results are paired with calls by
/// id, and a call's idempotency key is built from it, but a model may repeat an id within
/// one answer or reuse one from an earlier turn (servers that number calls `call_0`,
/// `call_1`, … in each answer do). A repeated id would leave one call forever unanswered
/// — the run looped executing it — or give two different calls one idempotency key, so
/// such an id (or an empty one) becomes `<id>_<n>`, the first free `n` from 2.
fn unique_call_ids(message: &mut Message, earlier: &[Message]) {
    let mut taken: std::collections::HashSet<String> = earlier
        .iter()
        .flat_map(|m| m.parts.iter())
        .filter_map(|part| match part {
            Part::ToolCall(call) => Some(call.id.clone()),
            Part::ToolResult(result) => Some(result.call_id.clone()),
            _ => None,
        })
        .collect();
    let own: std::collections::HashSet<String> =
        message.tool_calls().map(|call| call.id.clone()).collect();
    for part in &mut message.parts {
        let Part::ToolCall(call) = part else { continue };
        if !call.id.is_empty() && taken.insert(call.id.clone()) {
            continue;
        }
        let base = if call.id.is_empty() {
            "call"
        } else {
            call.id.as_str()
        };
        let fresh = (2u32..)
            .map(|n| format!("{base}_{n}"))
            .find(|id| !taken.contains(id) && !own.contains(id))
            .unwrap_or_else(|| keel_core::new_id("call"));
        taken.insert(fresh.clone());
        call.id = fresh;
    }
}

/// Journals the answer (or the failure) of a call.
#[allow(clippy::too_many_arguments)]
async fn finish_call(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    turn: u32,
    final_summary: bool,
    result: Result<ModelResponse, Option<ModelError>>,
    first_token: FirstToken,
    span: String,
    mut batch: Vec<(EventKind, String)>,
) -> Result<(), RunError> {
    let latency_ms = u64::try_from(first_token.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match result {
        Ok(mut response) => {
            let mut after = Vec::new();
            if agent.planner_mode == PlannerMode::Structured && !final_summary {
                after = structured_action(agent, journal, turn, &mut response, &span);
            }
            unique_call_ids(&mut response.message, journal.state().messages());
            let requested: Vec<(EventKind, String)> = response
                .message
                .tool_calls()
                .map(|call| {
                    let spec = agent.executor.spec(&call.name);
                    let requires_approval = spec.is_some_and(|s| {
                        journal
                            .ctx()
                            .requires_approval(&call.name, s.approval == ToolApproval::Always)
                    });
                    (
                        EventKind::ToolCallRequested {
                            call: call.clone(),
                            effect: spec.map(|s| s.effect),
                            requires_approval,
                        },
                        new_span_id(),
                    )
                })
                .collect();
            batch.push((
                EventKind::ModelResponded {
                    turn,
                    message: response.message,
                    usage: response.usage,
                    latency_ms,
                    stop_reason: response.stop_reason,
                    response_id: response.response_id,
                    cost_usd: response.cost_usd,
                    first_token_ms: first_token.millis(),
                },
                span,
            ));
            batch.extend(requested);
            batch.extend(after);
        }
        Err(None) => {}
        Err(Some(error)) => batch.push((
            EventKind::ModelFailed {
                turn,
                error: ModelFailure {
                    kind: error.kind,
                    message: error.message,
                    status: error.status,
                },
            },
            span,
        )),
    }
    // The next step is decided from these events; whatever it does outside the process
    // (a tool call, the next model call, the end of the run) starts with an append that
    // carries them to the store first.
    journal.stage(batch);
    Ok(())
}

/// Structured planner: turns the answer text into one action. A valid action rewrites the
/// assistant message (raw text kept as a provider item; a tool call, a control call or the
/// final answer added); an invalid one stays text and is followed by a re-ask.
fn structured_action(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    turn: u32,
    response: &mut ModelResponse,
    span: &str,
) -> Vec<(EventKind, String)> {
    let raw = response.message.text();
    let tool_names: Vec<&str> = agent.tools.names().collect();
    let raw_item = Part::ProviderItem {
        provider: STRUCTURED_PROVIDER.into(),
        item: serde_json::json!({ "raw": raw }),
    };
    let call = |name: &str, arguments: serde_json::Value| {
        Part::ToolCall(ToolCall {
            id: format!("act_{turn}"),
            name: name.to_string(),
            arguments: arguments.to_string(),
        })
    };
    let notice = |code: &str, message: String| {
        (
            EventKind::Notice {
                code: code.into(),
                message,
                data: None,
            },
            span.to_string(),
        )
    };
    let parts = match planner::parse_action(&raw, &tool_names) {
        Err(error) => {
            let attempt = journal
                .state()
                .run()
                .map(|r| r.invalid_actions)
                .unwrap_or(0)
                .saturating_add(1);
            return vec![
                notice(
                    INVALID_ACTION_NOTICE,
                    format!("invalid action (attempt {attempt}): {error}"),
                ),
                (
                    EventKind::UserMessage {
                        message: Message::user(format!(
                            "Your last reply was not a valid action: {error}. Reply with exactly one JSON action object."
                        )),
                    },
                    span.to_string(),
                ),
            ];
        }
        Ok(PlannerAction::CallTool { name, args }) => vec![raw_item, call(&name, args)],
        Ok(PlannerAction::AskUser {
            question,
            missing_fields,
        }) => vec![
            raw_item,
            call(
                planner::ASK_USER,
                serde_json::json!({ "question": question, "missing_fields": missing_fields }),
            ),
        ],
        Ok(PlannerAction::Replan { subgoals }) => {
            vec![
                raw_item,
                call(planner::REPLAN, serde_json::json!({ "subgoals": subgoals })),
            ]
        }
        Ok(PlannerAction::Stop { reason }) => vec![raw_item, Part::Text { text: reason }],
    };
    response.message.parts = parts;
    let reset = journal.state().run().is_some_and(|r| r.invalid_actions > 0);
    if reset {
        vec![notice(VALID_ACTION_NOTICE, "valid action".into())]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_token_is_the_first_fragment_of_the_answer_kept() {
        let mut first = FirstToken::new(Instant::now());
        // Bookkeeping is not the answer.
        first.observe(&StreamEvent::Retry {
            attempt: 1,
            error: ModelErrorKind::RateLimited,
            wait_ms: 0,
            message: "slow down".into(),
        });
        first.observe(&StreamEvent::TextDelta(String::new()));
        first.observe(&StreamEvent::Usage(keel_core::Usage::default()));
        assert_eq!(first.millis(), None);
        first.observe(&StreamEvent::TextDelta("Hel".into()));
        let seen = first.millis();
        assert!(seen.is_some());
        // Later fragments do not move it; a restart discards it.
        first.observe(&StreamEvent::TextDelta("lo".into()));
        assert_eq!(first.millis(), seen);
        first.observe(&StreamEvent::Restart);
        assert_eq!(first.millis(), None);
        first.observe(&StreamEvent::ToolCall(ToolCall {
            id: "c1".into(),
            name: "t".into(),
            arguments: "{}".into(),
        }));
        assert!(first.millis().is_some());
    }
}
