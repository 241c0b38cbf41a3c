//! The runner: runs every scenario × trial of a suite against the agent the suite names,
//! built exactly as `keel run --agent NAME [--model M] [--base-url URL]` builds it
//! (through [`keel_app::recipe::Recipe::build_agent`]), each trial on a fresh thread
//! (`eval-<scenario>-<trial>-<short id>`) under a timeout, then reads the thread's events
//! back from the store, scores them ([`score_scenario`]), asks the judge about the rubric
//! when there is one and a judge is configured, and builds the [`EvalReport`].
//!
//! A suite that cannot run (unknown agent, a model that cannot be built, expectations
//! naming tools the agent does not have, a `setup` without a [`TrialSetup`] hook) is an
//! [`EvalError`] before any trial runs. A trial whose run fails (setup hook error, run
//! error, timeout) is recorded as `failed` with the error text, never dropped.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use keel_app::App;
use keel_app::recipe::Recipe;
use keel_config::Diagnostic;
use keel_core::{CancellationToken, EventStore, Message};
use keel_runtime::Thread;
use serde_json::Value;

use crate::report::{EvalReport, ReportOptions, RunMeta, ScenarioTrials, Trial, TrialFacts};
use crate::score::{Judge, TrialStatus, apply_judge, score_scenario};
use crate::suite::{Scenario, Suite};
use crate::trace::RunTrace;

/// The default per-trial timeout (generous: a trial is a whole agent run).
pub const DEFAULT_TRIAL_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a timed-out run may take to stop after it was cancelled.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// Why a suite could not be run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The agent could not be found or built (unknown agent, bad model spec).
    #[error("cannot build the suite's agent: {0}")]
    Agent(String),
    /// The suite does not fit the agent (expectations name unknown tools).
    #[error("the suite does not fit the agent:\n{}", keel_config::render_text(.0))]
    Suite(Vec<Diagnostic>),
    /// A scenario has a `setup` but the runner was given no [`TrialSetup`] hook.
    #[error(
        "scenario `{scenario}` has a `setup`, and setup needs a hook this runner was not given \
         (remove `setup`, or name the hook that applies it in [suite] setup_hook — keel eval \
         run provides `release-service` — or pass a TrialSetup hook to run_suite)"
    )]
    Setup {
        /// The scenario id.
        scenario: String,
    },
    /// The suite lists several models and none was chosen.
    #[error(
        "suite.models lists {0} models and run_suite runs one: pick it with RunOptions::model \
         (`keel eval run` runs each model in turn, a matrix)"
    )]
    Models(usize),
    /// The store could not be opened.
    #[error("cannot open the store: {0}")]
    Store(String),
}

/// Prepares a trial from its scenario's `setup` (fixtures, injected faults) before the run.
#[async_trait::async_trait]
pub trait TrialSetup: Send + Sync {
    /// Called before every trial (`trial` is 1-based) of every scenario with the
    /// scenario's `setup`, untouched — `Value::Null` when it has none, so a hook can undo
    /// what the previous trial set up. An error fails the trial with that text.
    async fn prepare(&self, scenario: &Scenario, setup: &Value, trial: u32) -> Result<(), String>;
}

/// A trial's progress, for a progress bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Scenario id.
    pub scenario: String,
    /// Trial number, 1-based.
    pub trial: u32,
    /// `None` when the trial starts; its status once it is scored.
    pub status: Option<TrialStatus>,
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How to run a suite.
#[derive(Clone)]
pub struct RunOptions {
    /// Override the agent's model (`--model`).
    pub model: Option<String>,
    /// Override the provider base URL (`--base-url`).
    pub base_url: Option<String>,
    /// The store (`--store`; default: `KEEL_STORE`, keel.toml, `.keel/keel.db`).
    pub store: Option<String>,
    /// Trials per scenario (default: the suite's `trials`).
    pub trials: Option<u32>,
    /// Per-trial timeout.
    pub timeout: Duration,
    /// The judge of rubrics (rubrics stay unscored without one).
    pub judge: Option<Arc<dyn Judge>>,
    /// The hook that applies a scenario's `setup`.
    pub setup: Option<Arc<dyn TrialSetup>>,
    /// Called when a trial starts and when it is scored.
    pub progress: Option<ProgressFn>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            model: None,
            base_url: None,
            store: None,
            trials: None,
            timeout: DEFAULT_TRIAL_TIMEOUT,
            judge: None,
            setup: None,
            progress: None,
        }
    }
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("store", &self.store)
            .field("trials", &self.trials)
            .field("timeout", &self.timeout)
            .field("judge", &self.judge.is_some())
            .field("setup", &self.setup.is_some())
            .finish_non_exhaustive()
    }
}

