//! Executing one turn's tool calls: approvals, the control tools (`ask_user`, `replan`),
//! the executor for everything else (concurrently, committed in call order), the policy
//! engine on every failure (fallbacks, asking the user, stopping), normalized observations,
//! and critiques of each observation.

use std::sync::Arc;

use futures::StreamExt;
use keel_core::critic::{CriticInput, Subject};
use keel_core::event::{CriticNext, new_span_id};
use keel_core::observation::render_for_model;
use keel_core::planner::{ASK_USER, AskUserArgs, REPLAN, ReplanArgs};
use keel_core::policy::{PolicyContext, PolicyDecision, missing_required_fields};
use keel_core::state::PendingCall;
use keel_core::{
    EndState, EventKind, Message, ToolCall, ToolErrorCode, ToolOutcome, ToolResultKind,
};

use super::recovery::{
    call_started, forced_rerun_notice, is_read_only, may_have_run, recorded_key,
    relaxed_since_start, repeat_on_resume, resume_fallback, run_fallback, settle_interrupted,
};
use super::{error_outcome, ok_outcome, tool_finished};
use crate::context::{ApprovalDecision, ApprovalMode};
use crate::executor::{CallEnv, CallExtras};
use crate::journal::Journal;
use crate::outcome::{RunError, RunStatus};
use crate::tool_agent::ToolAgent;

/// How long a staged start of a call that may run again waits for the call to finish
/// before it is written anyway, while the call runs (see `execute_tools`).
const STAGED_START_FLUSH: std::time::Duration = std::time::Duration::from_millis(20);

