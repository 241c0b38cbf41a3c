//! What every handler shares: the application, the store's parts, the hub, the limits and
//! metrics, the `[server]` settings and the shutdown signal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_app::App;
use keel_config::ServerConfig;
use keel_core::{CancellationToken, EventStore};
use keel_store::{JobId, RunQueue, ServingStore};

use crate::hub::Hub;
use crate::limits::{RateLimiter, Usage};
use crate::metrics::Metrics;

/// The server's shared state.
pub struct Shared {
    /// keel.toml and what it builds.
    pub app: Arc<App>,
    /// The event log.
    pub events: Arc<dyn EventStore>,
    /// The run queue.
    pub queue: Arc<dyn RunQueue>,
    /// API keys and cancel requests.
    pub serving: Arc<dyn ServingStore>,
    /// Fan-out from the embedded workers.
    pub hub: Arc<Hub>,
    /// Requests per minute.
    pub rate: RateLimiter,
    /// Tokens per day.
    pub usage: Arc<Usage>,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    /// `[server]`.
    pub config: ServerConfig,
    /// Cancelled on SIGTERM / Ctrl-C: streams end, no new runs are accepted.
    pub shutdown: CancellationToken,
    /// How often streams and waits re-read the store when nothing was announced.
    pub poll: Duration,
    /// Jobs this process queued, by tenant, until seen started or finished (the
    /// concurrent-runs limit counts them with the store's running threads).
    pub pending: Mutex<Vec<PendingJob>>,
    /// The OpenAPI document (JSON), set when the router is built.
    pub openapi: std::sync::OnceLock<String>,
    /// Per-tenant locks held from counting a tenant's runs to queueing its new one.
    pub admissions: Admissions,
    /// Event streams open, by tenant and key.
    pub streams: Arc<crate::streams::OpenStreams>,
}

/// Makes "count the tenant's runs, then queue one" atomic in this process: one lock per
/// tenant, held by [`crate::api::chat::check_run_limits`]'s [`RunAdmission`] until the new
/// job is queued and tracked. Without it a burst of chats all counted the same runs and
/// were all admitted past `concurrent_runs`. (Several `keel serve` processes over one
/// Postgres each admit up to the limit: the limit is per process there, as documented.)
#[derive(Default)]
pub struct Admissions {
    locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Admissions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admissions").finish_non_exhaustive()
    }
}

impl Admissions {
    /// Waits for the tenant's admission lock (one entry per tenant that ever started a
    /// run; tenants are configured or have keys, so the map stays small).
    pub async fn enter(&self, tenant: &str) -> RunAdmission {
        let lock = {
            let mut locks = match self.locks.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            Arc::clone(locks.entry(tenant.to_string()).or_default())
        };
        RunAdmission {
            _guard: Some(lock.lock_owned().await),
        }
    }
}

/// A tenant's admission to start a run: while it lives, no other run of the tenant is
/// admitted in this process. Keep it until the job is queued and tracked.
#[must_use = "hold the admission until the new run's job is queued and tracked"]
#[derive(Debug)]
pub struct RunAdmission {
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl RunAdmission {
    /// An admission that holds nothing (the tenant has no concurrent-runs limit).
    pub fn unlimited() -> Self {
        Self { _guard: None }
    }
}

/// A job queued by this process.
#[derive(Debug, Clone)]
pub struct PendingJob {
    /// Tenant.
    pub tenant: String,
    /// Store thread id.
    pub store_id: String,
    /// The job.
    pub job_id: JobId,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The handlers' state.
pub type AppState = Arc<Shared>;

impl Shared {
    /// The longest a non-streaming request waits.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    /// The longest a stream stays open.
    pub fn stream_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stream_timeout_ms)
    }
}

/// The instant `after` from now, with checked arithmetic: configured durations are bounded
/// by `ServerConfig::problems`, but a deadline must never panic on one that was not (an
/// overflowing one is a year away, as good as never for a request or a stream).
pub(crate) fn deadline_after(after: Duration) -> tokio::time::Instant {
    later(tokio::time::Instant::now(), after)
}

/// `from + after`, or a year after `from` when that overflows.
pub(crate) fn later(from: tokio::time::Instant, after: Duration) -> tokio::time::Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    from.checked_add(after)
        .or_else(|| from.checked_add(YEAR))
        .unwrap_or(from)
}
