//! [`AgentBuilder`]: a tool-calling agent assembled in code — the runtime's
//! [`ToolAgentBuilder`] plus the facade's conveniences (typed tools added one by one, the
//! run context, the repair bound of typed answers).

use std::sync::Arc;

use keel_core::{Budget, DynTool, Model, Tool, ToolRegistry};
use keel_runtime::{RunContext, ToolAgentBuilder};

use crate::agent::{Agent, DEFAULT_MAX_REPAIRS};
use crate::error::Error;

/// Builds an [`Agent`] around a [`keel_runtime::ToolAgent`]; start with
/// [`Agent::builder`]. The common settings have methods here; every other setting of the
/// runtime's builder is reachable through [`AgentBuilder::configure`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keel::Error> {
/// use std::sync::Arc;
/// use keel_testkit::{ScriptStep, ScriptedModel};
///
/// let model = Arc::new(ScriptedModel::new(vec![
///     ScriptStep::tool_call("calculator", serde_json::json!({"expression": "17*23"})),
///     ScriptStep::text("17*23 = 391"),
/// ]));
/// let agent = keel::Agent::builder("math", model)
///     .instructions("Use the calculator for arithmetic.")
///     .tool(keel::tools::Calculator)
///     .budget(keel::core::Budget { max_turns: Some(4), ..Default::default() })
///     .configure(|b| b.temperature(Some(0.0)))
///     .build()?;
/// assert_eq!(agent.prompt("What is 17*23?").await?, "17*23 = 391");
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct AgentBuilder {
    inner: ToolAgentBuilder,
    tools: ToolRegistry,
    problems: Vec<keel_core::RegistryError>,
    context: Option<RunContext>,
    max_repairs: u32,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("tools", &self.tools)
            .field("context", &self.context)
            .field("max_repairs", &self.max_repairs)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    pub(crate) fn new(name: impl Into<String>, model: Arc<dyn Model>) -> Self {
        Self {
            inner: keel_runtime::ToolAgent::builder(name, model),
            tools: ToolRegistry::new(),
            problems: Vec::new(),
            context: None,
            max_repairs: DEFAULT_MAX_REPAIRS,
        }
    }

    /// Instructions (the top of the system prompt).
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.inner = self.inner.instructions(instructions);
        self
    }

    /// What the agent does, for a model that is offered it as a tool or handoff target.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.inner = self.inner.description(description);
        self
    }

    /// Adds a typed tool (its JSON Schemas are generated from its Rust types). A tool that
    /// breaks the tool contract, or whose name is taken, makes [`build`](Self::build) fail.
    pub fn tool<T: Tool>(mut self, tool: T) -> Self {
        if let Err(problem) = self.tools.register_typed(tool) {
            self.problems.push(problem);
        }
        self
    }

    /// Adds a tool defined at run time (JSON schemas, e.g. from an MCP server).
    pub fn dyn_tool(mut self, tool: Arc<dyn DynTool>) -> Self {
        if let Err(problem) = self.tools.register(tool) {
            self.problems.push(problem);
        }
        self
    }

    /// Adds every tool of `registry` (e.g. [`keel_tools::builtin_registry`]).
    pub fn tools(mut self, registry: ToolRegistry) -> Self {
        for name in registry.names() {
            if let Some(tool) = registry.get(name)
                && let Err(problem) = self.tools.register(Arc::clone(tool))
            {
                self.problems.push(problem);
            }
        }
        self
    }

    /// The budget of each run (turns, wall clock, tokens, cost).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.inner = self.inner.budget(budget);
        self
    }

    /// Where runs are stored and observed (default: a new in-memory store).
    pub fn context(mut self, context: RunContext) -> Self {
        self.context = Some(context);
        self
    }

    /// How many schema violations [`Agent::prompt_typed`] sends back to the model before
    /// failing (default 2).
    pub fn max_repairs(mut self, repairs: u32) -> Self {
        self.max_repairs = repairs;
        self
    }

    /// Any other setting of the runtime's builder (temperature, critic, planner mode,
    /// context strategy, policy table…).
    pub fn configure(mut self, change: impl FnOnce(ToolAgentBuilder) -> ToolAgentBuilder) -> Self {
        self.inner = change(self.inner);
        self
    }

    /// Builds the agent. Fails when a tool could not be registered (each problem names the
    /// tool and the rule it breaks).
    pub fn build(self) -> Result<Agent, Error> {
        if let Some(problem) = self.problems.into_iter().next() {
            return Err(problem.into());
        }
        let agent = self.inner.tools(self.tools).build();
        let context = self.context.unwrap_or_default();
        Ok(Agent::ready(Arc::new(agent), context).with_max_repairs(self.max_repairs))
    }
}
