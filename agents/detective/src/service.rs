//! The release service: an axum HTTP server answering release summaries and test details
//! from fixtures, and accepting risk reports (validated, kept on disk as JSON files).
//!
//! | endpoint | answer |
//! | --- | --- |
//! | `GET /releases` | `{"releases": [{"id", "version"}]}` |
//! | `GET /releases/{id}/summary` | the release summary (404 for an unknown release) |
//! | `GET /releases/{id}/test-details` | failing tests, suites, coverage by module |
//! | `POST /risk-reports` | 201 `{report_id, ...}`; 422 naming the field and the fix; 415 unless `Content-Type: application/json`; the same `Idempotency-Key` again → 200 with the first report, or 409 when the body differs |
//! | `GET /risk-reports/{id}` | the report (404 when unknown) |
//! | `GET /risk-reports?release_id=` | `{"reports": [...]}`, oldest first |
//! | `GET /health` | `{"status": "ok"}` |
//!
//! Idempotency keys are persisted next to the reports ([`IdempotencyIndex`]), so a retry
//! after a restart gets the report filed before the restart.
//!
//! Faults set with [`RunningService::set_faults`] ([`crate::faults`]) make chosen requests
//! fail, stall or answer malformed JSON, for evaluations of the agent's error handling.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Mutex, oneshot};

use crate::DetectiveError;
use crate::faults::{self, ActiveFaults, Endpoint, FaultAction, FaultRule};
use crate::fixtures::{self, Releases};
use crate::reports::{self, FieldError, IdempotencyIndex, ReportStore, RiskReport};

/// The default port of the release service.
pub const DEFAULT_PORT: u16 = 8787;

/// Where and how the service runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Port on 127.0.0.1; 0 picks a free one. Default 8787.
    pub port: u16,
    /// Directory of filed reports (one JSON file each). Default `.keel/risk-reports`.
    pub reports_dir: PathBuf,
    /// Directory of release fixtures; `None` uses the fixtures embedded in the crate.
    pub fixtures_dir: Option<PathBuf>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            reports_dir: PathBuf::from(".keel/risk-reports"),
            fixtures_dir: None,
        }
    }
}

struct AppState {
    releases: Releases,
    store: ReportStore,
    /// Idempotency key → report id, persisted next to the reports. The lock also makes
    /// filing one report at a time, so two requests with one key cannot both file.
    filed: Mutex<IdempotencyIndex>,
    /// Injected faults (shared with [`RunningService`], which sets them).
    faults: Arc<Mutex<ActiveFaults>>,
}

/// A running release service. Dropping it leaves the server running until the runtime
/// ends; call [`RunningService::shutdown`] to stop it.
#[derive(Debug)]
pub struct RunningService {
    addr: SocketAddr,
    reports_dir: PathBuf,
    faults: Arc<Mutex<ActiveFaults>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningService {
    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where reports are written.
    pub fn reports_dir(&self) -> &std::path::Path {
        &self.reports_dir
    }

    /// Replaces the injected faults (an empty list clears them); a rule's `times` counts
    /// from now. Every rule is validated first: the error names the rule and the fix, and
    /// leaves the faults as they were.
    pub async fn set_faults(&self, rules: Vec<FaultRule>) -> Result<(), String> {
        for (index, rule) in rules.iter().enumerate() {
            rule.validate()
                .map_err(|e| format!("faults[{index}]: {e}"))?;
        }
        self.faults.lock().await.set(rules);
        Ok(())
    }

    /// Stops accepting connections and waits (at most 5 s) for in-flight requests.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

/// Starts the service on `127.0.0.1:config.port`.
pub async fn serve(config: ServiceConfig) -> Result<RunningService, DetectiveError> {
    let releases = match &config.fixtures_dir {
        Some(dir) => fixtures::load_dir(dir)?,
        None => fixtures::embedded()?,
    };
    let store = ReportStore::open(&config.reports_dir).map_err(|source| DetectiveError::Io {
        path: config.reports_dir.display().to_string(),
        source,
    })?;
    let filed = IdempotencyIndex::load(&store)
        .await
        .map_err(|source| DetectiveError::Io {
            path: config.reports_dir.display().to_string(),
            source,
        })?;
    let faults = Arc::new(Mutex::new(ActiveFaults::default()));
    let state = Arc::new(AppState {
        releases,
        store,
        filed: Mutex::new(filed),
        faults: Arc::clone(&faults),
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], config.port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DetectiveError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| DetectiveError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router(state);
    let task = tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        if let Err(error) = server.await {
            tracing::error!(%error, "release service stopped with an error");
        }
    });
    tracing::debug!(%addr, "release service listening");
    Ok(RunningService {
        addr,
        reports_dir: config.reports_dir,
        faults,
        stop: Some(stop),
        task,
    })
}

/// Runs the service until Ctrl-C (for `keel detective serve`), printing
/// `release service listening on http://127.0.0.1:PORT` once it accepts connections.
pub async fn serve_forever(port: u16, reports_dir: PathBuf) -> Result<(), DetectiveError> {
    let service = serve(ServiceConfig {
        port,
        reports_dir,
        fixtures_dir: None,
    })
    .await?;
    println!("release service listening on {}", service.base_url());
    println!("reports are written to {}", service.reports_dir().display());
    let _ = tokio::signal::ctrl_c().await;
    service.shutdown().await;
    Ok(())
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/releases", get(list_releases))
        .route("/releases/{id}/summary", get(summary))
        .route("/releases/{id}/test-details", get(test_details))
        .route("/risk-reports", get(list_reports).post(file_report))
        .route("/risk-reports/{id}", get(get_report))
        .with_state(state)
}

fn error(
    status: StatusCode,
    code: &str,
    message: String,
    field: Option<&str>,
    fix: Option<String>,
) -> Response {
    let mut body = json!({"code": code, "message": message});
    if let Value::Object(map) = &mut body {
        if let Some(field) = field {
            map.insert("field".into(), json!(field));
        }
        if let Some(fix) = fix {
            map.insert("fix".into(), json!(fix));
        }
    }
    (status, axum::Json(json!({ "error": body }))).into_response()
}

fn field_error(problem: FieldError) -> Response {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        problem.message,
        Some(&problem.field),
        Some(problem.fix),
    )
}

