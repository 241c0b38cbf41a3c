//! [`ToolAgent`], the tool-calling agent (Keel's main [`crate::Agent`]): a name, instructions, a model, tools and a budget — and `run`, seed 003's
//! `agent.run(new_messages, &mut thread, &context)`.

use std::sync::Arc;
use std::time::Duration;

use keel_core::definition::sha256_hex;
use keel_core::observation::{DefaultNormalizer, ObservationMode, ObservationNormalizer};
use keel_core::planner::{self, PlannerMode};
use keel_core::{
    AgentDefinition, AgentFingerprint, Budget, CallRule, Critic, Message, Model, PolicyTable,
    ToolChoice, ToolDefinition, ToolFingerprint, ToolRegistry,
};

use crate::context::RunContext;
use crate::executor::ToolExecutor;
use crate::outcome::{RunError, RunOutcome};
use crate::runner;
use crate::thread::Thread;

/// An agent: everything needed to drive runs, shareable across concurrent runs.
pub struct ToolAgent {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) tools: ToolRegistry,
    pub(crate) executor: ToolExecutor,
    pub(crate) system_prompt: String,
    /// Shown again on every model call at the end of the user's latest message
    /// ([`ToolAgentBuilder::reminder`]).
    pub(crate) reminder: Option<String>,
    pub(crate) tool_definitions: Vec<ToolDefinition>,
    pub(crate) budget: Budget,
    pub(crate) tool_choice: ToolChoice,
    pub(crate) temperature: Option<f32>,
    /// Tokens the context budget reserves for each answer.
    pub(crate) output_reserve: u32,
    /// The output limit sent with each request (`max_output_tokens`, or the reservation
    /// when it had to be capped to fit the window).
    pub(crate) request_max_output: Option<u32>,
    pub(crate) stream_idle_timeout: Duration,
    pub(crate) policy: PolicyTable,
    pub(crate) observation_mode: ObservationMode,
    pub(crate) normalizer: Arc<dyn ObservationNormalizer>,
    pub(crate) critic: Option<Arc<dyn Critic>>,
    pub(crate) max_critic_rejections: u32,
    /// Conditions checked before a call runs (order, successes per run, grounding).
    pub(crate) call_rules: Vec<CallRule>,
    pub(crate) planner_mode: PlannerMode,
    pub(crate) max_invalid_actions: u32,
    pub(crate) action_schema: Option<serde_json::Value>,
    pub(crate) context: crate::compaction::ContextConfig,
    /// What each run records about this agent (recipe and fingerprint).
    pub(crate) definition: AgentDefinition,
    /// The estimate of the fixed part of requests, kept between calls.
    pub(crate) fixed_tokens: crate::compaction::FixedTokens,
    /// The agents this one may hand the conversation to (`transfer_to_<name>` tools).
    pub(crate) handoffs: Vec<crate::handoff::HandoffTarget>,
    /// Handoffs allowed in one chain (one user request) before a transfer is refused.
    pub(crate) max_handoffs: u32,
    pub(crate) durability: keel_core::RunDurability,
}