/// Whether a `setup` value says anything.
fn has_setup(setup: Option<&Value>) -> bool {
    match setup {
        None | Some(Value::Null) => false,
        Some(Value::Object(map)) => !map.is_empty(),
        Some(Value::Array(list)) => !list.is_empty(),
        Some(Value::String(text)) => !text.is_empty(),
        Some(_) => true,
    }
}

/// The random tail of a fresh id (8 hex digits).
fn short_id() -> String {
    let id = keel_core::new_id("e");
    let tail: Vec<char> = id.chars().rev().take(8).collect();
    tail.into_iter().rev().collect()
}

/// Runs every trial of `suite` and builds its report (see the module doc).
pub async fn run_suite(
    app: &App,
    suite: &Suite,
    options: &RunOptions,
) -> Result<EvalReport, EvalError> {
    if options.setup.is_none()
        && let Some(scenario) = suite.scenarios.iter().find(|s| has_setup(s.setup.as_ref()))
    {
        return Err(EvalError::Setup {
            scenario: scenario.id.clone(),
        });
    }
    let model = match (&options.model, suite.suite.models.as_slice()) {
        (Some(model), _) => Some(model.clone()),
        (None, []) => None,
        (None, [one]) => Some(one.clone()),
        (None, many) => return Err(EvalError::Models(many.len())),
    };
    let mut recipe = Recipe {
        model,
        base_url: options.base_url.clone(),
        ..Recipe::default()
    };
    let reference = suite
        .suite
        .agent
        .as_deref()
        .or(suite.suite.agent_file.as_deref())
        .ok_or_else(|| EvalError::Agent("the suite names no agent".into()))?;
    recipe.set_agent(
        app.find_agent(reference)
            .map_err(|e| EvalError::Agent(e.to_string()))?,
    );
    let built = recipe
        .build_agent(app, None)
        .await
        .map_err(|e| EvalError::Agent(e.to_string()))?;
    let names: Vec<&str> = built
        .agent
        .entry()
        .map(|entry| entry.tools().names().collect())
        .unwrap_or_default();
    let problems: Vec<Diagnostic> = suite
        .check_tools(&names)
        .into_iter()
        .filter(Diagnostic::is_error)
        .collect();
    if !problems.is_empty() {
        return Err(EvalError::Suite(problems));
    }
    let store = app
        .open_store(options.store.as_deref())
        .await
        .map_err(|e| EvalError::Store(e.to_string()))?
        .events;
    let trials = options.trials.unwrap_or(suite.suite.trials).max(1);
    let jobs: Vec<(usize, u32)> = (0..suite.scenarios.len())
        .flat_map(|s| (1..=trials).map(move |t| (s, t)))
        .collect();
    let runner = TrialRunner {
        app,
        suite,
        options,
        agent: &built.agent,
        approve: built.approve,
        store,
    };
    let concurrency = usize::try_from(suite.suite.concurrency.max(1)).unwrap_or(1);
    let started_at = chrono::Utc::now();
    let clock = std::time::Instant::now();
    let mut done: Vec<(usize, u32, Trial)> = futures::stream::iter(jobs)
        .map(|(s, t)| {
            let runner = &runner;
            async move {
                let trial = match runner.suite.scenarios.get(s) {
                    Some(scenario) => Some(runner.trial(scenario, t).await),
                    None => None,
                };
                trial.map(|trial| (s, t, trial))
            }
        })
        .buffer_unordered(concurrency)
        .filter_map(|x| async move { x })
        .collect()
        .await;
    done.sort_by_key(|(s, t, _)| (*s, *t));
    let scenarios: Vec<ScenarioTrials> = suite
        .scenarios
        .iter()
        .enumerate()
        .map(|(i, scenario)| ScenarioTrials {
            id: scenario.id.clone(),
            trials: done
                .iter()
                .filter(|(s, _, _)| *s == i)
                .map(|(_, _, trial)| trial.clone())
                .collect(),
        })
        .collect();
    let mut report = EvalReport::build(
        &suite.suite.name,
        &ReportOptions::from_suite(suite),
        &scenarios,
    );
    let facts = || done.iter().map(|(_, _, trial)| &trial.facts);
    let costs: Vec<f64> = facts().filter_map(|f| f.cost_usd).collect();
    report.run = Some(RunMeta {
        agent: keel_runtime::Agent::name(&built.agent).to_string(),
        model: Some(built.agent.model_id()),
        trials,
        started_at,
        duration_ms: u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX),
        tokens: facts()
            .filter_map(|f| f.tokens)
            .fold(0u64, u64::saturating_add),
        cost_usd: (!costs.is_empty()).then(|| costs.iter().sum()),
        baseline: None,
    });
    Ok(report)
}

