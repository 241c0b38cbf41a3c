//! Models from specs: `provider:model`, a keel.toml `[models.<alias>]` name, or
//! `local:NAME` (embedded model, feature `local`). The provider options come from
//! `[providers.<name>]` (base URL, key variable, timeouts, retry) under the alias's own
//! `retry` and `call_timeout_ms`; an alias's `pricing` replaces the built-in price (so the
//! cost runs report and budgets use changes), and its `temperature`, `max_output_tokens`
//! and `context_window` are returned as [`ModelSettings`] for the agent. A `local:` model
//! runs on [`LOCAL_THREADS_ENV`] llama.cpp threads when that variable is set.

use std::sync::Arc;
use std::time::Duration;

use keel_config::{BUILTIN_PROVIDERS, KeelConfig, RetrySettings, split_spec};
use keel_core::{Model, ModelCapabilities};
use keel_providers::{ModelPricing, PricingTable, ProviderOptions, RetryConfig};

use crate::error::AppError;

/// What an alias sets for the agent (the agent's own keys and flags win).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelSettings {
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Output limit per call.
    pub max_output_tokens: Option<u32>,
    /// Context window override, tokens.
    pub context_window: Option<u32>,
}

/// The settings of `spec` when it names a `[models]` alias.
pub fn model_settings(config: &KeelConfig, spec: &str) -> ModelSettings {
    config
        .models
        .get(spec)
        .map(|alias| ModelSettings {
            temperature: alias.temperature,
            max_output_tokens: alias.max_output_tokens,
            context_window: alias.context_window,
        })
        .unwrap_or_default()
}

/// Why `spec` cannot name a model, if it cannot (an alias, `local:NAME`, or
/// `provider:model` with a built-in or configured provider).
pub fn spec_problem(config: &KeelConfig, spec: &str) -> Option<String> {
    if config.models.contains_key(spec) || spec.starts_with("local:") {
        return None;
    }
    let aliases: Vec<&str> = config.models.keys().map(String::as_str).collect();
    let Some((provider, _)) = split_spec(spec) else {
        return Some(format!(
            "`{spec}` is not `provider:model` (e.g. `anthropic:claude-sonnet-4-5`) nor a [models] alias{}",
            crate::hint(spec, &aliases)
        ));
    };
    if BUILTIN_PROVIDERS.contains(&provider) || config.providers.contains_key(provider) {
        return None;
    }
    let mut known: Vec<&str> = BUILTIN_PROVIDERS.to_vec();
    known.extend(config.providers.keys().map(String::as_str));
    Some(format!(
        "unknown provider `{provider}` in `{spec}` (known: {}; declare others under [providers.<name>] with `kind`){}",
        known.join(", "),
        crate::hint(provider, &known)
    ))
}

