//! What a call's start records, and how what may have happened is settled: whether a
//! started call may run again (the record governs, not the tool's spec of the moment), the
//! `tool_call_started` of a call or a fallback with its effect and idempotency key, a
//! fallback run as a call of its own, a fallback found started on resume, and outcomes that
//! are unknown (`may_have_run`, never followed by a fallback). docs/durability.md, "The
//! durability rule".

use keel_core::event::new_span_id;
use keel_core::policy::PolicyDecision;
use keel_core::state::{PendingCall, RecordedFallback, RecordedStart};
use keel_core::{Effect, EventKind, ToolCall, ToolErrorCode, ToolOutcome, ToolResultKind};

use super::error_outcome;
use super::tools::{call_extras, content_for, decide_policy, finished_events};
use crate::executor::CallEnv;
use crate::journal::Journal;
use crate::outcome::RunError;
use crate::tool_agent::ToolAgent;

/// The details of an outcome that may or may not have taken effect: the model is told so,
/// with the key to check it by.
pub(super) fn may_have_run_details(idempotency_key: &str) -> serde_json::Value {
    serde_json::json!({
        "interrupted": true,
        "may_have_run": true,
        "idempotency_key": idempotency_key,
    })
}

/// Whether a call of this tool may run again after an interruption, as the tool is now:
/// it is not mutating, or it is mutating behind an idempotency key it honours (an unknown
/// tool is never run, so repeating it is harmless).
pub(super) fn repeatable_now(agent: &ToolAgent, name: &str) -> bool {
    agent
        .executor
        .spec(name)
        .is_none_or(|spec| spec.effect != Effect::Mutating || spec.honours_idempotency_key)
}

/// Whether a call that started and never finished runs again on resume. What its start
/// recorded governs: a call recorded as not repeatable is not repeated, whatever the
/// tool's spec says now (a relaxed effect does not re-run a started payment) — unless the
/// resume was forced to ([`RunContext::rerun_relaxed_calls`](crate::RunContext)). A call
/// whose start predates that record is judged by the tool as it is now.
pub(super) fn repeat_on_resume(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    name: &str,
    recorded: Option<&RecordedStart>,
) -> bool {
    repeatable_now(agent, name)
        && (journal.ctx().rerun_relaxed_calls || recorded.is_none_or(|start| start.repeatable))
}

/// Whether a started call is held back only by what its start recorded: the tool has
/// been relaxed since, so that repeating it now looks harmless.
pub(super) fn relaxed_since_start(
    agent: &ToolAgent,
    name: &str,
    recorded: Option<&RecordedStart>,
) -> bool {
    repeatable_now(agent, name) && recorded.is_some_and(|start| !start.repeatable)
}

/// The notice of a started call run again because the resume was forced to
/// (`rerun_relaxed_calls`) although its start recorded it as not repeatable.
pub(super) fn forced_rerun_notice(call: &ToolCall, idempotency_key: &str) -> EventKind {
    EventKind::Notice {
        code: "relaxed_call_rerun".into(),
        message: format!(
            "call {} of `{}` started as mutating and may already have taken effect; it runs \
             again because the resume was forced (--rerun-relaxed-calls) and the tool is now \
             declared repeatable (idempotency key {idempotency_key})",
            call.id, call.name
        ),
        data: Some(serde_json::json!({
            "call_id": call.id,
            "tool": call.name,
            "idempotency_key": idempotency_key,
        })),
    }
}

/// Whether calls of this tool only read: their starts may be staged.
pub(super) fn is_read_only(agent: &ToolAgent, name: &str) -> bool {
    agent
        .executor
        .spec(name)
        .is_none_or(|spec| spec.effect == Effect::ReadOnly)
}

/// The `ToolCallStarted` of a call (or of a fallback standing in for `fallback_for`),
/// recording what governs a resume: the effect, whether repeating is harmless, and the
/// idempotency key — fixed here, never derived again from a later model answer.
pub(super) fn call_started(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    call: &ToolCall,
    fallback_for: Option<String>,
) -> EventKind {
    let spec = agent.executor.spec(&call.name);
    let effect = spec.map(|s| s.effect);
    let idempotency_key = effect
        .filter(|effect| *effect != Effect::ReadOnly)
        .map(|_| default_key(journal, &call.id));
    EventKind::ToolCallStarted {
        call_id: call.id.clone(),
        name: call.name.clone(),
        effect,
        repeatable: repeatable_now(agent, &call.name),
        idempotency_key,
        fallback_for,
    }
}