/// What every trial shares.
struct TrialRunner<'a> {
    app: &'a App,
    suite: &'a Suite,
    options: &'a RunOptions,
    agent: &'a keel_app::ComposedAgent,
    approve: Option<keel_runtime::RunApprovalMode>,
    store: Arc<dyn EventStore>,
}

impl TrialRunner<'_> {
    fn progress(&self, scenario: &Scenario, trial: u32, status: Option<TrialStatus>) {
        if let Some(progress) = &self.options.progress {
            progress(&Progress {
                scenario: scenario.id.clone(),
                trial,
                status,
            });
        }
    }

    /// Runs, scores and judges one trial.
    async fn trial(&self, scenario: &Scenario, trial: u32) -> Trial {
        self.progress(scenario, trial, None);
        let thread_id = format!("eval-{}-{trial}-{}", scenario.id, short_id());
        let run_error = self.run(scenario, trial, &thread_id).await.err();
        let (events, load_error) = match self.store.load(&thread_id).await {
            Ok(events) => (events, None),
            Err(e) => (
                Vec::new(),
                Some(format!("cannot read the trial's events: {e}")),
            ),
        };
        let mut trace = RunTrace::from_events(&events);
        if trace.thread_id.is_empty() {
            trace.thread_id.clone_from(&thread_id);
        }
        let thresholds = &self.suite.suite.thresholds;
        let mut score = score_scenario(scenario, &trace, thresholds);
        match run_error.or(load_error) {
            Some(error) => score.fail_run(error, thresholds),
            None => {
                if let (Some(judge), Some(rubric)) = (
                    &self.options.judge,
                    scenario
                        .expect
                        .decision_quality
                        .as_ref()
                        .and_then(|dq| dq.rubric.as_deref()),
                ) {
                    let verdict = judge.judge(rubric, scenario, &trace).await.map_err(|e| {
                        crate::score::JudgeError(format!(
                            "{}: the rubric of scenario `{}` could not be scored: {}",
                            self.suite.rubric_location(&scenario.id),
                            scenario.id,
                            e.0
                        ))
                    });
                    apply_judge(&mut score, verdict, thresholds);
                }
            }
        }
        self.progress(scenario, trial, Some(score.status));
        Trial {
            thread_id,
            facts: TrialFacts::from_events(&events, &trace),
            trace_id: trace.trace_id,
            score,
        }
    }

    /// Applies the setup and runs the agent on the scenario's input under the timeout.
    async fn run(&self, scenario: &Scenario, trial: u32, thread_id: &str) -> Result<(), String> {
        if let Some(hook) = &self.options.setup {
            let setup = scenario.setup.as_ref().unwrap_or(&Value::Null);
            hook.prepare(scenario, setup, trial)
                .await
                .map_err(|e| format!("setup failed: {e}"))?;
        }
        let cancel = CancellationToken::new();
        let context = self
            .app
            .run_context(self.store.clone(), None, self.approve)
            .with_cancel(cancel.clone());
        let mut thread = Thread::with_id(thread_id);
        let run = self.agent.run(
            vec![Message::user(scenario.input.clone())],
            &mut thread,
            &context,
        );
        tokio::pin!(run);
        let timeout = self.options.timeout;
        let result = tokio::select! {
            result = &mut run => result,
            () = tokio::time::sleep(timeout) => {
                cancel.cancel();
                // Let the run record its cancellation, within bounds.
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut run).await;
                return Err(format!("the run timed out after {}s", timeout.as_secs()));
            }
        };
        result
            .map(|_| ())
            .map_err(|e| keel_app::worker::run_error(&e))
    }
}
