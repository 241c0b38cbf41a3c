//! What a workflow is made of: named [`Step`]s over agents, arranged by a [`Plan`] —
//! sequential, parallel fan-out/fan-in, or a router — and the texts a workflow hands
//! between steps (the fan-in message, the routing question) and the route matching.

use std::sync::Arc;

use crate::agent::Agent;

/// One step of a workflow: an agent under a name unique within the workflow. The name
/// also names the step's child thread (`<workflow thread>.<name>`).
#[derive(Clone)]
pub struct Step {
    pub(crate) name: String,
    pub(crate) agent: Arc<dyn Agent>,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("agent", &self.agent.name())
            .finish()
    }
}

impl Step {
    /// A step named after its agent.
    pub fn new(agent: Arc<dyn Agent>) -> Self {
        Self {
            name: agent.name().to_string(),
            agent,
        }
    }

    /// A step with its own name (letters, digits, `_` and `-`).
    pub fn named(name: impl Into<String>, agent: Arc<dyn Agent>) -> Self {
        Self {
            name: name.into(),
            agent,
        }
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent that runs the step.
    pub fn agent(&self) -> &Arc<dyn Agent> {
        &self.agent
    }
}

/// A function choosing a route from the workflow's input: the route's step name, or
/// `None` for none (then the default route, if any, is taken).
pub type RouteFn = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// How a router chooses its route.
#[derive(Clone)]
#[non_exhaustive]
pub enum RouteBy {
    /// An agent (typically a small model with no tools) is asked which route fits; its
    /// run is a durable step like any other, and its answer must name one route.
    Agent(Step),
    /// A function of the input (it must be deterministic: a resumed workflow that has
    /// not started its route yet asks it again).
    Function(RouteFn),
}

impl std::fmt::Debug for RouteBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Agent(step) => f.debug_tuple("Agent").field(step).finish(),
            Self::Function(_) => f.write_str("Function"),
        }
    }
}

/// How a workflow's steps are arranged.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Plan {
    /// Each step in order; the first gets the workflow's input, each next one the
    /// previous step's output; the workflow's answer is the last step's.
    Sequential(Vec<Step>),
    /// Fan-out: every branch gets the workflow's input and they run concurrently
    /// (bounded); fan-in: their outputs, in branch order, are combined into one message
    /// for `then` (whose answer is the workflow's), or are the answer themselves.
    Parallel {
        /// The branches.
        branches: Vec<Step>,
        /// The step that combines the branches' outputs.
        then: Option<Step>,
    },
    /// One route is chosen and runs on the workflow's input; its answer is the
    /// workflow's.
    Router {
        /// How the route is chosen.
        route_by: RouteBy,
        /// The routes (a route is chosen by its step name).
        routes: Vec<Step>,
        /// The route taken when the choice names none.
        default: Option<String>,
    },
}

