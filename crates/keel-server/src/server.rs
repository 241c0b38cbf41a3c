//! [`Server`]: the router (the Host check, auth, limits, body size, timeouts, CORS when
//! configured, metrics), the embedded workers, and the graceful shutdown: on the signal the server
//! stops accepting runs and connections, streams end (clients reconnect elsewhere with
//! `Last-Event-ID`), workers lease nothing more and runs in progress get
//! `[server] shutdown_grace_ms` to finish; runs still going then are interrupted (they
//! write nothing more and stay in progress) and their jobs released to the queue at once,
//! so another worker continues them from the log.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::routing::get;
use keel_app::App;
use keel_app::worker::{JobPolicy, Worker, WorkerOptions, WorkerReport};
use keel_config::ServerConfig;
use keel_core::CancellationToken;
use keel_runtime::RunObserver;
use keel_store::OpenedStore;
use tokio::net::TcpListener;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{ApiDoc, chat, jobs, runs, system, threads};
use crate::auth;
use crate::hub::Hub;
use crate::jobs::ServerJobs;
use crate::limits::{RateLimiter, Usage};
use crate::metrics::Metrics;
use crate::state::{AppState, Shared};

/// Why the server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// `[server]` has invalid values (each names its key and the fix).
    #[error("invalid [server] settings: {}", .0.join("; "))]
    Config(Vec<String>),
    /// The embedded workers could not be set up.
    #[error("cannot start the embedded workers: {0}")]
    Workers(String),
    /// Serving failed.
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
}

/// What happened when [`Server::serve`] returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// What the embedded workers did (none when they were disabled).
    pub workers: Option<WorkerReport>,
    /// Runs were still going when the grace period ended (given back to the queue: see
    /// [`WorkerReport::released`]; those that could not be released in time are left to
    /// their leases' expiry).
    pub left_to_queue: bool,
}

/// A configured server (see the module docs).
pub struct Server {
    state: AppState,
    jobs: ServerJobs,
    router: Router,
    worker_id: String,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.state.config)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server of `app`'s agents over `store` with `config` (keel.toml `[server]` with
    /// the flags applied). Invalid settings are refused, each named.
    pub fn new(
        app: Arc<App>,
        store: &OpenedStore,
        config: ServerConfig,
    ) -> Result<Self, ServerError> {
        let mut problems: Vec<String> = config.problems().into_iter().map(|(_, m)| m).collect();
        let bind = config.bind.parse::<SocketAddr>().ok();
        if let Some(bind) = bind {
            problems.extend(config.serving_problems(bind));
        }
        problems.extend(crate::credentials::problems(
            &config,
            app.config(),
            &crate::credentials::agent_file_http_tools(app.loaded()),
            app.env(),
        ));
        if !problems.is_empty() {
            return Err(ServerError::Config(problems));
        }
        // Each tenant's tool credentials, read through the application's environment.
        let credentials =
            crate::credentials::Credentials::new(&config, app.shared_env(), &app.loaded().base_dir);
        let hub = Arc::new(Hub::new());
        let usage = Arc::new(Usage::default());
        let state: AppState = Arc::new(Shared {
            app: app.clone(),
            events: store.events.clone(),
            queue: store.queue.clone(),
            serving: store.serving.clone(),
            hub: hub.clone(),
            rate: RateLimiter::default(),
            usage: usage.clone(),
            metrics: Metrics::default(),
            config,
            shutdown: CancellationToken::new(),
            poll: Duration::from_millis(250),
            pending: Mutex::new(Vec::new()),
            openapi: OnceLock::new(),
            admissions: crate::state::Admissions::default(),
            streams: Arc::default(),
        });
        let jobs = ServerJobs {
            credentials,
            app,
            hub,
            usage,
            serving: store.serving.clone(),
            observers: Vec::new(),
        };
        let router = build_router(&state, bind);
        Ok(Self {
            state,
            jobs,
            router,
            worker_id: format!("serve-{}", std::process::id()),
        })
    }

    /// Adds an observer to every run the embedded workers drive (telemetry).
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.jobs.observers.push(observer);
        self
    }

    /// Names the embedded workers in leases (default `serve-PID`).
    #[must_use]
    pub fn with_worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = id.into();
        self
    }

    /// The router (for tests and embedding), answering as the server at `[server] bind`
    /// (the A2A cards' URLs and the Host check; [`serve`](Self::serve) uses the address it
    /// is given instead).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The fan-out of this server's appends and text deltas (for tests and embedders).
    pub fn hub(&self) -> Arc<Hub> {
        self.state.hub.clone()
    }

    /// The OpenAPI document as JSON.
    pub fn openapi_json(&self) -> String {
        self.state.openapi.get().cloned().unwrap_or_default()
    }

    /// Cancelled when the server begins shutting down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.state.shutdown.clone()
    }

    /// Serves on `listener` with the embedded workers until `signal` completes, then shuts
    /// down gracefully (see the module docs).
    pub async fn serve(
        self,
        listener: TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<ServeReport, ServerError> {
        let config = &self.state.config;
        // Cards and the Host check name the address actually served (port 0 included).
        let bound = listener.local_addr().map_err(ServerError::Serve)?;
        let problems = config.serving_problems(bound);
        if !problems.is_empty() {
            return Err(ServerError::Config(problems));
        }
        let router = build_router(&self.state, Some(bound));
        let grace = Duration::from_millis(config.shutdown_grace_ms);
        let worker_stop = CancellationToken::new();
        let workers = if config.workers > 0 {
            let options = WorkerOptions {
                worker_id: self.worker_id.clone(),
                lease_ttl: Duration::from_millis(config.lease_ttl_ms),
                concurrency: config.workers,
                poll: self.state.poll,
                exit_when_idle: false,
                policy: JobPolicy::default(),
                max_attempts: config.max_attempts,
                retry_base: Duration::from_millis(config.retry_base_ms),
            };
            let worker = Worker::new(
                self.state.events.clone(),
                self.state.queue.clone(),
                self.jobs.clone(),
                options,
            )
            .map_err(|e| ServerError::Workers(e.to_string()))?
            .with_shutdown(worker_stop.clone())
            .with_shutdown_grace(grace)
            .with_log(Arc::new(
                |line: &str| tracing::info!(target: "keel::worker", "{line}"),
            ));
            Some(tokio::spawn(worker.run()))
        } else {
            None
        };
        let shutdown = self.state.shutdown.clone();
        let on_signal = {
            let shutdown = shutdown.clone();
            async move {
                tokio::select! {
                    () = signal => shutdown.cancel(),
                    () = shutdown.cancelled() => {}
                }
            }
        };
        let stopped = shutdown.clone();
        let mut http = tokio::spawn(
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .into_future(),
        );
        let serve_failed = tokio::select! {
            () = on_signal => None,
            result = &mut http => Some(result),
        };
        shutdown.cancel();
        worker_stop.cancel();
        if let Some(result) = serve_failed {
            if let Some(task) = workers {
                task.abort();
            }
            return match result {
                Ok(Ok(())) => Ok(ServeReport::default()),
                Ok(Err(e)) => Err(ServerError::Serve(e)),
                Err(e) => Err(ServerError::Serve(std::io::Error::other(e.to_string()))),
            };
        }
        let deadline = crate::state::deadline_after(grace);
        if tokio::time::timeout_at(deadline, &mut http).await.is_err() {
            http.abort();
        }
        let mut report = ServeReport::default();
        if let Some(mut task) = workers {
            // At the deadline the workers interrupt their runs still going and release
            // their jobs; a run gets up to a lease TTL to stop (then the worker drops it).
            let ttl = Duration::from_millis(config.lease_ttl_ms);
            let stopped = crate::state::later(deadline, ttl.saturating_add(Duration::from_secs(1)));
            match tokio::time::timeout_at(stopped, &mut task).await {
                Ok(Ok(worker)) => {
                    report.left_to_queue = worker.released > 0;
                    report.workers = Some(worker);
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    // Dropping the runs: their leases expire and another worker continues
                    // them from the log.
                    task.abort();
                    report.left_to_queue = true;
                }
            }
        }
        Ok(report)
    }
}

