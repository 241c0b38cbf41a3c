//! A queued job and how a worker drives it: what `submit` puts on the run queue
//! ([`JobPayload`]), what the application tells the worker about its agent recipes
//! ([`JobSpec`], [`JobAgents`]), and [`drive`] — start the job's run, continue it when this
//! job's run is already in progress (a worker crashed or lost its lease), or wait while
//! another run holds the thread.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::store::ThreadStatus;
use keel_core::tool::CredentialSource;
use keel_core::{CancellationToken, Event, EventKind, EventStore, Message, StoreError, new_id};
use keel_runtime::{Agent, RunContext, RunError, Thread};
use keel_store::{JobId, RunQueue};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::JobPolicy;

/// What a worker needs to know of an agent recipe (the application's own type, e.g. the
/// CLI's agent flags as data).
pub trait JobSpec {
    /// The custom model base URL the recipe sends API keys to, if any.
    fn base_url(&self) -> Option<&str>;
    /// The agent file the recipe builds from, if any.
    fn agent_file(&self) -> Option<&Path>;
    /// The submission id recorded with the run (see [`JobPayload::submission`]).
    fn submission(&self) -> Option<&str>;
    /// Sets the submission id the run will record.
    fn set_submission(&mut self, submission: Option<String>);
}

/// Whether a job starts a new run or continues its own run in progress.
#[derive(Debug, Clone, Copy)]
pub enum JobStart<'a> {
    /// A new run.
    New,
    /// Continues `run_id`, whose events so far are `run_events`.
    Resume {
        /// The run's id.
        run_id: &'a str,
        /// The thread's latest run's events.
        run_events: &'a [std::sync::Arc<Event>],
    },
}

/// How an application turns a job's agent recipe into an agent: implemented by the CLI
/// (and by any server that runs workers) over its own recipe type.
#[async_trait]
pub trait JobAgents: Send + Sync + 'static {
    /// The agent recipe submitted with a job and recorded by the runs it starts.
    type Spec: JobSpec + Serialize + DeserializeOwned + Clone + Send + Sync;

    /// The recipe the run of `run_events` recorded when it started (`Ok(None)` when it
    /// recorded none; `Err` when it cannot be read, e.g. another version wrote it).
    fn recorded(&self, run_events: &[std::sync::Arc<Event>]) -> Result<Option<Self::Spec>, String>;

    /// Builds the agent of `spec` and its run context over `store` (no terminal: approvals
    /// pause the run) on thread `thread_id` (a server scopes what the agent shares, such
    /// as the local model's prompt cache, to the thread's tenant), cancelled by `cancel`.
    /// A [`BuildError::Transient`] error retries
    /// the job (with backoff, up to the worker's `max_attempts`, then it is dead-lettered
    /// with the error); a [`BuildError::Permanent`] one fails it at once with its message.
    async fn build(
        &self,
        spec: &Self::Spec,
        thread_id: &str,
        start: JobStart<'_>,
        store: Arc<dyn EventStore>,
        cancel: CancellationToken,
    ) -> Result<(Box<dyn Agent>, RunContext), BuildError>;

    /// Where the tools of the runs on `thread_id` resolve their credentials, set on the
    /// context [`build`](Self::build) returns (see [`RunContext::credentials`]). `None`
    /// (the default) leaves the context as built: tools read their environment. A server
    /// answers with the credentials of the thread's tenant.
    fn credentials(&self, _thread_id: &str) -> Option<Arc<dyn CredentialSource>> {
        None
    }
}

/// Why a job's agent could not be built ([`JobAgents::build`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// It may work on a later attempt (the store, the network or an MCP server failed):
    /// the job is retried.
    #[error("{0}")]
    Transient(String),
    /// It can never work (an unknown agent or tool, a recipe refused by policy, a bad
    /// configuration): the job fails with this message.
    #[error("{0}")]
    Permanent(String),
}