async fn list_releases(State(state): State<Arc<AppState>>) -> Response {
    let releases: Vec<Value> = state
        .releases
        .values()
        .map(|r| json!({"id": r.id, "version": r.summary.get("version").cloned().unwrap_or(Value::Null)}))
        .collect();
    axum::Json(json!({ "releases": releases })).into_response()
}

/// Looks a release up, applying its failure behaviour; `Err` is the response to send.
async fn release<'s>(
    state: &'s AppState,
    id: &str,
) -> Result<&'s fixtures::ReleaseFixture, Response> {
    let Some(release) = state.releases.get(id) else {
        let known: Vec<&str> = state.releases.keys().map(String::as_str).collect();
        return Err(error(
            StatusCode::NOT_FOUND,
            "release_not_found",
            format!("release `{id}` not found"),
            Some("release_id"),
            Some(format!("use one of: {}", known.join(", "))),
        ));
    };
    if let Some(ms) = release.behavior.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(status) = release.behavior.fail_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Err(error(
            status,
            "internal",
            format!("the release database failed while reading `{id}`; try again later"),
            None,
            None,
        ));
    }
    Ok(release)
}

async fn summary(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    release_data(&state, Endpoint::Summary, &id, |release| &release.summary).await
}

async fn test_details(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    release_data(&state, Endpoint::TestDetails, &id, |release| {
        &release.test_details
    })
    .await
}

/// Answers one of a release's GET endpoints: the injected fault first, then the fixture.
async fn release_data(
    state: &AppState,
    endpoint: Endpoint,
    id: &str,
    pick: fn(&fixtures::ReleaseFixture) -> &Value,
) -> Response {
    let fault = state.faults.lock().await.take(endpoint, Some(id));
    match &fault {
        Some(FaultAction::Fail { status, message }) => return fault_response(*status, message),
        Some(FaultAction::Delay(ms)) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        Some(FaultAction::Malformed) | None => {}
    }
    match release(state, id).await {
        Ok(release) if fault == Some(FaultAction::Malformed) => malformed_response(pick(release)),
        Ok(release) => axum::Json(pick(release).clone()).into_response(),
        Err(response) => response,
    }
}

/// The answer of a `status` fault: the JSON error body a failing service would send.
fn fault_response(status: u16, message: &str) -> Response {
    let code = match status {
        429 => "rate_limited",
        503 => "unavailable",
        500..=599 => "internal",
        _ => "rejected",
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, code, message.to_string(), None, None)
}

/// A 200 whose JSON body is cut off halfway.
fn malformed_response(body: &Value) -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        faults::malformed_body(body),
    )
        .into_response()
}

