//! Building an agent from its definition and the caller's overrides: model (flag >
//! definition > `[defaults] model` > a hosted model whose key is set > the local model),
//! tools (catalog names and inline HTTP tools, `${VAR}` only from the definition's `env`
//! list), critic, instructions (or `instructions_file`, relative to the file that names
//! it), budget, planner, observation, context management, and the model alias's
//! temperature / output limit / context window. Every reference is checked before the
//! model is built, so a bad definition fails before any model call.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_config::{AgentDefinition, Diagnostic, DiagnosticCode, ToolEntry};
use keel_core::context::StrategyKind;
use keel_core::{Model, RuleCritic, ToolRegistry};
use keel_runtime::{RunApprovalMode, ToolAgent, ToolAgentBuilder};

use crate::App;
use crate::definition::{AgentRef, Resolved};
use crate::error::AppError;
use crate::model::{default_model_spec, model_settings, spec_problem};

/// The instructions of an agent no definition describes.
pub const DEFAULT_INSTRUCTIONS: &str =
    "You are a helpful assistant. Use the tools when they help; answer concisely.";

/// What to build: an agent (or none: a plain assistant) and the caller's overrides, which
/// win over the definition (the CLI's flags).
#[derive(Clone, Default)]
pub struct AgentRequest {
    /// The agent; `None` is a plain assistant with keel.toml's default tools.
    pub agent: Option<AgentRef>,
    /// Model spec (`provider:model`, alias, `local:NAME`).
    pub model: Option<String>,
    /// A ready model (e.g. a scripted one in tests); wins over every spec.
    pub model_override: Option<Arc<dyn Model>>,
    /// Provider base URL (wins over keel.toml).
    pub base_url: Option<String>,
    /// Tools added to the agent's own (or, without an agent, the tools offered).
    pub tools: Vec<String>,
    /// Instructions.
    pub instructions: Option<String>,
    /// Maximum model calls per run.
    pub max_turns: Option<u32>,
    /// Context strategy: `truncate`, `summarize`, `importance`.
    pub context_strategy: Option<String>,
    /// Context window, tokens.
    pub context_window: Option<u32>,
    /// Output limit per call.
    pub max_output_tokens: Option<u32>,
    /// Who the embedded local model's prompt cache is shared with (a server sets the
    /// tenant; `None`: the whole process).
    pub cache_partition: Option<String>,
}

impl std::fmt::Debug for AgentRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRequest")
            .field("agent", &self.agent)
            .field("model", &self.model)
            .field(
                "model_override",
                &self.model_override.as_ref().map(|m| m.id()),
            )
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

/// What building chose, for recording (e.g. in the run's recipe) and for the run context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolution {
    /// The agent's name.
    pub name: String,
    /// The `[agents.<name>]` name, when the agent came from keel.toml.
    pub agent_name: Option<String>,
    /// The agent file used (absolute), if any.
    pub agent_file: Option<PathBuf>,
    /// The model spec used (`None` with a model override).
    pub model_spec: Option<String>,
    /// The agent's tools, by name.
    pub tools: Vec<String>,
    /// The definition's approval mode.
    pub approve: Option<RunApprovalMode>,
    /// Things the caller should tell the user (e.g. the local model was chosen).
    pub notices: Vec<String>,
    /// The merged definition, when there was one.
    pub definition: Option<AgentDefinition>,
}

/// Located problems collected while checking one definition.
pub(crate) struct Problems<'a> {
    resolved: Option<&'a Resolved>,
    found: Vec<Diagnostic>,
    unlocated: Vec<String>,
}

impl Problems<'_> {
    /// Diagnostics already located (e.g. in another agent's file).
    pub(crate) fn extend(&mut self, diagnostics: Vec<Diagnostic>) {
        self.found.extend(diagnostics);
    }

    pub(crate) fn add(&mut self, code: DiagnosticCode, key: &str, message: String) {
        match self.resolved.map(|r| r.error(code, key, message.clone())) {
            Some(AppError::Located(diagnostics)) => self.found.extend(diagnostics),
            _ => self.unlocated.push(message),
        }
    }

    fn finish(self) -> Result<(), AppError> {
        if !self.found.is_empty() {
            return Err(AppError::Located(self.found));
        }
        match self.unlocated.is_empty() {
            true => Ok(()),
            false => Err(AppError::Invalid(self.unlocated.join("; "))),
        }
    }
}

