//! [`Recipe`]: an agent's settings as data — what `keel submit` queues and, resolved
//! (model chosen, agent file hashed), what every run records in its `RunStarted` event,
//! so the agent can be rebuilt from the log by another process ([`crate::resume`],
//! workers) with nothing given again. It never holds secrets: API keys are read from the
//! environment again when the agent is rebuilt.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_core::{Event, EventKind, Model};
use keel_runtime::RunApprovalMode;
use serde::{Deserialize, Serialize};

use crate::worker::JobSpec;
use crate::{AgentRef, AgentRequest, App, AppError, ComposedAgent};

/// The settings an agent is built from (the CLI's agent flags as data). Field names are
/// the recorded format: renaming one breaks resuming runs recorded before.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// Model spec (`--model`).
    #[serde(default)]
    pub model: Option<String>,
    /// Provider base URL (`--base-url`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// A model script (`--script`), absolute; the caller provides its model.
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// Tools (`--tool`).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Maximum model calls per run (`--max-turns`).
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// Instructions (`--instructions`).
    #[serde(default)]
    pub instructions: Option<String>,
    /// The run's approval mode (`--approve`; `None`: keel.toml's approvals decide).
    #[serde(default)]
    pub approve: Option<RunApprovalMode>,
    /// An agent file (`--agent FILE`), absolute.
    #[serde(default)]
    pub agent: Option<PathBuf>,
    /// An `[agents.<name>]` table of keel.toml (`--agent NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// SHA-256 of the agent file when the run started (set when resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_sha256: Option<String>,
    /// Context strategy (`--context-strategy`).
    #[serde(default)]
    pub context_strategy: Option<String>,
    /// Context window in tokens (`--context-window`).
    #[serde(default)]
    pub context_window: Option<u32>,
    /// Output limit per call (`--max-output-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// The `keel submit` message a worker started this run for (not part of the agent: a
    /// worker that takes the job over finds the job's own run by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission: Option<String>,
    /// The `keel serve` tenant the run belongs to (set by the server when it queues the
    /// run; not a CLI flag). Whichever process drives the run — the server's embedded
    /// workers, a `keel worker`, `keel resume` — resolves its tools' credentials from that
    /// tenant's `[server.tenants.<tenant>.credentials]` only, never from its own
    /// environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A recipe's agent, built.
pub struct BuiltRecipe {
    /// The agent, with the agents it hands off to (runs follow handoffs).
    pub agent: ComposedAgent,
    /// The definition's `approve`.
    pub approve: Option<RunApprovalMode>,
    /// Things to tell the user (e.g. the local model was chosen).
    pub notices: Vec<String>,
}

impl std::fmt::Debug for BuiltRecipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltRecipe")
            .field("agent", &self.agent)
            .field("approve", &self.approve)
            .field("notices", &self.notices)
            .finish()
    }
}

impl Recipe {
    /// The recipe the run of `run_events` recorded when it started (`Ok(None)` when it
    /// recorded none, e.g. a workflow's run or one recorded before recipes existed).
    pub fn recorded(run_events: &[std::sync::Arc<Event>]) -> Result<Option<Self>, AppError> {
        let recipe = run_events.iter().find_map(|event| match &event.kind {
            EventKind::RunStarted {
                definition: Some(definition),
                ..
            } if !definition.recipe.is_null() => Some(definition.recipe.clone()),
            _ => None,
        });
        let Some(recipe) = recipe else {
            return Ok(None);
        };
        serde_json::from_value(recipe).map(Some).map_err(|e| {
            AppError::Resume(format!(
                "the run's recorded agent definition cannot be read ({e}); it was written by \
                 another version of keel — pass the agent flags (--model, --tool, --agent, …) \
                 explicitly"
            ))
        })
    }

    /// Sets the agent (a keel.toml name or a file), forgetting the recorded file hash.
    pub fn set_agent(&mut self, agent: AgentRef) {
        match agent {
            AgentRef::Named(name) => {
                self.agent_name = Some(name);
                self.agent = None;
            }
            AgentRef::File(path) => {
                self.agent = Some(path);
                self.agent_name = None;
            }
            _ => {}
        }
        self.agent_sha256 = None;
    }