pub(super) async fn execute_tools(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    calls: Vec<PendingCall>,
) -> Result<(), RunError> {
    // Calls that break one of the agent's call rules never run: each gets the rule's
    // message as an `invalid_input` result (a call resumed after it started is exempt).
    // So does a question to the user asked beside calls that will run.
    let mut refusals = call_rule_refusals(agent, journal, &calls);
    refuse_premature_questions(agent, &calls, &mut refusals);
    let is_executed = |p: &PendingCall| {
        p.approval != Some(false)
            && p.call.name != ASK_USER
            && p.call.name != REPLAN
            && agent.handoff_target(&p.call.name).is_none()
            && !refusals.contains_key(&p.call.id)
    };
    // A call that started before a crash and never finished: re-run it only when what its
    // start recorded (and the tool as it is now) says repeating it is harmless; otherwise it
    // gets an "interrupted, may have run" outcome and goes to the policy. A call whose
    // fallback had started is settled through the fallback: the original never runs again.
    let (interrupted, calls): (Vec<PendingCall>, Vec<PendingCall>) =
        calls.into_iter().partition(|p| {
            is_executed(p)
                && p.started
                && (p.fallback.is_some()
                    || !repeat_on_resume(agent, journal, &p.call.name, p.start.as_ref()))
        });
    // A forced resume (`rerun_relaxed_calls`) runs a relaxed call again: the log says so.
    let forced: Vec<EventKind> = calls
        .iter()
        .filter(|p| is_executed(p) && p.started)
        .filter(|p| relaxed_since_start(agent, &p.call.name, p.start.as_ref()))
        .map(|p| forced_rerun_notice(&p.call, &recorded_key(journal, p)))
        .collect();
    for notice in forced {
        journal.append(notice).await?;
    }
    for pending in interrupted {
        match pending.fallback.clone() {
            Some(fallback) => resume_fallback(agent, journal, pending, fallback).await?,
            None => {
                let key = recorded_key(journal, &pending);
                settle_interrupted(agent, journal, pending.call, None, key).await?;
            }
        }
    }
    if calls.is_empty() {
        return Ok(());
    }
    let started: Vec<(EventKind, String)> = calls
        .iter()
        .filter(|p| is_executed(p) && !p.started)
        .map(|p| (call_started(agent, journal, &p.call, None), new_span_id()))
        .collect();
    // The durability rule (docs/durability.md): a call that is not read-only starts only
    // once the model's answer carrying its id and its own start — with its effect and
    // idempotency key — are on stable storage, so a crash can neither lose the record
    // that it may have run nor let a re-asked model give it a new id and a new key. When
    // every call starting now is read-only, nothing outside the process depends on their
    // starts: they are staged (with the model's answer before them) and reach the store
    // with a later durable point — unless a call is still running after
    // `STAGED_START_FLUSH`, when they are written while it runs so that observers (a CLI's
    // progress line, a server's event stream) hear of it.
    let starts_effect = calls
        .iter()
        .any(|p| is_executed(p) && !p.started && !is_read_only(agent, &p.call.name));
    // A call resumed after a crash keeps the span and key its start recorded.
    let extras = call_extras(journal, &started);
    if starts_effect {
        journal
            .append_batch_with(started, keel_core::AppendDurability::Sync)
            .await?;
    } else if started.is_empty() {
        journal.flush().await?;
    } else {
        journal.stage(started);
    }

    let ctx = journal.ctx().clone();
    let thread_id = journal.thread_id().to_string();
    let run_id = journal.run_id().to_string();
    let env = CallEnv {
        thread_id: &thread_id,
        run_id: &run_id,
        cancel: &ctx.cancel,
        extras: Some(&extras),
    };
    let to_run: Vec<ToolCall> = calls
        .iter()
        .filter(|p| is_executed(p))
        .map(|p| p.call.clone())
        .collect();
    let mut executions = agent.executor.execute_ordered(to_run, env);
    let mut committed: Vec<String> = Vec::new();
    let mut handed_off: Option<String> = None;
    // Results are committed in call order; denied and control calls keep their place.
    for pending in calls {
        let call = pending.call.clone();
        if pending.approval == Some(false) {
            let reason = pending
                .denial_reason
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            let outcome = error_outcome(
                journal,
                &call,
                ToolErrorCode::Denied,
                format!("a human denied this call: {reason}"),
            );
            journal
                .append_batch(vec![(tool_finished(call, outcome, None), new_span_id())])
                .await?;
            continue;
        }
        if let Some(message) = refusals.get(&call.id) {
            let outcome =
                error_outcome(journal, &call, ToolErrorCode::InvalidInput, message.clone());
            let content = content_for(agent, &outcome);
            journal
                .append_batch(vec![(
                    tool_finished(call, outcome, Some(content)),
                    new_span_id(),
                )])
                .await?;
            continue;
        }
        if call.name == ASK_USER {
            ask_user(journal, call).await?;
            continue;
        }
        if call.name == REPLAN {
            replan(journal, call).await?;
            continue;
        }
        if let Some(target) = agent.handoff_target(&call.name) {
            crate::handoff::transfer(agent, journal, call, target, &mut handed_off).await?;
            continue;
        }
        let next = executions.next();
        let Some((_, execution)) = (if journal.has_staged() {
            let mut next = std::pin::pin!(next);
            tokio::select! {
                biased;
                done = &mut next => done,
                () = tokio::time::sleep(STAGED_START_FLUSH) => {
                    journal.flush().await?;
                    next.await
                }
            }
        } else {
            next.await
        }) else {
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
                        call_id: Some(call.id.clone()),
                    },
                    new_span_id(),
                )
            })
            .collect();
        let mut outcome = execution.outcome;
        super::recovery::mark_unknown_outcome(agent, &mut outcome);
        let mut decision = decide_policy(agent, journal, &call, &outcome, false);
        if let Some(PolicyDecision::Fallback { tool }) = &decision {
            let tool = tool.clone();
            batch.push(policy_event(
                &call,
                &outcome,
                decision.clone().unwrap_or(PolicyDecision::ReturnToModel),
            ));
            let (fallback_outcome, fallback_decision) = run_fallback(
                agent,
                journal,
                &call,
                &tool,
                std::mem::take(&mut batch),
                env,
            )
            .await?;
            outcome = fallback_outcome;
            decision = fallback_decision;
        }
        let content = content_for(agent, &outcome);
        batch.extend(finished_events(&call, outcome, Some(content), decision));
        // Results ride with the next durable point. Losing one to a crash costs running a
        // repeatable call again (with its recorded key); a call that is not repeatable is
        // then settled as "may have run", never run twice.
        journal.stage(batch);
        committed.push(call.id);
    }
    if let Some(target) = handed_off {
        // The conversation goes on with `target`, in a run of its own.
        let reason = format!("handed off to `{target}`");
        return super::finish(journal, EndState::Done, Some(reason), None).await;
    }
    if agent.critic.is_some() {
        critique_observations(agent, journal, &committed).await?;
    }
    Ok(())
}