pub(crate) async fn agent_builder(
    app: &App,
    request: &AgentRequest,
) -> Result<(ToolAgentBuilder, Resolution), AppError> {
    let config = app.config();
    let resolved = match &request.agent {
        Some(reference) => Some(Resolved::load(app.loaded(), reference)?),
        None => None,
    };
    if let Some(refused) = resolved
        .as_ref()
        .and_then(crate::responses::not_a_tool_agent)
    {
        return Err(refused);
    }
    if let Some(resolved) = resolved.as_ref().filter(|r| crate::a2a_agent::is_a2a(r)) {
        let name = crate::a2a_agent::agent_name(resolved);
        let key = if resolved.definition.a2a.is_some() {
            "a2a"
        } else {
            "kind"
        };
        return Err(resolved.error(
            DiagnosticCode::InvalidValue,
            key,
            format!(
                "`{}`: agent `{name}` is answered by a remote A2A agent, so it is not a \
                 tool-calling agent and cannot be built as one here; run it as an agent \
                 (`keel run --agent {name}`, a handoff, agents_as_tools, a workflow step, \
                 `keel serve`), or build it with `App::composed_agent` / `App::a2a_agent`",
                resolved.key_path(key)
            ),
        ));
    }
    let empty = AgentDefinition::default();
    let def = resolved.as_ref().map_or(&empty, |r| &r.definition);
    let mut problems = Problems {
        resolved: resolved.as_ref(),
        found: Vec::new(),
        unlocated: Vec::new(),
    };
    let mut resolution = Resolution {
        agent_name: resolved.as_ref().and_then(|r| r.name.clone()),
        agent_file: resolved.as_ref().and_then(|r| r.file.clone()),
        approve: def.approve,
        definition: resolved.as_ref().map(|r| r.definition.clone()),
        ..Resolution::default()
    };
    resolution.name = def
        .name
        .clone()
        .or_else(|| resolution.agent_name.clone())
        .or_else(|| {
            resolution
                .agent_file
                .as_ref()
                .and_then(|p| p.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "keel".into());

    // The model spec, checked (not built) first.
    if request.model_override.is_none() {
        let spec = match (&request.model, &def.model, &config.defaults.model) {
            (Some(flag), _, _) => flag.clone(),
            (None, Some(own), _) => {
                if let Some(problem) = spec_problem(config, own) {
                    problems.add(
                        DiagnosticCode::UnknownReference,
                        "model",
                        format!("`{}`: {problem}", resolved_key(&resolved, "model")),
                    );
                }
                own.clone()
            }
            (None, None, Some(default)) => default.clone(),
            (None, None, None) => {
                let (spec, notice) = default_model_spec(app.env());
                resolution.notices.extend(notice);
                spec
            }
        };
        resolution.model_spec = Some(spec);
    }

    // Agents composed (handoffs, agents as tools): checked before anything is built.
    let composable = crate::compose::check(app, resolved.as_ref(), &mut problems);

    // Tools.
    let catalog = app.catalog().await?;
    resolution.notices.extend(catalog.warnings.iter().cloned());
    let mut tools = ToolRegistry::new();
    if resolved.is_some() {
        let allowed = def.env_allowlist().to_vec();
        let env = app.env();
        let declared = |name: &str| {
            if allowed.iter().any(|a| a == name) {
                env(name)
            } else {
                None
            }
        };
        let undeclared = def.undeclared_env_vars();
        for (index, tool, variable, field) in &undeclared {
            problems.add(
                DiagnosticCode::InvalidValue,
                &format!("tools[{index}]"),
                format!(
                    "tool `{tool}` {field}: `${{{variable}}}` is not declared; an agent may only \
                     read the environment variables it lists: add `env = [\"{variable}\"]` \
                     (declared: {})",
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            );
        }
        for (index, entry) in def.tools.iter().flatten().enumerate() {
            let key = format!("tools[{index}]");
            let tool = match entry {
                ToolEntry::Named(name) => match catalog.registry.get(name) {
                    Some(tool) => Arc::clone(tool),
                    None => {
                        let names: Vec<&str> = catalog.registry.names().collect();
                        problems.add(
                            DiagnosticCode::UnknownReference,
                            &key,
                            format!(
                                "`{}`: unknown tool `{name}`{}; available: {} (built-in tools, \
                                 keel.toml [[tools.http]], MCP tools as <server>__<tool>, or \
                                 declare an HTTP tool inline)",
                                resolved_key(&resolved, "tools"),
                                crate::hint(name, &names),
                                names.join(", ")
                            ),
                        );
                        continue;
                    }
                },
                ToolEntry::Http(config) => {
                    if undeclared.iter().any(|u| u.0 == index) {
                        continue;
                    }
                    let built = keel_tools::HttpTool::with_env(config.as_ref().clone(), &declared)
                        .and_then(|tool| {
                            let policy = app
                                .outbound_policy_or_public()
                                .allowing_destination(tool.url_template());
                            tool.with_outbound(policy)
                        });
                    match built {
                        Ok(tool) => Arc::new(tool.with_call_env(Arc::clone(&app.env))),
                        Err(e) => {
                            problems.add(
                                DiagnosticCode::InvalidValue,
                                &key,
                                format!("tool `{}`: {e}", config.name),
                            );
                            continue;
                        }
                    }
                }
            };
            if let Err(e) = tools.register(tool) {
                problems.add(
                    DiagnosticCode::InvalidValue,
                    &key,
                    format!("tool `{}`: {e}", entry.name()),
                );
            }
        }
        if composable {
            crate::compose::add_agent_tools(app, request, def, &mut tools, &mut problems).await;
        }
        // The caller's tools are added to the definition's.
        let extra = catalog.select(request.tools.iter().map(String::as_str));
        let extra = extra.map_err(|unknown| AppError::UnknownTool {
            unknown,
            available: catalog.names(),
        })?;
        for name in extra.names() {
            if let Some(tool) = extra.get(name).filter(|_| tools.get(name).is_none()) {
                tools
                    .register(Arc::clone(tool))
                    .map_err(|e| AppError::Tool {
                        name: name.to_string(),
                        message: e.to_string(),
                    })?;
            }
        }
    } else {
        let names: Vec<&str> = if request.tools.is_empty() {
            catalog.defaults.iter().map(String::as_str).collect()
        } else {
            request.tools.iter().map(String::as_str).collect()
        };
        tools = catalog
            .select(names)
            .map_err(|unknown| AppError::UnknownTool {
                unknown,
                available: catalog.names(),
            })?;
    }
    resolution.tools = tools.names().map(str::to_string).collect();

    // Critic: every rule's tool must be one of the agent's.
    let mut critic = None;
    if let Some(config) = def.critic.as_ref().filter(|c| c.has_rules()) {
        let mut rules = RuleCritic::new();
        for (index, rule) in config.require_calls.iter().enumerate() {
            if tools.get(&rule.tool).is_none() {
                problems.add(
                    DiagnosticCode::UnknownReference,
                    &format!("critic.require_calls[{index}].tool"),
                    format!(
                        "critic: tool `{}` is not one of the agent's tools ({}); add it to \
                         `tools`, or fix the name{}",
                        rule.tool,
                        resolution.tools.join(", "),
                        crate::hint(
                            &rule.tool,
                            &resolution
                                .tools
                                .iter()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                        )
                    ),
                );
            }
            let args: Vec<&str> = rule.args.iter().map(String::as_str).collect();
            rules = rules.require_successful_call(&rule.tool, &args);
        }
        for rule in &config.require_in_answer {
            rules = rules.require_in_answer(&rule.text, &rule.gap);
        }
        critic = Some(rules);
    }

    // Call rules: every tool they name must be one of the agent's.
    let call_rules = def.call_rules.clone().unwrap_or_default();
    for (index, rule) in call_rules.iter().enumerate() {
        let known: Vec<&str> = resolution.tools.iter().map(String::as_str).collect();
        let named = std::iter::once(("tool".to_string(), &rule.tool)).chain(
            rule.after
                .iter()
                .enumerate()
                .map(|(i, tool)| (format!("after[{i}]"), tool)),
        );
        for (key, tool) in named {
            if tools.get(tool).is_none() {
                problems.add(
                    DiagnosticCode::UnknownReference,
                    &format!("call_rules[{index}].{key}"),
                    format!(
                        "call_rules: tool `{tool}` is not one of the agent's tools ({}); add \
                         it to `tools`, or fix the name{}",
                        resolution.tools.join(", "),
                        crate::hint(tool, &known)
                    ),
                );
            }
        }
        if rule.max_successes == Some(0) {
            problems.add(
                DiagnosticCode::InvalidValue,
                &format!("call_rules[{index}].max_successes"),
                "call_rules: `max_successes` must be at least 1 (remove the tool to forbid it)"
                    .to_string(),
            );
        }
        for (i, pointer) in rule.grounded.iter().enumerate() {
            if !pointer.starts_with('/') {
                problems.add(
                    DiagnosticCode::InvalidValue,
                    &format!("call_rules[{index}].grounded[{i}]"),
                    format!(
                        "call_rules: `{pointer}` is not a JSON pointer into the arguments; \
                         write it like `/findings`"
                    ),
                );
            }
        }
    }

    // Instructions.
    let instructions = instructions(request, def, resolved.as_ref(), &mut problems);
    if def.reminder.as_ref().is_some_and(|r| r.trim().is_empty()) {
        problems.add(
            DiagnosticCode::InvalidValue,
            "reminder",
            "reminder must not be empty; write the few rules the model must keep in view, \
             or remove the key"
                .into(),
        );
    }
    if let Some(t) = def.temperature
        && !(0.0..=2.0).contains(&t)
    {
        problems.add(
            DiagnosticCode::InvalidValue,
            "temperature",
            format!("temperature must be between 0 and 2, got {t}"),
        );
    }
    let context = def.context.clone().unwrap_or_default();
    if let Some(window) = context.context_window.filter(|w| *w < 256) {
        problems.add(
            DiagnosticCode::InvalidValue,
            "context.context_window",
            format!("context.context_window must be at least 256 tokens, got {window}"),
        );
    }
    let strategy = match &request.context_strategy {
        Some(name) => Some(Some(name.parse::<StrategyKind>().map_err(|e| {
            AppError::Invalid(format!("context strategy `{name}`: {e}"))
        })?)),
        None => context.strategy.map(|s| s.kind()),
    };
    problems.finish()?;

    // Everything checked: build the model.
    let model = match (&request.model_override, &resolution.model_spec) {
        (Some(model), _) => Arc::clone(model),
        (None, Some(spec)) => {
            crate::model::build_model_async(
                config,
                spec,
                request.base_url.as_deref(),
                app.env(),
                request.cache_partition.as_deref(),
            )
            .await?
        }
        (None, None) => return Err(AppError::Invalid("no model".into())),
    };
    let settings = resolution
        .model_spec
        .as_deref()
        .map(|spec| model_settings(config, spec))
        .unwrap_or_default();
    let mut budget = def
        .budget
        .as_ref()
        .map(keel_config::BudgetConfig::to_budget)
        .unwrap_or_default();
    if let Some(turns) = request.max_turns {
        budget.max_turns = Some(turns);
    }
    let mut builder = ToolAgent::builder(resolution.name.clone(), model)
        .settings_fingerprint(settings_fingerprint(
            config,
            resolution.agent_name.as_deref(),
        ))
        .instructions(instructions)
        .reminder(def.reminder.clone())
        .tools(tools)
        .budget(budget)
        .policy(config.policies.clone())
        .temperature(def.temperature.or(settings.temperature))
        .max_output_tokens(
            request
                .max_output_tokens
                .or(def.max_output_tokens)
                .or(settings.max_output_tokens),
        );
    builder = crate::compose::with_handoffs(app, def, builder);
    if let Some(critic) = critic {
        builder = builder.critic(Arc::new(critic));
    }
    for rule in call_rules {
        builder = builder.call_rule(rule);
    }
    if let Some(rejections) = def.critic.as_ref().and_then(|c| c.max_rejections) {
        builder = builder.max_critic_rejections(rejections);
    }
    if let Some(planner) = def.planner {
        builder = builder.planner_mode(planner);
    }
    if let Some(observation) = def.observation {
        builder = builder.observation_mode(observation);
    }
    match strategy {
        Some(Some(kind)) => builder = builder.context_strategy(kind),
        Some(None) => builder = builder.disable_context_management(),
        None => {}
    }
    if let Some(window) = request
        .context_window
        .or(context.context_window)
        .or(settings.context_window)
    {
        builder = builder.context_window(window);
    }
    if let Some(chars) = context.max_tool_result_chars {
        builder = builder.max_tool_result_chars(chars);
    }
    if let Some(ms) = context.timeout_ms {
        builder = builder.compaction_timeout(Duration::from_millis(ms));
    }
    Ok((builder, resolution))
}

/// `key`'s full path in the file that set it, for messages.
fn resolved_key(resolved: &Option<Resolved>, key: &str) -> String {
    resolved
        .as_ref()
        .map_or_else(|| key.to_string(), |r| r.key_path(key))
}

fn instructions(
    request: &AgentRequest,
    def: &AgentDefinition,
    resolved: Option<&Resolved>,
    problems: &mut Problems<'_>,
) -> String {
    if let Some(text) = &request.instructions {
        return text.clone();
    }
    match (&def.instructions, &def.instructions_file, resolved) {
        (Some(_), Some(_), _) => {
            problems.add(
                DiagnosticCode::InvalidValue,
                "instructions_file",
                "set `instructions` or `instructions_file`, not both".into(),
            );
            String::new()
        }
        (Some(text), None, _) => {
            if text.trim().is_empty() {
                problems.add(
                    DiagnosticCode::InvalidValue,
                    "instructions",
                    "instructions must not be empty; say what the agent is for and how it works"
                        .into(),
                );
            }
            text.clone()
        }
        (None, Some(file), Some(resolved)) => {
            let path = resolved.dir_of("instructions_file").join(file);
            match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    problems.add(
                        DiagnosticCode::MissingFile,
                        "instructions_file",
                        format!(
                            "cannot read instructions file `{}` ({e}); paths are relative to \
                             the file that names them",
                            file.display()
                        ),
                    );
                    String::new()
                }
            }
        }
        _ => DEFAULT_INSTRUCTIONS.to_string(),
    }
}

/// The SHA-256 of each keel.toml section that shapes an agent built from `config` (its
/// own `[agents.NAME]` table when it has one), by section name: recorded in every run's
/// fingerprint, so that a resume names each section that changed since the run started
/// (`AgentFingerprint::compare_with`). `[providers]` is left out — a provider table may
/// hold a key, and even its hash is not written to a log; the model spec is recorded.
pub(crate) fn settings_fingerprint(
    config: &keel_config::KeelConfig,
    agent_name: Option<&str>,
) -> std::collections::BTreeMap<String, String> {
    fn hash(value: &impl serde::Serialize) -> Option<String> {
        serde_json::to_value(value)
            .ok()
            .map(|value| keel_core::definition::sha256_json(&value))
    }
    let sections = [
        ("[defaults]", hash(&config.defaults)),
        ("[models]", hash(&config.models)),
        ("[tools]", hash(&config.tools)),
        ("[mcp]", hash(&config.mcp)),
        ("[policies]", hash(&config.policies)),
        ("[approvals]", hash(&config.approvals)),
    ];
    let own = agent_name.and_then(|name| {
        config
            .agents
            .get(name)
            .and_then(hash)
            .map(|sha| (format!("[agents.{name}]"), sha))
    });
    sections
        .into_iter()
        .filter_map(|(name, sha)| sha.map(|sha| (name.to_string(), sha)))
        .chain(own)
        .collect()
}
