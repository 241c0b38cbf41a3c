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
        Some(spec) => {
            let options = keel_providers::ProviderOptions {
                base_url: args.base_url.clone(),
                ..Default::default()
            };
            let model = keel_providers::model_from_spec(spec, &options)
                .map_err(|e| CliError::usage(format!("--model {spec}: {e}")))?;
            Ok(Selected { model, scripted: None })
        }
        None => Err(CliError::usage("no model: pass --model PROVIDER:MODEL or --script FILE")),
    }
}
