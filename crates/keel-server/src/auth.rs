//! Authentication and the per-request limit: every `/v1` request must carry
//! `Authorization: Bearer <key>` of an active key (401 otherwise, without saying whether
//! the key exists); the key's [`Tenant`] is put in the request's extensions for the
//! handlers, and the tenant's requests-per-minute allowance is taken (429).

use std::sync::atomic::Ordering;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::keys;
use crate::state::AppState;
use crate::tenancy::Tenant;

/// The middleware in front of every `/v1` route.
pub async fn require_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .map(str::to_string);
    let Some(presented) = presented else {
        state.metrics.unauthorized.fetch_add(1, Ordering::Relaxed);
        return ApiError::unauthorized(
            "missing `Authorization: Bearer <key>` header: create a key with \
             `keel keys create --tenant NAME`",
        )
        .into_response();
    };
    let found = tokio::time::timeout(
        state.request_timeout(),
        keys::resolve(&state.serving, &presented),
    )
    .await;
    let info = match found {
        Ok(Ok(Some(info))) => info,
        Ok(Ok(None)) => {
            state.metrics.unauthorized.fetch_add(1, Ordering::Relaxed);
            return ApiError::unauthorized(
                "the API key is not valid (unknown or revoked): check the key, or create \
                 one with `keel keys create --tenant NAME`",
            )
            .into_response();
        }
        Ok(Err(e)) => return ApiError::unavailable(e.to_string()).into_response(),
        Err(_) => {
            return ApiError::unavailable("the key store did not answer in time; retry")
                .into_response();
        }
    };
    let limits = state.config.limits_for(&info.tenant);
    if let Err(error) = state.rate.check(&info.tenant, limits.requests_per_minute) {
        state.metrics.limited.fetch_add(1, Ordering::Relaxed);
        return error.into_response();
    }
    request.extensions_mut().insert(Tenant {
        name: info.tenant,
        key_id: info.key_id,
        key_sha256: keys::digest(&presented),
    });
    next.run(request).await
}

/// Counts every request by route template, method and status (for `/metrics`). Every
/// label comes from a closed set, so no request — keyed or not — adds a series of its
/// own: the route is the template the router matched (`unmatched` for any other path),
/// the method one of [`method_label`]'s.
pub async fn count(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = method_label(request.method());
    let response = next.run(request).await;
    state
        .metrics
        .request(&route, method, response.status().as_u16());
    response
}

/// The metrics label of `method`: the standard ones by name, any other `other`.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}
