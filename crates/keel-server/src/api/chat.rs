//! `POST /v1/chat`: queue a run of a keel.toml agent on a new or existing thread, then
//! either wait for it (the `keel run --output json` object; 202 when it outlasts the
//! request timeout) or stream its events (`stream: true`). The run belongs to the queue,
//! not to the request: a client that disconnects leaves it running.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use keel_core::store::{ThreadFilter, ThreadStatus};
use keel_runtime::Thread;
use keel_store::JobState;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use super::runs::refuse_if_paused;
use super::{ApiJson, tenant_thread};
use crate::error::{ApiError, ErrorBody};
use crate::follow::{Follow, Settled, Until, event_stream, open_stream, wait_settled};
use crate::jobs::{enqueue_new, recipe_for};
use crate::state::{AppState, PendingJob, RunAdmission};
use crate::tenancy::Tenant;

/// A chat request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// A keel.toml `[agents.<name>]` name.
    pub agent: String,
    /// Continue this thread (yours); leave out to start a new one.
    #[serde(default)]
    pub thread_id: Option<String>,
    /// The user's message (or use `messages`).
    #[serde(default)]
    pub message: Option<String>,
    /// New user messages for this turn (role `user`), sent as one turn joined by blank
    /// lines; the thread keeps the history, so do not resend it.
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// Stream the run's events as Server-Sent Events instead of waiting for the outcome.
    #[serde(default)]
    pub stream: bool,
}

/// A message of [`ChatRequest::messages`].
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `user`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A queued run that is still going (202).
#[derive(Debug, serde::Serialize, ToSchema)]
pub struct Accepted {
    /// The thread.
    pub thread_id: String,
    /// The run, once it started.
    pub run_id: Option<String>,
    /// `queued` or `running`.
    pub status: String,
    /// Where to follow it (SSE).
    pub events_url: String,
    /// Its job in the run queue (`GET /v1/jobs/{job_id}`; `POST /v1/jobs/{job_id}/cancel`
    /// while it is queued).
    pub job_id: keel_store::JobId,
}

/// Starts (or continues) a conversation. A thread whose run is paused (awaiting approval
/// or the user's answer) takes no new message until that run is answered: `409
/// thread_paused` says what it waits for and how to answer it.
#[utoipa::path(
    post,
    path = "/v1/chat",
    tag = "chat",
    request_body = ChatRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The run ended or paused: the `keel run --output json` object (`status`: `ended`, `awaiting_approval` with `awaiting.call_id`, or `awaiting_user`)", body = serde_json::Value),
        (status = 202, description = "The run outlasted the request timeout; follow it with the events URL", body = Accepted),
        (status = 200, description = "`stream: true`: text/event-stream of the run's events (`id:` = sequence number), `text_delta`s, then `outcome`", content_type = "text/event-stream"),
        (status = 400, description = "Bad request (names the field)", body = ErrorBody),
        (status = 404, description = "No such thread", body = ErrorBody),
        (status = 409, description = "`thread_paused`: the thread's run is paused, awaiting approval or the user's answer; nothing is queued. `error.details` names the run (`thread_id`, `run_id`, `status`: `awaiting_approval` or `awaiting_user`), what it waits for (`awaiting`: `call_id` and `tool`, or `question`) and how to answer it (`answer`: `approve` and `deny` — POST /v1/threads/{thread_id}/approvals/{call_id} — or `reply` — POST /v1/threads/{thread_id}/reply — and `cancel`, each with `method`, `path` and an example `body`). Answer it, then send the message again. Or `job_cancelled`: the queued run was cancelled (`POST /v1/jobs/{job_id}/cancel`) before it started", body = ErrorBody),
        (status = 422, description = "`job_failed`: the run could not be started and never can be (e.g. its agent cannot be built); `error.details` has the job and its reason", body = ErrorBody),
        (status = 429, description = "A per-tenant limit (Retry-After)", body = ErrorBody),
        (status = 503, description = "`job_dead`: the run could not be started on any of its `[server] max_attempts` attempts; `error.details.error` is the last error", body = ErrorBody),
    )
)]
pub async fn chat(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiJson(request): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let message = message_of(&request)?;
    check_agent(&state, &request.agent)?;
    if state.shutdown.is_cancelled() {
        return Err(ApiError::unavailable(
            "the server is shutting down and accepts no new runs; retry on another instance",
        ));
    }
    let (client_id, thread) = match &request.thread_id {
        Some(id) => {
            let thread = tenant_thread(&state, &tenant, id).await?;
            refuse_if_paused(&thread, id)?;
            (id.clone(), thread)
        }
        None => {
            let (client, store) = tenant.new_thread();
            (client, Thread::with_id(store))
        }
    };
    let admission = check_run_limits(&state, &tenant).await?;
    // The stream's slot is taken before the run is queued: a refused stream queues nothing.
    let permit = request
        .stream
        .then(|| open_stream(&state, &tenant))
        .transpose()?;
    // Subscribed before the run is queued: a worker here may start it at once.
    let hub = request
        .stream
        .then(|| state.hub.subscribe_thread(thread.id()));
    let queued = enqueue_new(
        state.queue.as_ref(),
        &thread,
        recipe_for(&request.agent),
        message,
    )
    .await
    .map_err(ApiError::internal)?;
    state.metrics.runs_queued.fetch_add(1, Ordering::Relaxed);
    track(&state, &tenant, thread.id(), queued.job_id);
    drop(admission);
    let header = HeaderValue::from_str(&client_id).ok();
    let mut response = if let Some(permit) = permit {
        event_stream(
            state.clone(),
            Follow {
                tenant: tenant.clone(),
                store_id: thread.id().to_string(),
                client_id: client_id.clone(),
                from_seq: queued.base_seq,
                until: Until::Run(queued.submission),
            },
            hub,
            permit,
        )
        .into_response()
    } else {
        let settled = wait_settled(
            &state,
            thread.id(),
            &client_id,
            &queued.submission,
            queued.job_id,
            state.request_timeout(),
        )
        .await;
        match settled {
            Settled::Run(run) => axum::Json(run).into_response(),
            Settled::JobEnded(job) => job_ended(&job, &client_id).into_response(),
            Settled::Pending(run_id) => (
                StatusCode::ACCEPTED,
                axum::Json(json!(Accepted {
                    status: if run_id.is_some() {
                        "running"
                    } else {
                        "queued"
                    }
                    .into(),
                    run_id,
                    events_url: format!("/v1/threads/{client_id}/events"),
                    thread_id: client_id.clone(),
                    job_id: queued.job_id,
                })),
            )
                .into_response(),
        }
    };
    if let Some(value) = header {
        response.headers_mut().insert("x-keel-thread-id", value);
    }
    response
        .headers_mut()
        .insert("x-keel-job-id", HeaderValue::from(queued.job_id));
    Ok(response)
}

