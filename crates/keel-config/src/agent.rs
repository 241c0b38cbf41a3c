//! The one agent schema: [`AgentDefinition`] is both a keel.toml `[agents.<name>]` table
//! and a standalone agent file (e.g. `agents/detective/agent.toml`). An `[agents.<name>]`
//! table may name a file (`file = "..."`) whose keys it overrides ([`AgentDefinition::overlay`]).
//!
//! Tools are one list: each entry is a tool name (built-in, keel.toml `[[tools.http]]`,
//! `<server>__<tool>` MCP tools), a table with only `name` (the same, written as
//! `[[tools]]`), or a declarative HTTP tool table (keel-tools' [`HttpToolConfig`]). The
//! critic is `require_calls`, `require_in_answer` and `max_rejections`; `call_rules` are
//! checked before each call runs.
//!
//! Agent files are parsed like keel.toml ([`AgentDefinition::parse`]): every problem with
//! file, key, line, column and the nearest valid key. They are not `${VAR}`-expanded at
//! load: `${VAR}` in their HTTP tools is resolved when the tools are built, and only for
//! the variables the file lists in `env = [...]`.

use std::path::{Path, PathBuf};

use keel_core::{ObservationMode, PlannerMode};
use keel_runtime::RunApprovalMode as ApprovalMode;
use keel_tools::HttpToolConfig;
use serde::{Deserialize, Serialize};

use crate::analyze::{Reporter, Seg, analyze_as};
use crate::diagnostic::{Diagnostic, DiagnosticCode, Severity};
use crate::load::ConfigError;
use crate::schema::{BudgetConfig, ContextSection};
use crate::source::Source;

/// An agent: keel.toml `[agents.<name>]` or a standalone agent file. Every key is
/// optional; what a definition leaves unset comes from keel.toml's defaults (model,
/// approvals) or the runtime's (budget, context).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentDefinition {
    /// keel.toml only: an agent file (relative to keel.toml) whose keys this table overrides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// What runs the agent: `tool` (the default, the tool-calling agent),
    /// `openai-responses` (the conversation lives on OpenAI's Responses API) or `a2a` (a
    /// remote agent answers every turn over the Agent2Agent protocol; set by `a2a`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<AgentKind>,
    /// The remote agent that answers this agent's turns: the `name` of a keel.toml
    /// `[[a2a.agents]]` entry (its URL, credentials and deadline). Makes the agent
    /// `kind = "a2a"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a: Option<String>,
    /// The agent's name (default: the `[agents.<name>]` name, else `agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the agent is for: for people, and shown to a model this agent is offered to
    /// as a tool or handoff target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// System instructions: the top of the system prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// A file holding the instructions, relative to the file that declares this key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions_file: Option<PathBuf>,
    /// A short note the model is shown again on every call, at the end of the user's
    /// latest message: the few rules the agent must not lose sight of behind a long system
    /// prompt (small local models weigh what is near the end of the prompt far more than
    /// its top). Not stored in the thread's log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reminder: Option<String>,
    /// Model: `provider:model` or a keel.toml `[models.<alias>]` name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sampling temperature (over the model alias's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Maximum output tokens per model call (over the model alias's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// The agent's tools: names from the catalog and inline HTTP tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolEntry>>,
    /// Environment variables the definition's HTTP tools may read in `${VAR}` references;
    /// any other reference is an error when the tools are built.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    /// Limits of each run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
    /// `native` or `structured`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planner: Option<PlannerMode>,
    /// What the model sees of tool results: `raw`, `normalized` or `both`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<ObservationMode>,
    /// Rules the final answer must meet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticConfig>,
    /// Context window management.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextSection>,
    /// Approval mode of this agent's runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approve: Option<ApprovalMode>,
    /// keel.toml `[agents.<name>]` names this agent may hand the conversation to (a
    /// `transfer_to_<name>` tool each); the target continues the same thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoffs: Option<Vec<String>>,
    /// How many handoffs one user request may go through (default 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_handoffs: Option<u32>,
    /// keel.toml `[agents.<name>]` names offered to this agent as tools (a tool named
    /// after each, taking `{"task": string}`); each runs on a child thread with its own
    /// budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents_as_tools: Option<Vec<String>>,
    /// Rules checked before a tool call runs (`[[call_rules]]`: `tool`, `after`, `same`,
    /// `max_successes`, `grounded`); a call breaking one is answered with an error telling
    /// the model what to do, and never runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_rules: Option<Vec<keel_core::CallRule>>,
    /// When the runs' events reach the store: `effects` (default: only before an effect
    /// outside the process depends on them) or `steps` (also before every model call, for
    /// viewers in another process; one commit per step). docs/durability.md.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<keel_core::RunDurability>,
}