/// Builds the model `spec` names; `base_url` (the `--base-url` flag) wins over keel.toml.
pub fn build_model(
    config: &KeelConfig,
    spec: &str,
    base_url: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>, AppError> {
    let error = |message: String| AppError::Model {
        spec: spec.to_string(),
        message,
    };
    if let Some(name) = spec.strip_prefix("local:") {
        let settings = LocalSettings {
            threads: local_threads(spec, env)?,
            cache_partition: None,
            allowed_sha256: config.local.allowed_sha256.clone(),
        };
        return local_model(spec, name, &settings);
    }
    if let Some(problem) = spec_problem(config, spec) {
        return Err(error(problem));
    }
    let (provider_spec, options) =
        provider_options(config, spec, base_url.map(str::to_string), env);
    keel_providers::model_from_spec(&provider_spec, &options).map_err(|e| error(e.to_string()))
}

/// [`build_model`] for async callers: an embedded `local:` model is resolved (its file
/// verified against its pin, which hashes it the first time) and loaded on the blocking
/// thread pool, never on the async runtime; its prompt cache is shared only within
/// `cache_partition` (`None`: the whole process).
pub fn build_model_async(
    config: &KeelConfig,
    spec: &str,
    base_url: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
    cache_partition: Option<&str>,
) -> impl std::future::Future<Output = Result<Arc<dyn Model>, AppError>> + Send + 'static {
    // Everything read from the arguments now: the future holds none of them (the
    // environment lookup is not `Sync`).
    let local = match spec.strip_prefix("local:") {
        None => Err(build_model(config, spec, base_url, env)),
        Some(name) => match local_threads(spec, env) {
            Ok(threads) => Ok((
                spec.to_string(),
                name.to_string(),
                LocalSettings {
                    threads,
                    cache_partition: cache_partition.map(str::to_string),
                    allowed_sha256: config.local.allowed_sha256.clone(),
                },
            )),
            Err(error) => Err(Err(error)),
        },
    };
    async move {
        let (spec, name, settings) = match local {
            Ok(local) => local,
            Err(built) => return built,
        };
        let label = spec.clone();
        tokio::task::spawn_blocking(move || local_model(&spec, &name, &settings))
            .await
            .map_err(|e| AppError::Model {
                spec: label,
                message: format!("the model loading task failed: {e}"),
            })?
    }
}

/// How an embedded `local:` model is loaded (read only with the `local` feature).
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "local"), allow(dead_code))]
struct LocalSettings {
    threads: Option<u32>,
    cache_partition: Option<String>,
    allowed_sha256: Vec<String>,
}

/// The environment variable that sets how many CPU threads an embedded `local:` model
/// computes on (decoding and prompt processing). Unset: the number of cores, at most 8.
/// On a machine whose cores are busy with other work, one thread is several times faster
/// than two (llama.cpp's threads spin while they wait for each other).
pub const LOCAL_THREADS_ENV: &str = "KEEL_LOCAL_THREADS";