/// The answer to a chat whose job ended before its run started: `422 job_failed` (it can
/// never work, e.g. its agent cannot be built), `503 job_dead` (it failed on every attempt
/// allowed; `Retry-After`) or `409 job_cancelled`, with the job's reason and record.
fn job_ended(job: &keel_store::JobInfo, client_id: &str) -> ApiError {
    let reason = job
        .error
        .as_deref()
        .unwrap_or("no reason was recorded")
        .replace(&job.thread_id, client_id);
    let (status, code, what) = match job.state {
        JobState::Dead => (
            StatusCode::SERVICE_UNAVAILABLE,
            "job_dead",
            format!("failed on each of its {} attempts", job.attempts),
        ),
        JobState::Cancelled => (
            StatusCode::CONFLICT,
            "job_cancelled",
            "was cancelled".into(),
        ),
        _ => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "job_failed",
            "failed and cannot succeed".into(),
        ),
    };
    let mut error = ApiError::new(
        status,
        code,
        format!(
            "the run was not started: job {} {what}: {reason}",
            job.job_id
        ),
    )
    .with_details(json!({
        "job_id": job.job_id,
        "thread_id": client_id,
        "state": job.state.as_str(),
        "attempts": job.attempts,
        "error": reason,
    }));
    if job.state == JobState::Dead {
        error.retry_after = Some(30);
    }
    error
}

/// The user's text of a request: `message`, or the `messages` (all `user`) joined.
fn message_of(request: &ChatRequest) -> Result<String, ApiError> {
    let text = match (&request.message, &request.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give either `message` or `messages`, not both",
            ));
        }
        (Some(message), None) => message.clone(),
        (None, Some(messages)) => {
            if messages.is_empty() {
                return Err(ApiError::invalid(
                    "messages: empty; send at least one {\"role\": \"user\", \"content\": \"...\"}",
                ));
            }
            if let Some(index) = messages
                .iter()
                .position(|m| !super::contract::has_text(&m.content))
            {
                return Err(ApiError::invalid(format!(
                    "messages[{index}].content is empty: send the user's text"
                )));
            }
            if let Some((index, bad)) = messages.iter().enumerate().find(|(_, m)| m.role != "user")
            {
                return Err(ApiError::invalid(format!(
                    "messages[{index}].role is {:?}: only `user` messages are sent (the thread \
                     keeps the assistant's answers; continue it with `thread_id`)",
                    bad.role
                )));
            }
            messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n\n")
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "missing `message` (the user's text) or `messages` ([{\"role\": \"user\", \
                 \"content\": \"...\"}])",
            ));
        }
    };
    if !super::contract::has_text(&text) {
        return Err(ApiError::invalid(
            "`message` is empty: send the user's text",
        ));
    }
    Ok(text)
}

