//! The HTTP API: the routes (each handler documented for OpenAPI with utoipa, collected by
//! `utoipa-axum`'s router so a route cannot be served without being in `/openapi.json`),
//! the request extractors that answer bad input with the API's JSON errors, and the
//! shared lookups (a tenant's thread, a run's events).

pub mod chat;
pub mod contract;
pub mod jobs;
pub mod runs;
pub mod system;
pub mod threads;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use keel_core::Event;
use keel_runtime::Thread;
use serde::de::DeserializeOwned;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;
use crate::tenancy::Tenant;

/// The OpenAPI document's fixed parts (the paths come from the router).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Keel server API",
        description = "Chat with keel.toml agents over a durable run queue; stream run events \
                       (SSE, resumable with Last-Event-ID); manage threads and runs. Every \
                       /v1 route needs `Authorization: Bearer <key>` (`keel keys create`). \
                       Errors are `{\"error\": {\"code\", \"message\"}}`. See docs/server.md."
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// Adds the `bearer` security scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some("An API key from `keel keys create`"))
                        .build(),
                ),
            );
        }
    }
}

/// A JSON body; a malformed one is a 400 naming the field (413 when too large).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the request body is larger than the server accepts ([server] \
                     max_body_bytes in keel.toml)",
                )
            } else {
                ApiError::invalid(format!("cannot read the request body: {e}"))
            }
        })?;
        let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
            Bytes::from_static(b"{}")
        } else {
            bytes
        };
        // Every body is an object: serde would also read a struct from an array of its
        // fields in order (`[]` as `{}`), which the schema does not allow.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::invalid(
                "request body: expected a JSON object (see the schema in /openapi.json)",
            ));
        }
        serde_json::from_slice(&bytes).map(ApiJson).map_err(|e| {
            ApiError::invalid(format!(
                "request body: {e} (see the schema in /openapi.json)"
            ))
        })
    }
}

/// Query parameters; bad ones are a 400 naming the parameter.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| ApiQuery(q.0))
            .map_err(|e| ApiError::invalid(format!("query string: {}", e.body_text())))
    }
}

/// Path parameters; a malformed one (a job id that is no integer, bytes that are not
/// UTF-8) is a 400 with the API's JSON error, like every other bad input.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e| ApiError::invalid(format!("path: {}", e.body_text())))
    }
}

/// The tenant's thread `client_id`, loaded; 404 when the tenant has no such thread.
pub async fn tenant_thread(
    state: &AppState,
    tenant: &Tenant,
    client_id: &str,
) -> Result<Thread, ApiError> {
    let store_id = tenant.store_id(client_id).map_err(ApiError::invalid)?;
    let thread = Thread::load(state.events.as_ref(), &store_id)
        .await
        .map_err(|e| ApiError::internal(format!("cannot load thread {client_id}: {e}")))?;
    if thread.is_empty() {
        return Err(ApiError::thread_not_found(client_id));
    }
    Ok(thread)
}

/// Every event of the tenant's thread `client_id`; 404 when it has none.
pub async fn tenant_events(
    state: &AppState,
    tenant: &Tenant,
    client_id: &str,
) -> Result<(String, Vec<Event>), ApiError> {
    let store_id = tenant.store_id(client_id).map_err(ApiError::invalid)?;
    let events = state
        .events
        .load(&store_id)
        .await
        .map_err(|e| ApiError::internal(format!("cannot load thread {client_id}: {e}")))?;
    if events.is_empty() {
        return Err(ApiError::thread_not_found(client_id));
    }
    Ok((store_id, events))
}

/// 404 for a run id the thread does not have.
pub fn run_not_found(thread_id: &str, run_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "run {run_id} is not a run of thread {thread_id} (see GET /v1/threads/{thread_id})"
        ),
    )
}