    /// The agent it names, if any.
    pub fn agent_ref(&self) -> Option<AgentRef> {
        match (&self.agent_name, &self.agent) {
            (Some(name), _) => Some(AgentRef::Named(name.clone())),
            (None, Some(path)) => Some(AgentRef::File(path.clone())),
            (None, None) => None,
        }
    }

    /// `given`'s settings (the ones it sets) over this recorded recipe; returns the result
    /// and one notice per changed setting, named by its CLI flag (plus one when the agent
    /// file changed since the run began). A vanished agent file is an error.
    pub fn with_overrides(self, given: &Self) -> Result<(Self, Vec<String>), AppError> {
        let mut spec = self;
        let mut notices = Vec::new();
        let mut note = |flag: &str, from: String, to: String| {
            if from != to {
                let from = if from.is_empty() {
                    "default".into()
                } else {
                    from
                };
                notices.push(format!("{flag} {to} overrides the run's recorded {from}"));
            }
        };
        let shown = |value: &Option<String>| value.clone().unwrap_or_default();
        let shown_path = |value: &Option<PathBuf>| {
            value
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let shown_number = |value: Option<u32>| value.map(|n| n.to_string()).unwrap_or_default();
        let shown_mode = |value: Option<RunApprovalMode>| {
            value
                .map(|a| format!("{a:?}").to_lowercase())
                .unwrap_or_default()
        };
        if let Some(script) = &given.script {
            let to = script.display().to_string();
            note("--script", shown_path(&spec.script), to);
            spec.script = Some(script.clone());
            spec.model = None;
        }
        if let Some(model) = &given.model {
            note("--model", shown(&spec.model), model.clone());
            spec.model = Some(model.clone());
            spec.script = None;
        }
        if let Some(base_url) = &given.base_url {
            note("--base-url", shown(&spec.base_url), base_url.clone());
            spec.base_url = Some(base_url.clone());
        }
        if !given.tools.is_empty() {
            note("--tool", spec.tools.join(","), given.tools.join(","));
            spec.tools.clone_from(&given.tools);
        }
        if let Some(turns) = given.max_turns {
            let from = shown_number(spec.max_turns);
            note("--max-turns", from, turns.to_string());
            spec.max_turns = Some(turns);
        }
        if let Some(instructions) = &given.instructions {
            let from = shown(&spec.instructions);
            note("--instructions", from, instructions.clone());
            spec.instructions = Some(instructions.clone());
        }
        if let Some(approve) = given.approve {
            note(
                "--approve",
                shown_mode(spec.approve),
                shown_mode(Some(approve)),
            );
            spec.approve = Some(approve);
        }
        if given.agent.is_some() || given.agent_name.is_some() {
            let shown_agent =
                |s: &Self| s.agent_name.clone().unwrap_or_else(|| shown_path(&s.agent));
            note("--agent", shown_agent(&spec), shown_agent(given));
            spec.agent.clone_from(&given.agent);
            spec.agent_name.clone_from(&given.agent_name);
            spec.agent_sha256 = None;
        }
        if let Some(strategy) = &given.context_strategy {
            let from = shown(&spec.context_strategy);
            note("--context-strategy", from, strategy.clone());
            spec.context_strategy = Some(strategy.clone());
        }
        if let Some(window) = given.context_window {
            let from = shown_number(spec.context_window);
            note("--context-window", from, window.to_string());
            spec.context_window = Some(window);
        }
        if let Some(tokens) = given.max_output_tokens {
            let from = shown_number(spec.max_output_tokens);
            note("--max-output-tokens", from, tokens.to_string());
            spec.max_output_tokens = Some(tokens);
        }
        if let (Some(path), Some(recorded_hash)) = (&spec.agent, &spec.agent_sha256) {
            if !path.exists() {
                return Err(AppError::Resume(format!(
                    "the run was started with agent file {}, which no longer exists: restore \
                     it, or pass --agent FILE to continue with another one",
                    path.display()
                )));
            }
            if &file_sha256(path)? != recorded_hash {
                notices.push(format!(
                    "agent file {} changed since the run started; its tools are checked \
                     against the run's before it continues",
                    path.display()
                ));
            }
        }
        Ok((spec, notices))
    }

    /// Checks the values a caller gave (a turn budget of 0, a window under 256 tokens, an
    /// output limit of 0 are refused).
    pub fn validate(&self) -> Result<(), AppError> {
        if self.max_turns == Some(0) {
            return Err(AppError::Invalid("--max-turns must be at least 1".into()));
        }
        if self.context_window.is_some_and(|w| w < 256) {
            return Err(AppError::Invalid(
                "--context-window must be at least 256 tokens".into(),
            ));
        }
        if self.max_output_tokens == Some(0) {
            return Err(AppError::Invalid(
                "--max-output-tokens must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Builds the agent (every reference checked first) with the agents it composes, each
    /// recording the resolved recipe. `model_override` is the model of a `script` recipe
    /// (the caller's: the application does not run scripts); a script recipe without one
    /// is refused.
    pub async fn build_agent(
        &self,
        app: &App,
        model_override: Option<Arc<dyn Model>>,
    ) -> Result<BuiltRecipe, AppError> {
        self.build_agent_in(app, model_override, None).await
    }

    /// [`Recipe::build_agent`] with the embedded local model's prompt cache shared only
    /// within `cache_partition` (a server passes the tenant).
    pub async fn build_agent_in(
        &self,
        app: &App,
        model_override: Option<Arc<dyn Model>>,
        cache_partition: Option<&str>,
    ) -> Result<BuiltRecipe, AppError> {
        self.validate()?;
        if crate::a2a_agent::refers_to_a2a(app, self.agent_ref().as_ref()) {
            return self.build_a2a_agent(app);
        }
        if let (Some(script), None) = (&self.script, &model_override) {
            return Err(AppError::Invalid(format!(
                "the agent is driven by script {}, whose model this caller cannot provide",
                script.display()
            )));
        }
        let request = AgentRequest {
            agent: self.agent_ref(),
            model: self.model.clone(),
            model_override,
            base_url: self.base_url.clone(),
            tools: self.tools.clone(),
            instructions: self.instructions.clone(),
            max_turns: self.max_turns,
            context_strategy: self.context_strategy.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            cache_partition: cache_partition.map(str::to_string),
        };
        let (builder, resolution) = app.agent_builder(&request).await?;
        let mut resolved = self.clone();
        if self.script.is_none() {
            resolved.model.clone_from(&resolution.model_spec);
        }
        if let Some(path) = &self.agent {
            resolved.agent_sha256 = Some(file_sha256(path)?);
        }
        if resolution.definition.is_none() {
            // The tools actually chosen (keel.toml's declared tools when none was given),
            // so a resumed run gets the same set.
            resolved.tools.clone_from(&resolution.tools);
        }
        let recipe = serde_json::to_value(&resolved)
            .map_err(|e| AppError::Resume(format!("cannot record the agent definition: {e}")))?;
        let agent = app
            .compose(
                builder.recipe(recipe.clone()),
                &resolution,
                &request,
                recipe,
            )
            .await?;
        Ok(BuiltRecipe {
            agent,
            approve: resolution.approve,
            notices: resolution.notices,
        })
    }
}

impl Recipe {
    /// [`build_agent`](Self::build_agent) for a remote A2A agent: built from its
    /// `[[a2a.agents]]` entry, recording this recipe (with the agent file's hash); model
    /// settings do not apply (a notice says so) and `--tool` is refused.
    fn build_a2a_agent(&self, app: &App) -> Result<BuiltRecipe, AppError> {
        let request = AgentRequest {
            agent: self.agent_ref(),
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            tools: self.tools.clone(),
            instructions: self.instructions.clone(),
            max_turns: self.max_turns,
            context_strategy: self.context_strategy.clone(),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            ..AgentRequest::default()
        };
        let mut resolved = self.clone();
        if let Some(path) = &self.agent {
            resolved.agent_sha256 = Some(file_sha256(path)?);
        }
        let recipe = serde_json::to_value(&resolved)
            .map_err(|e| AppError::Resume(format!("cannot record the agent definition: {e}")))?;
        let (agent, resolution) = app.a2a_agent(&request, recipe)?;
        let mut notices = resolution.notices;
        if let Some(script) = &self.script {
            notices.push(format!(
                "--script {} does not apply to agent `{}`: a remote A2A agent answers it",
                script.display(),
                resolution.name
            ));
        }
        Ok(BuiltRecipe {
            agent: ComposedAgent::remote(agent),
            approve: None,
            notices,
        })
    }
}

impl JobSpec for Recipe {
    fn base_url(&self) -> Option<&str> {
        self.base_url.as_deref()
    }

    fn agent_file(&self) -> Option<&Path> {
        self.agent.as_deref()
    }

    fn submission(&self) -> Option<&str> {
        self.submission.as_deref()
    }

    fn set_submission(&mut self, submission: Option<String>) {
        self.submission = submission;
    }
}

/// SHA-256 (hex) of a file's text.
pub fn file_sha256(path: &Path) -> Result<String, AppError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| AppError::Invalid(format!("cannot read {}: {e}", path.display())))?;
    Ok(keel_core::definition::sha256_hex(&text))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn recorded() -> Recipe {
        Recipe {
            model: Some("openai:gpt-4.1".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            tools: vec!["calculator".into(), "delay".into()],
            max_turns: Some(8),
            approve: Some(RunApprovalMode::Auto),
            context_window: Some(4000),
            ..Recipe::default()
        }
    }

    #[test]
    fn no_overrides_keep_the_recorded_agent() {
        let (spec, notices) = recorded().with_overrides(&Recipe::default()).unwrap();
        assert_eq!(spec, recorded());
        assert!(notices.is_empty(), "{notices:?}");
    }

    #[test]
    fn overrides_apply_with_a_notice_each() {
        let given = Recipe {
            model: Some("anthropic:claude-sonnet-4-5".into()),
            max_turns: Some(8), // same as recorded: no notice
            approve: Some(RunApprovalMode::Deny),
            ..Recipe::default()
        };
        let (spec, notices) = recorded().with_overrides(&given).unwrap();
        assert_eq!(spec.model.as_deref(), Some("anthropic:claude-sonnet-4-5"));
        assert_eq!(spec.approve, Some(RunApprovalMode::Deny));
        assert_eq!(spec.tools, recorded().tools);
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].contains("--model anthropic:claude-sonnet-4-5 overrides"));
        assert!(notices[0].contains("openai:gpt-4.1"));
        assert_eq!(
            notices[1],
            "--approve deny overrides the run's recorded auto"
        );
    }

    #[test]
    fn a_vanished_agent_file_is_a_clear_error() {
        let mut spec = recorded();
        spec.agent = Some("/nonexistent/agent.toml".into());
        spec.agent_sha256 = Some("00".into());
        let error = spec.with_overrides(&Recipe::default()).unwrap_err();
        assert!(error.to_string().contains("no longer exists"), "{error}");
    }

    #[test]
    fn the_recorded_format_is_the_cli_flags_format() {
        let recipe: Recipe = serde_json::from_value(serde_json::json!({
            "model": "openai:gpt-4.1", "tools": ["calculator"], "approve": "ask",
            "agent_name": "detective"
        }))
        .unwrap();
        assert_eq!(recipe.approve, Some(RunApprovalMode::Ask));
        assert_eq!(
            recipe.agent_ref(),
            Some(AgentRef::Named("detective".into()))
        );
        let back = serde_json::to_value(&recipe).unwrap();
        assert_eq!(back["approve"], "ask");
    }
}
