//! `/v1/threads`: list, show, fork and delete the tenant's threads, and follow one's events
//! as Server-Sent Events from where a client left off (`Last-Event-ID`).

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use keel_app::threads::{parse_since, parse_status, status_name};
use keel_core::RunState;
use keel_core::store::{ThreadFilter, ThreadStatus, ThreadSummary};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::{ApiJson, ApiPath, ApiQuery, tenant_events};
use crate::error::{ApiError, ErrorBody};
use crate::follow::{Follow, Until, event_stream, open_stream};
use crate::state::AppState;
use crate::tenancy::Tenant;

/// Most threads one list returns.
pub(crate) const MAX_LIMIT: usize = 500;

/// Filters of `GET /v1/threads`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `running`, `awaiting_approval`, `awaiting_user` or an end state (`done`, `failed`, …).
    pub status: Option<String>,
    /// Only threads whose latest run used this agent.
    pub agent: Option<String>,
    /// Updated since an RFC 3339 time or an age (`30s`, `15m`, `2h`, `7d`).
    pub since: Option<String>,
    /// At most this many (default 50, at most 500), most recently updated first.
    pub limit: Option<usize>,
}

/// A thread in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadItem {
    /// Thread id.
    pub thread_id: String,
    /// `running`, `awaiting_approval`, `awaiting_user` or the end state.
    pub status: String,
    /// Agent of the latest run.
    pub agent: Option<String>,
    /// Events in the log.
    pub event_count: u64,
    /// First event time (RFC 3339).
    pub created_at: String,
    /// Last event time (RFC 3339).
    pub updated_at: String,
}

/// `GET /v1/threads`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadList {
    /// The threads.
    pub threads: Vec<ThreadItem>,
}

fn item(tenant: &Tenant, summary: &ThreadSummary) -> Option<ThreadItem> {
    Some(ThreadItem {
        thread_id: tenant.client_id(&summary.thread_id)?.to_string(),
        status: status_name(summary.status),
        agent: summary.agent.clone(),
        event_count: summary.event_count,
        created_at: summary.created_at.to_rfc3339(),
        updated_at: summary.updated_at.to_rfc3339(),
    })
}

/// Lists your threads.
#[utoipa::path(
    get,
    path = "/v1/threads",
    tag = "threads",
    params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, body = ThreadList),
        (status = 400, description = "A bad filter (names the parameter)", body = ErrorBody),
    )
)]
pub async fn list_threads(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<ThreadList>, ApiError> {
    let status = query
        .status
        .as_deref()
        .map(parse_status)
        .transpose()
        .map_err(|e| ApiError::invalid(format!("status: {e}")))?;
    // An RFC 3339 time, or an age by the document's own pattern (parse_since alone takes
    // more than the document says: the two must agree).
    if let Some(since) = query.since.as_deref()
        && chrono::DateTime::parse_from_rfc3339(since).is_err()
        && !super::contract::is_age(since)
    {
        return Err(ApiError::invalid(format!(
            "since: {since:?}: give an RFC 3339 time or an age like 30s, 15m, 2h, 7d (at most \
             six digits)"
        )));
    }
    let since = query
        .since
        .as_deref()
        .map(|s| parse_since(s, chrono::Utc::now()))
        .transpose()
        .map_err(|e| ApiError::invalid(format!("since: {e}")))?;
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(format!(
            "limit: {limit} is out of range: use 1 to {MAX_LIMIT}"
        )));
    }
    // The store filters by tenant, status, agent and time (sub-agent threads, which share
    // the prefix, are left out here).
    let filter = ThreadFilter {
        status,
        agent: query.agent,
        updated_since: since,
        limit: None,
        id_prefix: Some(tenant.prefix()),
    };
    let all = state
        .events
        .list_threads(&filter)
        .await
        .map_err(|e| ApiError::internal(format!("cannot list threads: {e}")))?;
    let threads = all
        .iter()
        .filter_map(|s| item(&tenant, s))
        .take(limit)
        .collect();
    Ok(axum::Json(ThreadList { threads }))
}

/// Shows a thread: its summary, conversation and events.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    params(("thread_id" = String, Path, description = "Your thread id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "`{thread, messages, events}` (events as stored)", body = serde_json::Value),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn get_thread(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(thread_id): ApiPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let (store_id, events) = tenant_events(&state, &tenant, &thread_id).await?;
    let summary = ThreadSummary::from_events(&store_id, &events)
        .and_then(|s| item(&tenant, &s))
        .ok_or_else(|| ApiError::thread_not_found(&thread_id))?;
    let messages = RunState::from_events(&store_id, &events)
        .messages()
        .to_vec();
    let events: Vec<Value> = events
        .iter()
        .map(|e| tenant.event_json(e, &thread_id))
        .collect();
    Ok(axum::Json(json!({
        "thread": summary,
        "messages": messages,
        "events": events,
    })))
}

