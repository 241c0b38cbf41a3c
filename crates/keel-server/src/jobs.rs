//! Runs go through the run queue, never the request: [`enqueue_new`] queues a job (the
//! keel-app worker payload, [`JobPayload`] of a [`Recipe`] naming a keel.toml agent — the
//! format `keel submit` queues, so `keel worker` processes can drive server jobs too), and
//! [`enqueue_continue`] queues the continuation of a paused run under the run's own
//! submission id, so whichever worker leases it resumes that run. [`ServerJobs`] is how
//! the server's embedded workers build agents: through keel-app's [`Recipe`], exactly as
//! the CLI does, plus the [`HubObserver`] and the cross-process cancel check; each run's
//! tools get the credentials of the thread's tenant ([`crate::credentials`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_app::App;
use keel_app::recipe::Recipe;
use keel_app::worker::{BuildError, JobAgents, JobPayload, JobStart};
use keel_core::tool::CredentialSource;
use keel_core::{CancellationToken, Event, EventStore, new_id};
use keel_runtime::{Agent, RunContext, Thread};
use keel_store::{JobId, RunQueue, ServingStore};

use crate::credentials::Credentials;
use crate::hub::{Hub, HubObserver};
use crate::limits::Usage;

/// How often a run driven here checks the store for a cancel asked of another process.
const CANCEL_POLL: Duration = Duration::from_millis(250);

/// A queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The job.
    pub job_id: JobId,
    /// The submission id the job's run records (find the run by it).
    pub submission: String,
    /// The thread's length when queued: the job's events come after it.
    pub base_seq: u64,
}

/// The recipe of keel.toml agent `name`.
pub fn recipe_for(name: &str) -> Recipe {
    Recipe {
        agent_name: Some(name.to_string()),
        ..Recipe::default()
    }
}

/// Queues a new run of `recipe` on store thread `thread` with `message`.
pub async fn enqueue_new(
    queue: &dyn RunQueue,
    thread: &Thread,
    recipe: Recipe,
    message: String,
) -> Result<Queued, String> {
    enqueue_new_as(queue, thread, recipe, message, new_id("sub")).await
}

/// [`enqueue_new`] with the submission id the run records (unique per run).
pub async fn enqueue_new_as(
    queue: &dyn RunQueue,
    thread: &Thread,
    recipe: Recipe,
    message: String,
    submission: String,
) -> Result<Queued, String> {
    let base_seq = thread.state().next_seq();
    // Recorded with the run, so any process that drives it (a `keel worker` too) gives
    // its tools this tenant's credentials.
    let mut recipe = recipe;
    recipe.tenant = crate::tenancy::tenant_of(thread.id()).map(str::to_string);
    let payload = JobPayload {
        agent: recipe,
        message,
        base_seq,
        submission: Some(submission.clone()),
    };
    let job_id = enqueue(queue, thread.id(), &payload).await?;
    Ok(Queued {
        job_id,
        submission,
        base_seq,
    })
}

/// Queues the continuation of `thread`'s run in progress (paused for approval or the
/// user, or interrupted): the job carries the run's own recipe and submission id, and is a
/// queue continuation ([`RunQueue::enqueue_continuation`]), leased ahead of the thread's
/// other queued jobs — a message waiting for this run never holds it up.
pub async fn enqueue_continue(queue: &dyn RunQueue, thread: &Thread) -> Result<Queued, String> {
    let recorded = Recipe::recorded(thread.run_events())
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "the run on thread {} recorded no agent recipe, so no worker can continue it; \
                 continue it with `keel resume`",
                thread.id()
            )
        })?;
    let submission = recorded.submission.clone();
    // Runs without a submission id (started by `keel run`): any run in progress is the
    // job's own when `base_seq` is at or before its start.
    let base_seq = thread.run_events().first().map_or(0, |e| e.seq);
    let payload = JobPayload {
        agent: recorded,
        message: String::new(),
        base_seq,
        submission: submission.clone(),
    };
    // Ahead of the thread's other queued jobs, which may wait for this very run.
    let value = serde_json::to_value(&payload).map_err(|e| format!("cannot queue the run: {e}"))?;
    let job_id = queue
        .enqueue_continuation(thread.id(), &value)
        .await
        .map_err(|e| format!("cannot queue the run: {e}"))?;
    Ok(Queued {
        job_id,
        submission: submission.unwrap_or_default(),
        base_seq,
    })
}

