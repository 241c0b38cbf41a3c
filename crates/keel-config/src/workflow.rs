//! `[workflows.<name>]`: durable compositions of agents — `sequential` steps, a
//! `parallel` fan-out with an optional fan-in step (`then`), or a `router` choosing one
//! route — and their checks: every agent a workflow names must be an `[agents.<name>]`
//! entry or an agent file (relative to keel.toml), each problem reported with its file,
//! key and line before any model is called.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::diagnostic::{DiagnosticCode, nearest};
use crate::schema::KeelConfig;

/// How a workflow arranges its agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkflowKind {
    /// `steps` in order, each getting the previous one's output.
    Sequential,
    /// `agents` at once on the same input, then `then` on their combined outputs.
    Parallel,
    /// One of `routes`, chosen by `router` (an agent) or a classifier on `model`.
    Router,
}

impl WorkflowKind {
    /// `sequential`, `parallel` or `router`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sequential => "sequential",
            Self::Parallel => "parallel",
            Self::Router => "router",
        }
    }
}

/// `[workflows.<name>]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkflowConfig {
    /// `sequential`, `parallel` or `router` (required).
    pub kind: Option<WorkflowKind>,
    /// What the workflow does.
    pub description: Option<String>,
    /// Sequential: the agents, in order.
    pub steps: Vec<String>,
    /// Parallel: the agents that all work on the input.
    pub agents: Vec<String>,
    /// Parallel: the agent that combines their outputs (optional).
    pub then: Option<String>,
    /// Parallel: at most this many agents run at once (default 4).
    pub max_parallel: Option<usize>,
    /// Router: route name → agent.
    pub routes: BTreeMap<String, String>,
    /// Router: the agent whose answer names the route (else a classifier on `model`).
    pub router: Option<String>,
    /// Router: the model of the built-in classifier (default: `[defaults] model`).
    pub model: Option<String>,
    /// Router: the route taken when the answer names none.
    pub default: Option<String>,
}

impl WorkflowConfig {
    /// Every agent reference with its key path under `workflows.<name>.` (`steps[0]`,
    /// `then`, `routes.billing`, `router`), in plan order.
    pub fn agent_refs(&self) -> Vec<(String, &str)> {
        let mut refs: Vec<(String, &str)> = Vec::new();
        if let Some(router) = &self.router {
            refs.push(("router".into(), router));
        }
        for (i, step) in self.steps.iter().enumerate() {
            refs.push((format!("steps[{i}]"), step));
        }
        for (i, agent) in self.agents.iter().enumerate() {
            refs.push((format!("agents[{i}]"), agent));
        }
        if let Some(then) = &self.then {
            refs.push(("then".into(), then));
        }
        for (route, agent) in &self.routes {
            refs.push((format!("routes.{route}"), agent));
        }
        refs
    }
}

/// One problem of a workflow: the full key path (`workflows.review.agents[1]`), its code
/// and a message naming the fix.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowProblem {
    /// Full key path.
    pub key: String,
    /// What kind of problem.
    pub code: DiagnosticCode,
    /// The message.
    pub message: String,
}

