//! The agent of a stored run, rebuilt from the log: every run records the resolved
//! [`AgentSpec`] it was built from in its `RunStarted` event, so `keel resume`, `approve`,
//! `deny`, `reply` and workers need no flags to continue it. Flags given explicitly still
//! win, each with a printed notice; a run recorded before definitions existed is
//! continued with the flags, as before.

use std::path::Path;

use keel_core::{Event, EventKind};
use keel_runtime::Thread;

use crate::CliError;
use crate::agents::{AgentArgs, AgentSpec};

/// The agent spec a run recorded when it started, if it recorded one.
pub fn recorded_spec(run_events: &[Event]) -> Result<Option<AgentSpec>, CliError> {
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
        CliError::failure(format!(
            "the run's recorded agent definition cannot be read ({e}); it was written by another \
             version of keel — pass the agent flags (--model, --tool, --agent, …) explicitly"
        ))
    })
}

/// The spec to continue the thread's latest run with: the recorded one with explicit
/// `flags` applied over it (a notice for each flag that changes something), or the flags
/// alone for runs recorded without a definition. Notices are printed on stderr.
pub fn spec_for_thread(thread: &Thread, flags: &AgentArgs) -> Result<AgentSpec, CliError> {
    let Some(recorded) = recorded_spec(thread.run_events())? else {
        return flags.spec();
    };
    let (spec, notices) = apply_flags(recorded, flags)?;
    for notice in notices {
        eprintln!("keel: {}", crate::redaction::for_stderr(&notice));
    }
    Ok(spec)
}

/// Applies the explicitly given `flags` over a recorded spec; returns the result and one
/// notice per changed setting (plus one when the agent file changed since the run began).
pub fn apply_flags(
    recorded: AgentSpec,
    flags: &AgentArgs,
) -> Result<(AgentSpec, Vec<String>), CliError> {
    let given = flags.spec()?;
    let mut spec = recorded;
    let mut notices = Vec::new();
    let mut note = |flag: &str, from: String, to: String| {
        if from != to {
            notices.push(format!(
                "{flag} {to} overrides the run's recorded {}",
                if from.is_empty() {
                    "default".into()
                } else {
                    from
                }
            ));
        }
    };
    let shown = |value: &Option<String>| value.clone().unwrap_or_default();
    let shown_path = |value: &Option<std::path::PathBuf>| {
        value
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let shown_number = |value: Option<u32>| value.map(|n| n.to_string()).unwrap_or_default();
    if let Some(script) = &given.script {
        note(
            "--script",
            shown_path(&spec.script),
            script.display().to_string(),
        );
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
        note(
            "--max-turns",
            shown_number(spec.max_turns),
            turns.to_string(),
        );
        spec.max_turns = Some(turns);
    }
    if let Some(instructions) = &given.instructions {
        note(
            "--instructions",
            shown(&spec.instructions),
            instructions.clone(),
        );
        spec.instructions = Some(instructions.clone());
    }
    if let Some(approve) = flags.approve {
        note(
            "--approve",
            spec.approve
                .map(|a| format!("{a:?}").to_lowercase())
                .unwrap_or_default(),
            format!("{approve:?}").to_lowercase(),
        );
        spec.approve = Some(approve);
    }
    if given.agent.is_some() || given.agent_name.is_some() {
        let shown_agent =
            |s: &AgentSpec| s.agent_name.clone().unwrap_or_else(|| shown_path(&s.agent));
        note("--agent", shown_agent(&spec), shown_agent(&given));
        spec.agent.clone_from(&given.agent);
        spec.agent_name.clone_from(&given.agent_name);
        spec.agent_sha256 = None;
    }
    if let Some(strategy) = &given.context_strategy {
        note(
            "--context-strategy",
            shown(&spec.context_strategy),
            strategy.clone(),
        );
        spec.context_strategy = Some(strategy.clone());
    }
    if let Some(window) = given.context_window {
        note(
            "--context-window",
            shown_number(spec.context_window),
            window.to_string(),
        );
        spec.context_window = Some(window);
    }
    if let Some(tokens) = given.max_output_tokens {
        note(
            "--max-output-tokens",
            shown_number(spec.max_output_tokens),
            tokens.to_string(),
        );
        spec.max_output_tokens = Some(tokens);
    }
    if let (Some(path), Some(recorded_hash)) = (&spec.agent, &spec.agent_sha256) {
        if !path.exists() {
            return Err(CliError::failure(format!(
                "the run was started with agent file {}, which no longer exists: restore it, or \
                 pass --agent FILE to continue with another one",
                path.display()
            )));
        }
        if &file_sha256(path)? != recorded_hash {
            notices.push(format!(
                "agent file {} changed since the run started; its tools are checked against the \
                 run's before it continues",
                path.display()
            ));
        }
    }
    Ok((spec, notices))
}

/// SHA-256 (hex) of a file's bytes.
pub fn file_sha256(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?;
    Ok(keel_core::definition::sha256_hex(&text))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::agents::ApproveFlag;

    fn recorded() -> AgentSpec {
        AgentSpec {
            model: Some("openai:gpt-4.1".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            script: None,
            tools: vec!["calculator".into(), "delay".into()],
            max_turns: Some(8),
            instructions: None,
            approve: Some(ApproveFlag::Auto),
            agent: None,
            agent_name: None,
            agent_sha256: None,
            context_strategy: None,
            context_window: Some(4000),
            max_output_tokens: None,
            submission: None,
        }
    }

    #[test]
    fn no_flags_keep_the_recorded_agent() {
        let (spec, notices) = apply_flags(recorded(), &AgentArgs::default()).unwrap();
        assert_eq!(spec, recorded());
        assert!(notices.is_empty(), "{notices:?}");
    }

    #[test]
    fn explicit_flags_override_with_a_notice_each() {
        let mut flags = AgentArgs::default();
        flags.model.model = Some("anthropic:claude-sonnet-4-5".into());
        flags.max_turns = Some(8); // same as recorded: no notice
        flags.approve = Some(ApproveFlag::Deny);
        let (spec, notices) = apply_flags(recorded(), &flags).unwrap();
        assert_eq!(spec.model.as_deref(), Some("anthropic:claude-sonnet-4-5"));
        assert_eq!(spec.approve, Some(ApproveFlag::Deny));
        assert_eq!(spec.tools, recorded().tools);
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].contains("--model anthropic:claude-sonnet-4-5 overrides"));
        assert!(notices[0].contains("openai:gpt-4.1"));
    }

    #[test]
    fn a_vanished_agent_file_is_a_clear_error() {
        let mut spec = recorded();
        spec.agent = Some("/nonexistent/agent.toml".into());
        spec.agent_sha256 = Some("00".into());
        let error = apply_flags(spec, &AgentArgs::default()).unwrap_err();
        assert!(
            error.message.contains("no longer exists"),
            "{}",
            error.message
        );
    }
}
