//! A thread's runs: show one, cancel one, decide a call awaiting approval, answer the
//! agent's question. Decisions and answers are recorded here (through the runtime's
//! `Thread`, which journals them), and the run then continues on a worker — a queued
//! continuation of the run's own job — never in the process that took the request.

use std::sync::atomic::Ordering;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_app::recipe::Recipe;
use keel_runtime::thread::HumanInputError;
use keel_runtime::{RunContext, Thread};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::chat::{check_run_limits, track};
use super::{ApiJson, ApiPath, run_not_found, tenant_events, tenant_thread};
use crate::error::{ApiError, ErrorBody};
use crate::jobs::{enqueue_continue, enqueue_new};
use crate::outcome::{RunPosition, position, run_events, run_json};
use crate::state::AppState;
use crate::tenancy::Tenant;

/// Shows a run: the `keel run --output json` object (`status` also `running` or
/// `awaiting_user`).
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}/runs/{run_id}",
    tag = "runs",
    params(
        ("thread_id" = String, Path, description = "Your thread id"),
        ("run_id" = String, Path, description = "A run of the thread"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, body = serde_json::Value),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn get_run(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath((thread_id, run_id)): ApiPath<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let (_, events) = tenant_events(&state, &tenant, &thread_id).await?;
    let own = run_events(&events, &run_id);
    if own.is_empty() {
        return Err(run_not_found(&thread_id, &run_id));
    }
    Ok(axum::Json(run_json(&thread_id, &run_id, &own)))
}

/// Cancels a run: a run being driven stops at its next step (a tool waiting is
/// cancelled) and ends `cancelled`, whichever worker process drives it; a run paused for
/// approval or the user, or interrupted, is continued on a worker just to end it
/// `cancelled`. Answers at once; follow the thread's events.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/runs/{run_id}/cancel",
    tag = "runs",
    params(
        ("thread_id" = String, Path, description = "Your thread id"),
        ("run_id" = String, Path, description = "A run of the thread"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "`{thread_id, run_id, status: \"cancelling\"}`", body = serde_json::Value),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The run already ended", body = ErrorBody),
    )
)]
pub async fn cancel_run(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath((thread_id, run_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    request_cancel(&state, &tenant, &thread_id, &run_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"thread_id": thread_id, "run_id": run_id, "status": "cancelling"})),
    )
        .into_response())
}