/// Whether `name` can name a step or route (it becomes part of a thread id).
pub fn valid_route_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Every problem of workflow `name`: missing or misplaced keys for its kind, and agents
/// that are neither `[agents.<name>]` entries nor files (relative to `base_dir`).
pub fn problems(
    config: &KeelConfig,
    name: &str,
    workflow: &WorkflowConfig,
    base_dir: &Path,
) -> Vec<WorkflowProblem> {
    let mut out = Vec::new();
    let at = |key: &str| {
        if key.is_empty() {
            format!("workflows.{name}")
        } else {
            format!("workflows.{name}.{key}")
        }
    };
    let mut push = |key: &str, code: DiagnosticCode, message: String| {
        out.push(WorkflowProblem {
            key: at(key),
            code,
            message,
        });
    };
    let Some(kind) = workflow.kind else {
        push(
            "",
            DiagnosticCode::MissingKey,
            format!(
                "`workflows.{name}` needs `kind = \"sequential\"`, `\"parallel\"` or `\"router\"`"
            ),
        );
        return out;
    };
    // Keys of the other kinds.
    let misplaced: Vec<(&str, bool)> = vec![
        ("steps", !workflow.steps.is_empty()),
        ("agents", !workflow.agents.is_empty()),
        ("then", workflow.then.is_some()),
        ("max_parallel", workflow.max_parallel.is_some()),
        ("routes", !workflow.routes.is_empty()),
        ("router", workflow.router.is_some()),
        ("model", workflow.model.is_some()),
        ("default", workflow.default.is_some()),
    ];
    let allowed: &[&str] = match kind {
        WorkflowKind::Sequential => &["steps"],
        WorkflowKind::Parallel => &["agents", "then", "max_parallel"],
        WorkflowKind::Router => &["routes", "router", "model", "default"],
    };
    for (key, set) in misplaced {
        if set && !allowed.contains(&key) {
            push(
                key,
                DiagnosticCode::InvalidValue,
                format!(
                    "`workflows.{name}.{key}` does not apply to a {} workflow (its keys: {})",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            );
        }
    }
    match kind {
        WorkflowKind::Sequential if workflow.steps.is_empty() => push(
            "",
            DiagnosticCode::MissingKey,
            format!("`workflows.{name}` (sequential) needs `steps = [\"agent\", ...]`"),
        ),
        WorkflowKind::Parallel if workflow.agents.is_empty() => push(
            "",
            DiagnosticCode::MissingKey,
            format!(
                "`workflows.{name}` (parallel) needs `agents = [\"agent\", ...]` (and usually `then = \"agent\"` to combine them)"
            ),
        ),
        WorkflowKind::Router if workflow.routes.is_empty() => push(
            "",
            DiagnosticCode::MissingKey,
            format!("`workflows.{name}` (router) needs `routes = {{ route = \"agent\", ... }}`"),
        ),
        _ => {}
    }
    if workflow.max_parallel == Some(0) {
        push(
            "max_parallel",
            DiagnosticCode::InvalidValue,
            format!("`workflows.{name}.max_parallel` must be at least 1"),
        );
    }
    if kind == WorkflowKind::Router {
        for route in workflow.routes.keys() {
            if !valid_route_name(route) {
                push(
                    &format!("routes.{route}"),
                    DiagnosticCode::InvalidValue,
                    format!(
                        "route name `{route}` of `workflows.{name}` must be 1 to 64 letters, digits, `_` or `-`"
                    ),
                );
            }
        }
        if let Some(default) = &workflow.default
            && !workflow.routes.contains_key(default)
        {
            let routes: Vec<&str> = workflow.routes.keys().map(String::as_str).collect();
            push(
                "default",
                DiagnosticCode::InvalidValue,
                format!(
                    "`workflows.{name}.default` = `{default}` is not one of its routes ({}){}",
                    routes.join(", "),
                    hint(default, &routes)
                ),
            );
        }
        if workflow.router.is_some() && workflow.model.is_some() {
            push(
                "model",
                DiagnosticCode::InvalidValue,
                format!(
                    "`workflows.{name}`: set `router` (an agent that chooses) or `model` (the built-in classifier's model), not both"
                ),
            );
        }
    }
    // Agent references.
    let names: Vec<&str> = config.agents.keys().map(String::as_str).collect();
    for (key, reference) in workflow.agent_refs() {
        if config.agents.contains_key(reference) || base_dir.join(reference).is_file() {
            continue;
        }
        let known = match hint(reference, &names) {
            h if !h.is_empty() => h,
            _ if names.is_empty() => " (keel.toml declares no agents)".to_string(),
            _ => format!(" (keel.toml declares: {})", names.join(", ")),
        };
        let also = if config.workflows.contains_key(reference) {
            "; workflows cannot be steps of workflows in keel.toml"
        } else {
            ""
        };
        push(
            &key,
            DiagnosticCode::UnknownReference,
            format!(
                "`workflows.{name}.{key}`: unknown agent `{reference}`: it is neither an \
                 [agents.<name>] entry nor an agent file (relative to keel.toml){known}{also}"
            ),
        );
    }
    out
}

fn hint(given: &str, candidates: &[&str]) -> String {
    nearest(given, candidates.iter().copied())
        .map_or_else(String::new, |best| format!("; did you mean `{best}`?"))
}
