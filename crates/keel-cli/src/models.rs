//! The model selection flags. Resolving a spec (aliases, `[providers]`, pricing, local
//! models) is keel-app's ([`keel_app::model`]); a script (`--script`) replaces the model
//! (see [`crate::scripted`]).

/// The model selection flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelArgs {
    /// The model, as PROVIDER:MODEL (anthropic, openai, openai-responses, openrouter,
    /// ollama), a keel.toml [models] alias, or local:NAME.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: Option<String>,
    /// Override the provider's base URL.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Replay a scripted conversation instead of calling a model (see docs/scripts.md).
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    pub script: Option<std::path::PathBuf>,
}
