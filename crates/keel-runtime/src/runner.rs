//! The runner: the loop that asks `keel_core::decide` what to do, does it, and journals
//! what happened. It owns no state of its own — everything it needs is in the thread's
//! folded state — so a crashed run resumes by loading the log and calling this again.

use std::time::Instant;

use chrono::Utc;
use futures::StreamExt;
use keel_core::decide::Action;
use keel_core::event::{ModelFailure, new_span_id};
use keel_core::model::ResponseAssembler;
use keel_core::state::PendingCall;
use keel_core::{
    ApprovalMode as ToolApproval, EndState, EventKind, Message, ModelError, ModelErrorKind,
    ModelRequest, StreamEvent, ToolCall, ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind,
    decide, new_id,
};

use crate::agent::Agent;
use crate::context::{ApprovalDecision, ApprovalMode, RunContext};
use crate::executor::CallEnv;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;

/// Starts a new run on a thread.
pub(crate) async fn start(
    agent: &Agent,
    new_messages: Vec<Message>,
    thread: &mut Thread,
    ctx: &RunContext,
) -> Result<RunOutcome, RunError> {
    if new_messages.is_empty() {
        return Err(RunError::NoInput);
    }
    if let Some(run) = thread
        .state()
        .run()
        .filter(|_| thread.state().run_in_progress())
    {
        return Err(RunError::RunInProgress {
            thread_id: thread.id().to_string(),
            run_id: run.run_id.clone(),
        });
    }
    let goal = new_messages
        .iter()
        .map(Message::text)
        .collect::<Vec<_>>()
        .join("\n");
    let mut journal = Journal::start(thread, ctx, new_id("run"));
    let span = journal.run_span().to_string();
    let mut batch = vec![(
        EventKind::RunStarted {
            agent: agent.name.clone(),
            model: agent.model.id(),
            goal,
            constraints: Vec::new(),
            budget: agent.budget,
        },
        span.clone(),
    )];
    batch.extend(
        new_messages
            .into_iter()
            .map(|message| (EventKind::UserMessage { message }, span.clone())),
    );
    journal.append_batch(batch).await?;
    drive(agent, &mut journal).await
}

/// Resumes the run in progress on a thread.
pub(crate) async fn resume(
    agent: &Agent,
    thread: &mut Thread,
    ctx: &RunContext,
) -> Result<RunOutcome, RunError> {
    let Some(run_id) = thread
        .state()
        .run()
        .filter(|_| thread.state().run_in_progress())
        .map(|run| run.run_id.clone())
    else {
        return Err(RunError::NothingToResume(thread.id().to_string()));
    };
    let events = ctx.store.load(thread.id()).await?;
    let run_events: Vec<_> = events.into_iter().filter(|e| e.run_id == run_id).collect();
    let mut journal = Journal::resume(thread, ctx, run_events);
    drive(agent, &mut journal).await
}

/// The loop.
async fn drive(agent: &Agent, journal: &mut Journal<'_>) -> Result<RunOutcome, RunError> {
    loop {
        if journal.ctx().cancel.is_cancelled() && journal.state().run_in_progress() {
            finish(
                journal,
                EndState::Cancelled,
                Some("cancelled by the user".into()),
                None,
            )
            .await?;
            continue;
        }
        let action = decide(journal.state(), Utc::now());
        match action {
            Action::Finish {
                end_state,
                reason,
                final_text,
            } => {
                if journal.state().run_in_progress() {
                    finish(journal, end_state, reason, final_text).await?;
                }
                return Ok(outcome(journal, RunStatus::Ended { end_state }));
            }
            Action::CallModel { turn } => call_model(agent, journal, turn).await?,
            Action::ExecuteTools(calls) => {
                let calls: Vec<PendingCall> = calls.into_iter().cloned().collect();
                execute_tools(agent, journal, calls).await?;
            }
            Action::AwaitApproval(pending) => {
                let pending = pending.clone();
                if let Some(status) = await_approval(journal, pending).await? {
                    return Ok(outcome(journal, status));
                }
            }
            Action::AwaitUser {
                question,
                missing_fields,
            } => {
                let (question, missing_fields) = (question.to_string(), missing_fields.to_vec());
                let answer = tokio::select! {
                    answer = journal.ctx().user_input.answer(journal.thread_id(), &question, &missing_fields) => answer,
                    () = journal.ctx().cancel.cancelled() => continue,
                };
                match answer {
                    Some(answer) => journal.append(EventKind::UserAnswered { answer }).await?,
                    None => {
                        return Ok(outcome(
                            journal,
                            RunStatus::AwaitingUser {
                                question,
                                missing_fields,
                            },
                        ));
                    }
                }
            }
        }
    }
}