/// Asks run `run_id` of the tenant's thread `thread_id` to stop (see [`cancel_run`]; the
/// A2A `CancelTask` takes the same path).
pub(crate) async fn request_cancel(
    state: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    run_id: &str,
) -> Result<(), ApiError> {
    let thread = tenant_thread(state, tenant, thread_id).await?;
    let latest = thread.state().run().map(|r| r.run_id.clone());
    if latest.as_deref() != Some(run_id) {
        let (_, events) = tenant_events(state, tenant, thread_id).await?;
        if run_events(&events, run_id).is_empty() {
            return Err(run_not_found(thread_id, run_id));
        }
        return Err(ApiError::conflict(
            "run_ended",
            format!("run {run_id} already ended; nothing to cancel"),
        ));
    }
    if let RunPosition::Settled(keel_runtime::RunStatus::Ended { end_state }) =
        position(thread.run_events())
    {
        return Err(ApiError::conflict(
            "run_ended",
            format!("run {run_id} already ended ({end_state}); nothing to cancel"),
        ));
    }
    state
        .serving
        .request_cancel(thread.id(), run_id)
        .await
        .map_err(|e| ApiError::internal(format!("cannot record the cancel: {e}")))?;
    if !state.hub.cancel(run_id) {
        // Paused, interrupted, or driven by another process: a continuation job resumes
        // the run and sees the cancel (behind the job driving it, if any, when that one
        // already stopped it the continuation finds the run ended and does nothing).
        enqueue_continue(state.queue.as_ref(), &thread)
            .await
            .map_err(ApiError::internal)?;
        state.metrics.runs_queued.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// `POST /v1/threads/{thread_id}/approvals/{call_id}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// `approve` or `deny`.
    pub decision: String,
    /// Why (deny; shown to the model).
    #[serde(default)]
    pub reason: Option<String>,
    /// A name for who decided, recorded after the key that made the request: the
    /// decision is recorded as `key:<key id>` (the authenticated identity, which a
    /// client cannot choose), or `key:<key id> for <by>` (at most 200 characters of
    /// `by`, control characters removed).
    #[serde(default)]
    pub by: Option<String>,
}

/// Who a decision is recorded as: the key that made the request, then the name the
/// client gave, if any (a client names itself; it cannot be another key).
pub(crate) fn decided_by(key_id: &str, by: Option<&str>) -> String {
    let named: String = by
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let named = named.trim();
    if named.is_empty() {
        format!("key:{key_id}")
    } else {
        format!("key:{key_id} for {named}")
    }
}

/// Approves or denies a call the run awaits; the run continues on a worker.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/approvals/{call_id}",
    tag = "runs",
    params(
        ("thread_id" = String, Path, description = "Your thread id"),
        ("call_id" = String, Path, description = "The call awaiting approval (`awaiting.call_id`)"),
    ),
    request_body = DecisionRequest,
    security(("bearer" = [])),
    responses(
        (status = 202, description = "`{thread_id, run_id, call_id, decision, status: \"queued\"}`: the run continues on a worker; follow the thread's events", body = serde_json::Value),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The call is not awaiting approval", body = ErrorBody),
    )
)]
pub async fn decide(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath((thread_id, call_id)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<DecisionRequest>,
) -> Result<Response, ApiError> {
    let approve = match request.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return Err(ApiError::invalid(format!(
                "decision: {other:?} is not a decision: use \"approve\" or \"deny\""
            )));
        }
    };
    let mut thread = tenant_thread(&state, &tenant, &thread_id).await?;
    let run_id = thread
        .state()
        .run()
        .map(|r| r.run_id.clone())
        .unwrap_or_default();
    let context = RunContext::new(state.events.clone());
    let by = Some(decided_by(&tenant.key_id, request.by.as_deref()));
    let recorded = if approve {
        thread.approve(&context, &call_id, by).await
    } else {
        thread
            .deny_by(&context, &call_id, request.reason.clone(), by)
            .await
    };
    recorded.map_err(|e| human_error(e, thread.id(), &thread_id))?;
    continue_on_worker(&state, &thread).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "thread_id": thread_id,
            "run_id": run_id,
            "call_id": call_id,
            "decision": if approve { "approved" } else { "denied" },
            "status": "queued",
        })),
    )
        .into_response())
}

/// `POST /v1/threads/{thread_id}/reply`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyRequest {
    /// The answer to the agent's question.
    pub answer: String,
}

/// Answers the question a run waits on (`ask_user`) and continues it on a worker; when
/// the thread's last run ended (e.g. `clarify_needed`), starts a new run with the answer
/// as the message, with the agent of that run.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/reply",
    tag = "runs",
    params(("thread_id" = String, Path, description = "Your thread id")),
    request_body = ReplyRequest,
    security(("bearer" = [])),
    responses(
        (status = 202, description = "`{thread_id, status: \"queued\"}`; follow the thread's events", body = serde_json::Value),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A run is in progress that does not wait for an answer", body = ErrorBody),
        (status = 429, body = ErrorBody),
    )
)]
pub async fn reply(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(thread_id): ApiPath<String>,
    ApiJson(request): ApiJson<ReplyRequest>,
) -> Result<Response, ApiError> {
    if !super::contract::has_text(&request.answer) {
        return Err(ApiError::invalid("answer: empty; send the user's answer"));
    }
    let mut thread = tenant_thread(&state, &tenant, &thread_id).await?;
    if thread.state().run_in_progress() {
        let context = RunContext::new(state.events.clone());
        thread
            .answer_user(&context, &request.answer)
            .await
            .map_err(|e| human_error(e, thread.id(), &thread_id))?;
        continue_on_worker(&state, &thread).await?;
    } else {
        let recipe = Recipe::recorded(thread.run_events())
            .map_err(|e| ApiError::internal(e.to_string()))?
            .ok_or_else(|| {
                ApiError::conflict(
                    "no_agent",
                    format!(
                        "thread {thread_id}'s last run recorded no agent; start a run with \
                         POST /v1/chat {{\"agent\": ..., \"thread_id\": \"{thread_id}\"}}"
                    ),
                )
            })?;
        let admission = check_run_limits(&state, &tenant).await?;
        let recipe = Recipe {
            submission: None,
            ..recipe
        };
        let queued = enqueue_new(state.queue.as_ref(), &thread, recipe, request.answer)
            .await
            .map_err(ApiError::internal)?;
        state.metrics.runs_queued.fetch_add(1, Ordering::Relaxed);
        track(&state, &tenant, thread.id(), queued.job_id);
        drop(admission);
    }
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"thread_id": thread_id, "status": "queued"})),
    )
        .into_response())
}

