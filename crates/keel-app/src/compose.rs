//! Agents made of agents, from configuration: `agents_as_tools` (each named agent built
//! and offered to the agent as a [`AgentTool`]) and `handoffs` (a `transfer_to_<name>`
//! tool per target, and a [`HandoffGroup`] holding every agent a conversation can reach).
//! A member may be a remote A2A agent (`a2a = "…"`, [`A2aAgent`]): a handoff target, an
//! agent offered as a tool, or the entry itself.
//!
//! Everything is checked before any model is built or called, each problem naming the
//! file, key and line: an unknown agent in `handoffs` or `agents_as_tools`, a cycle of
//! handoffs (`a → b → a`, `a → a`), and an agent that would run itself as a tool, directly
//! or through other agents (runs nesting forever).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use keel_config::{AgentDefinition, DiagnosticCode};
use keel_core::{Message, Model, ToolRegistry};
use keel_runtime::{
    Agent, AgentTool, HandoffGroup, RunContext, RunError, RunOutcome, Thread, ToolAgent,
    ToolAgentBuilder,
};

use crate::App;
use crate::a2a_agent::A2aAgent;
use crate::build::{AgentRequest, Problems, Resolution};
use crate::definition::{AgentRef, Resolved};
use crate::error::AppError;

/// An agent built from configuration with what it composes: the agent itself (the entry)
/// and, when it hands off, every agent its conversations can be handed to. Runs go through
/// the handoff group, so the agent owning a thread (read from its log) answers. The entry
/// and the members are tool-calling agents or remote A2A agents ([`A2aAgent`]).
pub struct ComposedAgent {
    entry: Member,
    members: BTreeMap<String, Member>,
    group: Option<HandoffGroup>,
}

/// One agent of a composition.
#[derive(Clone)]
enum Member {
    Tool(Arc<ToolAgent>),
    Remote(Arc<A2aAgent>),
}

impl Member {
    fn name(&self) -> &str {
        match self {
            Self::Tool(agent) => agent.name(),
            Self::Remote(agent) => Agent::name(agent.as_ref()),
        }
    }

    fn as_agent(&self) -> &dyn Agent {
        match self {
            Self::Tool(agent) => agent.as_ref(),
            Self::Remote(agent) => agent.as_ref(),
        }
    }

    fn shared(&self) -> Arc<dyn Agent> {
        match self {
            Self::Tool(agent) => Arc::clone(agent) as Arc<dyn Agent>,
            Self::Remote(agent) => Arc::clone(agent) as Arc<dyn Agent>,
        }
    }

    fn check_resumable(&self, thread: &Thread) -> Result<Vec<String>, RunError> {
        match self {
            Self::Tool(agent) => agent.check_resumable(thread),
            Self::Remote(agent) => agent.check_resumable(thread),
        }
    }
}

