//! The routes without a tenant: `/healthz` (the process answers), `/readyz` (the store
//! answers), `/openapi.json` and `/docs` (the API's description, which holds no tenant
//! data), and `/metrics` (Prometheus text; needs a key like every `/v1` route).

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use keel_core::store::ThreadFilter;
use serde_json::json;

use crate::error::{ApiError, ErrorBody};
use crate::state::AppState;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "`{\"status\": \"ok\"}`", body = serde_json::Value)))]
pub async fn healthz() -> axum::Json<serde_json::Value> {
    axum::Json(json!({"status": "ok"}))
}

/// Readiness: the store answers a query within 5 s and the server is not shutting down.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "system",
    responses(
        (status = 200, description = "`{\"status\": \"ready\"}`", body = serde_json::Value),
        (status = 503, description = "The store does not answer, or the server is shutting down", body = ErrorBody),
    )
)]
pub async fn readyz(
    State(state): State<AppState>,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let probe = ThreadFilter {
        limit: Some(1),
        ..ThreadFilter::default()
    };
    match tokio::time::timeout(Duration::from_secs(5), state.events.list_threads(&probe)).await {
        Ok(Ok(_)) => Ok(axum::Json(json!({"status": "ready"}))),
        Ok(Err(e)) => Err(ApiError::unavailable(format!(
            "the store is not reachable: {e}"
        ))),
        Err(_) => Err(ApiError::unavailable("the store did not answer within 5 s")),
    }
}

/// Metrics in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "system",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, description = "No or an unknown key", body = ErrorBody),
        (status = 403, description = "`operator_only`: the key's tenant is not in `[server] operators` (the figures are every tenant's)", body = ErrorBody),
    )
)]
pub async fn metrics(
    State(state): State<AppState>,
    axum::Extension(tenant): axum::Extension<crate::tenancy::Tenant>,
) -> Response {
    if !state.config.operators.contains(&tenant.name) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            format!(
                "/metrics shows every tenant's traffic: only keys of the tenants in keel.toml \
                 [server] operators may read it (tenant {} is not one; add it, or scrape \
                 with a key of an operator tenant)",
                tenant.name
            ),
        )
        .into_response();
    }
    let counts = tokio::time::timeout(Duration::from_secs(5), state.queue.counts())
        .await
        .ok()
        .and_then(Result::ok);
    let text = state.metrics.render(counts, state.hub.running_count());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The OpenAPI document, set once the router is built.
pub async fn openapi(State(state): State<AppState>) -> Response {
    match state.openapi.get() {
        Some(text) => ([(header::CONTENT_TYPE, "application/json")], text.clone()).into_response(),
        None => ApiError::internal("the OpenAPI document is not built").into_response(),
    }
}

/// A small page listing the API from `/openapi.json` (self-contained: no CDN).
pub async fn docs() -> Html<&'static str> {
    Html(DOCS_PAGE)
}

/// JSON 404 for unknown routes.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such route: see /openapi.json (or /docs) for the API",
    )
}

/// JSON 405 for a known route and another method.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take this method: see /openapi.json",
    )
}

const DOCS_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Keel server API</title>
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
code,pre{font:13px ui-monospace,monospace}.op{border:1px solid #ddd;border-radius:6px;margin:.8rem 0;padding:.6rem .9rem}
.m{display:inline-block;min-width:4.5rem;font-weight:700}.get{color:#0a6}.post{color:#06c}.delete{color:#c30}
.auth{font-size:12px;color:#777}details pre{background:#f6f6f6;padding:.5rem;overflow:auto}
</style></head><body>
<h1>Keel server API</h1>
<p id="about"></p>
<p>The machine-readable description is <a href="/openapi.json">/openapi.json</a>. Every <code>/v1</code> route needs <code>Authorization: Bearer &lt;key&gt;</code> (<code>keel keys create --tenant NAME</code>).</p>
<div id="ops">Loading…</div>
<script>
fetch('/openapi.json').then(r=>r.json()).then(api=>{
  document.getElementById('about').textContent=api.info.description||'';
  const ops=document.getElementById('ops');ops.textContent='';
  for(const [path,item] of Object.entries(api.paths)){
    for(const [method,op] of Object.entries(item)){
      const d=document.createElement('div');d.className='op';
      const h=document.createElement('div');
      const m=document.createElement('span');m.className='m '+method;m.textContent=method.toUpperCase();
      const p=document.createElement('code');p.textContent=path;
      h.append(m,p);
      if(op.security){const a=document.createElement('span');a.className='auth';a.textContent='  (API key)';h.append(a);}
      const s=document.createElement('div');s.textContent=op.summary||op.description||'';
      const x=document.createElement('details');const sm=document.createElement('summary');sm.textContent='details';
      const pre=document.createElement('pre');pre.textContent=JSON.stringify(op,null,2);x.append(sm,pre);
      d.append(h,s,x);ops.append(d);
    }
  }
}).catch(e=>{document.getElementById('ops').textContent='Cannot load /openapi.json: '+e});
</script></body></html>"#;