/// The idempotency key of a call whose start recorded none (read-only, or an older log).
pub(super) fn default_key(journal: &Journal<'_>, call_id: &str) -> String {
    format!("{}:{call_id}", journal.thread_id())
}

/// The key a started call was given: the one its start recorded, else the default.
pub(super) fn recorded_key(journal: &Journal<'_>, pending: &PendingCall) -> String {
    pending
        .start
        .as_ref()
        .and_then(|start| start.idempotency_key.clone())
        .unwrap_or_else(|| default_key(journal, &pending.call.id))
}

/// A call that is not read-only and timed out or was abandoned after it started may have
/// taken effect: its outcome says so (`may_have_run`), and no fallback follows it.
pub(super) fn mark_unknown_outcome(agent: &ToolAgent, outcome: &mut ToolOutcome) {
    if outcome.attempts == 0 || is_read_only(agent, &outcome.tool) {
        return;
    }
    if let ToolResultKind::Error {
        code: ToolErrorCode::Timeout | ToolErrorCode::Cancelled,
        details,
        ..
    } = &mut outcome.result
    {
        let mut map = match details.take() {
            Some(serde_json::Value::Object(map)) => map,
            Some(other) => {
                let mut map = serde_json::Map::new();
                map.insert("tool_details".into(), other);
                map
            }
            None => serde_json::Map::new(),
        };
        map.insert("may_have_run".into(), serde_json::Value::Bool(true));
        *details = Some(serde_json::Value::Object(map));
    }
}

/// Whether an outcome says its call may have taken effect.
pub(super) fn may_have_run(outcome: &ToolOutcome) -> bool {
    matches!(
        &outcome.result,
        ToolResultKind::Error { details: Some(details), .. }
            if details.get("may_have_run").and_then(serde_json::Value::as_bool) == Some(true)
    )
}

/// Runs the fallback the policy chose for a failed call, as a call of its own: its start
/// (own id, effect and key, `fallback_for` naming the call) is journalled — synchronously
/// with everything before it when the fallback is not read-only, so it runs at most once
/// even across a crash — then it runs through the executor. `batch` holds the failed
/// call's retries and policy decision, journalled with the start.
pub(super) async fn run_fallback(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    call: &ToolCall,
    tool: &str,
    mut batch: Vec<(EventKind, String)>,
    env: CallEnv<'_>,
) -> Result<(ToolOutcome, Option<PolicyDecision>), RunError> {
    let fallback_call = ToolCall {
        id: format!("{}.fallback.{tool}", call.id),
        name: tool.to_string(),
        arguments: call.arguments.clone(),
    };
    let start = call_started(agent, journal, &fallback_call, Some(call.id.clone()));
    let key = match &start {
        EventKind::ToolCallStarted {
            idempotency_key, ..
        } => idempotency_key.clone(),
        _ => None,
    };
    let span = new_span_id();
    batch.push((start, span.clone()));
    if is_read_only(agent, tool) {
        journal.stage(batch);
    } else {
        journal
            .append_batch_with(batch, keel_core::AppendDurability::Sync)
            .await?;
    }
    Ok(execute_fallback(agent, journal, &fallback_call, key, span, env).await)
}

/// Executes a fallback call with its recorded key and span; its outcome is judged by the
/// policy as a fallback's (no second fallback), and an unknown outcome is marked.
async fn execute_fallback(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    fallback_call: &ToolCall,
    key: Option<String>,
    span: String,
    env: CallEnv<'_>,
) -> (ToolOutcome, Option<PolicyDecision>) {
    let mut extras = env.extras.cloned().unwrap_or_default();
    extras.spans.insert(fallback_call.id.clone(), span);
    if let Some(key) = key {
        extras.keys.insert(fallback_call.id.clone(), key);
    }
    let env = CallEnv {
        extras: Some(&extras),
        ..env
    };
    let mut outcome = agent.executor.execute(fallback_call, env).await.outcome;
    mark_unknown_outcome(agent, &mut outcome);
    let decision = decide_policy(agent, journal, fallback_call, &outcome, true)
        .filter(|decision| !matches!(decision, PolicyDecision::Fallback { .. }));
    (outcome, decision)
}