/// The thread count [`LOCAL_THREADS_ENV`] sets, if it is set; an error naming the variable
/// when it is not a positive whole number.
fn local_threads(
    spec: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<u32>, AppError> {
    let Some(value) = env(LOCAL_THREADS_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match value.trim().parse::<u32>() {
        Ok(threads) if threads > 0 => Ok(Some(threads)),
        _ => Err(AppError::Model {
            spec: spec.to_string(),
            message: format!(
                "{LOCAL_THREADS_ENV} must be a positive number of threads, got `{value}` \
                 (unset it to use every core, at most 8)"
            ),
        }),
    }
}

#[cfg(feature = "local")]
fn local_model(
    spec: &str,
    name: &str,
    settings: &LocalSettings,
) -> Result<Arc<dyn Model>, AppError> {
    let mut options = keel_local::LocalModelOptions::default();
    if let Some(threads) = settings.threads {
        options = options.with_threads(threads);
    }
    options
        .cache_partition
        .clone_from(&settings.cache_partition);
    options.allowed_sha256.clone_from(&settings.allowed_sha256);
    keel_local::LocalModel::load_spec(name, options)
        .map(|model| Arc::new(model) as Arc<dyn Model>)
        .map_err(|e| AppError::Model {
            spec: spec.to_string(),
            message: e.to_string(),
        })
}

#[cfg(not(feature = "local"))]
fn local_model(
    spec: &str,
    _name: &str,
    _settings: &LocalSettings,
) -> Result<Arc<dyn Model>, AppError> {
    Err(AppError::Model {
        spec: spec.to_string(),
        message: "this build has no embedded local models (keel-app's `local` feature)".into(),
    })
}

/// The spec to build and its provider options: `spec` resolved through keel.toml (a
/// `[models]` alias names its `provider:model`; a `[providers.<name>]` with `kind` speaks
/// that protocol), with the provider's settings, then the alias's `retry`,
/// `call_timeout_ms` and `pricing` over them. `base_url` (the flag) wins over the file.
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
    // The key from the configured (or usual) variable, read through `env`.
    if let Some(key) = config
        .api_key_env(&resolved.provider)
        .and_then(|var| env(&var))
        .filter(|key| !key.trim().is_empty())
    {
        options.api_key = Some(key.into());
    }
    if let Some(provider) = provider {
        if options.base_url.is_none() {
            options.base_url.clone_from(&provider.base_url);
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
        if let Some(pricing) = &settings.pricing {
            let base = PricingTable::builtin();
            let known = base.lookup(&kind, &resolved.model);
            let defaults = ModelCapabilities::default();
            let entry = ModelPricing {
                provider: kind.clone(),
                model: resolved.model.clone(),
                input: pricing.input,
                output: pricing.output,
                cache_read: pricing.cache_read,
                cache_write: pricing.cache_write,
                context_window: settings
                    .context_window
                    .or(known.map(|k| k.context_window))
                    .unwrap_or(defaults.context_window),
                max_output_tokens: settings
                    .max_output_tokens
                    .or(known.map(|k| k.max_output_tokens))
                    .unwrap_or(defaults.max_output_tokens),
            };
            options.pricing = Some(Arc::new(PricingTable::with_overrides(PricingTable {
                source: "keel.toml [models] pricing".into(),
                models: vec![entry],
            })));
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

/// The model used when no flag, agent nor keel.toml names one: a hosted model when its
/// API key is set, else the embedded local model — then with a notice saying so and how to
/// switch.
pub fn default_model_spec(env: &dyn Fn(&str) -> Option<String>) -> (String, Option<String>) {
    let hosted = [
        ("ANTHROPIC_API_KEY", "anthropic:claude-sonnet-4-5"),
        ("OPENAI_API_KEY", "openai:gpt-4o-mini"),
        ("OPENROUTER_API_KEY", "openrouter:openai/gpt-4o-mini"),
    ];
    for (variable, spec) in hosted {
        if env(variable).is_some_and(|v| !v.trim().is_empty()) {
            return (spec.to_string(), None);
        }
    }
    (
        "local:smollm2".to_string(),
        Some(
            "no model configured and no API key set; using the embedded local model local:smollm2 \
             (set ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENROUTER_API_KEY, or pass --model \
             PROVIDER:MODEL, to use a hosted model)"
                .to_string(),
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
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

    #[test]
    fn bad_specs_are_named_with_the_nearest_provider() {
        let config = KeelConfig::from_toml_str(CONFIG).unwrap();
        assert!(spec_problem(&config, "flaky").is_none());
        assert!(spec_problem(&config, "gateway:x").is_none());
        let problem = spec_problem(&config, "opneai:gpt-4o").unwrap();
        assert!(problem.contains("did you mean `openai`"), "{problem}");
        let problem = spec_problem(&config, "flakey").unwrap();
        assert!(problem.contains("did you mean `flaky`"), "{problem}");
        let (spec, notice) = default_model_spec(&|_| None);
        assert_eq!(spec, "local:smollm2");
        assert!(notice.unwrap().contains("no API key"));
    }

    #[test]
    fn local_threads_come_from_the_environment_and_are_checked() {
        let set = |value: &'static str| {
            move |name: &str| (name == LOCAL_THREADS_ENV).then(|| value.to_string())
        };
        assert_eq!(local_threads("local:smollm2", &|_| None).unwrap(), None);
        assert_eq!(local_threads("local:smollm2", &set("")).unwrap(), None);
        assert_eq!(
            local_threads("local:smollm2", &set(" 1 ")).unwrap(),
            Some(1)
        );
        for bad in ["0", "-1", "two"] {
            let Err(AppError::Model { spec, message }) = local_threads("local:smollm2", &set(bad))
            else {
                panic!("{bad} accepted");
            };
            assert_eq!(spec, "local:smollm2");
            assert!(message.contains("KEEL_LOCAL_THREADS"), "{message}");
            assert!(message.contains(&format!("`{bad}`")), "{message}");
        }
    }
}