/// An agent's `kind`: what runs it, and so where its threads' conversations live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum AgentKind {
    /// The tool-calling agent (model, tools, policies); the conversation is Keel's log.
    #[default]
    #[serde(rename = "tool")]
    Tool,
    /// An agent on OpenAI's Responses API in its stateful mode: the provider stores the
    /// conversation and each run sends only the new messages with the previous response's
    /// id. Its threads cannot be continued by a tool-calling agent, nor can it take over
    /// theirs.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// A remote agent reached over the Agent2Agent protocol (`a2a = "<[[a2a.agents]]
    /// name>"`): each run sends the new message to it — continuing its task when it asked
    /// for input — and journals its reply.
    #[serde(rename = "a2a")]
    A2a,
}

impl AgentKind {
    /// The name written in keel.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tool => "tool",
            Self::OpenAiResponses => "openai-responses",
            Self::A2a => "a2a",
        }
    }
}

/// The keys of an agent definition a remote A2A agent cannot honour: everything about a
/// model, its tools and its loop (the remote agent has its own).
pub const A2A_UNSUPPORTED_KEYS: [&str; 18] = [
    "instructions",
    "instructions_file",
    "reminder",
    "model",
    "temperature",
    "max_output_tokens",
    "tools",
    "env",
    "budget",
    "planner",
    "observation",
    "critic",
    "context",
    "approve",
    "handoffs",
    "max_handoffs",
    "agents_as_tools",
    "call_rules",
];

/// One entry of an agent's `tools`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEntry {
    /// A tool of the catalog, by name.
    Named(String),
    /// A declarative HTTP tool.
    Http(Box<HttpToolConfig>),
}

impl ToolEntry {
    /// The tool's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Named(name) => name,
            Self::Http(config) => &config.name,
        }
    }
}

impl Serialize for ToolEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Named(name) => serializer.serialize_str(name),
            Self::Http(config) => config.serialize(serializer),
        }
    }
}

/// Prefix of an error raised inside an HTTP tool table: `in `PATH`: ` — the analysis
/// turns it back into a key path so the diagnostic points at the key itself.
pub(crate) const INNER_PREFIX: &str = "in `";

impl<'de> Deserialize<'de> for ToolEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ToolEntryVisitor)
    }
}

struct ToolEntryVisitor;

impl<'de> serde::de::Visitor<'de> for ToolEntryVisitor {
    type Value = ToolEntry;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "a tool name or an HTTP tool table (name, description, usage, method, url, ...)",
        )
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ToolEntry, E> {
        if name.trim().is_empty() {
            return Err(E::custom("a tool name must not be empty"));
        }
        Ok(ToolEntry::Named(name.to_string()))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ToolEntry, A::Error> {
        let mut table = toml::Table::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: toml::Value = map.next_value()?;
            table.insert(key, value);
        }
        if table.len() == 1
            && let Some(toml::Value::String(name)) = table.get("name")
        {
            return self.visit_str(name);
        }
        serde_path_to_error::deserialize::<_, HttpToolConfig>(toml::Value::Table(table))
            .map(|config| ToolEntry::Http(Box::new(config)))
            .map_err(|error| {
                let inner = inner_path(error.path());
                let message = error.inner().message().trim().to_string();
                if inner.is_empty() {
                    serde::de::Error::custom(message)
                } else {
                    serde::de::Error::custom(format!("{INNER_PREFIX}{inner}`: {message}"))
                }
            })
    }
}

