//! A queued run's job: where it stands (`queued`, `leased`, `done`, `failed`, `dead`,
//! `cancelled`, with its attempts and its last error) and, while no worker holds it, its
//! cancellation. A chat names its job in the `x-keel-job-id` header (and `job_id` of a
//! 202); a job of another tenant is a 404 like one that does not exist.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_store::{JobId, JobInfo, JobState};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::ApiPath;
use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;
use crate::tenancy::Tenant;

/// A job as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    /// The job.
    pub job_id: JobId,
    /// Its thread (your id).
    pub thread_id: String,
    /// `queued`, `leased`, `done`, `failed` (it can never succeed), `dead` (it failed on
    /// every attempt allowed: `[server] max_attempts`) or `cancelled` (while queued).
    pub state: String,
    /// Acquisitions so far (waiting for another run of the thread is not counted).
    pub attempts: u32,
    /// Why it failed, died or was cancelled.
    pub error: Option<String>,
}

/// The tenant's job `job_id`; 404 when the tenant has no such job.
async fn tenant_job(
    state: &AppState,
    tenant: &Tenant,
    job_id: JobId,
) -> Result<(JobInfo, String), ApiError> {
    let info = state
        .queue
        .job(job_id)
        .await
        .map_err(|e| ApiError::internal(format!("cannot look job {job_id} up: {e}")))?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("job {job_id} does not exist"),
        )
    };
    let info = info.ok_or_else(not_found)?;
    let client = tenant
        .client_id(&info.thread_id)
        .map(str::to_string)
        .ok_or_else(not_found)?;
    Ok((info, client))
}

fn view(info: &JobInfo, thread_id: String) -> JobView {
    JobView {
        job_id: info.job_id,
        thread_id,
        state: info.state.as_str().to_string(),
        attempts: info.attempts,
        error: info.error.clone(),
    }
}

/// Shows a job of the run queue.
#[utoipa::path(
    get,
    path = "/v1/jobs/{job_id}",
    tag = "runs",
    params(("job_id" = i64, Path, description = "The job (`x-keel-job-id` of the chat)")),
    security(("bearer" = [])),
    responses(
        (status = 200, body = JobView),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn get_job(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(job_id): ApiPath<JobId>,
) -> Result<axum::Json<JobView>, ApiError> {
    let (info, client) = tenant_job(&state, &tenant, job_id).await?;
    Ok(axum::Json(view(&info, client)))
}

/// Cancels a job no worker took yet: it ends `cancelled` and its message is never run.
/// A job a worker holds has a run: cancel the run
/// (`POST /v1/threads/{thread_id}/runs/{run_id}/cancel`).
#[utoipa::path(
    post,
    path = "/v1/jobs/{job_id}/cancel",
    tag = "runs",
    params(("job_id" = i64, Path, description = "The job (`x-keel-job-id` of the chat)")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The job, now `cancelled`", body = JobView),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`job_not_queued`: a worker holds it (cancel its run) or it ended", body = ErrorBody),
    )
)]
pub async fn cancel_job(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(job_id): ApiPath<JobId>,
) -> Result<Response, ApiError> {
    let (_, client) = tenant_job(&state, &tenant, job_id).await?;
    let cancelled = state
        .queue
        .cancel_queued(job_id, &format!("cancelled by key:{}", tenant.key_id))
        .await
        .map_err(|e| ApiError::internal(format!("cannot cancel job {job_id}: {e}")))?;
    let (info, _) = tenant_job(&state, &tenant, job_id).await?;
    if !cancelled {
        let hint = if info.state == JobState::Leased {
            format!(
                "a worker holds it: cancel its run (POST /v1/threads/{client}/runs/{{run_id}}/cancel)"
            )
        } else {
            format!("it already ended ({})", info.state.as_str())
        };
        return Err(ApiError::conflict(
            "job_not_queued",
            format!("job {job_id} is not queued: {hint}"),
        )
        .with_details(json!({"job_id": job_id, "state": info.state.as_str()})));
    }
    Ok(axum::Json(view(&info, client)).into_response())
}