/// Deletes a thread, its events and its sub-agent threads (not while a run is in
/// progress).
#[utoipa::path(
    delete,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    params(("thread_id" = String, Path, description = "Your thread id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "`{thread_id, deleted: true, sub_threads_deleted}`: the thread and the threads its agents-as-tools ran on", body = serde_json::Value),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A run is in progress: cancel it first", body = ErrorBody),
    )
)]
pub async fn delete_thread(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(thread_id): ApiPath<String>,
) -> Result<axum::Json<Value>, ApiError> {
    let (store_id, events) = tenant_events(&state, &tenant, &thread_id).await?;
    if ThreadSummary::from_events(&store_id, &events)
        .is_some_and(|s| s.status == ThreadStatus::Running)
    {
        return Err(ApiError::conflict(
            "run_in_progress",
            format!(
                "thread {thread_id} has a run in progress: cancel it \
                 (POST /v1/threads/{thread_id}/runs/{{run_id}}/cancel) before deleting"
            ),
        ));
    }
    // Its sub-agent threads first (`<id>.sub.<digest>`, and theirs): the conversations
    // its agents-as-tools had hold the same user's data.
    let subs = ThreadFilter {
        id_prefix: Some(format!("{store_id}.sub.")),
        ..ThreadFilter::default()
    };
    let sub_threads = state.events.list_threads(&subs).await.map_err(|e| {
        ApiError::internal(format!(
            "cannot list thread {thread_id}'s sub-agent threads: {e}"
        ))
    })?;
    for sub in &sub_threads {
        state
            .events
            .delete_thread(&sub.thread_id)
            .await
            .map_err(|e| {
                ApiError::internal(format!(
                    "cannot delete a sub-agent thread of {thread_id}: {e}; retry the delete"
                ))
            })?;
    }
    let deleted = state
        .events
        .delete_thread(&store_id)
        .await
        .map_err(|e| ApiError::internal(format!("cannot delete thread {thread_id}: {e}")))?;
    if !deleted {
        return Err(ApiError::thread_not_found(&thread_id));
    }
    Ok(axum::Json(json!({
        "thread_id": thread_id,
        "deleted": true,
        "sub_threads_deleted": sub_threads.len(),
    })))
}

/// `POST /v1/threads/{thread_id}/fork`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Copy events `0..=at_seq` (default: every event).
    #[serde(default)]
    pub at_seq: Option<u64>,
}

/// Copies a thread's log (up to `at_seq`) into a new thread of yours.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/fork",
    tag = "threads",
    params(("thread_id" = String, Path, description = "Your thread id")),
    request_body = ForkRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "`{thread_id, forked_from, at_seq, events}`", body = serde_json::Value),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn fork_thread(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(thread_id): ApiPath<String>,
    ApiJson(request): ApiJson<ForkRequest>,
) -> Result<Response, ApiError> {
    let (store_id, events) = tenant_events(&state, &tenant, &thread_id).await?;
    let last = events.last().map_or(0, |e| e.seq);
    let at_seq = request.at_seq.unwrap_or(last);
    if at_seq > last {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_event",
            format!("at_seq: thread {thread_id} has no event {at_seq} (its last is {last})"),
        ));
    }
    let (client, target) = tenant.new_thread();
    let copied = state
        .events
        .fork_thread(&store_id, at_seq, &target)
        .await
        .map_err(|e| ApiError::internal(format!("cannot fork thread {thread_id}: {e}")))?;
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "thread_id": client,
            "forked_from": thread_id,
            "at_seq": at_seq,
            "events": copied,
        })),
    )
        .into_response())
}

/// `GET /v1/threads/{thread_id}/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Send events after this sequence number (the `Last-Event-ID` header wins).
    pub after: Option<u64>,
}

/// Streams a thread's events (SSE) from after `Last-Event-ID` (or `after`, or the start)
/// until the thread is idle (its last event is `run_ended`), then an `outcome` event.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}/events",
    tag = "threads",
    params(
        ("thread_id" = String, Path, description = "Your thread id"),
        ("Last-Event-ID" = Option<String>, Header, description = "The last sequence number received: the stream resumes after it"),
        EventsQuery
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "text/event-stream: one event per stored event (`id:` = sequence number, `event:` = its type, `data:` = the event JSON), `text_delta`s (no id), a final `outcome`", content_type = "text/event-stream"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn thread_events(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    ApiPath(thread_id): ApiPath<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let last_id = match headers.get("last-event-id") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .filter(|v| super::contract::is_seq(v))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "Last-Event-ID: expected the sequence number of the last event \
                         received (an `id:` of this stream)",
                    )
                })?,
        ),
        None => match query.after {
            Some(after) if i64::try_from(after).is_err() => {
                return Err(ApiError::invalid(format!(
                    "after: {after} is past the largest sequence number ({})",
                    i64::MAX
                )));
            }
            after => after,
        },
    };
    let (store_id, _) = tenant_events(&state, &tenant, &thread_id).await?;
    let permit = open_stream(&state, &tenant)?;
    Ok(event_stream(
        state.clone(),
        Follow {
            tenant,
            store_id,
            client_id: thread_id,
            from_seq: last_id.map_or(0, |id| id.saturating_add(1)),
            until: Until::Idle,
        },
        None,
        permit,
    )
    .into_response())
}