impl std::fmt::Debug for ComposedAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComposedAgent")
            .field("entry", &self.entry.name())
            .field("members", &self.members.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ComposedAgent {
    /// One agent, composing nothing.
    pub fn single(agent: ToolAgent) -> Self {
        Self::of(Member::Tool(Arc::new(agent)))
    }

    /// One remote A2A agent, composing nothing.
    pub fn remote(agent: A2aAgent) -> Self {
        Self::of(Member::Remote(Arc::new(agent)))
    }

    fn of(entry: Member) -> Self {
        let mut members = BTreeMap::new();
        members.insert(entry.name().to_string(), entry.clone());
        Self {
            entry,
            members,
            group: None,
        }
    }

    /// The agent new conversations start with, when it is a tool-calling agent (`None`
    /// for a remote A2A agent: see [`entry_agent`](Self::entry_agent)).
    pub fn entry(&self) -> Option<&ToolAgent> {
        match &self.entry {
            Member::Tool(agent) => Some(agent),
            Member::Remote(_) => None,
        }
    }

    /// The agent new conversations start with, whatever its kind.
    pub fn entry_agent(&self) -> &dyn Agent {
        self.entry.as_agent()
    }

    /// The entry agent's model (`None` for a remote A2A agent, which has its own).
    pub fn model(&self) -> Option<&Arc<dyn Model>> {
        self.entry().map(ToolAgent::model)
    }

    /// What answers the entry agent: its model's id (`provider:model`), or
    /// `a2a:<remote>` for a remote A2A agent.
    pub fn model_id(&self) -> String {
        match &self.entry {
            Member::Tool(agent) => agent.model().id(),
            Member::Remote(agent) => agent.model_id(),
        }
    }

    /// An agent of the composition by name (the entry or a handoff target).
    pub fn member(&self, name: &str) -> Option<&dyn Agent> {
        self.members.get(name).map(Member::as_agent)
    }

    /// The agent that owns `thread` (see [`HandoffGroup::active_agent`]).
    pub fn owner(&self, thread: &Thread) -> &dyn Agent {
        self.owner_member(thread).as_agent()
    }

    fn owner_member(&self, thread: &Thread) -> &Member {
        let state = thread.state();
        state
            .pending_handoff()
            .or_else(|| state.run().map(|run| run.agent.as_str()))
            .and_then(|name| self.members.get(name))
            .unwrap_or(&self.entry)
    }

    /// Whether the agent that owns `thread` can continue its run (see
    /// [`ToolAgent::check_resumable`]); answers the differences worth telling.
    pub fn check_resumable(&self, thread: &Thread) -> Result<Vec<String>, RunError> {
        self.owner_member(thread).check_resumable(thread)
    }

    /// Runs on `thread` (see [`Agent::run`]).
    pub async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        match &self.group {
            Some(group) => group.run(new_messages, thread, context).await,
            None => {
                self.entry
                    .as_agent()
                    .run(new_messages, thread, context)
                    .await
            }
        }
    }

    /// Continues `thread` (see [`Agent::resume`]).
    pub async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        match &self.group {
            Some(group) => group.resume(thread, context).await,
            None => self.entry.as_agent().resume(thread, context).await,
        }
    }
}

#[async_trait]
impl Agent for ComposedAgent {
    fn name(&self) -> &str {
        self.entry.name()
    }

    fn description(&self) -> &str {
        self.entry.as_agent().description()
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        ComposedAgent::run(self, new_messages, thread, context).await
    }

    async fn resume(
        &self,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        ComposedAgent::resume(self, thread, context).await
    }
}

/// Which way an agent refers to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    Handoff,
    Tool,
}

impl Edge {
    fn key(self) -> &'static str {
        match self {
            Self::Handoff => "handoffs",
            Self::Tool => "agents_as_tools",
        }
    }
}

/// The agents `def` refers to, with the key of each reference.
fn edges(def: &AgentDefinition) -> Vec<(Edge, String, String)> {
    let refs = |edge: Edge, names: &Option<Vec<String>>| {
        names
            .iter()
            .flatten()
            .enumerate()
            .map(move |(i, name)| (edge, format!("{}[{i}]", edge.key()), name.clone()))
            .collect::<Vec<_>>()
    };
    let mut out = refs(Edge::Handoff, &def.handoffs);
    out.extend(refs(Edge::Tool, &def.agents_as_tools));
    out
}

/// Checks the agents `resolved` composes and everything reachable from it: unknown names,
/// handoff cycles and agent-tool recursion, each added to `problems` at the key that
/// closes it. Returns whether the composition is sound (only then are agents built).
pub(crate) fn check(app: &App, resolved: Option<&Resolved>, problems: &mut Problems<'_>) -> bool {
    let Some(root) = resolved else {
        return true;
    };
    let declared: Vec<&str> = app.config().agents.keys().map(String::as_str).collect();
    let mut sound = true;
    for (_, key, name) in edges(&root.definition) {
        if !app.config().agents.contains_key(&name) {
            sound = false;
            problems.add(
                DiagnosticCode::UnknownReference,
                &key,
                format!(
                    "`{}`: unknown agent `{name}`{}; handoffs and agents_as_tools name \
                     keel.toml [agents.<name>] tables{}",
                    root.key_path(&key),
                    crate::hint(&name, &declared),
                    if declared.is_empty() {
                        " (none declared)".to_string()
                    } else {
                        format!(" (declared: {})", declared.join(", "))
                    }
                ),
            );
        }
    }
    if !sound {
        return false;
    }
    let mut cache: HashMap<String, Resolved> = HashMap::new();
    let root_node = root.name.clone().unwrap_or_else(|| "(this agent)".into());
    let mut path: Vec<(String, Edge)> = Vec::new();
    let mut reported = Vec::new();
    let mut done = std::collections::HashSet::new();
    visit(
        app,
        &root_node,
        &root.definition,
        root,
        &mut cache,
        &mut path,
        &mut done,
        &mut reported,
        problems,
    );
    reported.is_empty()
}