impl From<crate::AppError> for BuildError {
    /// Store and tool (MCP server, HTTP tool) failures are transient; the rest is not.
    fn from(error: crate::AppError) -> Self {
        if error.is_transient() {
            Self::Transient(error.to_string())
        } else {
            Self::Permanent(error.to_string())
        }
    }
}

impl From<BuildError> for JobFailure {
    fn from(error: BuildError) -> Self {
        match error {
            BuildError::Transient(message) => {
                JobFailure::Transient(format!("cannot build the agent: {message}"))
            }
            BuildError::Permanent(message) => JobFailure::Permanent(message),
        }
    }
}

/// `context` with the credentials `agents` gives the runs on `thread_id`, if any.
fn with_credentials<A: JobAgents>(agents: &A, thread_id: &str, context: RunContext) -> RunContext {
    match agents.credentials(thread_id) {
        Some(credentials) => context.with_credentials(credentials),
        None => context,
    }
}

/// What `submit` puts on the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPayload<S> {
    /// The agent recipe.
    pub agent: S,
    /// The user's message.
    pub message: String,
    /// The thread's length at submission (jobs submitted before submission ids: a
    /// `RunStarted` at or after it is this job's run).
    pub base_seq: u64,
    /// This submission's id, recorded in the run it starts: a worker taking the job over
    /// finds the job's own run by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
}

/// A submitted job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The thread the job runs on.
    pub thread_id: String,
    /// The job.
    pub job_id: JobId,
    /// The thread had a run in progress at submission: the job runs after it ends.
    pub run_in_progress: bool,
}

/// Why a job could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SubmitError(pub String);

/// Enqueues one job running `agent` on `message` in `thread_id` (default: a new thread).
pub async fn submit<S: Serialize>(
    events: &dyn EventStore,
    queue: &dyn RunQueue,
    thread_id: Option<String>,
    agent: S,
    message: String,
) -> Result<Submitted, SubmitError> {
    let thread_id = thread_id.unwrap_or_else(|| new_id("thr"));
    let thread = Thread::load(events, &thread_id)
        .await
        .map_err(|e| SubmitError(format!("cannot load thread {thread_id}: {e}")))?;
    let payload = JobPayload {
        agent,
        message,
        base_seq: thread.state().next_seq(),
        submission: Some(new_id("sub")),
    };
    let payload = serde_json::to_value(&payload)
        .map_err(|e| SubmitError(format!("cannot serialize the job: {e}")))?;
    let job_id = queue
        .enqueue(&thread_id, &payload)
        .await
        .map_err(|e| SubmitError(format!("cannot enqueue: {e}")))?;
    Ok(Submitted {
        run_in_progress: thread.state().run_in_progress(),
        thread_id,
        job_id,
    })
}

/// Why a job could not be driven.
#[derive(Debug)]
pub(super) enum JobFailure {
    /// Retrying cannot help: the job fails.
    Permanent(String),
    /// The store failed or another process drives the thread: the job is retried (up to
    /// the worker's `max_attempts`, then dead-lettered).
    Transient(String),
    /// The thread has a run in progress that is not this job's: the job waits for it
    /// (snoozed: waiting uses up no attempt).
    Wait(String),
}