/// The routes, their OpenAPI document (stored in the state) and the layers, for a server
/// listening on `bound` (`None`: an address unknown yet — cards then name `[server]
/// public_url`, else the default address).
fn build_router(state: &AppState, bound: Option<SocketAddr>) -> Router {
    let bound = bound.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let (keyed, mut api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(chat::chat))
        .routes(routes!(threads::list_threads))
        .routes(routes!(threads::get_thread, threads::delete_thread))
        .routes(routes!(threads::fork_thread))
        .routes(routes!(threads::thread_events))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(runs::decide))
        .routes(routes!(runs::reply))
        .routes(routes!(jobs::get_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(system::metrics))
        .split_for_parts();
    let keyed = keyed.route_layer(from_fn_with_state(state.clone(), auth::require_key));
    let (public, public_api) = OpenApiRouter::default()
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .split_for_parts();
    api.merge(public_api);
    let mut document = serde_json::to_value(&api).unwrap_or_default();
    let offered: Vec<String> = state
        .app
        .config()
        .agents
        .keys()
        .filter(|name| state.config.allows_agent(name))
        .cloned()
        .collect();
    crate::api::contract::complete(&mut document, &offered);
    let _ = state
        .openapi
        .set(serde_json::to_string_pretty(&document).unwrap_or_else(|_| "{}".into()));
    let config = &state.config;
    let router = keyed
        .merge(public)
        .route("/openapi.json", get(system::openapi))
        .route("/docs", get(system::docs))
        .merge(crate::a2a::routes(state, &config.base_url(bound)))
        .merge(crate::ui::routes(state))
        .fallback(system::not_found)
        .method_not_allowed_fallback(system::method_not_allowed);
    // Refused Hosts (DNS rebinding) get 421 before anything else runs; health checks,
    // which show nothing, answer whatever name a load balancer probes with.
    let hosts = keel_ui::AllowedHosts::for_server(config, &[bound])
        .exempt("/healthz")
        .exempt("/readyz");
    let mut router = keel_ui::guard_hosts(router, hosts)
        .layer(from_fn_with_state(state.clone(), auth::count))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_millis(config.request_timeout_ms)
                .saturating_add(Duration::from_secs(10)),
        ));
    if let Some(cors) = cors(&config.cors_origins) {
        router = router.layer(cors);
    }
    router.with_state(state.clone())
}

/// The CORS layer of `origins` (none: no CORS headers at all).
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("last-event-id"),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                HeaderName::from_static("x-keel-thread-id"),
            ]),
    )
}