/// Depth-first walk of the reference graph; a reference back into the current path is a
/// cycle, reported once at that reference.
#[allow(clippy::too_many_arguments)]
fn visit(
    app: &App,
    node: &str,
    def: &AgentDefinition,
    located: &Resolved,
    cache: &mut HashMap<String, Resolved>,
    path: &mut Vec<(String, Edge)>,
    done: &mut std::collections::HashSet<String>,
    reported: &mut Vec<String>,
    problems: &mut Problems<'_>,
) {
    for (edge, key, target) in edges(def) {
        if let Some(start) = path
            .iter()
            .position(|(n, _)| *n == target)
            .or_else(|| (target == node).then_some(path.len()))
        {
            let mut cycle: Vec<(String, Edge)> = path.get(start..).unwrap_or_default().to_vec();
            cycle.push((node.to_string(), edge));
            let only_handoffs = cycle.iter().all(|(_, e)| *e == Edge::Handoff);
            let mut shown = String::new();
            for (name, e) in &cycle {
                shown.push_str(name);
                shown.push_str(if *e == Edge::Handoff {
                    " → "
                } else {
                    " →(tool) "
                });
            }
            shown.push_str(&target);
            let message = if only_handoffs {
                format!(
                    "`{}`: handoff cycle {shown}: a conversation could be handed around \
                     forever; remove one of these handoffs",
                    located.key_path(&key)
                )
            } else {
                format!(
                    "`{}`: agent `{target}` would run itself as a tool ({shown}), nesting runs \
                     forever; remove one of these agents_as_tools or handoffs",
                    located.key_path(&key)
                )
            };
            let id = format!("{node}:{key}");
            if !reported.contains(&id) {
                reported.push(id);
                match located.error(DiagnosticCode::InvalidValue, &key, message.clone()) {
                    AppError::Located(diagnostics) => problems.extend(diagnostics),
                    _ => problems.add(DiagnosticCode::InvalidValue, &key, message),
                }
            }
            continue;
        }
        if done.contains(&target) {
            continue;
        }
        if !cache.contains_key(&target) {
            match Resolved::load(app.loaded(), &AgentRef::Named(target.clone())) {
                Ok(resolved) => {
                    cache.insert(target.clone(), resolved);
                }
                Err(_) => continue,
            }
        }
        let Some(next) = cache.get(&target).cloned() else {
            continue;
        };
        path.push((node.to_string(), edge));
        let definition = next.definition.clone();
        visit(
            app,
            &target,
            &definition,
            &next,
            cache,
            path,
            done,
            reported,
            problems,
        );
        path.pop();
        done.insert(target);
    }
}

/// The request building a composed agent (`name`): the caller's ready model and provider
/// URL carry over; each agent's own definition says the rest.
fn member_request(request: &AgentRequest, name: &str) -> AgentRequest {
    AgentRequest {
        agent: Some(AgentRef::Named(name.to_string())),
        model_override: request.model_override.clone(),
        base_url: request.base_url.clone(),
        cache_partition: request.cache_partition.clone(),
        ..AgentRequest::default()
    }
}

/// Registers an [`AgentTool`] for each of `def`'s `agents_as_tools` (built, with what
/// they compose, from their own definitions).
pub(crate) async fn add_agent_tools(
    app: &App,
    request: &AgentRequest,
    def: &AgentDefinition,
    tools: &mut ToolRegistry,
    problems: &mut Problems<'_>,
) {
    for (index, name) in def.agents_as_tools.iter().flatten().enumerate() {
        let key = format!("agents_as_tools[{index}]");
        let sub = member_request(request, name);
        let built = Box::pin(app.composed_agent(&sub)).await;
        let agent = match built {
            Ok((agent, _)) => agent,
            Err(AppError::Located(diagnostics)) => {
                problems.extend(diagnostics);
                continue;
            }
            Err(e) => {
                problems.add(
                    DiagnosticCode::InvalidValue,
                    &key,
                    format!("agent `{name}`: {e}"),
                );
                continue;
            }
        };
        let tool = AgentTool::new(Arc::new(agent));
        if let Err(e) = tools.register(Arc::new(tool)) {
            problems.add(
                DiagnosticCode::InvalidValue,
                &key,
                format!("agent `{name}` as a tool: {e}"),
            );
        }
    }
}

