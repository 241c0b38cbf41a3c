//! Continuing a stored thread from its log, in any process: what ran it ([`recorded_runner`]:
//! a workflow or an agent's [`Recipe`]), where its latest run stands ([`latest_run`]: ended,
//! or to be continued — a run interrupted or paused, or one that ended `failed` on a
//! retryable model error and continues the conversation in a new run), and
//! [`resume_thread`], which rebuilds whatever ran the thread (agent, composed agent with
//! handoffs, workflow) and resumes it. The `keel resume` / `approve` / `deny` / `reply`
//! commands use the same pieces; servers call [`resume_thread`].

use std::collections::HashSet;
use std::sync::Arc;

use keel_core::{Event, EventKind, EventStore, Model};
use keel_runtime::{Agent, RunContext, RunOutcome, RunStatus, Thread};

use crate::recipe::Recipe;
use crate::worker::run_error;
use crate::workflow::{self, WorkflowRequest};
use crate::{App, AppError};

/// What ran a thread's latest run, as its log records it.
#[derive(Debug)]
pub enum Runner {
    /// A `[workflows.<name>]` workflow.
    Workflow(WorkflowRequest),
    /// An agent: the recipe its run recorded (`None` for runs recorded without one).
    Agent(Option<Recipe>),
}

/// What ran `thread`'s latest run (an unreadable recorded recipe is an error).
pub fn recorded_runner(thread: &Thread) -> Result<Runner, AppError> {
    if let Some(workflow) = workflow::recorded_workflow(thread.run_events()) {
        return Ok(Runner::Workflow(workflow));
    }
    Recipe::recorded(thread.run_events()).map(Runner::Agent)
}

/// Where a thread's latest run stands.
#[derive(Debug)]
pub enum Latest {
    /// It ended (not resumable): its outcome.
    Ended(Box<RunOutcome>),
    /// It is to be continued.
    Continue {
        /// The run's id.
        run_id: String,
        /// Model answers it already has (where a model script continues).
        consumed_steps: usize,
        /// Set when the run ended `failed` on a retryable model error: the conversation
        /// continues in a new run, and this says so.
        notice: Option<String>,
    },
}

/// Where `thread`'s latest run stands; a thread without a run is an error.
pub fn latest_run(thread: &Thread) -> Result<Latest, AppError> {
    let thread_id = thread.id();
    let Some(run) = thread.state().run() else {
        return Err(AppError::Resume(format!(
            "thread {thread_id} has no run to resume"
        )));
    };
    let consumed_steps = consumed_steps(thread.run_events(), &run.run_id);
    let mut notice = None;
    if let Some(outcome) = ended_outcome(thread) {
        if !outcome.resumable {
            return Ok(Latest::Ended(Box::new(outcome)));
        }
        notice = Some(format!(
            "run {} ended failed on a retryable model error; continuing the conversation in a new run",
            outcome.run_id
        ));
    }
    Ok(Latest::Continue {
        run_id: run.run_id.clone(),
        consumed_steps,
        notice,
    })
}

/// The outcome of `thread`'s latest run, when it ended.
pub fn ended_outcome(thread: &Thread) -> Option<RunOutcome> {
    let run = thread.state().run()?;
    let end_state = run.ended?;
    Some(RunOutcome::from_run_events(
        thread.id(),
        &run.run_id,
        thread.run_events(),
        RunStatus::Ended { end_state },
    ))
}

/// How many model answers (responses or failures) the run `run_id` has in `events`: the
/// script step a resumed run continues at.
pub fn consumed_steps(events: &[std::sync::Arc<Event>], run_id: &str) -> usize {
    events
        .iter()
        .filter(|e| &*e.run_id == run_id)
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::ModelResponded { .. } | EventKind::ModelFailed { .. }
            )
        })
        .count()
}

/// The script step a resumed run continues at: `latest` (its own model answers) plus
/// those of every earlier run it continues (`run_continued` notices), which consumed
/// steps of the same script.
pub async fn script_steps(
    store: &dyn EventStore,
    thread: &Thread,
    latest: usize,
) -> Result<usize, AppError> {
    let mut previous = continues(thread.run_events());
    if previous.is_none() {
        return Ok(latest);
    }
    let events = store
        .load(thread.id())
        .await
        .map_err(|e| AppError::Resume(format!("cannot load thread {}: {e}", thread.id())))?;
    let events: Vec<std::sync::Arc<Event>> = events.into_iter().map(std::sync::Arc::new).collect();
    let mut steps = latest;
    let mut seen = HashSet::new();
    while let Some(run_id) = previous.filter(|id| seen.insert(id.clone())) {
        steps += consumed_steps(&events, &run_id);
        let run: Vec<std::sync::Arc<Event>> = events
            .iter()
            .filter(|e| *e.run_id == *run_id)
            .cloned()
            .collect();
        previous = continues(&run);
    }
    Ok(steps)
}