/// Refuses a new run on a thread whose run is paused — awaiting approval or the user's
/// answer — with `409 thread_paused`: what the run waits for and how to answer it (the
/// approve/deny, reply and cancel endpoints), in the message and in `details`. A message
/// queued there would wait for that run, which only an answer continues; answered, the
/// run ends and the thread takes the message. `client_id` is the thread's id as the client
/// knows it.
pub(crate) fn refuse_if_paused(thread: &Thread, client_id: &str) -> Result<(), ApiError> {
    if !thread.state().run_in_progress() {
        return Ok(());
    }
    let run_id = thread
        .state()
        .run()
        .map(|r| r.run_id.clone())
        .unwrap_or_default();
    let cancel_path = format!("/v1/threads/{client_id}/runs/{run_id}/cancel");
    let cancel = json!({"method": "POST", "path": cancel_path});
    let (status, awaiting, answer, how) = match position(thread.run_events()) {
        RunPosition::Settled(keel_runtime::RunStatus::AwaitingApproval { call_id, tool }) => {
            let path = format!("/v1/threads/{client_id}/approvals/{call_id}");
            let how = format!(
                "is awaiting approval of call {call_id} ({tool}): approve it with POST {path}                  {{\"decision\": \"approve\"}} or deny it with {{\"decision\": \"deny\", \
                 \"reason\": \"...\"}}, or cancel the run with POST {cancel_path}"
            );
            (
                "awaiting_approval",
                json!({"call_id": call_id, "tool": tool}),
                json!({
                    "approve": {"method": "POST", "path": path, "body": {"decision": "approve"}},
                    "deny": {"method": "POST", "path": path, "body": {"decision": "deny", "reason": "..."}},
                    "cancel": cancel,
                }),
                how,
            )
        }
        RunPosition::AwaitingUser(question) => {
            let path = format!("/v1/threads/{client_id}/reply");
            let how = format!(
                "is waiting for the user's answer to {question:?}: answer it with POST {path}                  {{\"answer\": \"...\"}}, or cancel the run with POST {cancel_path}"
            );
            (
                "awaiting_user",
                json!({"question": question}),
                json!({
                    "reply": {"method": "POST", "path": path, "body": {"answer": "..."}},
                    "cancel": cancel,
                }),
                how,
            )
        }
        // Running (or interrupted): the message is queued behind the run's own job.
        _ => return Ok(()),
    };
    Err(ApiError::conflict(
        "thread_paused",
        format!(
            "thread {client_id}'s run {run_id} {how}; then send this message again (a message \
             is not queued behind a paused run: it would wait for an answer that only you can give)"
        ),
    )
    .with_details(json!({
        "thread_id": client_id,
        "run_id": run_id,
        "status": status,
        "awaiting": awaiting,
        "answer": answer,
    })))
}

pub(crate) async fn continue_on_worker(state: &AppState, thread: &Thread) -> Result<(), ApiError> {
    enqueue_continue(state.queue.as_ref(), thread)
        .await
        .map_err(ApiError::internal)?;
    state.metrics.runs_queued.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// A failed decision or answer, with the store's thread id shown as the client's.
pub(crate) fn human_error(error: HumanInputError, store_id: &str, thread_id: &str) -> ApiError {
    match error {
        HumanInputError::Run(run) => {
            ApiError::internal(keel_app::worker::run_error(&run).replace(store_id, thread_id))
        }
        other => ApiError::conflict(other.code(), other.to_string().replace(store_id, thread_id)),
    }
}