fn outcome(journal: &Journal<'_>, status: RunStatus) -> RunOutcome {
    RunOutcome::from_run_events(
        journal.thread_id(),
        journal.run_id(),
        journal.run_events(),
        status,
    )
}

/// Ends the run, first answering any unanswered tool call so the thread never holds an
/// orphan call.
async fn finish(
    journal: &mut Journal<'_>,
    end_state: EndState,
    reason: Option<String>,
    final_text: Option<String>,
) -> Result<(), RunError> {
    let unanswered: Vec<ToolCall> = journal
        .state()
        .unanswered_calls()
        .map(|p| p.call.clone())
        .collect();
    let span = journal.run_span().to_string();
    let because = reason.clone().unwrap_or_else(|| end_state.to_string());
    let mut batch: Vec<(EventKind, String)> = unanswered
        .into_iter()
        .map(|call| {
            let outcome = error_outcome(
                journal,
                &call,
                ToolErrorCode::Cancelled,
                format!("the run ended ({because}) before this call ran"),
            );
            (tool_finished(call, outcome), span.clone())
        })
        .collect();
    batch.push((
        EventKind::RunEnded {
            end_state,
            reason,
            final_text,
        },
        span,
    ));
    journal.append_batch(batch).await
}

async fn call_model(agent: &Agent, journal: &mut Journal<'_>, turn: u32) -> Result<(), RunError> {
    let (message_count, estimated) = {
        let request = build_request(agent, journal.state().messages());
        (
            request.messages.len(),
            agent.model.estimate_tokens(&request),
        )
    };
    let span = new_span_id();
    journal
        .append_batch(vec![(
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
                max_tokens: agent.max_output_tokens,
                context_window: Some(u64::from(agent.model.capabilities().context_window)),
            },
            span.clone(),
        )])
        .await?;

    let started = Instant::now();
    let mut retries = Vec::new();
    let result = {
        let ctx = journal.ctx();
        let (thread_id, run_id) = (journal.thread_id(), journal.run_id());
        let mut stream = agent
            .model
            .stream(build_request(agent, journal.state().messages()));
        let mut assembler = ResponseAssembler::new();
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(agent.stream_idle_timeout, stream.next()) => next,
                () = ctx.cancel.cancelled() => break Err(None),
            };
            match next {
                Err(_) => {
                    break Err(Some(ModelError::new(
                        ModelErrorKind::Timeout,
                        format!(
                            "the model stream was silent for {} s",
                            agent.stream_idle_timeout.as_secs()
                        ),
                    )));
                }
                Ok(None) if assembler.is_complete() => break Ok(assembler.finish()),
                Ok(None) => {
                    break Err(Some(ModelError::new(
                        ModelErrorKind::StreamInterrupted,
                        "the model stream ended before the answer was complete",
                    )));
                }
                Ok(Some(Err(error))) => break Err(Some(error)),
                Ok(Some(Ok(event))) => {
                    for observer in &ctx.observers {
                        observer.on_stream(thread_id, run_id, &event);
                    }
                    if let StreamEvent::Retry {
                        attempt,
                        error,
                        wait_ms,
                        ..
                    } = &event
                    {
                        retries.push((
                            EventKind::Retry {
                                scope: "model".into(),
                                attempt: *attempt,
                                class: error.to_string(),
                                wait_ms: *wait_ms,
                                call_id: None,
                            },
                            span.clone(),
                        ));
                    }
                    if matches!(event, StreamEvent::Restart) {
                        retries.push((
                            EventKind::Notice {
                                code: "stream_restarted".into(),
                                message: "the model stream restarted; partial output was discarded"
                                    .into(),
                                data: None,
                            },
                            span.clone(),
                        ));
                    }
                    assembler.push(&event);
                }
            }
        }
    };
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut batch = retries;
    match result {
        Ok(response) => {
            let requested: Vec<(EventKind, String)> = response
                .message
                .tool_calls()
                .map(|call| {
                    let spec = agent.executor.spec(&call.name);
                    let requires_approval = spec.is_some()
                        && (journal.ctx().approval_mode == ApprovalMode::Ask
                            || spec.is_some_and(|s| s.approval == ToolApproval::Always));
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
                },
                span,
            ));
            batch.extend(requested);
        }
        Err(None) => {
            // Cancelled: the loop records the end; only keep what was already known.
            journal.append_batch(batch).await?;
            return Ok(());
        }
        Err(Some(error)) => {
            batch.push((
                EventKind::ModelFailed {
                    turn,
                    error: ModelFailure {
                        kind: error.kind,
                        message: error.message,
                        status: error.status,
                    },
                },
                span,
            ));
        }
    }
    journal.append_batch(batch).await
}