/// A question to the user asked in the same turn as calls that will run is refused: their
/// results may answer it. Without this, a model that asks for figures its own calls of the
/// turn are about to return stops the run for an answer it already has — measured with
/// Qwen2.5-Coder-1.5B on the Detective, which called `get_test_details` and, beside it,
/// asked the user for the error rate, in every trial. The refusal is an `invalid_input`
/// result telling the model why; after reading the results it may ask again.
fn refuse_premature_questions(
    agent: &ToolAgent,
    calls: &[PendingCall],
    refusals: &mut std::collections::HashMap<String, String>,
) {
    let running: Vec<&str> = calls
        .iter()
        .filter(|p| {
            p.approval != Some(false)
                && p.call.name != ASK_USER
                && p.call.name != REPLAN
                && agent.handoff_target(&p.call.name).is_none()
                && !refusals.contains_key(&p.call.id)
        })
        .map(|p| p.call.name.as_str())
        .collect();
    if running.is_empty() {
        return;
    }
    let names = running
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    for pending in calls.iter().filter(|p| p.call.name == ASK_USER) {
        refusals.insert(
            pending.call.id.clone(),
            format!(
                "the question was not asked: this turn also calls {names}, whose results may \
                 answer it. Read those results first; ask the user only for what they do not say."
            ),
        );
    }
}

/// The calls of this turn that break one of the agent's call rules, with the message for
/// the model, judged against the run's successful calls so far (from its log) and the
/// calls let through earlier in the turn.
fn call_rule_refusals(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    calls: &[PendingCall],
) -> std::collections::HashMap<String, String> {
    let mut refusals = std::collections::HashMap::new();
    if agent.call_rules.is_empty() {
        return refusals;
    }
    let succeeded = successful_calls(journal);
    let past = past_calls(&succeeded);
    let mut in_flight: Vec<&str> = Vec::new();
    for pending in calls
        .iter()
        .filter(|p| p.approval != Some(false) && !p.started)
    {
        let arguments = pending
            .call
            .parse_arguments()
            .unwrap_or(serde_json::Value::Null);
        match keel_core::check_call(
            &agent.call_rules,
            &pending.call.name,
            &arguments,
            &past,
            &in_flight,
        ) {
            Ok(()) => in_flight.push(&pending.call.name),
            Err(message) => {
                refusals.insert(pending.call.id.clone(), message);
            }
        }
    }
    refusals
}

/// The run's successful tool calls so far, in order, as the call rules judge them: the
/// tool, its parsed arguments and its result data (from the run's log).
pub(super) fn successful_calls<'j>(
    journal: &'j Journal<'_>,
) -> Vec<(&'j str, serde_json::Value, &'j serde_json::Value)> {
    let mut requested: std::collections::HashMap<&str, (&str, serde_json::Value)> =
        std::collections::HashMap::new();
    let mut succeeded = Vec::new();
    for event in journal.run_events() {
        match &event.kind {
            EventKind::ToolCallRequested { call, .. } => {
                let arguments = call.parse_arguments().unwrap_or(serde_json::Value::Null);
                requested.insert(call.id.as_str(), (call.name.as_str(), arguments));
            }
            EventKind::ToolCallFinished { result } => {
                if let (ToolResultKind::Ok { data, .. }, Some((tool, arguments))) = (
                    &result.outcome.result,
                    requested.get(result.call_id.as_str()),
                ) {
                    succeeded.push((*tool, arguments.clone(), data));
                }
            }
            _ => {}
        }
    }
    succeeded
}

/// [`successful_calls`] as [`keel_core::PastCall`]s.
pub(super) fn past_calls<'a>(
    succeeded: &'a [(&'a str, serde_json::Value, &'a serde_json::Value)],
) -> Vec<keel_core::PastCall<'a>> {
    succeeded
        .iter()
        .map(|(tool, arguments, result)| keel_core::PastCall {
            tool,
            arguments,
            result,
        })
        .collect()
}

