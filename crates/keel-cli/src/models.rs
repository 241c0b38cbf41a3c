//! Chooses the model a command runs on: a script (`--script`), or a provider model
//! (`--model provider:model`).

use std::sync::Arc;

use keel_core::Model;
use keel_testkit::ScriptedModel;

use crate::CliError;

/// The model selection flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelArgs {
    /// The model, as PROVIDER:MODEL (anthropic, openai, openai-responses, openrouter, ollama).
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: Option<String>,
    /// Override the provider's base URL.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Replay a scripted conversation instead of calling a model (see docs/scripts.md).
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    pub script: Option<std::path::PathBuf>,
}

/// The model to run and, for scripts, the scripted model itself (to inspect requests).
pub struct Selected {
    /// The model.
    pub model: Arc<dyn Model>,
    /// The same model when it is scripted.
    pub scripted: Option<Arc<ScriptedModel>>,
}

/// Resolves the flags to a model.
pub fn select(args: &ModelArgs) -> Result<Selected, CliError> {
    if let Some(path) = &args.script {
        let scripted =
            Arc::new(ScriptedModel::from_file(path).map_err(|e| CliError::usage(e.to_string()))?);
        return Ok(Selected {
            model: scripted.clone(),
            scripted: Some(scripted),
        });
    }
    match &args.model {
        Some(spec) if spec.starts_with("local:") => {
            let name = spec.trim_start_matches("local:");
            let model =
                keel_local::LocalModel::load_spec(name, keel_local::LocalModelOptions::default())
                    .map_err(|e| CliError::usage(format!("--model {spec}: {e}")))?;
            Ok(Selected {
                model: Arc::new(model),
                scripted: None,
            })
        }
        Some(spec) => {
            let options = keel_providers::ProviderOptions {
                base_url: args.base_url.clone(),
                ..Default::default()
            };
            let model = keel_providers::model_from_spec(spec, &options)
                .map_err(|e| CliError::usage(format!("--model {spec}: {e}")))?;
            Ok(Selected {
                model,
                scripted: None,
            })
        }
        None => Err(CliError::usage(
            "no model: pass --model PROVIDER:MODEL or --script FILE",
        )),
    }
}

/// The model used when neither `--model`, an agent file nor keel.toml names one: a hosted
/// model when its API key is in the environment, else the embedded local model — with one
/// line saying so and how to switch.
pub fn default_model_spec() -> String {
    let hosted = [
        ("ANTHROPIC_API_KEY", "anthropic:claude-sonnet-4-5"),
        ("OPENAI_API_KEY", "openai:gpt-4o-mini"),
        ("OPENROUTER_API_KEY", "openrouter:openai/gpt-4o-mini"),
    ];
    for (variable, spec) in hosted {
        if std::env::var(variable).is_ok_and(|v| !v.trim().is_empty()) {
            return spec.to_string();
        }
    }
    eprintln!(
        "keel: no model configured and no API key set; using the embedded local model local:smollm2 \
         (set ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENROUTER_API_KEY, or pass --model PROVIDER:MODEL, to use a hosted model)"
    );
    format!("local:{}", keel_local::models::DEFAULT_MODEL)
}