impl Plan {
    /// `sequential`, `parallel` or `router`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sequential(_) => "sequential",
            Self::Parallel { .. } => "parallel",
            Self::Router { .. } => "router",
        }
    }

    /// Every step, in plan order (a router's agent first).
    pub fn steps(&self) -> Vec<&Step> {
        match self {
            Self::Sequential(steps) => steps.iter().collect(),
            Self::Parallel { branches, then } => branches.iter().chain(then.as_ref()).collect(),
            Self::Router {
                route_by, routes, ..
            } => {
                let router = match route_by {
                    RouteBy::Agent(step) => Some(step),
                    RouteBy::Function(_) => None,
                };
                router.into_iter().chain(routes.iter()).collect()
            }
        }
    }

    /// A one-line description of the arrangement (`parallel[a=x, b=y] then s=z`): what a
    /// run records as the workflow's fingerprint, compared when it is resumed.
    pub fn shape(&self) -> String {
        let list = |steps: &[Step]| {
            steps
                .iter()
                .map(|s| format!("{}={}", s.name, s.agent.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Self::Sequential(steps) => format!("sequential[{}]", list(steps)),
            Self::Parallel { branches, then } => {
                let then = then
                    .as_ref()
                    .map(|s| format!(" then {}={}", s.name, s.agent.name()))
                    .unwrap_or_default();
                format!("parallel[{}]{then}", list(branches))
            }
            Self::Router {
                route_by,
                routes,
                default,
            } => {
                let by = match route_by {
                    RouteBy::Agent(step) => format!("{}={}", step.name, step.agent.name()),
                    RouteBy::Function(_) => "function".to_string(),
                };
                let default = default
                    .as_ref()
                    .map(|d| format!(" default {d}"))
                    .unwrap_or_default();
                format!("router({by})[{}]{default}", list(routes))
            }
        }
    }
}

/// The message the `then` step of a parallel workflow receives: the task, then each
/// branch's output under its step name, in branch order.
pub(crate) fn fan_in(input: &str, results: &[(&Step, String)]) -> String {
    let mut text = format!(
        "Task:\n{}\n\nResults of the steps that worked on it:",
        input.trim()
    );
    for (step, output) in results {
        text.push_str(&format!(
            "\n\n## {} ({})\n{}",
            step.name,
            step.agent.name(),
            if output.trim().is_empty() {
                "(no output)"
            } else {
                output.trim()
            }
        ));
    }
    text
}

/// What a router agent is asked: the request, then the routes with what each is for.
pub(crate) fn routing_prompt(input: &str, routes: &[Step]) -> String {
    let mut text = format!(
        "Request:\n{}\n\nChoose the route that should handle the request above. Routes:",
        input.trim()
    );
    for route in routes {
        let description = route.agent.description();
        if description.trim().is_empty() {
            text.push_str(&format!("\n- {}", route.name));
        } else {
            text.push_str(&format!("\n- {}: {}", route.name, description.trim()));
        }
    }
    text.push_str("\n\nAnswer with the route's name only.");
    text
}

/// The route an answer names: the whole answer (trimmed of quotes and punctuation,
/// case-insensitive) equal to a route's name, else the only route whose name appears in
/// it as a word.
pub(crate) fn match_route<'a>(answer: &str, routes: &'a [Step]) -> Option<&'a Step> {
    let is_name_char = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    let whole = answer
        .trim()
        .trim_matches(|c: char| !is_name_char(c))
        .to_lowercase();
    if let Some(route) = routes.iter().find(|r| r.name.to_lowercase() == whole) {
        return Some(route);
    }
    let words: Vec<String> = answer
        .split(|c: char| !is_name_char(c))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut named = routes
        .iter()
        .filter(|r| words.contains(&r.name.to_lowercase()));
    match (named.next(), named.next()) {
        (Some(route), None) => Some(route),
        _ => None,
    }
}

/// Whether `name` is a valid step name (it becomes part of a thread id).
pub(crate) fn valid_step_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::RunContext;
    use crate::outcome::{RunError, RunOutcome};
    use crate::thread::Thread;
    use async_trait::async_trait;
    use keel_core::Message;

    struct Named(&'static str);

    #[async_trait]
    impl Agent for Named {
        fn name(&self) -> &str {
            self.0
        }
        async fn run(
            &self,
            _m: Vec<Message>,
            _t: &mut Thread,
            _c: &RunContext,
        ) -> Result<RunOutcome, RunError> {
            Err(RunError::NoInput)
        }
    }

    fn routes() -> Vec<Step> {
        vec![
            Step::new(Arc::new(Named("billing"))),
            Step::new(Arc::new(Named("tech"))),
        ]
    }

    #[test]
    fn routes_match_the_whole_answer_or_a_single_word() {
        let routes = routes();
        assert_eq!(match_route("billing", &routes).unwrap().name, "billing");
        assert_eq!(match_route(" `Tech`.\n", &routes).unwrap().name, "tech");
        assert_eq!(
            match_route("This is a tech question.", &routes)
                .unwrap()
                .name,
            "tech"
        );
        assert!(match_route("billing or tech", &routes).is_none());
        assert!(match_route("no idea", &routes).is_none());
    }

    #[test]
    fn fan_in_keeps_branch_order_and_names() {
        let routes = routes();
        let text = fan_in(
            "task",
            &[(&routes[1], "B".to_string()), (&routes[0], String::new())],
        );
        let tech = text.find("## tech").unwrap();
        let billing = text.find("## billing").unwrap();
        assert!(tech < billing, "{text}");
        assert!(text.contains("(no output)"));
    }

    #[test]
    fn step_names_are_checked() {
        assert!(valid_step_name("a-b_1"));
        assert!(!valid_step_name("a.b"));
        assert!(!valid_step_name(""));
    }
}
