//! The runner: the loop that asks `keel_core::decide` what to do, does it, and journals
//! what happened. It owns no state of its own — everything it needs is in the thread's
//! folded state — so a crashed run resumes by loading the log and calling this again.
//!
//! Submodules: [`model_call`] (one model call, streamed, including the structured
//! planner's action parsing), [`tools`] (executing a turn's calls with control tools,
//! the policy engine and observation critiques) and [`recovery`] (what a call's start
//! records, fallbacks as calls of their own, and settling what may have happened).

mod model_call;
mod recovery;
mod tools;

pub use model_call::{FirstToken, stream_event_record};

use chrono::Utc;
use keel_core::critic::{CriticInput, Subject};
use keel_core::decide::Action;
use keel_core::event::CriticNext;
use keel_core::planner::ASK_USER;
use keel_core::state::PendingCall;
use keel_core::{
    EndState, EventKind, Message, ToolCall, ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind,
    decide, new_id,
};

use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome, RunStatus};
use crate::thread::Thread;
use crate::tool_agent::ToolAgent;

/// Starts a new run on a thread.
pub(crate) async fn start(
    agent: &ToolAgent,
    new_messages: Vec<Message>,
    thread: &mut Thread,
    ctx: &RunContext,
) -> Result<RunOutcome, RunError> {
    thread.reload_if_diverged(ctx.store.as_ref()).await?;
    thread.check_home(&agent.name, None)?;
    let opening = crate::custom::RunOpening {
        agent: agent.name.clone(),
        model: agent.model.id(),
        budget: agent.budget,
        definition: Some(Box::new(agent.definition.clone())),
    };
    let (mut journal, batch) = crate::custom::open_run(thread, ctx, opening, new_messages).await?;
    // Nothing leaves the process before the first model call's `ModelRequested`, which
    // carries these events to the store in the same transaction.
    journal.stage(batch);
    drive(agent, &mut journal).await
}

/// Resumes the run in progress on a thread.
pub(crate) async fn resume(
    agent: &ToolAgent,
    thread: &mut Thread,
    ctx: &RunContext,
) -> Result<RunOutcome, RunError> {
    thread.reload_if_diverged(ctx.store.as_ref()).await?;
    thread.check_home(&agent.name, None)?;
    if !thread.state().run_in_progress() {
        if crate::outcome::retryable_failure(thread.run_events()).is_some() {
            return continue_failed(agent, thread, ctx).await;
        }
        return Err(RunError::NothingToResume(thread.id().to_string()));
    }
    let changes = check_resumable(agent, thread)?;
    let mut journal = Journal::resume(thread, ctx);
    if !changes.is_empty() {
        journal
            .append(EventKind::Notice {
                code: AGENT_CHANGED_NOTICE.into(),
                message: format!(
                    "the run continues with a changed agent: {}",
                    changes.join("; ")
                ),
                data: Some(serde_json::json!({ "changes": changes })),
            })
            .await?;
    }
    drive(agent, &mut journal).await
}

/// Notice code recorded when a run continues with an agent that differs (compatibly)
/// from the one it started with.
pub const AGENT_CHANGED_NOTICE: &str = "agent_changed";

/// Notice code opening a run that continues one which ended `failed` on a retryable model
/// error; its data names that run (`continues`) and the error.
pub const RUN_CONTINUED_NOTICE: &str = "run_continued";