async fn enqueue(
    queue: &dyn RunQueue,
    thread_id: &str,
    payload: &JobPayload<Recipe>,
) -> Result<JobId, String> {
    let value = serde_json::to_value(payload).map_err(|e| format!("cannot queue the run: {e}"))?;
    queue
        .enqueue(thread_id, &value)
        .await
        .map_err(|e| format!("cannot queue the run: {e}"))
}

/// The submission id a run records (its `RunStarted` recipe), if any.
pub fn submission_of(event: &Event) -> Option<String> {
    match &event.kind {
        keel_core::EventKind::RunStarted {
            definition: Some(definition),
            ..
        } => definition
            .recipe
            .get("submission")
            .and_then(|s| s.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// The embedded workers' agents (see the module docs).
#[derive(Clone)]
pub struct ServerJobs {
    /// The application (keel.toml).
    pub app: Arc<App>,
    /// The fan-out to streams.
    pub hub: Arc<Hub>,
    /// Per-tenant token usage.
    pub usage: Arc<Usage>,
    /// Cancel requests.
    pub serving: Arc<dyn ServingStore>,
    /// More observers for every run (telemetry).
    pub observers: Vec<Arc<dyn keel_runtime::RunObserver>>,
    /// The tenants' tool credentials.
    pub credentials: Credentials,
}

impl std::fmt::Debug for ServerJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerJobs").finish_non_exhaustive()
    }
}

#[async_trait]
impl JobAgents for ServerJobs {
    type Spec = Recipe;

    fn recorded(&self, run_events: &[std::sync::Arc<Event>]) -> Result<Option<Recipe>, String> {
        Recipe::recorded(run_events).map_err(|e| e.to_string())
    }

    /// The thread's tenant's credentials, and nothing else: never the server's environment.
    fn credentials(&self, thread_id: &str) -> Option<Arc<dyn CredentialSource>> {
        Some(Arc::new(self.credentials.for_thread(thread_id)))
    }

    async fn build(
        &self,
        spec: &Recipe,
        thread_id: &str,
        start: JobStart<'_>,
        store: Arc<dyn EventStore>,
        cancel: CancellationToken,
    ) -> Result<(Box<dyn Agent>, RunContext), BuildError> {
        // The tenant's own prompt cache: a local model shares cached prefixes only among
        // one tenant's runs (another tenant could time them).
        let partition = crate::tenancy::tenant_of(thread_id).unwrap_or_default();
        let built = spec
            .build_agent_in(&self.app, None, Some(partition))
            .await
            .map_err(BuildError::from)?;
        let run_id = match start {
            JobStart::Resume { run_id, .. } => Some(run_id),
            JobStart::New => None,
        };
        if let Some(run_id) = run_id {
            // Fails closed: a run whose cancel cannot be looked up is not continued (the
            // job is retried), never continued as if nobody had asked.
            let asked = self.serving.cancel_requested(run_id).await.map_err(|e| {
                BuildError::Transient(format!(
                    "cannot tell whether run {run_id} was asked to cancel: {e}"
                ))
            })?;
            if asked {
                cancel.cancel();
            }
        }
        let observer = Arc::new(HubObserver::new(
            self.hub.clone(),
            self.usage.clone(),
            cancel.clone(),
            run_id,
        ));
        spawn_cancel_watch(
            Arc::downgrade(&observer),
            self.serving.clone(),
            cancel.clone(),
        );
        let mut context = self
            .app
            .run_context(store, spec.approve, built.approve)
            .with_cancel(cancel)
            .with_observer(observer);
        for extra in &self.observers {
            context = context.with_observer(extra.clone());
        }
        Ok((Box::new(built.agent), context))
    }
}

/// While the run's observer lives (the run is driven), polls the store for a cancel asked
/// of another process and cancels the run.
fn spawn_cancel_watch(
    observer: std::sync::Weak<HubObserver>,
    serving: Arc<dyn ServingStore>,
    cancel: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(CANCEL_POLL) => {}
                () = cancel.cancelled() => return,
            }
            let Some(observer) = observer.upgrade() else {
                return;
            };
            let Some(run_id) = observer.run_id() else {
                continue;
            };
            drop(observer);
            // A lookup that fails or hangs decides nothing: the next poll asks again (the
            // run's lease, renewed on its own, stops the run if the store stays away).
            match tokio::time::timeout(CANCEL_POLL * 8, serving.cancel_requested(&run_id)).await {
                Ok(Ok(true)) => {
                    cancel.cancel();
                    return;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(target: "keel::worker", "run {run_id}: cannot look up cancels: {e}");
                }
                Err(_) => {
                    tracing::warn!(target: "keel::worker", "run {run_id}: the cancel lookup timed out");
                }
            }
        }
    });
}