/// Settles, on resume, a call whose fallback had started before the process stopped:
/// the original is never run again. A fallback its start recorded as repeatable (and
/// still is) runs again with its recorded key; any other is settled as interrupted —
/// it may have run — and nothing else runs in its place.
pub(super) async fn resume_fallback(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    pending: PendingCall,
    fallback: RecordedFallback,
) -> Result<(), RunError> {
    let call = pending.call;
    let key = fallback
        .start
        .as_ref()
        .and_then(|start| start.idempotency_key.clone())
        .unwrap_or_else(|| default_key(journal, &fallback.call_id));
    if !repeat_on_resume(agent, journal, &fallback.name, fallback.start.as_ref()) {
        let fallback_call = ToolCall {
            id: fallback.call_id,
            name: fallback.name,
            arguments: call.arguments.clone(),
        };
        return settle_interrupted(agent, journal, call, Some(fallback_call), key).await;
    }
    let fallback_call = ToolCall {
        id: fallback.call_id.clone(),
        name: fallback.name.clone(),
        arguments: call.arguments.clone(),
    };
    let ctx = journal.ctx().clone();
    let thread_id = journal.thread_id().to_string();
    let run_id = journal.run_id().to_string();
    let extras = call_extras(journal, &[]);
    let span = extras
        .spans
        .get(&fallback.call_id)
        .cloned()
        .unwrap_or_else(new_span_id);
    let env = CallEnv {
        thread_id: &thread_id,
        run_id: &run_id,
        cancel: &ctx.cancel,
        extras: Some(&extras),
    };
    let (outcome, decision) =
        execute_fallback(agent, journal, &fallback_call, Some(key), span, env).await;
    let content = content_for(agent, &outcome);
    let batch = finished_events(&call, outcome, Some(content), decision);
    journal.append_batch(batch).await
}

/// Records the outcome of a call that started but never finished (the process stopped
/// mid-call) and may not run again — or of a call whose fallback did so (`fallback`): it
/// is NOT executed again. The model is told it may or may not have taken effect, with its
/// idempotency key (`may_have_run` in the details), and the policy decides what follows,
/// never with a fallback.
pub(super) async fn settle_interrupted(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    call: ToolCall,
    fallback: Option<ToolCall>,
    idempotency_key: String,
) -> Result<(), RunError> {
    let what = match &fallback {
        Some(fallback) => format!(
            "its fallback `{}` (the policy ran it after `{}` failed) was interrupted (the process driving the run \
             stopped while it ran); it may or may not have taken effect and was not re-executed because `{}` was \
             mutating when it started",
            fallback.name, call.name, fallback.name
        ),
        None => format!(
            "this call was interrupted (the process driving the run stopped while it ran); it may or may not have \
             taken effect and was not re-executed because `{}` was mutating when it started",
            call.name
        ),
    };
    let mut outcome = error_outcome(
        journal,
        &call,
        ToolErrorCode::Cancelled,
        format!(
            "{what}. Check its effect before calling it again (idempotency key {idempotency_key})."
        ),
    );
    if let Some(fallback) = &fallback {
        outcome.tool.clone_from(&fallback.name);
    }
    // Held back only by what its start recorded? The operator hears how to force it.
    let settled = fallback.as_ref().unwrap_or(&call);
    let relaxed = agent
        .executor
        .spec(&settled.name)
        .is_some_and(|_| repeatable_now(agent, &settled.name));
    if let ToolResultKind::Error { details, .. } = &mut outcome.result {
        let mut map = may_have_run_details(&idempotency_key);
        if let (true, Some(fields)) = (relaxed, map.as_object_mut()) {
            fields.insert("relaxed_since_start".into(), serde_json::Value::Bool(true));
        }
        *details = Some(map);
    }
    if relaxed {
        journal
            .append(EventKind::Notice {
                code: "relaxed_call_not_rerun".into(),
                message: format!(
                    "call {} of `{}` started as mutating and was not run again although the agent now \
                     declares the tool repeatable: the effect its start recorded governs. To run such a \
                     call again anyway — its effect may then happen twice — resume with \
                     `keel resume --rerun-relaxed-calls {}`",
                    settled.id,
                    settled.name,
                    journal.thread_id()
                ),
                data: Some(serde_json::json!({
                    "call_id": settled.id,
                    "tool": settled.name,
                    "idempotency_key": idempotency_key,
                })),
            })
            .await?;
    }
    // A fallback tool is not run in place of a call whose effect is unknown.
    let decision = decide_policy(agent, journal, &call, &outcome, fallback.is_some())
        .filter(|decision| !matches!(decision, PolicyDecision::Fallback { .. }));
    let batch = finished_events(&call, outcome, None, decision);
    journal.append_batch(batch).await
}