/// What the run lends the turn's tools: its trace, each call's span (the span of its
/// `tool_call_started`, new or — for a call resumed after a crash — recorded), and the
/// run context.
pub(super) fn call_extras(journal: &Journal<'_>, started: &[(EventKind, String)]) -> CallExtras {
    let recorded = journal.run_events().iter().map(|e| (&e.kind, &e.span_id));
    let mut spans = std::collections::HashMap::new();
    let mut keys = std::collections::HashMap::new();
    for (kind, span) in recorded.chain(started.iter().map(|(kind, span)| (kind, span))) {
        if let EventKind::ToolCallStarted {
            call_id,
            idempotency_key,
            ..
        } = kind
        {
            spans.insert(call_id.clone(), span.clone());
            if let Some(key) = idempotency_key {
                keys.insert(call_id.clone(), key.clone());
            }
        }
    }
    let runtime: Arc<dyn std::any::Any + Send + Sync> = Arc::new(journal.ctx().clone());
    CallExtras {
        trace_id: journal.trace_id().to_string(),
        spans,
        keys,
        runtime: Some(runtime),
        credentials: journal.ctx().credentials.clone(),
    }
}

/// The events that close a call: its `ToolCallFinished` (which takes the outcome, not a
/// copy of it), then — when the policy decided something — the question it asks the user
/// and the decision.
pub(super) fn finished_events(
    call: &ToolCall,
    outcome: ToolOutcome,
    content: Option<String>,
    decision: Option<PolicyDecision>,
) -> Vec<(EventKind, String)> {
    let mut events = Vec::with_capacity(3);
    let policy = decision.map(|decision| {
        let asked = match &decision {
            PolicyDecision::AskUser {
                question,
                missing_fields,
            } => Some(EventKind::UserAsked {
                question: question.clone(),
                missing_fields: missing_fields.clone(),
            }),
            _ => None,
        };
        (asked, policy_event(call, &outcome, decision))
    });
    events.push((tool_finished(call.clone(), outcome, content), new_span_id()));
    if let Some((asked, decision)) = policy {
        if let Some(asked) = asked {
            events.push((asked, new_span_id()));
        }
        events.push(decision);
    }
    events
}

pub(super) fn policy_event(
    call: &ToolCall,
    outcome: &ToolOutcome,
    decision: PolicyDecision,
) -> (EventKind, String) {
    (
        EventKind::PolicyApplied {
            call_id: call.id.clone(),
            tool: outcome.tool.clone(),
            error_code: outcome.error_code().unwrap_or(ToolErrorCode::ToolBug),
            decision,
        },
        new_span_id(),
    )
}

/// The policy decision for a failed outcome (`None` on success).
pub(super) fn decide_policy(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    call: &ToolCall,
    outcome: &ToolOutcome,
    is_fallback: bool,
) -> Option<PolicyDecision> {
    outcome.error_code()?;
    let missing = match &outcome.result {
        ToolResultKind::Error { details, .. } => missing_required_fields(details.as_ref()),
        ToolResultKind::Ok { .. } => Vec::new(),
    };
    let same_missing_field_failures = if missing.is_empty() {
        0
    } else {
        journal
            .run_events()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolCallFinished { result } if result.name == outcome.tool => {
                    match &result.outcome.result {
                        ToolResultKind::Error {
                            code: ToolErrorCode::InvalidInput,
                            details,
                            ..
                        } => Some(missing_required_fields(details.as_ref())),
                        _ => None,
                    }
                }
                _ => None,
            })
            .filter(|earlier| *earlier == missing)
            .count() as u32
            + 1
    };
    let decision = agent.policy.decide(
        outcome,
        PolicyContext {
            arguments: &call.arguments,
            same_missing_field_failures,
            is_fallback,
        },
    );
    // What may have happened is never followed by a fallback blindly: the model is told.
    match decision {
        Some(PolicyDecision::Fallback { .. }) if may_have_run(outcome) => {
            Some(PolicyDecision::ReturnToModel)
        }
        other => other,
    }
}

/// What the model sees for an outcome, per the agent's observation mode.
pub(super) fn content_for(agent: &ToolAgent, outcome: &ToolOutcome) -> String {
    let observation = agent
        .executor
        .tool(&outcome.tool)
        .and_then(|tool| tool.normalize(outcome))
        .unwrap_or_else(|| agent.normalizer.normalize(outcome));
    render_for_model(outcome, Some(&observation), agent.observation_mode)
}

