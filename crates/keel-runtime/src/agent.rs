//! [`Agent`]: a name, instructions, a model, tools and a budget — and `run`, seed 003's
//! `agent.run(new_messages, &mut thread, &context)`.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{Budget, Message, Model, ToolChoice, ToolDefinition, ToolRegistry};

use crate::context::RunContext;
use crate::executor::ToolExecutor;
use crate::outcome::{RunError, RunOutcome};
use crate::runner;
use crate::thread::Thread;

/// An agent: everything needed to drive runs, shareable across concurrent runs.
pub struct Agent {
    pub(crate) name: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) tools: ToolRegistry,
    pub(crate) executor: ToolExecutor,
    pub(crate) system_prompt: String,
    pub(crate) tool_definitions: Vec<ToolDefinition>,
    pub(crate) budget: Budget,
    pub(crate) tool_choice: ToolChoice,
    pub(crate) temperature: Option<f32>,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) stream_idle_timeout: Duration,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.name)
            .field("model", &self.model.id())
            .field("tools", &self.tools)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts building an agent.
    pub fn builder(name: impl Into<String>, model: Arc<dyn Model>) -> AgentBuilder {
        AgentBuilder {
            name: name.into(),
            model,
            instructions: String::new(),
            tools: ToolRegistry::new(),
            budget: Budget::default(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_output_tokens: None,
            stream_idle_timeout: Duration::from_secs(300),
        }
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.model
    }

    /// The tools.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The full system prompt: instructions, then the "Tools" guidance section.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// The budget of each run.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Starts a run on `thread` with `new_messages` and drives it until it ends or pauses.
    /// Every event is in `context.store` before it is acted on.
    pub async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        runner::start(self, new_messages, thread, context).await
    }

    /// Continues the run in progress on `thread` (after a pause or a crash).
    pub async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        runner::resume(self, thread, context).await
    }
}

/// Builds an [`Agent`].
pub struct AgentBuilder {
    name: String,
    model: Arc<dyn Model>,
    instructions: String,
    tools: ToolRegistry,
    budget: Budget,
    tool_choice: ToolChoice,
    temperature: Option<f32>,
    max_output_tokens: Option<u32>,
    stream_idle_timeout: Duration,
}

impl AgentBuilder {
    /// Instructions (the top of the system prompt).
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// The tools the agent may call.
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// The budget of each run.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// Tool choice on every request.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }

    /// Sampling temperature (omitted from requests when unset).
    pub fn temperature(mut self, temperature: Option<f32>) -> Self {
        self.temperature = temperature;
        self
    }

    /// Maximum output tokens per model call.
    pub fn max_output_tokens(mut self, tokens: Option<u32>) -> Self {
        self.max_output_tokens = tokens;
        self
    }

    /// Longest silence tolerated between two pieces of a model stream.
    pub fn stream_idle_timeout(mut self, timeout: Duration) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    /// Builds the agent.
    pub fn build(self) -> Agent {
        let mut system_prompt = self.instructions.trim().to_string();
        if !self.tools.is_empty() {
            if !system_prompt.is_empty() {
                system_prompt.push_str("\n\n");
            }
            system_prompt.push_str(&self.tools.render_guidance());
        }
        Agent {
            name: self.name,
            executor: ToolExecutor::new(&self.tools),
            tool_definitions: self.tools.definitions(),
            tools: self.tools,
            model: self.model,
            system_prompt,
            budget: self.budget,
            tool_choice: self.tool_choice,
            temperature: self.temperature,
            max_output_tokens: self.max_output_tokens,
            stream_idle_timeout: self.stream_idle_timeout,
        }
    }
}