fn inner_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            _ => {}
        }
    }
    out
}

/// The rule critic: deterministic rules checked on the final answer. An answer that breaks
/// one goes back to the model with the gap, at most `max_rejections` times; then the run
/// fails.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticConfig {
    /// How many rejections before the run fails (default 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rejections: Option<u32>,
    /// Tools that must have been called successfully, with non-empty arguments.
    pub require_calls: Vec<RequiredCall>,
    /// Text the final answer must contain.
    pub require_in_answer: Vec<RequiredText>,
}

impl CriticConfig {
    /// Whether the critic has any rule.
    pub fn has_rules(&self) -> bool {
        !self.require_calls.is_empty() || !self.require_in_answer.is_empty()
    }
}

/// `[[critic.require_calls]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredCall {
    /// The tool.
    pub tool: String,
    /// Arguments that must be present and non-empty.
    #[serde(default)]
    pub args: Vec<String>,
}

/// `[[critic.require_in_answer]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredText {
    /// Text the answer must contain (case-insensitive).
    pub text: String,
    /// The gap reported to the model when it does not.
    pub gap: String,
}

/// An agent file, parsed: its definition and its text (for positions in later errors).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentFile {
    /// The definition.
    pub definition: AgentDefinition,
    /// The file's text, name and path.
    pub source: Source,
}

impl AgentDefinition {
    /// Parses agent-file text; `file` is the name shown in diagnostics. Every problem is
    /// reported (unknown keys with the nearest valid key, invalid values, a `file` key).
    ///
    /// ```
    /// use keel_config::AgentDefinition;
    ///
    /// let agent = AgentDefinition::parse(
    ///     "name = \"helper\"\ninstructions = \"Be brief.\"\ntools = [\"calculator\"]\n",
    ///     "helper.toml",
    /// )
    /// .expect("a valid agent file");
    /// assert_eq!(agent.name.as_deref(), Some("helper"));
    /// assert_eq!(agent.tools.unwrap()[0].name(), "calculator");
    ///
    /// // A typo is located (file, line, column) with the nearest valid key.
    /// let problems = AgentDefinition::parse("name = \"x\"\nmodle = \"openai:gpt-4.1\"\n", "x.toml")
    ///     .unwrap_err();
    /// assert_eq!((problems[0].line, problems[0].column), (Some(2), Some(1)));
    /// assert!(problems[0].message.contains("did you mean `model`?"));
    /// assert!(problems[0].render().starts_with("x.toml:2:1: error:"), "{}", problems[0].render());
    /// ```
    pub fn parse(text: &str, file: &str) -> Result<AgentDefinition, Vec<Diagnostic>> {
        let analysis = analyze_as::<AgentDefinition>(text, file, None);
        let mut diagnostics = analysis.diagnostics;
        if let Some(definition) = &analysis.config
            && definition.file.is_some()
        {
            let reporter = Reporter::new(text, file, &analysis.spans);
            diagnostics.push(
                reporter.at(
                    Severity::Error,
                    DiagnosticCode::InvalidValue,
                    &[Seg::Key("file".into())],
                    true,
                    "`file` belongs in keel.toml's [agents.<name>] tables; an agent file cannot \
                 include another: remove it"
                        .into(),
                ),
            );
        }
        match analysis.config {
            Some(definition) if diagnostics.iter().all(|d| !d.is_error()) => Ok(definition),
            _ => {
                diagnostics.sort_by_key(|d| (d.line.unwrap_or(usize::MAX), d.column.unwrap_or(0)));
                Err(diagnostics)
            }
        }
    }