async fn ask_user(journal: &mut Journal<'_>, call: ToolCall) -> Result<(), RunError> {
    let args = call
        .parse_arguments()
        .ok()
        .and_then(|v| serde_json::from_value::<AskUserArgs>(v).ok());
    match args {
        Some(args) if !args.question.trim().is_empty() => {
            journal
                .append(EventKind::UserAsked {
                    question: args.question,
                    missing_fields: args.missing_fields,
                })
                .await
        }
        _ => {
            let outcome = error_outcome(
                journal,
                &call,
                ToolErrorCode::InvalidInput,
                "ask_user needs {\"question\": string, \"missing_fields\"?: [string]}".into(),
            );
            journal
                .append_batch(vec![(tool_finished(call, outcome, None), new_span_id())])
                .await
        }
    }
}

async fn replan(journal: &mut Journal<'_>, call: ToolCall) -> Result<(), RunError> {
    let args = call
        .parse_arguments()
        .ok()
        .and_then(|v| serde_json::from_value::<ReplanArgs>(v).ok());
    match args {
        Some(args) if !args.subgoals.is_empty() => {
            let outcome = ok_outcome(
                journal,
                &call,
                serde_json::json!({"status": "plan recorded", "subgoals": args.subgoals}),
            );
            let span = new_span_id();
            journal
                .append_batch(vec![
                    (
                        EventKind::Replanned {
                            subgoals: args.subgoals,
                        },
                        span.clone(),
                    ),
                    (tool_finished(call, outcome, None), span),
                ])
                .await
        }
        _ => {
            let outcome = error_outcome(
                journal,
                &call,
                ToolErrorCode::InvalidInput,
                "replan needs {\"subgoals\": [string, ...]} with at least one subgoal".into(),
            );
            journal
                .append_batch(vec![(tool_finished(call, outcome, None), new_span_id())])
                .await
        }
    }
}

/// Critiques each new observation; a critic may ask for a replan, a clarification, or stop.
async fn critique_observations(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    call_ids: &[String],
) -> Result<(), RunError> {
    let Some(critic) = &agent.critic else {
        return Ok(());
    };
    // The critic is a model call: the results it judges are stored first.
    journal.flush().await?;
    let goal = journal
        .run_events()
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { goal, .. } => Some(goal.clone()),
            _ => None,
        })
        .unwrap_or_default();
    for call_id in call_ids {
        let result = journal
            .state()
            .messages()
            .iter()
            .rev()
            .flat_map(Message::tool_results)
            .find(|r| &r.call_id == call_id)
            .cloned();
        let Some(result) = result else { continue };
        let verdict = critic
            .assess(CriticInput {
                goal: &goal,
                messages: journal.state().messages(),
                subject: Subject::Observation(&result),
            })
            .await;
        let gaps = verdict.known_gaps.join("; ");
        let mut batch = vec![(
            EventKind::Critique {
                satisfied: verdict.satisfied,
                known_gaps: verdict.known_gaps.clone(),
                next: verdict.next,
                next_tool: verdict.next_tool.clone(),
            },
            new_span_id(),
        )];
        match verdict.next {
            CriticNext::Continue => {}
            CriticNext::Replan => batch.push((
                EventKind::UserMessage {
                    message: Message::user(format!("A reviewer suggests re-planning: {gaps}")),
                },
                new_span_id(),
            )),
            CriticNext::Clarify => batch.push((
                EventKind::UserAsked {
                    question: format!("Could you clarify: {gaps}?"),
                    missing_fields: Vec::new(),
                },
                new_span_id(),
            )),
            CriticNext::Stop => batch.push(policy_event(
                &ToolCall {
                    id: result.call_id.clone(),
                    name: result.name.clone(),
                    arguments: String::new(),
                },
                &result.outcome,
                PolicyDecision::Stop {
                    end_state: EndState::Failed,
                    reason: format!("the critic stopped the run: {gaps}"),
                    action_item: None,
                    alert: false,
                },
            )),
        }
        journal.append_batch(batch).await?;
    }
    Ok(())
}

pub(super) async fn await_approval(
    journal: &mut Journal<'_>,
    pending: PendingCall,
) -> Result<Option<RunStatus>, RunError> {
    let call = pending.call;
    // Whoever decides (a person, a callback) sees only stored events: the request carries
    // everything staged before it to the store (or, asked again on resume, a flush does).
    if pending.approval_requested {
        journal.flush().await?;
    } else {
        journal
            .append(EventKind::ApprovalRequested {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .await?;
    }
    let decision = if journal.ctx().approval_mode_for(&call.name) == ApprovalMode::Deny {
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
                    by: None,
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
