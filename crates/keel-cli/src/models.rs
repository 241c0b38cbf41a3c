//! Chooses the model a command runs on: a script (`--script`), or a provider model
//! (`--model provider:model` or a keel.toml `[models.<alias>]`), built with the provider
//! options keel.toml gives: `[providers.<name>]` (base URL, key variable, timeouts, retry)
//! under the model's own `retry` and `call_timeout_ms`.

use std::sync::Arc;
use std::time::Duration;

use keel_config::{KeelConfig, RetrySettings};
use keel_core::Model;
use keel_providers::{ProviderOptions, RetryConfig};
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
            let env = |name: &str| std::env::var(name).ok();
            let (provider_spec, options) =
                provider_options(crate::config::get(), spec, args.base_url.clone(), &env);
            let model = keel_providers::model_from_spec(&provider_spec, &options)
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

/// The spec to build and its provider options: `spec` resolved through keel.toml (a
/// `[models]` alias names its `provider:model`; a `[providers.<name>]` with `kind` speaks
/// that protocol), with the provider's settings, then the model's `retry` and
/// `call_timeout_ms` over them. `base_url` (the `--base-url` flag) wins over the file.
pub fn provider_options(
    config: &KeelConfig,
    spec: &str,
    base_url: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> (String, ProviderOptions) {
    let mut options = ProviderOptions {
        base_url,
        ..ProviderOptions::default()
    };
    let Some(resolved) = config.resolve_model(spec) else {
        return (spec.to_string(), options);
    };
    let provider = config.providers.get(&resolved.provider);
    let kind = provider
        .and_then(|p| p.kind.clone())
        .unwrap_or_else(|| resolved.provider.clone());
    if let Some(provider) = provider {
        if options.base_url.is_none() {
            options.base_url.clone_from(&provider.base_url);
        }
        if let Some(key) = provider
            .api_key_env
            .as_deref()
            .and_then(env)
            .filter(|key| !key.trim().is_empty())
        {
            options.api_key = Some(key.into());
        }
        if let Some(ms) = provider.connect_timeout_ms {
            options.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = provider.idle_timeout_ms {
            options.idle_timeout = Duration::from_millis(ms);
        }
        options.loopback_only |= provider.loopback_only;
        if let Some(retry) = &provider.retry {
            apply_retry(&mut options.retry, retry);
        }
    }
    if let Some(settings) = &resolved.settings {
        if let Some(retry) = &settings.retry {
            apply_retry(&mut options.retry, retry);
        }
        if let Some(ms) = settings.call_timeout_ms {
            options.call_timeout = Duration::from_millis(ms);
        }
    }
    (format!("{kind}:{}", resolved.model), options)
}

/// Applies the fields a retry section sets.
fn apply_retry(retry: &mut RetryConfig, settings: &RetrySettings) {
    if let Some(attempts) = settings.max_attempts {
        retry.max_attempts = attempts.max(1);
    }
    if let Some(ms) = settings.initial_delay_ms {
        retry.initial_delay = Duration::from_millis(ms);
    }
    if let Some(ms) = settings.max_delay_ms {
        retry.max_delay = Duration::from_millis(ms);
    }
    if let Some(factor) = settings.factor {
        retry.factor = factor;
    }
    if let Some(ms) = settings.max_retry_after_ms {
        retry.max_retry_after = Duration::from_millis(ms);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const CONFIG: &str = r#"
[providers.openai]
base_url = "http://127.0.0.1:9/v1"
idle_timeout_ms = 5000
retry = { max_attempts = 3, initial_delay_ms = 50 }

[providers.gateway]
kind = "openai"
base_url = "http://127.0.0.1:8/v1"
api_key_env = "GATEWAY_KEY"

[models.flaky]
model = "openai:gpt-4o-mini"
retry = { max_attempts = 9 }
call_timeout_ms = 1234

[models.proxied]
model = "gateway:gpt-4o"
"#;

    #[test]
    fn keel_toml_settings_reach_the_provider_options() {
        let config = KeelConfig::from_toml_str(CONFIG).unwrap();
        let env = |name: &str| (name == "GATEWAY_KEY").then(|| "gw-key".to_string());
        // An alias: the model's retry budget over the provider's, its deadline.
        let (spec, options) = provider_options(&config, "flaky", None, &env);
        assert_eq!(spec, "openai:gpt-4o-mini");
        assert_eq!(options.retry.max_attempts, 9);
        assert_eq!(options.retry.initial_delay, Duration::from_millis(50));
        assert_eq!(options.call_timeout, Duration::from_millis(1234));
        assert_eq!(options.idle_timeout, Duration::from_millis(5000));
        assert_eq!(options.base_url.as_deref(), Some("http://127.0.0.1:9/v1"));
        // A plain spec gets the provider's settings; the flag wins over the file.
        let (spec, options) = provider_options(
            &config,
            "openai:gpt-4.1",
            Some("http://127.0.0.1:7".into()),
            &env,
        );
        assert_eq!(spec, "openai:gpt-4.1");
        assert_eq!(options.retry.max_attempts, 3);
        assert_eq!(options.base_url.as_deref(), Some("http://127.0.0.1:7"));
        // A custom provider speaks its kind's protocol with its own key.
        let (spec, options) = provider_options(&config, "proxied", None, &env);
        assert_eq!(spec, "openai:gpt-4o");
        assert_eq!(options.base_url.as_deref(), Some("http://127.0.0.1:8/v1"));
        assert!(options.api_key.is_some());
        // Without keel.toml: the built-in defaults.
        let (spec, options) =
            provider_options(&KeelConfig::default(), "anthropic:claude", None, &env);
        assert_eq!(spec, "anthropic:claude");
        assert_eq!(options.retry, RetryConfig::default());
    }
}