impl std::fmt::Debug for ToolAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolAgent")
            .field("name", &self.name)
            .field("model", &self.model.id())
            .field("tools", &self.tools)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl ToolAgent {
    /// Starts building an agent.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use keel_core::Message;
    /// use keel_runtime::{RunContext, Thread, ToolAgent};
    /// use keel_testkit::{ScriptStep, ScriptedModel};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let model = Arc::new(ScriptedModel::new(vec![
    ///     ScriptStep::tool_call("calculator", serde_json::json!({"expression": "17*23"})),
    ///     ScriptStep::text("17*23 = 391"),
    /// ]));
    /// let agent = ToolAgent::builder("math", model.clone())
    ///     .instructions("Use the calculator for arithmetic.")
    ///     .tools(keel_tools::builtin_registry()?)
    ///     .build();
    /// let mut thread = Thread::new();
    /// let question = vec![Message::user("What is 17*23?")];
    /// let outcome = agent.run(question, &mut thread, &RunContext::default()).await?;
    /// assert_eq!(outcome.final_text.as_deref(), Some("17*23 = 391"));
    /// assert_eq!(outcome.tool_calls[0].name, "calculator");
    /// assert!(model.requests()[1].tool_result_contents()[0].contains("391"));
    /// # Ok(()) }
    /// ```
    pub fn builder(name: impl Into<String>, model: Arc<dyn Model>) -> ToolAgentBuilder {
        ToolAgentBuilder {
            name: name.into(),
            description: String::new(),
            model,
            instructions: String::new(),
            reminder: None,
            tools: ToolRegistry::new(),
            budget: Budget::default(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_output_tokens: None,
            stream_idle_timeout: Duration::from_secs(300),
            policy: PolicyTable::default(),
            observation_mode: ObservationMode::Raw,
            normalizer: Arc::new(DefaultNormalizer),
            critic: None,
            max_critic_rejections: 2,
            call_rules: Vec::new(),
            planner_mode: PlannerMode::Native,
            control_tools: true,
            max_invalid_actions: 2,
            context: crate::compaction::ContextSettings::default(),
            recipe: serde_json::Value::Null,
            settings: std::collections::BTreeMap::new(),
            max_parallel_tool_calls: crate::executor::DEFAULT_MAX_PARALLEL_CALLS,
            handoffs: Vec::new(),
            max_handoffs: crate::handoff::DEFAULT_MAX_HANDOFFS,
            durability: keel_core::RunDurability::default(),
        }
    }

    /// When this agent's runs write their events to the store.
    pub fn durability(&self) -> keel_core::RunDurability {
        self.durability
    }

    /// What every run of this agent records in its `RunStarted` event: the recipe the
    /// application layer rebuilds the agent from, and the agent's fingerprint.
    pub fn definition(&self) -> &AgentDefinition {
        &self.definition
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the agent does (shown when it is offered to another agent as a tool or a
    /// handoff target).
    pub fn description(&self) -> &str {
        &self.description
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

    /// The tool definitions sent to the model (tools plus control tools in native mode).
    pub fn tool_definitions(&self) -> &[ToolDefinition] {
        &self.tool_definitions
    }

    /// The agents this one may hand the conversation to.
    pub fn handoffs(&self) -> &[crate::handoff::HandoffTarget] {
        &self.handoffs
    }

    /// The handoff target a call of `tool` transfers to, when it is a transfer tool.
    pub(crate) fn handoff_target(&self, tool: &str) -> Option<&crate::handoff::HandoffTarget> {
        self.handoffs.iter().find(|target| target.tool == tool)
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

    /// Checks that this agent may continue the run in progress on `thread`: compared with
    /// the definition the run recorded when it started, no tool of the run may be missing
    /// or have changed its input schema. Returns the compatible differences (another model,
    /// changed instructions…), which [`ToolAgent::resume`] records as an `agent_changed` notice.
    /// Call it before recording a human decision, so an agent that cannot continue the
    /// run is refused before anything is written.
    pub fn check_resumable(&self, thread: &Thread) -> Result<Vec<String>, RunError> {
        runner::check_resumable(self, thread)
    }

    /// Continues the run in progress on `thread` (after a pause or a crash) — or, when the
    /// thread's last run ended `failed` because a model call failed on a retryable error
    /// ([`RunOutcome::resumable`]), continues the conversation in a new run that records
    /// which run it continues (`run_continued` notice). Fails with
    /// [`RunError::IncompatibleAgent`], before any model call, when this agent cannot
    /// continue it (see [`ToolAgent::check_resumable`]).
    pub async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        runner::resume(self, thread, context).await
    }
}

/// Builds a [`ToolAgent`].
#[must_use]
pub struct ToolAgentBuilder {
    name: String,
    description: String,
    model: Arc<dyn Model>,
    instructions: String,
    reminder: Option<String>,
    tools: ToolRegistry,
    budget: Budget,
    tool_choice: ToolChoice,
    temperature: Option<f32>,
    max_output_tokens: Option<u32>,
    stream_idle_timeout: Duration,
    policy: PolicyTable,
    observation_mode: ObservationMode,
    normalizer: Arc<dyn ObservationNormalizer>,
    critic: Option<Arc<dyn Critic>>,
    max_critic_rejections: u32,
    call_rules: Vec<CallRule>,
    planner_mode: PlannerMode,
    control_tools: bool,
    max_invalid_actions: u32,
    context: crate::compaction::ContextSettings,
    recipe: serde_json::Value,
    settings: std::collections::BTreeMap<String, String>,
    max_parallel_tool_calls: usize,
    handoffs: Vec<crate::handoff::HandoffTarget>,
    max_handoffs: u32,
    durability: keel_core::RunDurability,
}

impl ToolAgentBuilder {
    /// Lets the agent hand the conversation to the agent named `agent` (its
    /// [`crate::Agent::name`]): the model gets a `transfer_to_<agent>` tool described by
    /// `description`; calling it records a `handoff` event and ends the run, and a
    /// [`crate::HandoffGroup`] holding both agents lets `agent` continue the thread.
    pub fn handoff(mut self, agent: impl Into<String>, description: impl Into<String>) -> Self {
        self.handoffs
            .push(crate::handoff::HandoffTarget::new(agent, description));
        self
    }

    /// How many handoffs one user request may go through (default
    /// [`crate::handoff::DEFAULT_MAX_HANDOFFS`]); past it a transfer is refused and the
    /// model is told to answer itself.
    pub fn max_handoffs(mut self, handoffs: u32) -> Self {
        self.max_handoffs = handoffs;
        self
    }

    /// When the run's events reach the store (default
    /// [`keel_core::RunDurability::Effects`]: only before effects that depend on them;
    /// `Steps` also before every model call, for viewers in another process).
    pub fn durability(mut self, durability: keel_core::RunDurability) -> Self {
        self.durability = durability;
        self
    }

    /// At most this many tool calls of one turn run at once (default
    /// [`crate::executor::DEFAULT_MAX_PARALLEL_CALLS`]); the others wait for a free slot and
    /// results are still committed in call order.
    pub fn max_parallel_tool_calls(mut self, calls: usize) -> Self {
        self.max_parallel_tool_calls = calls.max(1);
        self
    }

    /// How the application layer rebuilds this agent (model spec, provider options, tool
    /// selection, agent file…), recorded in every run's `RunStarted` event so that
    /// `resume`, approvals and workers can rebuild the agent from the log alone. Never put
    /// secrets here: keys are resolved from the environment again on rebuild.
    pub fn recipe(mut self, recipe: serde_json::Value) -> Self {
        self.recipe = recipe;
        self
    }

    /// The SHA-256 of each configuration section that shapes this agent, by its name in
    /// the configuration (`[agents.NAME]`, `[policies]`…), recorded in the fingerprint
    /// ([`AgentFingerprint::settings`]) so that a resume names every section that changed.
    pub fn settings_fingerprint(
        mut self,
        settings: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.settings = settings;
        self
    }

    /// The context strategy keeping requests within the context window (default
    /// `truncate`): `truncate`, `summarize` or `importance`.
    pub fn context_strategy(mut self, kind: keel_core::context::StrategyKind) -> Self {
        self.context.kind = Some(kind);
        self.context.custom = None;
        self
    }

    /// A custom context strategy (replaces the built-in one).
    pub fn custom_context_strategy(
        mut self,
        strategy: Arc<dyn keel_core::context::ContextStrategy>,
    ) -> Self {
        self.context.custom = Some(strategy);
        self
    }

    /// Turns context management off: requests are sent as they are, however large.
    pub fn disable_context_management(mut self) -> Self {
        self.context.kind = None;
        self.context.custom = None;
        self
    }

    /// Overrides the model's context window (tokens) used for the token budget.
    pub fn context_window(mut self, tokens: u32) -> Self {
        self.context.context_window = Some(tokens);
        self
    }

    /// Longest tool result the model sees, in characters (default 40,000); longer ones are
    /// cut with an `[OUTPUT TRUNCATED: ...]` notice.
    pub fn max_tool_result_chars(mut self, chars: usize) -> Self {
        self.context.max_tool_result_chars = chars;
        self
    }

    /// The model that writes summaries for the `summarize` strategy (default: the agent's
    /// model), e.g. a cheaper one.
    pub fn summarizer_model(mut self, model: Arc<dyn Model>) -> Self {
        self.context.summarizer = Some(model);
        self
    }

    /// Longest a compaction (including its summarization call) may take (default 120 s).
    pub fn compaction_timeout(mut self, timeout: Duration) -> Self {
        self.context.timeout = timeout;
        self
    }

    /// The policy table deciding what follows a failed tool call (default: seed 000's).
    pub fn policy(mut self, policy: PolicyTable) -> Self {
        self.policy = policy;
        self
    }

    /// What the model sees of tool results: raw, normalized observation, or both.
    pub fn observation_mode(mut self, mode: ObservationMode) -> Self {
        self.observation_mode = mode;
        self
    }

    /// The normalizer for tools that do not normalize their own outcomes.
    pub fn normalizer(mut self, normalizer: Arc<dyn ObservationNormalizer>) -> Self {
        self.normalizer = normalizer;
        self
    }

    /// A critic called after each observation and on the final answer.
    pub fn critic(mut self, critic: Arc<dyn Critic>) -> Self {
        self.critic = Some(critic);
        self
    }

    /// A rule checked before each call of `rule.tool` runs: tools that must have
    /// succeeded first, successes allowed per run, argument fields that must cite the
    /// run's tool results ([`keel_core::call_rules`]). A call breaking it is answered with
    /// an `invalid_input` error telling the model what to do, and never runs.
    pub fn call_rule(mut self, rule: CallRule) -> Self {
        self.call_rules.push(rule);
        self
    }

    /// How many times an unsatisfied final answer goes back to the model (default 2);
    /// after that the run fails with the critic's gaps.
    pub fn max_critic_rejections(mut self, rejections: u32) -> Self {
        self.max_critic_rejections = rejections;
        self
    }

    /// Native tool calling (default) or one structured JSON action per turn.
    pub fn planner_mode(mut self, mode: PlannerMode) -> Self {
        self.planner_mode = mode;
        self
    }

    /// Whether the built-in `ask_user` and `replan` control tools are offered (native
    /// mode; default true).
    pub fn control_tools(mut self, enabled: bool) -> Self {
        self.control_tools = enabled;
        self
    }

    /// How many invalid structured actions are re-asked before the run fails (default 2).
    pub fn max_invalid_actions(mut self, reasks: u32) -> Self {
        self.max_invalid_actions = reasks;
        self
    }

    /// What the agent does, for a model that is offered it as a tool or handoff target.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Instructions (the top of the system prompt).
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// A short note shown to the model again on every call, at the end of the user's
    /// latest message (a text part of its own, after a blank line; `None`, or only
    /// whitespace: none). For the few rules the agent must keep in view however long the
    /// system prompt and the run get: small local models weigh what is near the end of the
    /// prompt far more than the top of a long system prompt. It is part of each request,
    /// not of the thread's log; its text counts in the agent's fingerprint like the system
    /// prompt's. A critic's rejection is a user message too: the reminder moves to it.
    pub fn reminder(mut self, reminder: Option<String>) -> Self {
        self.reminder = reminder
            .map(|text| text.trim().to_string())
            .filter(|text| !text.is_empty());
        self
    }

    /// The tools the agent may call.
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// Replaces the tools with what `map` makes of them — e.g. a golden replay wraps each
    /// tool so it answers with recorded outputs while keeping its contract.
    pub fn map_tools(mut self, map: impl FnOnce(ToolRegistry) -> ToolRegistry) -> Self {
        self.tools = map(std::mem::take(&mut self.tools));
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
    pub fn build(self) -> ToolAgent {
        let mut system_prompt = self.instructions.trim().to_string();
        let mut push_section = |section: &str| {
            if !system_prompt.is_empty() {
                system_prompt.push_str("\n\n");
            }
            system_prompt.push_str(section.trim_end());
        };
        let mut tool_names: Vec<&str> = self.tools.names().collect();
        tool_names.extend(self.handoffs.iter().map(|target| target.tool.as_str()));
        let (tool_definitions, action_schema) = match self.planner_mode {
            PlannerMode::Native => {
                if !self.tools.is_empty() {
                    push_section(&self.tools.render_guidance());
                }
                let mut definitions = self.tools.definitions();
                if !self.handoffs.is_empty() {
                    push_section(&crate::handoff::guidance(&self.handoffs));
                    definitions.extend(self.handoffs.iter().map(|t| t.definition()));
                }
                if self.control_tools {
                    push_section(planner::CONTROL_TOOLS_GUIDANCE);
                    definitions.extend(planner::control_tool_definitions());
                }
                (definitions, None)
            }
            PlannerMode::Structured => {
                if !self.tools.is_empty() {
                    push_section(&self.tools.render_guidance());
                    let schemas: Vec<String> = self
                        .tools
                        .specs()
                        .map(|spec| format!("- {}: args schema {}", spec.name, spec.input_schema))
                        .collect();
                    push_section(&format!("Tool argument schemas:\n{}", schemas.join("\n")));
                }
                if !self.handoffs.is_empty() {
                    push_section(&crate::handoff::guidance(&self.handoffs));
                }
                push_section(&planner::structured_prompt(&tool_names));
                (Vec::new(), Some(planner::action_schema(&tool_names)))
            }
        };
        let context = self.context.build();
        let caps = self.model.capabilities();
        let window = context.context_window.unwrap_or(caps.context_window);
        let (output_reserve, request_max_output) =
            output_limits(self.max_output_tokens, caps.max_output_tokens, window);
        let mut tools: Vec<ToolFingerprint> = self.tools.specs().map(ToolFingerprint::of).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let definition = AgentDefinition {
            recipe: self.recipe,
            fingerprint: AgentFingerprint {
                model: self.model.id(),
                system_prompt_sha256: match &self.reminder {
                    None => sha256_hex(&system_prompt),
                    Some(reminder) => sha256_hex(&format!("{system_prompt}\n\n{reminder}")),
                },
                tools,
                planner: self.planner_mode,
                observation: self.observation_mode,
                critic: self.critic.is_some(),
                context_strategy: context.strategy.as_ref().map(|s| s.name().to_string()),
                context_window: context.context_window,
                max_output_tokens: self.max_output_tokens,
                settings: self.settings,
            },
        };
        ToolAgent {
            name: self.name,
            description: self.description,
            executor: ToolExecutor::new(&self.tools)
                .with_max_parallel_calls(self.max_parallel_tool_calls),
            tool_definitions,
            tools: self.tools,
            model: self.model,
            system_prompt,
            reminder: self.reminder,
            budget: self.budget,
            tool_choice: self.tool_choice,
            temperature: self.temperature,
            output_reserve,
            request_max_output,
            stream_idle_timeout: self.stream_idle_timeout,
            policy: self.policy,
            observation_mode: self.observation_mode,
            normalizer: self.normalizer,
            critic: self.critic,
            max_critic_rejections: self.max_critic_rejections,
            call_rules: self.call_rules,
            planner_mode: self.planner_mode,
            max_invalid_actions: self.max_invalid_actions,
            action_schema,
            context,
            definition,
            fixed_tokens: crate::compaction::FixedTokens::default(),
            handoffs: self.handoffs,
            max_handoffs: self.max_handoffs,
            durability: self.durability,
        }
    }
}

/// The largest share of the context window reserved for the answer when the output limit
/// is not set explicitly (a quarter: a model whose default limit is 32k tokens still
/// works in a 2k window).
pub const MAX_IMPLICIT_OUTPUT_SHARE: u32 = 4;

/// `(reserved, sent)`: the tokens the context budget reserves for each answer and the
/// output limit sent with requests. An explicit limit is used as given (a window too
/// small for it is reported before the first call); otherwise the model's limit, capped
/// at a quarter of the window — and then sent, so the answer cannot outgrow the
/// reservation.
pub(crate) fn output_limits(
    explicit: Option<u32>,
    model_limit: u32,
    window: u32,
) -> (u32, Option<u32>) {
    match explicit {
        Some(tokens) => (tokens, Some(tokens)),
        None => {
            let share = (window / MAX_IMPLICIT_OUTPUT_SHARE).max(1);
            if model_limit > share {
                (share, Some(share))
            } else {
                (model_limit, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::output_limits;

    #[test]
    fn implicit_output_reservation_is_capped_at_a_quarter_of_the_window() {
        assert_eq!(output_limits(None, 32_768, 2_000), (500, Some(500)));
        assert_eq!(output_limits(None, 4_096, 128_000), (4_096, None));
        assert_eq!(
            output_limits(Some(1_500), 32_768, 2_000),
            (1_500, Some(1_500))
        );
        assert_eq!(output_limits(None, 32_768, 0), (1, Some(1)));
    }
}
