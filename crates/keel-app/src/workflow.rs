//! Workflows of keel.toml (`[workflows.<name>]`) built into a
//! [`keel_runtime::Workflow`]: every agent it names is checked (an unknown one is an
//! error naming the file, key and line, before any model is built or called) and built
//! like `--agent NAME` would build it, with the caller's overrides applied to each.
//!
//! Each run records how to rebuild the workflow (its recipe: the workflow's name and the
//! overrides), and each step's run records how to rebuild its agent, so `keel resume`
//! continues a workflow thread — or a single step's thread — from the log alone.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use keel_config::{WorkflowConfig, WorkflowKind};
use keel_core::{Event, EventKind, Model, ToolRegistry};
use keel_runtime::workflow::{Plan, RouteBy, Step};
use keel_runtime::{Agent, Workflow};
use serde_json::{Value, json};

use crate::definition::AgentRef;
use crate::error::AppError;
use crate::{AgentRequest, App};

/// The key of a workflow run's recipe (`{"workflow": {...}}`) in its `run_started`.
pub const RECIPE_KEY: &str = "workflow";

/// The name of the step that chooses a router's route with the built-in classifier.
pub const CLASSIFIER_STEP: &str = "route";

/// What to build: a workflow of keel.toml, and overrides applied to every agent of it.
#[derive(Clone, Default)]
pub struct WorkflowRequest {
    /// The `[workflows.<name>]` name.
    pub workflow: String,
    /// Model spec for every agent (`--model`).
    pub model: Option<String>,
    /// A ready model for every agent (tests); wins over every spec. Not recorded.
    pub model_override: Option<Arc<dyn Model>>,
    /// Provider base URL (`--base-url`).
    pub base_url: Option<String>,
    /// Maximum model calls per step run (`--max-turns`).
    pub max_turns: Option<u32>,
}

impl std::fmt::Debug for WorkflowRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowRequest")
            .field("workflow", &self.workflow)
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("max_turns", &self.max_turns)
            .finish_non_exhaustive()
    }
}

impl WorkflowRequest {
    /// A request for workflow `name` with no overrides.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            workflow: name.into(),
            ..Self::default()
        }
    }

    /// What a run records to rebuild the workflow (never a secret; the model override is
    /// not recordable).
    pub fn recipe(&self) -> Value {
        json!({ RECIPE_KEY: {
            "name": self.workflow,
            "model": self.model,
            "base_url": self.base_url,
            "max_turns": self.max_turns,
        }})
    }

    /// Applies explicitly given overrides over this (recorded) request.
    #[must_use]
    pub fn with_overrides(
        mut self,
        model: Option<String>,
        base_url: Option<String>,
        max_turns: Option<u32>,
    ) -> Self {
        self.model = model.or(self.model);
        self.base_url = base_url.or(self.base_url);
        self.max_turns = max_turns.or(self.max_turns);
        self
    }
}

/// The workflow request a workflow run recorded in its `run_started`, when the run is a
/// workflow's (`None` for an agent's run).
pub fn recorded_workflow(run_events: &[std::sync::Arc<Event>]) -> Option<WorkflowRequest> {
    let recipe = run_events.iter().find_map(|event| match &event.kind {
        EventKind::RunStarted {
            definition: Some(definition),
            ..
        } => definition.recipe.get(RECIPE_KEY).cloned(),
        _ => None,
    })?;
    let text = |key: &str| recipe.get(key).and_then(Value::as_str).map(str::to_string);
    Some(WorkflowRequest {
        workflow: text("name")?,
        model: text("model"),
        model_override: None,
        base_url: text("base_url"),
        max_turns: recipe
            .get("max_turns")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
    })
}

/// Builds workflow `request.workflow` of the application's keel.toml.
pub(crate) async fn build(app: &App, request: &WorkflowRequest) -> Result<Workflow, AppError> {
    let loaded = app.loaded();
    let name = request.workflow.as_str();
    let Some(config) = loaded.config.workflows.get(name) else {
        let names: Vec<&str> = loaded.config.workflows.keys().map(String::as_str).collect();
        let known = match crate::hint(name, &names) {
            hint if !hint.is_empty() => hint,
            _ if names.is_empty() => " (keel.toml declares no [workflows.<name>])".to_string(),
            _ => format!(" (keel.toml declares: {})", names.join(", ")),
        };
        return Err(AppError::Invalid(format!(
            "unknown workflow `{name}`{known}"
        )));
    };
    let problems = keel_config::workflow::problems(&loaded.config, name, config, &loaded.base_dir);
    if !problems.is_empty() {
        return Err(AppError::Located(
            problems
                .into_iter()
                .map(|p| loaded.source.error(p.code, &p.key, p.message))
                .collect(),
        ));
    }
    let mut builder = StepBuilder {
        app,
        request,
        built: BTreeMap::new(),
        names: HashSet::new(),
    };
    let plan = match config.kind {
        Some(WorkflowKind::Sequential) => {
            let mut steps = Vec::new();
            for reference in &config.steps {
                steps.push(builder.step(reference, None).await?);
            }
            Plan::Sequential(steps)
        }
        Some(WorkflowKind::Parallel) => {
            let mut branches = Vec::new();
            for reference in &config.agents {
                branches.push(builder.step(reference, None).await?);
            }
            let then = match &config.then {
                Some(reference) => Some(builder.step(reference, None).await?),
                None => None,
            };
            Plan::Parallel { branches, then }
        }
        _ => {
            let route_by = match &config.router {
                Some(reference) => RouteBy::Agent(builder.step(reference, None).await?),
                None => RouteBy::Agent(builder.classifier(name, config).await?),
            };
            let mut routes = Vec::new();
            for (route, reference) in &config.routes {
                routes.push(builder.step(reference, Some(route)).await?);
            }
            Plan::Router {
                route_by,
                routes,
                default: config.default.clone(),
            }
        }
    };
    Workflow::builder(name, plan)
        .description(config.description.clone().unwrap_or_default())
        .recipe(request.recipe())
        .max_parallel(
            config
                .max_parallel
                .unwrap_or(keel_runtime::workflow::DEFAULT_MAX_PARALLEL),
        )
        .build()
        .map_err(|e| AppError::Invalid(e.to_string()))
}

