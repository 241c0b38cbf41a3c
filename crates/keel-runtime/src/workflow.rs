//! Durable workflows: [`Workflow`], an [`Agent`] made of other agents — sequential steps,
//! a parallel fan-out/fan-in, or a router ([`Plan`]). A workflow is durable like a run:
//! its own thread's log records each step before and after it runs
//! (`workflow_step_started` / `workflow_step_finished`), and each step runs on its own
//! child thread in the same store (`<workflow thread>.<step>`), so
//! [`resume`](Agent::resume) after a crash skips finished steps (their output comes from
//! the log), continues the step whose run was in progress (the agent's resume settles
//! interrupted tool calls: a mutating call never runs twice) and starts the steps not
//! started yet. A step's run is never started twice.
//!
//! ```
//! # use std::sync::Arc;
//! # use keel_runtime::workflow::{Plan, Step, Workflow};
//! # fn demo(researcher: Arc<dyn keel_runtime::Agent>, critic: Arc<dyn keel_runtime::Agent>,
//! #         summarizer: Arc<dyn keel_runtime::Agent>) -> Result<(), keel_runtime::workflow::WorkflowError> {
//! let review = Workflow::builder(
//!     "review",
//!     Plan::Parallel {
//!         branches: vec![Step::new(researcher), Step::new(critic)],
//!         then: Some(Step::new(summarizer)),
//!     },
//! )
//! .max_parallel(2)
//! .build()?;
//! # let _ = review; Ok(()) }
//! ```

mod drive;
mod log;
mod plan;
mod step;

use async_trait::async_trait;
use keel_core::definition::sha256_hex;
use keel_core::{AgentDefinition, AgentFingerprint, Budget, EventKind, Message, new_id};

use crate::agent::Agent;
use crate::context::RunContext;
use crate::journal::Journal;
use crate::outcome::{RunError, RunOutcome};
use crate::thread::Thread;

pub use plan::{Plan, RouteBy, RouteFn, Step};
pub use step::child_thread_id as step_thread_id;

/// How many branches of a parallel workflow run at once by default.
pub const DEFAULT_MAX_PARALLEL: usize = 4;

/// Why a workflow could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkflowError {
    /// The plan has no step (or a router no route).
    #[error("workflow `{0}` has no steps")]
    NoSteps(String),
    /// A step name is not usable in a thread id.
    #[error(
        "workflow `{workflow}`: step name `{step}` must be 1 to 64 letters, digits, `_` or `-`"
    )]
    InvalidStepName {
        /// The workflow.
        workflow: String,
        /// The step name.
        step: String,
    },
    /// Two steps have the same name.
    #[error("workflow `{workflow}`: two steps are named `{step}`; name them apart")]
    DuplicateStep {
        /// The workflow.
        workflow: String,
        /// The step name.
        step: String,
    },
    /// A router's default route is not one of its routes.
    #[error("workflow `{workflow}`: default route `{route}` is not one of the routes ({routes})")]
    UnknownDefaultRoute {
        /// The workflow.
        workflow: String,
        /// The default named.
        route: String,
        /// The routes.
        routes: String,
    },
}

/// A composition of agents that is itself an [`Agent`]; see the module documentation.
pub struct Workflow {
    name: String,
    description: String,
    plan: Plan,
    recipe: serde_json::Value,
    max_parallel: usize,
}

impl std::fmt::Debug for Workflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("plan", &self.plan.shape())
            .field("max_parallel", &self.max_parallel)
            .finish_non_exhaustive()
    }
}