/// The run a run's `run_continued` notice says it continues.
fn continues(events: &[std::sync::Arc<Event>]) -> Option<String> {
    events.iter().find_map(|e| match &e.kind {
        EventKind::Notice { code, data, .. }
            if code == keel_runtime::runner::RUN_CONTINUED_NOTICE =>
        {
            data.as_ref()
                .and_then(|d| d.get("continues"))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        }
        _ => None,
    })
}

/// Loads thread `id`, which must exist.
pub async fn load_existing(store: &dyn EventStore, id: &str) -> Result<Thread, AppError> {
    let thread = Thread::load(store, id)
        .await
        .map_err(|e| AppError::Resume(format!("cannot load thread {id}: {e}")))?;
    if thread.is_empty() {
        return Err(AppError::Resume(format!(
            "thread {id} does not exist in this store"
        )));
    }
    Ok(thread)
}

/// A resumed thread's outcome, and what to tell the user about how it was resumed.
#[derive(Debug)]
pub struct Resumed {
    /// The run's outcome (the latest run's, when it had already ended).
    pub outcome: RunOutcome,
    /// Settings overridden, a changed agent file, a run continued in a new one, the
    /// model chosen.
    pub notices: Vec<String>,
}

/// Rebuilds whatever ran thread `thread_id` from its log and resumes it: a workflow (the
/// `model`, `base_url` and `max_turns` of `overrides` apply to every agent of it), or the
/// agent its run recorded with `overrides`' settings over it (a run recorded without a
/// recipe is rebuilt from `overrides` alone). A latest run that already ended returns
/// its outcome. `model_override` drives every model call (a script's, a test's);
/// `configure` adds observers, an approval handler and cancellation to the run context
/// (the store, keel.toml's approval modes and the recipe's are already set).
pub async fn resume_thread(
    app: &App,
    store: Arc<dyn EventStore>,
    thread_id: &str,
    overrides: &Recipe,
    model_override: Option<Arc<dyn Model>>,
    configure: impl FnOnce(RunContext) -> RunContext,
) -> Result<Resumed, AppError> {
    let mut thread = load_existing(store.as_ref(), thread_id).await?;
    let mut notices = Vec::new();
    let (recipe, workflow) = match recorded_runner(&thread)? {
        Runner::Workflow(recorded) => {
            let mut request = recorded.with_overrides(
                overrides.model.clone(),
                overrides.base_url.clone(),
                overrides.max_turns,
            );
            request.model_override = model_override.clone();
            (None, Some(request))
        }
        Runner::Agent(Some(recorded)) => {
            let (recipe, changed) = recorded.with_overrides(overrides)?;
            notices.extend(changed);
            (Some(recipe), None)
        }
        Runner::Agent(None) => (Some(overrides.clone()), None),
    };
    if let Some(request) = workflow {
        if let Some(outcome) = ended_outcome(&thread) {
            return Ok(Resumed { outcome, notices });
        }
        let built = app.workflow(&request).await.map_err(|e| {
            AppError::Resume(format!(
                "cannot rebuild workflow `{}` of thread {thread_id}: {e}",
                request.workflow
            ))
        })?;
        let context = configure(app.run_context(store, overrides.approve, None));
        let outcome = built
            .resume(&mut thread, &context)
            .await
            .map_err(|e| AppError::Resume(run_error(&e)))?;
        return Ok(Resumed { outcome, notices });
    }
    let notice = match latest_run(&thread)? {
        Latest::Ended(outcome) => {
            return Ok(Resumed {
                outcome: *outcome,
                notices,
            });
        }
        Latest::Continue { notice, .. } => notice,
    };
    let recipe = recipe.unwrap_or_else(|| overrides.clone());
    notices.extend(notice);
    let built = recipe.build_agent(app, model_override).await.map_err(|e| {
        AppError::Resume(format!(
            "cannot rebuild the agent of thread {thread_id}'s run: {e}"
        ))
    })?;
    notices.extend(built.notices);
    let context = configure(app.run_context(store, recipe.approve, built.approve));
    let outcome = built
        .agent
        .resume(&mut thread, &context)
        .await
        .map_err(|e| AppError::Resume(run_error(&e)))?;
    Ok(Resumed { outcome, notices })
}