    /// Reads and parses an agent file; `shown` is its name in diagnostics (as the user
    /// wrote it).
    pub fn load(path: &Path, shown: &str) -> Result<AgentFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let definition = Self::parse(&text, shown).map_err(|diagnostics| ConfigError::Invalid {
            path: path.to_path_buf(),
            diagnostics,
        })?;
        Ok(AgentFile {
            definition,
            source: Source::new(shown, Some(path.to_path_buf()), text),
        })
    }

    /// This definition with every key `over` sets replacing its own (`budget` and
    /// `context` key by key; `file` is dropped: the result is complete).
    #[must_use]
    pub fn overlay(&self, over: &AgentDefinition) -> AgentDefinition {
        fn pick<T: Clone>(over: &Option<T>, base: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        let budget = match (&self.budget, &over.budget) {
            (Some(base), Some(top)) => Some(BudgetConfig {
                max_turns: top.max_turns.or(base.max_turns),
                max_wall_clock_ms: top.max_wall_clock_ms.or(base.max_wall_clock_ms),
                max_tokens: top.max_tokens.or(base.max_tokens),
                max_cost_usd: top.max_cost_usd.or(base.max_cost_usd),
            }),
            (base, top) => pick(top, base),
        };
        let context = match (&self.context, &over.context) {
            (Some(base), Some(top)) => Some(ContextSection {
                strategy: top.strategy.or(base.strategy),
                context_window: top.context_window.or(base.context_window),
                max_tool_result_chars: top.max_tool_result_chars.or(base.max_tool_result_chars),
                timeout_ms: top.timeout_ms.or(base.timeout_ms),
            }),
            (base, top) => pick(top, base),
        };
        AgentDefinition {
            file: None,
            kind: pick(&over.kind, &self.kind),
            a2a: pick(&over.a2a, &self.a2a),
            name: pick(&over.name, &self.name),
            description: pick(&over.description, &self.description),
            instructions: pick(&over.instructions, &self.instructions),
            instructions_file: pick(&over.instructions_file, &self.instructions_file),
            reminder: pick(&over.reminder, &self.reminder),
            model: pick(&over.model, &self.model),
            temperature: pick(&over.temperature, &self.temperature),
            max_output_tokens: pick(&over.max_output_tokens, &self.max_output_tokens),
            tools: pick(&over.tools, &self.tools),
            env: pick(&over.env, &self.env),
            budget,
            planner: pick(&over.planner, &self.planner),
            observation: pick(&over.observation, &self.observation),
            critic: pick(&over.critic, &self.critic),
            context,
            approve: pick(&over.approve, &self.approve),
            handoffs: pick(&over.handoffs, &self.handoffs),
            max_handoffs: pick(&over.max_handoffs, &self.max_handoffs),
            agents_as_tools: pick(&over.agents_as_tools, &self.agents_as_tools),
            call_rules: pick(&over.call_rules, &self.call_rules),
            durability: pick(&over.durability, &self.durability),
        }
    }

    /// The top-level keys this definition sets (for telling which file a key came from).
    pub fn set_keys(&self) -> Vec<&'static str> {
        let flags = [
            ("file", self.file.is_some()),
            ("kind", self.kind.is_some()),
            ("a2a", self.a2a.is_some()),
            ("name", self.name.is_some()),
            ("description", self.description.is_some()),
            ("instructions", self.instructions.is_some()),
            ("instructions_file", self.instructions_file.is_some()),
            ("reminder", self.reminder.is_some()),
            ("model", self.model.is_some()),
            ("temperature", self.temperature.is_some()),
            ("max_output_tokens", self.max_output_tokens.is_some()),
            ("tools", self.tools.is_some()),
            ("env", self.env.is_some()),
            ("budget", self.budget.is_some()),
            ("planner", self.planner.is_some()),
            ("observation", self.observation.is_some()),
            ("critic", self.critic.is_some()),
            ("context", self.context.is_some()),
            ("approve", self.approve.is_some()),
            ("handoffs", self.handoffs.is_some()),
            ("max_handoffs", self.max_handoffs.is_some()),
            ("agents_as_tools", self.agents_as_tools.is_some()),
            ("call_rules", self.call_rules.is_some()),
            ("durability", self.durability.is_some()),
        ];
        flags
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect()
    }

    /// What runs the agent: its `kind`, else `a2a` when it names a remote agent, else the
    /// tool-calling agent.
    pub fn agent_kind(&self) -> AgentKind {
        match (self.kind, &self.a2a) {
            (Some(kind), _) => kind,
            (None, Some(_)) => AgentKind::A2a,
            (None, None) => AgentKind::Tool,
        }
    }

    /// What is wrong with this definition as a remote A2A agent (`kind = "a2a"` or `a2a`
    /// set), given keel.toml's `[a2a]`: as (top-level key, message naming the key — by
    /// `path`, which turns a key into its full path, e.g. `agents.NAME.a2a` — and the fix).
    /// Empty for agents of another kind that do not set `a2a`. `keel config check` and the
    /// application's builder report the same problems.
    pub fn a2a_problems(
        &self,
        a2a: &crate::A2aConfig,
        path: &dyn Fn(&str) -> String,
    ) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let declared: Vec<&str> = a2a.agents.iter().map(|a| a.name.as_str()).collect();
        match (self.kind, &self.a2a) {
            (Some(kind), Some(_)) if kind != AgentKind::A2a => out.push((
                "a2a",
                format!(
                    "`{}` makes this a remote A2A agent, but `{}` = \"{}\": remove `kind` (or \
                     set it to \"a2a\"), or remove `a2a`",
                    path("a2a"),
                    path("kind"),
                    kind.as_str()
                ),
            )),
            (Some(AgentKind::A2a), None) => out.push((
                "kind",
                format!(
                    "`{}` = \"a2a\" needs `a2a = \"<name>\"` naming the [[a2a.agents]] entry \
                     that answers (its url, auth and timeout_ms){}",
                    path("kind"),
                    match declared.as_slice() {
                        [] => "; keel.toml declares none".to_string(),
                        names => format!("; declared: {}", names.join(", ")),
                    }
                ),
            )),
            (_, Some(name)) if !declared.contains(&name.as_str()) => {
                let at = path("a2a");
                out.push((
                    "a2a",
                    match crate::diagnostic::nearest(name, declared.iter().copied()) {
                        Some(best) => format!(
                            "`{at}` = \"{name}\" is not the name of an [[a2a.agents]] entry; \
                             did you mean `{best}`?"
                        ),
                        None if declared.is_empty() => format!(
                            "`{at}` = \"{name}\" is not the name of an [[a2a.agents]] entry, and \
                             keel.toml declares none: add [[a2a.agents]] with name = \"{name}\" \
                             and the agent's url"
                        ),
                        None => format!(
                            "`{at}` = \"{name}\" is not the name of an [[a2a.agents]] entry \
                             (declared: {})",
                            declared.join(", ")
                        ),
                    },
                ));
            }
            _ => {}
        }
        if self.agent_kind() == AgentKind::A2a {
            let set = self.set_keys();
            for key in A2A_UNSUPPORTED_KEYS.iter().filter(|key| set.contains(key)) {
                out.push((
                    key,
                    format!(
                        "`{}` is not supported by a remote A2A agent (the remote agent has its \
                         own model, instructions and tools; Keel only relays its turns): remove \
                         it, or make this a tool-calling agent without `a2a`",
                        path(key)
                    ),
                ));
            }
        }
        out
    }

    /// The declared environment allowlist (empty when unset).
    pub fn env_allowlist(&self) -> &[String] {
        self.env.as_deref().unwrap_or_default()
    }

    /// The inline HTTP tools.
    pub fn http_tools(&self) -> impl Iterator<Item = (usize, &HttpToolConfig)> {
        self.tools
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, entry)| match entry {
                ToolEntry::Http(config) => Some((i, config.as_ref())),
                ToolEntry::Named(_) => None,
            })
    }

    /// `${VAR}` references of the inline HTTP tools to variables `env` does not list, as
    /// `(tool index, tool, variable, field)`.
    pub fn undeclared_env_vars(&self) -> Vec<(usize, String, String, String)> {
        let allowed = self.env_allowlist();
        self.http_tools()
            .flat_map(|(index, tool)| {
                tool.env_references()
                    .into_iter()
                    .filter(|(variable, _)| !allowed.contains(variable))
                    .map(move |(variable, field)| (index, tool.name.clone(), variable, field))
            })
            .collect()
    }
}