impl Workflow {
    /// Starts building a workflow named `name` with `plan`.
    pub fn builder(name: impl Into<String>, plan: Plan) -> WorkflowBuilder {
        WorkflowBuilder {
            name: name.into(),
            description: String::new(),
            plan,
            recipe: serde_json::Value::Null,
            max_parallel: DEFAULT_MAX_PARALLEL,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The recipe recorded in each run's `run_started` (how the application rebuilds the
    /// workflow, e.g. `keel resume`).
    pub fn recipe(&self) -> &serde_json::Value {
        &self.recipe
    }

    /// How many parallel branches run at once.
    pub fn max_parallel(&self) -> usize {
        self.max_parallel
    }

    /// What each run records about the workflow: its recipe, and as fingerprint the
    /// plan's kind (as the "model") and the hash of its shape.
    fn definition(&self) -> AgentDefinition {
        AgentDefinition {
            recipe: self.recipe.clone(),
            fingerprint: AgentFingerprint {
                model: self.model_label(),
                system_prompt_sha256: sha256_hex(&self.plan.shape()),
                tools: Vec::new(),
                planner: Default::default(),
                observation: Default::default(),
                critic: false,
                context_strategy: None,
                context_window: None,
                max_output_tokens: None,
                settings: Default::default(),
            },
        }
    }

    fn model_label(&self) -> String {
        format!("workflow:{}", self.plan.kind())
    }

    /// Refuses to continue a run this workflow did not start, or one started when the
    /// workflow's steps were arranged differently (finished steps would not line up).
    fn check_resumable(&self, thread: &Thread, log: &log::WorkflowLog) -> Result<(), RunError> {
        let mut problems = Vec::new();
        if log.agent != self.name {
            problems.push(format!(
                "the run in progress belongs to `{}`, not to workflow `{}`",
                log.agent, self.name
            ));
        } else if let Some(recorded) = &log.shape_sha256
            && *recorded != sha256_hex(&self.plan.shape())
        {
            problems.push(format!(
                "workflow `{}` changed since the run started (its steps are now {}); restore \
                 it, or start a new run",
                self.name,
                self.plan.shape()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RunError::IncompatibleAgent {
                thread_id: thread.id().to_string(),
                problems,
            })
        }
    }
}

/// Builds a [`Workflow`].
#[must_use]
pub struct WorkflowBuilder {
    name: String,
    description: String,
    plan: Plan,
    recipe: serde_json::Value,
    max_parallel: usize,
}

impl WorkflowBuilder {
    /// What the workflow does (shown when it is offered to a model).
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// How the application rebuilds the workflow; recorded in every run's `run_started`.
    /// Never put secrets here.
    pub fn recipe(mut self, recipe: serde_json::Value) -> Self {
        self.recipe = recipe;
        self
    }

    /// At most this many parallel branches run at once (default
    /// [`DEFAULT_MAX_PARALLEL`], at least 1).
    pub fn max_parallel(mut self, branches: usize) -> Self {
        self.max_parallel = branches.max(1);
        self
    }

    /// Checks the plan (at least one step, step names usable and unique, the default
    /// route one of the routes) and builds the workflow.
    pub fn build(self) -> Result<Workflow, WorkflowError> {
        let name = self.name;
        let steps = self.plan.steps();
        let empty = match &self.plan {
            Plan::Sequential(steps) => steps.is_empty(),
            Plan::Parallel { branches, .. } => branches.is_empty(),
            Plan::Router { routes, .. } => routes.is_empty(),
        };
        if empty {
            return Err(WorkflowError::NoSteps(name));
        }
        let mut seen = std::collections::HashSet::new();
        for step in &steps {
            if !plan::valid_step_name(&step.name) {
                return Err(WorkflowError::InvalidStepName {
                    workflow: name,
                    step: step.name.clone(),
                });
            }
            if !seen.insert(step.name.as_str()) {
                return Err(WorkflowError::DuplicateStep {
                    workflow: name,
                    step: step.name.clone(),
                });
            }
        }
        if let Plan::Router {
            routes,
            default: Some(default),
            ..
        } = &self.plan
            && !routes.iter().any(|r| &r.name == default)
        {
            return Err(WorkflowError::UnknownDefaultRoute {
                workflow: name,
                route: default.clone(),
                routes: routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(Workflow {
            name,
            description: self.description,
            plan: self.plan,
            recipe: self.recipe,
            max_parallel: self.max_parallel,
        })
    }
}

#[async_trait]
impl Agent for Workflow {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        if new_messages.is_empty() {
            return Err(RunError::NoInput);
        }
        thread.reload_if_diverged(context.store.as_ref()).await?;
        if let Some(run) = thread
            .state()
            .run()
            .filter(|_| thread.state().run_in_progress())
        {
            return Err(RunError::RunInProgress {
                thread_id: thread.id().to_string(),
                run_id: run.run_id.clone(),
            });
        }
        let goal = new_messages
            .iter()
            .map(Message::text)
            .collect::<Vec<_>>()
            .join("\n");
        let mut journal = Journal::start(thread, context, new_id("run"));
        let span = journal.run_span().to_string();
        let mut batch = vec![(
            EventKind::RunStarted {
                agent: self.name.clone(),
                model: self.model_label(),
                goal: goal.clone(),
                constraints: Vec::new(),
                budget: Budget::default(),
                definition: Some(Box::new(self.definition())),
                parent_span_id: None,
            },
            span.clone(),
        )];
        batch.extend(
            new_messages
                .into_iter()
                .map(|message| (EventKind::UserMessage { message }, span.clone())),
        );
        journal.append_batch(batch).await?;
        let log = log::WorkflowLog {
            input: goal,
            agent: self.name.clone(),
            ..log::WorkflowLog::default()
        };
        drive::drive(self, &mut journal, &log, context).await
    }

    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        thread.reload_if_diverged(context.store.as_ref()).await?;
        if !thread.state().run_in_progress() {
            return Err(RunError::NothingToResume(thread.id().to_string()));
        }
        let log = log::WorkflowLog::read(thread.run_events());
        self.check_resumable(thread, &log)?;
        let mut journal = Journal::resume(thread, context);
        drive::drive(self, &mut journal, &log, context).await
    }
}

#[cfg(test)]
mod tests;