/// Whether a `Content-Type` header value is JSON (`application/json`, any parameters such
/// as `charset`, any letter case). Hand-written: a comparison of the media type, not worth
/// a MIME crate.
fn is_json_content_type(value: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

async fn file_report(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if !content_type.as_deref().is_some_and(is_json_content_type) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body must be JSON, but Content-Type is {}",
                content_type.map_or_else(|| "missing".to_string(), |t| format!("`{t}`"))
            ),
            Some("Content-Type"),
            Some("send the report as a JSON object with `Content-Type: application/json`".into()),
        );
    }
    let release_id = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|body| {
            body.get("release_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    let fault = state
        .faults
        .lock()
        .await
        .take(Endpoint::RiskReports, release_id.as_deref());
    match &fault {
        Some(FaultAction::Fail { status, message }) => return fault_response(*status, message),
        Some(FaultAction::Delay(ms)) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        Some(FaultAction::Malformed) | None => {}
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(problem) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not valid JSON: {problem}"),
                Some("body"),
                Some("send a JSON object with release_id, severity and findings".into()),
            );
        }
    };
    let new = match reports::validate(&body, &|id| state.releases.contains_key(id)) {
        Ok(new) => new,
        Err(problem) => return field_error(problem),
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|k| !k.is_empty());
    let mut filed = state.filed.lock().await;
    if let Some(key) = &key
        && let Some(existing) = filed.get(key)
    {
        match state.store.get(existing).await {
            Ok(Some(report)) if report.has_content_of(&new) => {
                return (StatusCode::OK, axum::Json(report)).into_response();
            }
            Ok(Some(report)) => {
                return error(
                    StatusCode::CONFLICT,
                    "idempotency_conflict",
                    format!(
                        "Idempotency-Key `{key}` was already used to file report `{}` with a \
                         different body; a key may only be reused to retry the same report",
                        report.report_id
                    ),
                    Some("Idempotency-Key"),
                    Some(
                        "retry with the body sent first to get that report back, or use a new \
                         Idempotency-Key to file a different report"
                            .into(),
                    ),
                );
            }
            // The report file is gone: file it again under the same key.
            Ok(None) => {}
            Err(problem) => return storage_error(&state.store, &problem),
        }
    }
    let report = RiskReport {
        report_id: format!("rr-{}", uuid::Uuid::now_v7().simple()),
        release_id: new.release_id,
        severity: new.severity,
        findings: new.findings,
        summary: new.summary,
        recommendations: new.recommendations,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        idempotency_key: key.clone(),
    };
    if let Err(problem) = state.store.save(&report).await {
        return storage_error(&state.store, &problem);
    }
    if let Some(key) = key
        && let Err(problem) = filed.record(&key, &report.report_id).await
    {
        // The report is on disk and carries its key, so the index is rebuilt from it on
        // the next start; this process still knows the key in memory.
        tracing::warn!(%problem, report_id = %report.report_id, "cannot write the idempotency index");
    }
    tracing::debug!(report_id = %report.report_id, release = %report.release_id, severity = %report.severity, "risk report filed");
    if fault == Some(FaultAction::Malformed) {
        // Filed, but the answer is cut off: a retry with the same Idempotency-Key gets it.
        return match serde_json::to_value(&report) {
            Ok(value) => {
                let mut response = malformed_response(&value);
                *response.status_mut() = StatusCode::CREATED;
                response
            }
            Err(_) => (StatusCode::CREATED, axum::Json(report)).into_response(),
        };
    }
    (StatusCode::CREATED, axum::Json(report)).into_response()
}

fn storage_error(store: &ReportStore, problem: &std::io::Error) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "storage",
        format!(
            "cannot use the reports directory {}: {problem}",
            store.dir().display()
        ),
        None,
        None,
    )
}

async fn get_report(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.store.get(&id).await {
        Ok(Some(report)) => axum::Json(report).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "report_not_found",
            format!("risk report `{id}` not found"),
            Some("report_id"),
            Some("use the report_id returned by POST /risk-reports".into()),
        ),
        Err(problem) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage",
            problem.to_string(),
            None,
            None,
        ),
    }
}

/// Query of `GET /risk-reports`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    release_id: Option<String>,
}

async fn list_reports(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ListQuery>,
) -> Response {
    match state.store.list(query.release_id.as_deref()).await {
        Ok(list) => axum::Json(json!({ "reports": list })).into_response(),
        Err(problem) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage",
            problem.to_string(),
            None,
            None,
        ),
    }
}