async fn execute_tools(
    agent: &Agent,
    journal: &mut Journal<'_>,
    calls: Vec<PendingCall>,
) -> Result<(), RunError> {
    let mut to_run = Vec::new();
    let mut started = Vec::new();
    for pending in &calls {
        if pending.approval != Some(false) {
            started.push((
                EventKind::ToolCallStarted {
                    call_id: pending.call.id.clone(),
                    name: pending.call.name.clone(),
                },
                new_span_id(),
            ));
            to_run.push(pending.call.clone());
        }
    }
    journal.append_batch(started).await?;

    let ctx = journal.ctx().clone();
    let thread_id = journal.thread_id().to_string();
    let run_id = journal.run_id().to_string();
    let env = CallEnv {
        thread_id: &thread_id,
        run_id: &run_id,
        cancel: &ctx.cancel,
    };
    let mut executions = agent.executor.execute_ordered(to_run, env);
    // Results are committed in call order; denied calls take their place in that order.
    for pending in calls {
        let outcome = if pending.approval == Some(false) {
            let reason = pending
                .denial_reason
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            error_outcome(
                journal,
                &pending.call,
                ToolErrorCode::Denied,
                format!("a human denied this call: {reason}"),
            )
        } else {
            let Some((_, execution)) = executions.next().await else {
                break;
            };
            let mut batch: Vec<(EventKind, String)> = execution
                .retries
                .iter()
                .map(|retry| {
                    (
                        EventKind::Retry {
                            scope: "tool".into(),
                            attempt: retry.attempt,
                            class: retry.code.to_string(),
                            wait_ms: retry.wait_ms,
                            call_id: Some(pending.call.id.clone()),
                        },
                        new_span_id(),
                    )
                })
                .collect();
            batch.push((
                tool_finished(pending.call.clone(), execution.outcome),
                new_span_id(),
            ));
            journal.append_batch(batch).await?;
            continue;
        };
        journal
            .append_batch(vec![(tool_finished(pending.call, outcome), new_span_id())])
            .await?;
    }
    Ok(())
}

async fn await_approval(
    journal: &mut Journal<'_>,
    pending: PendingCall,
) -> Result<Option<RunStatus>, RunError> {
    let call = pending.call;
    if !pending.approval_requested {
        journal
            .append(EventKind::ApprovalRequested {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .await?;
    }
    let decision = if journal.ctx().approval_mode == ApprovalMode::Deny {
        ApprovalDecision::Deny {
            reason: Some("approvals are set to deny".into()),
        }
    } else {
        let ctx = journal.ctx().clone();
        tokio::select! {
            decision = ctx.approvals.decide(journal.thread_id(), &call) => decision,
            () = ctx.cancel.cancelled() => return Ok(None),
        }
    };
    match decision {
        ApprovalDecision::Approve => {
            journal
                .append(EventKind::ApprovalGranted {
                    call_id: call.id,
                    by: None,
                })
                .await?;
            Ok(None)
        }
        ApprovalDecision::Deny { reason } => {
            journal
                .append(EventKind::ApprovalDenied {
                    call_id: call.id,
                    reason,
                })
                .await?;
            Ok(None)
        }
        ApprovalDecision::Defer => Ok(Some(RunStatus::AwaitingApproval {
            call_id: call.id,
            tool: call.name,
        })),
    }
}

fn build_request<'a>(agent: &'a Agent, messages: &'a [Message]) -> ModelRequest<'a> {
    ModelRequest {
        system: Some(agent.system_prompt.as_str()).filter(|s| !s.is_empty()),
        messages,
        tools: &agent.tool_definitions,
        tool_choice: &agent.tool_choice,
        temperature: agent.temperature,
        top_p: None,
        max_output_tokens: agent.max_output_tokens,
        response_schema: None,
    }
}

fn error_outcome(
    journal: &Journal<'_>,
    call: &ToolCall,
    code: ToolErrorCode,
    message: String,
) -> ToolOutcome {
    ToolOutcome {
        tool: call.name.clone(),
        call_id: call.id.clone(),
        thread_id: journal.thread_id().to_string(),
        run_id: journal.run_id().to_string(),
        attempts: 0,
        latency_ms: 0,
        result: ToolResultKind::Error {
            code,
            message,
            details: None,
        },
    }
}

fn tool_finished(call: ToolCall, outcome: ToolOutcome) -> EventKind {
    let content = outcome.render_for_model();
    EventKind::ToolCallFinished {
        result: ToolResult {
            call_id: call.id,
            name: call.name,
            outcome,
            content,
        },
    }
}