/// Starts or resumes the job's run; returns a one-line status.
pub(super) async fn drive<A: JobAgents>(
    agents: &A,
    store: Arc<dyn EventStore>,
    thread_id: &str,
    payload: serde_json::Value,
    policy: &JobPolicy,
    cancel: CancellationToken,
) -> Result<String, JobFailure> {
    use JobFailure::{Permanent, Transient, Wait};
    if let Some(holder) = keel_store::claim_holder(&payload) {
        // The lease a command outside the queue took on the thread ([`crate::claim`]),
        // left to expire when it died: closing it frees the thread for its next job (the
        // run it drove is continued by the next `keel resume`, or by a job of its own).
        return Ok(format!("closed the expired claim of {holder}"));
    }
    let job: JobPayload<A::Spec> =
        serde_json::from_value(payload).map_err(|e| Permanent(format!("bad job payload: {e}")))?;
    // The log is read once; the thread keeps its latest run's events.
    let mut thread = Thread::load(store.as_ref(), thread_id)
        .await
        .map_err(|e| Transient(format!("cannot load thread: {e}")))?;
    let in_progress = thread.state().run_in_progress();
    // A recipe another keel version wrote cannot be this job's (nor be resumed here).
    let recorded = agents.recorded(thread.run_events()).ok().flatten();
    let own_run = match &job.submission {
        Some(submission) => recorded
            .as_ref()
            .is_some_and(|spec| spec.submission() == Some(submission.as_str())),
        // Jobs from before submission ids: any run in progress, or one started since.
        None => {
            in_progress
                || thread.run_events().iter().any(|e| {
                    e.seq >= job.base_seq && matches!(e.kind, EventKind::RunStarted { .. })
                })
        }
    };
    let submitted = || {
        let mut spec = job.agent.clone();
        spec.set_submission(job.submission.clone());
        spec
    };
    let outcome = match thread.state().run() {
        Some(run) if own_run && in_progress => {
            // The run's own record of its agent wins over the submitted recipe.
            let spec = match agents.recorded(thread.run_events()).map_err(Permanent)? {
                Some(spec) => spec,
                None => submitted(),
            };
            policy.check(&spec).map_err(Permanent)?;
            let start = JobStart::Resume {
                run_id: &run.run_id,
                run_events: thread.run_events(),
            };
            let (agent, context) = agents
                .build(&spec, thread_id, start, store.clone(), cancel)
                .await
                .map_err(JobFailure::from)?;
            let context = with_credentials(agents, thread_id, context);
            agent.resume(&mut thread, &context).await
        }
        Some(run) if own_run => {
            return Ok(format!(
                "already ended ({})",
                run.ended.map(|e| e.as_str()).unwrap_or("?")
            ));
        }
        Some(_) if in_progress => {
            return Err(Wait(format!(
                "the thread has a run in progress ({}) that is not this job's; this job runs \
                 once it ends (a worker continues it, or approve, deny, reply to or resume it)",
                run_status(&thread)
            )));
        }
        _ => {
            let spec = submitted();
            policy.check(&spec).map_err(Permanent)?;
            let (agent, context) = agents
                .build(&spec, thread_id, JobStart::New, store.clone(), cancel)
                .await
                .map_err(JobFailure::from)?;
            let context = with_credentials(agents, thread_id, context);
            agent
                .run(
                    vec![Message::user(job.message.clone())],
                    &mut thread,
                    &context,
                )
                .await
        }
    };
    let outcome = outcome.map_err(|e| Transient(run_error(&e)))?;
    let how = if in_progress {
        " (resumed an interrupted run)"
    } else {
        ""
    };
    Ok(match outcome.end_state() {
        Some(end_state) => format!("ended {end_state}{how}"),
        None => format!("paused awaiting approval{how}"),
    })
}

/// A run error in words; a store conflict means another process drives the thread.
pub fn run_error(error: &RunError) -> String {
    match error {
        RunError::Store(StoreError::Conflict { thread_id, .. }) => format!(
            "another process is driving thread {thread_id} (append conflict: {error}); \
             nothing of this step was written — try again when it is done"
        ),
        _ => error.to_string(),
    }
}

/// How the thread's run in progress stands, in words.
fn run_status(thread: &Thread) -> &'static str {
    let status = thread
        .run_events()
        .iter()
        .fold(ThreadStatus::Running, |status, event| {
            ThreadStatus::after(status, &event.kind)
        });
    match status {
        ThreadStatus::AwaitingApproval => "awaiting approval",
        ThreadStatus::AwaitingUser => "awaiting the user's answer",
        ThreadStatus::Running | ThreadStatus::Ended(_) => "running or interrupted",
    }
}