/// The agent must be a keel.toml agent the server offers.
pub(crate) fn check_agent(state: &AppState, agent: &str) -> Result<(), ApiError> {
    let config = state.app.config();
    let offered: Vec<&str> = config
        .agents
        .keys()
        .map(String::as_str)
        .filter(|name| config.server.allows_agent(name))
        .collect();
    if offered.contains(&agent) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "agent: {agent:?} is not an agent this server offers; use one of: {}",
        if offered.is_empty() {
            "(none: declare [agents.<name>] in keel.toml)".to_string()
        } else {
            offered.join(", ")
        }
    )))
}

/// Remembers a job this process queued for the concurrent-runs limit (not when the tenant
/// has none: nothing would ever read or prune the list).
pub(crate) fn track(state: &AppState, tenant: &Tenant, store_id: &str, job_id: keel_store::JobId) {
    if state.config.limits_for(&tenant.name).concurrent_runs == 0 {
        return;
    }
    let mut pending = match state.pending.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    pending.push(PendingJob {
        tenant: tenant.name.clone(),
        store_id: store_id.to_string(),
        job_id,
    });
}

/// Refuses a new run when the tenant is at its concurrent-runs or tokens-per-day limit;
/// otherwise admits it. The admission holds the tenant's lock: keep it until the run's
/// job is queued and [`track`]ed, so that the next chat counts it.
pub(crate) async fn check_run_limits(
    state: &AppState,
    tenant: &Tenant,
) -> Result<RunAdmission, ApiError> {
    let limits = state.config.limits_for(&tenant.name);
    if let Err(error) = state.usage.check(&tenant.name, limits.tokens_per_day) {
        state.metrics.limited.fetch_add(1, Ordering::Relaxed);
        return Err(error);
    }
    if limits.concurrent_runs == 0 {
        return Ok(RunAdmission::unlimited());
    }
    let admission = state.admissions.enter(&tenant.name).await;
    let active = active_runs(state, tenant, limits.concurrent_runs).await?;
    if active >= limits.concurrent_runs {
        state.metrics.limited.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::too_many(
            "concurrent_runs",
            format!(
                "tenant {} has {active} runs queued or in progress, its limit \
                 ([server.limits] concurrent_runs in keel.toml); retry when one ends",
                tenant.name
            ),
            5,
        ));
    }
    Ok(admission)
}

/// The tenant's threads with a run in progress in the store, plus the threads of jobs
/// this process queued that no worker started yet — counted exactly only when it matters:
/// while the running threads plus the remembered jobs of the other threads stay under
/// `limit` (an upper bound of the count), no job is looked up (a lookup per remembered job
/// on every chat made a burst of N chats cost N² queue reads); at the limit, each job of a
/// thread that is not running is looked up and the finished ones are forgotten, so fewer
/// than `limit` of those are ever kept. (Jobs of running threads need no lookup: their
/// thread is counted already; they are looked up once it is idle.)
async fn active_runs(state: &AppState, tenant: &Tenant, limit: u64) -> Result<u64, ApiError> {
    let filter = ThreadFilter {
        status: Some(ThreadStatus::Running),
        id_prefix: Some(tenant.prefix()),
        ..ThreadFilter::default()
    };
    let running = state
        .events
        .list_threads(&filter)
        .await
        .map_err(|e| ApiError::internal(format!("cannot count runs: {e}")))?;
    let mut threads: HashSet<String> = running
        .into_iter()
        .filter(|t| tenant.client_id(&t.thread_id).is_some())
        .map(|t| t.thread_id)
        .collect();
    let mine: Vec<PendingJob> = {
        let pending = match state.pending.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        pending
            .iter()
            .filter(|p| p.tenant == tenant.name && !threads.contains(&p.store_id))
            .cloned()
            .collect()
    };
    let bound = threads.len().saturating_add(mine.len());
    if bound < usize::try_from(limit).unwrap_or(usize::MAX) {
        return Ok(bound as u64);
    }
    let mut finished = Vec::new();
    for job in mine {
        if threads.contains(&job.store_id) {
            continue;
        }
        match state.queue.job(job.job_id).await {
            Ok(Some(info)) if info.state == JobState::Queued || info.state == JobState::Leased => {
                threads.insert(job.store_id);
            }
            Ok(_) => finished.push(job.job_id),
            Err(e) => return Err(ApiError::internal(format!("cannot count runs: {e}"))),
        }
    }
    if !finished.is_empty() {
        let mut pending = match state.pending.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        pending.retain(|p| !finished.contains(&p.job_id));
    }
    Ok(threads.len() as u64)
}