/// Builds each agent once (a workflow may name an agent twice) and names the steps.
struct StepBuilder<'a> {
    app: &'a App,
    request: &'a WorkflowRequest,
    built: BTreeMap<String, Arc<dyn Agent>>,
    names: HashSet<String>,
}

impl StepBuilder<'_> {
    async fn step(&mut self, reference: &str, name: Option<&str>) -> Result<Step, AppError> {
        let agent = match self.built.get(reference) {
            Some(agent) => Arc::clone(agent),
            None => {
                let agent = self.agent(reference).await?;
                self.built.insert(reference.to_string(), Arc::clone(&agent));
                agent
            }
        };
        let base = name.map_or_else(|| step_name(reference), str::to_string);
        Ok(Step::named(self.unique(base), agent))
    }

    /// A unique step name: `base`, else `base-2`, `base-3`…
    fn unique(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut n = 2;
        while !self.names.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }

    async fn agent(&self, reference: &str) -> Result<Arc<dyn Agent>, AppError> {
        let loaded = self.app.loaded();
        let agent = crate::definition::find(loaded, reference, &loaded.base_dir)?;
        // The shape of the CLI's recorded agent spec, so `keel resume STEP_THREAD` (and
        // `keel approve` on a step's thread) rebuilds the step's agent.
        let mut recipe = serde_json::Map::new();
        recipe.insert("base_url".into(), json!(self.request.base_url));
        recipe.insert("max_turns".into(), json!(self.request.max_turns));
        match &agent {
            AgentRef::Named(name) => {
                recipe.insert("agent_name".into(), json!(name));
            }
            AgentRef::File(path) => {
                recipe.insert("agent".into(), json!(path));
            }
            _ => {}
        }
        if crate::a2a_agent::refers_to_a2a(self.app, Some(&agent)) {
            // A remote A2A agent: the workflow's model settings are not its own.
            let request = AgentRequest {
                agent: Some(agent),
                ..AgentRequest::default()
            };
            let (remote, _) = self.app.a2a_agent(&request, Value::Object(recipe))?;
            return Ok(Arc::new(remote));
        }
        let request = AgentRequest {
            agent: Some(agent),
            model: self.request.model.clone(),
            model_override: self.request.model_override.clone(),
            base_url: self.request.base_url.clone(),
            max_turns: self.request.max_turns,
            ..AgentRequest::default()
        };
        let (builder, resolution) = self.app.agent_builder(&request).await?;
        let model = match &self.request.model_override {
            Some(_) => None,
            None => resolution.model_spec,
        };
        recipe.insert("model".into(), json!(model));
        Ok(Arc::new(builder.recipe(Value::Object(recipe)).build()))
    }

    /// The built-in route classifier: a model with no tools asked to name a route.
    async fn classifier(
        &mut self,
        workflow: &str,
        config: &WorkflowConfig,
    ) -> Result<Step, AppError> {
        let instructions = format!(
            "You route requests for the `{workflow}` workflow{}. Read the request and answer \
             with the name of the one route that should handle it, and nothing else.",
            config
                .description
                .as_ref()
                .map(|d| format!(" ({})", d.trim()))
                .unwrap_or_default()
        );
        let request = AgentRequest {
            agent: None,
            model: self.request.model.clone().or_else(|| config.model.clone()),
            model_override: self.request.model_override.clone(),
            base_url: self.request.base_url.clone(),
            instructions: Some(instructions.clone()),
            max_turns: Some(self.request.max_turns.unwrap_or(2)),
            ..AgentRequest::default()
        };
        let (builder, resolution) = self.app.agent_builder(&request).await?;
        let recipe = json!({
            "model": resolution.model_spec,
            "base_url": self.request.base_url,
            "instructions": instructions,
            "max_turns": request.max_turns,
            "tools": [],
        });
        let agent = builder
            .tools(ToolRegistry::new())
            .control_tools(false)
            .recipe(recipe)
            .build();
        let name = self.unique(CLASSIFIER_STEP.to_string());
        Ok(Step::named(name, Arc::new(agent)))
    }
}

/// A step name for an agent reference: the `[agents.<name>]` name or the file's stem,
/// with characters a thread id should not hold replaced by `_`.
fn step_name(reference: &str) -> String {
    let stem = std::path::Path::new(reference)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|_| reference.ends_with(".toml"))
        .unwrap_or_else(|| reference.to_string());
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() { "step".into() } else { name }
}