/// The name and description of the agent `[agents.<table>]` defines (what its runs record
/// and what a transfer tool shows).
fn name_and_description(app: &App, table: &str) -> (String, String) {
    match Resolved::load(app.loaded(), &AgentRef::Named(table.to_string())) {
        Ok(resolved) => (
            resolved
                .definition
                .name
                .clone()
                .unwrap_or_else(|| table.to_string()),
            resolved.definition.description.clone().unwrap_or_default(),
        ),
        Err(_) => (table.to_string(), String::new()),
    }
}

/// `builder` with the agent's description (shown to models offered it as a tool or
/// handoff target), a transfer tool for each of `def`'s handoffs, and its handoff limit.
pub(crate) fn with_handoffs(
    app: &App,
    def: &AgentDefinition,
    mut builder: ToolAgentBuilder,
) -> ToolAgentBuilder {
    if let Some(description) = &def.description {
        builder = builder.description(description.clone());
    }
    for table in def.handoffs.iter().flatten() {
        let (name, description) = name_and_description(app, table);
        builder = builder.handoff(name, description);
    }
    if let Some(limit) = def.max_handoffs {
        builder = builder.max_handoffs(limit);
    }
    if let Some(durability) = def.durability {
        builder = builder.durability(durability);
    }
    builder
}

/// Builds `builder` (the agent `resolution` describes, with `recipe`) and, when it hands
/// off, every agent reachable through handoffs — each with the same recipe, so a thread
/// resumed from its log rebuilds the whole group — into one [`ComposedAgent`].
pub(crate) async fn compose(
    app: &App,
    builder: ToolAgentBuilder,
    resolution: &Resolution,
    request: &AgentRequest,
    recipe: serde_json::Value,
) -> Result<ComposedAgent, AppError> {
    let mut composed = ComposedAgent::single(builder.build());
    let Some(def) = &resolution.definition else {
        return Ok(composed);
    };
    if def.handoffs.iter().flatten().next().is_none() {
        return Ok(composed);
    }
    let mut queue: Vec<String> = def.handoffs.iter().flatten().cloned().collect();
    let mut built_tables: Vec<String> = resolution.agent_name.iter().cloned().collect();
    let mut limit = def.max_handoffs;
    while let Some(table) = queue.pop() {
        if built_tables.contains(&table) {
            continue;
        }
        built_tables.push(table.clone());
        let sub = member_request(request, &table);
        let agent = if crate::a2a_agent::refers_to_a2a(app, sub.agent.as_ref()) {
            // A remote agent hands nothing off (its definition cannot say `handoffs`).
            let (agent, _) = app.a2a_agent(&sub, recipe.clone())?;
            Member::Remote(Arc::new(agent))
        } else {
            let (builder, member) = Box::pin(app.agent_builder(&sub)).await?;
            if let Some(member_def) = &member.definition {
                queue.extend(member_def.handoffs.iter().flatten().cloned());
                limit = limit.max(member_def.max_handoffs);
            }
            Member::Tool(Arc::new(builder.recipe(recipe.clone()).build()))
        };
        if composed.members.contains_key(agent.name()) {
            return Err(AppError::Invalid(format!(
                "two agents reachable by handoff from `{}` are named `{}`; give them \
                 distinct `name`s",
                resolution.name,
                agent.name()
            )));
        }
        composed.members.insert(agent.name().to_string(), agent);
    }
    let mut group = HandoffGroup::new(composed.entry.shared());
    for member in composed.members.values() {
        group = group.with_agent(member.shared());
    }
    if let Some(limit) = limit {
        group = group.max_handoffs(limit);
    }
    composed.group = Some(group);
    Ok(composed)
}