/// Continues a run that ended `failed` on a retryable model error: the ended run stays
/// ended (its log is never reopened); a new run on the thread, with the same goal and
/// budget, starts with a [`RUN_CONTINUED_NOTICE`] naming it and asks the model again from
/// the conversation as it stood.
async fn continue_failed(
    agent: &ToolAgent,
    thread: &mut Thread,
    ctx: &RunContext,
) -> Result<RunOutcome, RunError> {
    let changes = check_resumable(agent, thread)?;
    let failed = thread.run_events().first().map(|e| e.run_id.clone());
    let failure = crate::outcome::retryable_failure(thread.run_events()).cloned();
    let goal = thread
        .run_events()
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { goal, .. } => Some(goal.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mut journal = Journal::start(thread, ctx, new_id("run"));
    let span = journal.run_span().to_string();
    let mut batch = vec![
        (
            EventKind::RunStarted {
                agent: agent.name.clone(),
                model: agent.model.id(),
                goal,
                constraints: Vec::new(),
                budget: agent.budget,
                definition: Some(Box::new(agent.definition.clone())),
                parent_span_id: None,
            },
            span.clone(),
        ),
        (
            EventKind::Notice {
                code: RUN_CONTINUED_NOTICE.into(),
                message: format!(
                    "continues run {}, which failed on a retryable model error: {}",
                    failed.as_deref().unwrap_or("?"),
                    failure
                        .as_ref()
                        .map(|f| format!("{}: {}", f.kind, f.message))
                        .unwrap_or_default()
                ),
                data: Some(serde_json::json!({ "continues": failed, "error": failure })),
            },
            span.clone(),
        ),
    ];
    if !changes.is_empty() {
        batch.push((
            EventKind::Notice {
                code: AGENT_CHANGED_NOTICE.into(),
                message: format!(
                    "the run continues with a changed agent: {}",
                    changes.join("; ")
                ),
                data: Some(serde_json::json!({ "changes": changes })),
            },
            span,
        ));
    }
    journal.append_batch(batch).await?;
    drive(agent, &mut journal).await
}

/// Compares `agent` with the definition the thread's latest run recorded when it started:
/// an incompatible agent (a tool of the run gone or reshaped) is refused before anything
/// is appended; compatible differences are returned to be recorded. Runs recorded before
/// definitions existed are continued as they are.
pub(crate) fn check_resumable(agent: &ToolAgent, thread: &Thread) -> Result<Vec<String>, RunError> {
    thread.check_home(&agent.name, None)?;
    let recorded = thread.run_events().iter().find_map(|e| match &e.kind {
        EventKind::RunStarted { definition, .. } => definition.as_ref(),
        _ => None,
    });
    let Some(recorded) = recorded else {
        return Ok(Vec::new());
    };
    let comparison = agent
        .definition
        .fingerprint
        .compare_with(&recorded.fingerprint);
    if !comparison.is_compatible() {
        return Err(RunError::IncompatibleAgent {
            thread_id: thread.id().to_string(),
            problems: comparison.incompatible,
        });
    }
    Ok(comparison.changed)
}

/// The loop.
async fn drive(agent: &ToolAgent, journal: &mut Journal<'_>) -> Result<RunOutcome, RunError> {
    loop {
        if journal.state().run_in_progress() {
            if journal.ctx().cancel.is_cancelled() {
                finish(
                    journal,
                    EndState::Cancelled,
                    Some("cancelled by the user".into()),
                    None,
                )
                .await?;
                continue;
            }
            let invalid = journal
                .state()
                .run()
                .map(|r| r.invalid_actions)
                .unwrap_or(0);
            if invalid > agent.max_invalid_actions {
                let reason = format!(
                    "the model gave no valid action after {} re-asks",
                    agent.max_invalid_actions
                );
                finish(journal, EndState::Failed, Some(reason), None).await?;
                continue;
            }
        }
        let action = decide(journal.state(), Utc::now());
        match action {
            Action::Finish {
                end_state,
                reason,
                final_text,
            } => {
                if !journal.state().run_in_progress() {
                    return Ok(outcome(journal, RunStatus::Ended { end_state }));
                }
                if end_state == EndState::Done && agent.critic.is_some() {
                    // The critic is a model call: what it judges is stored first.
                    journal.flush().await?;
                    match critique_final_answer(agent, journal).await? {
                        FinalVerdict::Accepted => {}
                        FinalVerdict::SentBack => continue,
                        FinalVerdict::Rejected(reason) => {
                            finish(journal, EndState::Failed, Some(reason), final_text).await?;
                            continue;
                        }
                    }
                }
                finish(journal, end_state, reason, final_text).await?;
            }
            Action::CallModel {
                turn,
                final_summary,
            } => {
                model_call::call_model(agent, journal, turn, final_summary).await?;
            }
            Action::ExecuteTools(calls) => {
                let calls: Vec<PendingCall> = calls.into_iter().cloned().collect();
                tools::execute_tools(agent, journal, calls).await?;
            }
            Action::AwaitApproval(pending) => {
                let pending = pending.clone();
                if let Some(status) = tools::await_approval(journal, pending).await? {
                    return Ok(outcome(journal, status));
                }
            }
            Action::AwaitUser {
                question,
                missing_fields,
            } => {
                let (question, missing_fields) = (question.to_string(), missing_fields.to_vec());
                journal.flush().await?;
                await_user(journal, question, missing_fields).await?;
            }
        }
    }
}

/// Asks the user-input source; without an answer the run ends `clarify_needed` with the
/// question in its outcome (a later run on the thread carries the answer).
async fn await_user(
    journal: &mut Journal<'_>,
    question: String,
    missing_fields: Vec<String>,
) -> Result<(), RunError> {
    let ctx = journal.ctx().clone();
    let answer = tokio::select! {
        answer = ctx.user_input.answer(journal.thread_id(), &question, &missing_fields) => answer,
        () = ctx.cancel.cancelled() => return Ok(()),
    };
    let ask_call = journal
        .state()
        .unanswered_calls()
        .find(|p| p.call.name == ASK_USER)
        .map(|p| p.call.clone());
    match (answer, ask_call) {
        (Some(answer), Some(call)) => {
            let outcome = ok_outcome(journal, &call, serde_json::json!({ "answer": answer }));
            journal
                .append_batch(vec![(
                    tool_finished(call, outcome, None),
                    journal.run_span().to_string(),
                )])
                .await
        }
        (Some(answer), None) => journal.append(EventKind::UserAnswered { answer }).await,
        (None, _) => {
            let reason = format!("waiting for the user's answer to: {question}");
            finish(journal, EndState::ClarifyNeeded, Some(reason), None).await
        }
    }
}

enum FinalVerdict {
    Accepted,
    SentBack,
    Rejected(String),
}

/// Runs the critic on the final answer (once per answer), journals the verdict, and sends
/// an unsatisfied answer back to the model with its gaps, a bounded number of times.
async fn critique_final_answer(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
) -> Result<FinalVerdict, RunError> {
    let Some(critic) = &agent.critic else {
        return Ok(FinalVerdict::Accepted);
    };
    let Some(run) = journal.state().run() else {
        return Ok(FinalVerdict::Accepted);
    };
    if let Some(satisfied) = run.answer_verdict {
        // Already judged (e.g. before a crash): a rejected answer past the limit fails.
        return Ok(
            if satisfied || run.critic_rejections <= agent.max_critic_rejections {
                FinalVerdict::Accepted
            } else {
                FinalVerdict::Rejected("the critic rejected the final answer".into())
            },
        );
    }
    let goal = journal
        .run_events()
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { goal, .. } => Some(goal.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let answer = journal
        .state()
        .messages()
        .last()
        .map(Message::text)
        .unwrap_or_default();
    let verdict = critic
        .assess(CriticInput {
            goal: &goal,
            messages: journal.state().messages(),
            subject: Subject::FinalAnswer(&answer),
        })
        .await;
    let gaps = verdict.known_gaps.join("; ");
    journal
        .append(EventKind::Critique {
            satisfied: verdict.satisfied,
            known_gaps: verdict.known_gaps.clone(),
            next: verdict.next,
            next_tool: verdict.next_tool.clone(),
        })
        .await?;
    if verdict.satisfied {
        return Ok(FinalVerdict::Accepted);
    }
    let rejections = journal
        .state()
        .run()
        .map(|r| r.critic_rejections)
        .unwrap_or(0);
    if rejections > agent.max_critic_rejections || verdict.next == CriticNext::Stop {
        return Ok(FinalVerdict::Rejected(format!(
            "the critic rejected the final answer {rejections} time(s): {gaps}"
        )));
    }
    let feedback = format!(
        "Your answer is not complete yet. Missing: {gaps}. Address every gap (use the tools if needed), then give your final answer."
    );
    journal
        .append(EventKind::UserMessage {
            message: Message::user(feedback),
        })
        .await?;
    Ok(FinalVerdict::SentBack)
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
pub(crate) async fn finish(
    journal: &mut Journal<'_>,
    end_state: EndState,
    reason: Option<String>,
    final_text: Option<String>,
) -> Result<(), RunError> {
    let unanswered: Vec<PendingCall> = journal.state().unanswered_calls().cloned().collect();
    let span = journal.run_span().to_string();
    let because = reason.clone().unwrap_or_else(|| end_state.to_string());
    let mut batch: Vec<(EventKind, String)> = unanswered
        .into_iter()
        .map(|pending| {
            let call = pending.call.clone();
            let outcome = unanswered_outcome(journal, &pending, &because);
            (tool_finished(call, outcome, None), span.clone())
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

/// The outcome of a call still unanswered when its run ends. A call that started (itself
/// or its fallback) and is not read-only may have taken effect: its outcome says so
/// (`may_have_run`, with its key) instead of claiming it never ran.
fn unanswered_outcome(journal: &Journal<'_>, pending: &PendingCall, because: &str) -> ToolOutcome {
    let call = &pending.call;
    if call.name == ASK_USER {
        let message =
            format!("the run ended ({because}); the user's reply will arrive as a new message");
        return error_outcome(journal, call, ToolErrorCode::Cancelled, message);
    }
    let started_effect = pending
        .fallback
        .as_ref()
        .map(|fallback| fallback.start.as_ref().map(|s| s.effect))
        .or(pending.started.then_some(pending.effect));
    let Some(effect) = started_effect else {
        let message = format!("the run ended ({because}) before this call ran");
        return error_outcome(journal, call, ToolErrorCode::Cancelled, message);
    };
    if effect == Some(keel_core::Effect::ReadOnly) {
        let message = format!("the run ended ({because}) while this read-only call ran");
        return error_outcome(journal, call, ToolErrorCode::Cancelled, message);
    }
    let key = pending
        .fallback
        .as_ref()
        .and_then(|fallback| fallback.start.as_ref())
        .or(pending.start.as_ref())
        .and_then(|start| start.idempotency_key.clone())
        .unwrap_or_else(|| recovery::default_key(journal, &call.id));
    let mut outcome = error_outcome(
        journal,
        call,
        ToolErrorCode::Cancelled,
        format!(
            "the run ended ({because}) after this call started; it may or may not have taken effect. Check its \
             effect before calling it again (idempotency key {key})."
        ),
    );
    if let ToolResultKind::Error { details, .. } = &mut outcome.result {
        *details = Some(recovery::may_have_run_details(&key));
    }
    outcome
}

pub(crate) fn error_outcome(
    journal: &Journal<'_>,
    call: &ToolCall,
    code: ToolErrorCode,
    message: String,
) -> ToolOutcome {
    base_outcome(
        journal,
        call,
        ToolResultKind::Error {
            code,
            message,
            details: None,
        },
    )
}

pub(crate) fn ok_outcome(
    journal: &Journal<'_>,
    call: &ToolCall,
    data: serde_json::Value,
) -> ToolOutcome {
    base_outcome(
        journal,
        call,
        ToolResultKind::Ok {
            data,
            schema_validated: true,
            truncated: false,
        },
    )
}

fn base_outcome(journal: &Journal<'_>, call: &ToolCall, result: ToolResultKind) -> ToolOutcome {
    ToolOutcome {
        tool: call.name.clone(),
        call_id: call.id.clone(),
        thread_id: journal.thread_id().to_string(),
        run_id: journal.run_id().to_string(),
        attempts: 0,
        latency_ms: 0,
        repairs: Vec::new(),
        result,
    }
}

/// The `ToolCallFinished` event for a call; `content` overrides what the model sees.
pub(crate) fn tool_finished(
    call: ToolCall,
    outcome: ToolOutcome,
    content: Option<String>,
) -> EventKind {
    let content = content.unwrap_or_else(|| outcome.render_for_model());
    EventKind::ToolCallFinished {
        result: std::sync::Arc::new(ToolResult {
            call_id: call.id,
            name: call.name,
            outcome,
            content,
        }),
    }
}
