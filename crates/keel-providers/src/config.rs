//! Configuration: [`ProviderOptions`] and [`model_from_spec`], which turns
//! `provider:model` into a ready [`Model`], reading keys and base URLs from the
//! environment and refusing non-loopback endpoints in test mode.

use std::sync::Arc;
use std::time::Duration;

use keel_core::{Model, ModelCapabilities};
use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};

use crate::anthropic::Anthropic;
use crate::driver::{HttpModel, Protocol};
use crate::framing::DEFAULT_MAX_EVENT_BYTES;
use crate::ollama::Ollama;
use crate::openai_chat::{Flavor, OpenAiChat};
use crate::openai_responses::OpenAiResponses;
use crate::pricing::PricingTable;
use crate::retry::{RetryConfig, Sleeper, TokioSleeper};

/// The providers [`model_from_spec`] knows, in the order shown in error messages.
pub const PROVIDERS: [&str; 5] = [
    "anthropic",
    "openai",
    "openai-responses",
    "openrouter",
    "ollama",
];

/// The environment variable that forces [`ProviderOptions::loopback_only`] (`1` = on).
pub const TEST_MODE_VAR: &str = "KEEL_TEST_MODE";

/// The default overall deadline of one model call (10 minutes).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// How to reach and call a provider.
///
/// `Debug` never shows the API key (it is a [`SecretString`]) nor the base URL's
/// userinfo or query.
#[derive(Clone)]
pub struct ProviderOptions {
    /// Overrides the base URL (else the provider's environment variable, else its default).
    pub base_url: Option<String>,
    /// Overrides the API key (else the provider's environment variable). Held as a
    /// [`SecretString`]: `Some("sk-…".into())`; its `Debug` prints `[REDACTED]`.
    pub api_key: Option<SecretString>,
    /// Retry policy for retryable failures: attempts, initial and maximum delay, growth
    /// factor, jitter and the longest `retry-after` honoured.
    pub retry: RetryConfig,
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Longest silence allowed while waiting for the response or between stream bytes.
    pub idle_timeout: Duration,
    /// Overall deadline of one model call, from the first request to the last byte,
    /// retries and their waits included (default [`DEFAULT_CALL_TIMEOUT`], 10 minutes).
    /// When it passes the call fails with a `timeout` error that is not retried.
    pub call_timeout: Duration,
    /// Largest streamed line, or SSE event's data, accepted, in bytes (default
    /// [`DEFAULT_MAX_EVENT_BYTES`], 16 MiB). A larger one fails the call with a
    /// non-retryable `other` error naming the limit.
    pub max_event_bytes: usize,
    /// Refuse any base URL that is not loopback (forced on when `KEEL_TEST_MODE=1`).
    pub loopback_only: bool,
    /// Waits between retries; `None` is the tokio timer. Tests inject a virtual clock.
    pub sleeper: Option<Arc<dyn Sleeper>>,
    /// Pricing table; `None` is the built-in table.
    pub pricing: Option<Arc<PricingTable>>,
    /// OpenRouter attribution (`HTTP-Referer`); defaults to the Keel repository URL.
    pub app_url: Option<String>,
    /// OpenRouter attribution (`X-Title`); defaults to `Keel`.
    pub app_title: Option<String>,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            base_url: None,
            api_key: None,
            retry: RetryConfig::default(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            loopback_only: false,
            sleeper: None,
            pricing: None,
            app_url: None,
            app_title: None,
        }
    }
}

impl std::fmt::Debug for ProviderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderOptions")
            .field(
                "base_url",
                &self
                    .base_url
                    .as_deref()
                    .map(crate::redact::display_url_text),
            )
            .field("api_key", &self.api_key)
            .field("retry", &self.retry)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("max_event_bytes", &self.max_event_bytes)
            .field("loopback_only", &self.loopback_only)
            .field("sleeper", &self.sleeper)
            .field("pricing", &self.pricing.as_ref().map(|_| "…"))
            .field("app_url", &self.app_url)
            .field("app_title", &self.app_title)
            .finish()
    }
}

/// Why a model could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderConfigError {
    /// The spec is not `provider:model`.
    #[error(
        "invalid model spec `{spec}`: expected `provider:model`, e.g. `anthropic:claude-sonnet-4-5` (providers: {valid})"
    )]
    InvalidSpec {
        /// The spec given.
        spec: String,
        /// The valid providers.
        valid: String,
    },
    /// The provider is not one of [`PROVIDERS`].
    #[error("unknown model provider `{provider}`; valid providers are: {valid}")]
    UnknownProvider {
        /// The provider given.
        provider: String,
        /// The valid providers.
        valid: String,
    },
    /// The API key is missing.
    #[error(
        "{provider} needs an API key: set the environment variable {variable} (or pass an api_key)"
    )]
    MissingApiKey {
        /// The provider.
        provider: String,
        /// The variable to set.
        variable: String,
    },
    /// The base URL does not parse.
    #[error("invalid base URL `{url}` for {provider}: {reason}")]
    InvalidBaseUrl {
        /// The provider.
        provider: String,
        /// The URL given.
        url: String,
        /// Why.
        reason: String,
    },
    /// Loopback-only mode refused a non-loopback base URL.
    #[error(
        "refusing base URL `{url}` for {provider}: only loopback addresses (127.0.0.1, ::1, localhost) are allowed in test mode (KEEL_TEST_MODE=1 or loopback_only); point --base-url at a local mock such as `keel mock-llm`"
    )]
    NonLoopbackRefused {
        /// The provider.
        provider: String,
        /// The URL refused.
        url: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

struct ProviderInfo {
    key_var: Option<&'static str>,
    base_var: &'static str,
    default_base: &'static str,
}

fn info(provider: &str) -> Option<ProviderInfo> {
    Some(match provider {
        "anthropic" => ProviderInfo {
            key_var: Some("ANTHROPIC_API_KEY"),
            base_var: "ANTHROPIC_BASE_URL",
            default_base: "https://api.anthropic.com",
        },
        "openai" | "openai-responses" => ProviderInfo {
            key_var: Some("OPENAI_API_KEY"),
            base_var: "OPENAI_BASE_URL",
            default_base: "https://api.openai.com/v1",
        },
        "openrouter" => ProviderInfo {
            key_var: Some("OPENROUTER_API_KEY"),
            base_var: "OPENROUTER_BASE_URL",
            default_base: "https://openrouter.ai/api/v1",
        },
        "ollama" => ProviderInfo {
            key_var: None,
            base_var: "OLLAMA_HOST",
            default_base: "http://127.0.0.1:11434",
        },
        _ => return None,
    })
}

/// Builds a model from `provider:model`, reading the process environment.
pub fn model_from_spec(
    spec: &str,
    options: &ProviderOptions,
) -> Result<Arc<dyn Model>, ProviderConfigError> {
    model_from_spec_with_env(spec, options, &|name| std::env::var(name).ok())
}

/// [`model_from_spec`] with an explicit environment lookup (for tests and embedding).
pub fn model_from_spec_with_env(
    spec: &str,
    options: &ProviderOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>, ProviderConfigError> {
    let model: Arc<dyn Model> = Arc::new(http_model_from_spec(spec, options, env)?);
    Ok(model)
}

/// The HTTP model behind [`model_from_spec_with_env`].
pub(crate) fn http_model_from_spec(
    spec: &str,
    options: &ProviderOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HttpModel, ProviderConfigError> {
    let valid = PROVIDERS.join(", ");
    let Some((provider, model)) = spec
        .split_once(':')
        .filter(|(p, m)| !p.is_empty() && !m.is_empty())
    else {
        return Err(ProviderConfigError::InvalidSpec {
            spec: spec.to_owned(),
            valid,
        });
    };
    let Some(info) = info(provider) else {
        return Err(ProviderConfigError::UnknownProvider {
            provider: provider.to_owned(),
            valid,
        });
    };
    let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let api_key: Option<SecretString> = options
        .api_key
        .clone()
        .filter(|key| !key.expose_secret().trim().is_empty())
        .or_else(|| {
            info.key_var
                .and_then(|v| non_empty(env(v)))
                .map(SecretString::from)
        });
    let api_key = match (info.key_var, api_key) {
        (Some(variable), None) => {
            return Err(ProviderConfigError::MissingApiKey {
                provider: provider.to_owned(),
                variable: variable.to_owned(),
            });
        }
        (_, key) => key,
    };
    let raw_base = non_empty(options.base_url.clone())
        .or_else(|| non_empty(env(info.base_var)))
        .unwrap_or_else(|| info.default_base.to_owned());
    let base = parse_base(provider, &raw_base)?;
    let loopback_only =
        options.loopback_only || env(TEST_MODE_VAR).is_some_and(|v| v.trim() == "1");
    if loopback_only && !is_loopback(&base) {
        return Err(ProviderConfigError::NonLoopbackRefused {
            provider: provider.to_owned(),
            url: crate::redact::display_url_text(&raw_base),
        });
    }
    let client = crate::clients::client(crate::clients::ClientSettings {
        connect_timeout: options.connect_timeout,
        idle_timeout: options.idle_timeout,
        no_proxy: loopback_only,
    })
    .map_err(|e| ProviderConfigError::Client(e.to_string()))?;
    let key = api_key.unwrap_or_else(|| SecretString::from(""));
    let protocol: Box<dyn Protocol> = match provider {
        "anthropic" => Box::new(Anthropic {
            url: endpoint(&base, "/v1", "/messages"),
            api_key: key,
        }),
        "openai" => Box::new(OpenAiChat {
            flavor: Flavor::OpenAi,
            url: endpoint(&base, "/v1", "/chat/completions"),
            api_key: key,
            app_url: None,
            app_title: None,
        }),
        "openrouter" => Box::new(OpenAiChat {
            flavor: Flavor::OpenRouter,
            url: endpoint(&base, "/v1", "/chat/completions"),
            api_key: key,
            app_url: Some(
                options
                    .app_url
                    .clone()
                    .unwrap_or_else(|| env!("CARGO_PKG_REPOSITORY").to_owned()),
            ),
            app_title: Some(
                options
                    .app_title
                    .clone()
                    .unwrap_or_else(|| "Keel".to_owned()),
            ),
        }),
        "openai-responses" => Box::new(OpenAiResponses {
            url: endpoint(&base, "/v1", "/responses"),
            api_key: key,
        }),
        _ => Box::new(Ollama {
            url: endpoint(&base, "/api", "/chat"),
            api_key: non_empty(env("OLLAMA_API_KEY"))
                .map(SecretString::from)
                .or_else(|| (!key.expose_secret().trim().is_empty()).then_some(key)),
        }),
    };
    let pricing_table = options
        .pricing
        .clone()
        .unwrap_or_else(PricingTable::builtin);
    let pricing = HttpModel::pricing_for(&pricing_table, provider, model);
    let defaults = ModelCapabilities::default();
    let capabilities = ModelCapabilities {
        structured_output: provider != "anthropic",
        context_window: pricing
            .as_ref()
            .map_or(defaults.context_window, |p| p.context_window),
        max_output_tokens: pricing
            .as_ref()
            .map_or(defaults.max_output_tokens, |p| p.max_output_tokens),
        ..defaults
    };
    Ok(HttpModel {
        protocol,
        model: model.to_owned(),
        client,
        retry: options.retry,
        idle_timeout: options.idle_timeout,
        call_timeout: options.call_timeout,
        max_event_bytes: options.max_event_bytes.max(1),
        sleeper: options
            .sleeper
            .clone()
            .unwrap_or_else(|| Arc::new(TokioSleeper)),
        pricing,
        capabilities,
    })
}

fn parse_base(provider: &str, raw: &str) -> Result<Url, ProviderConfigError> {
    let with_scheme = if raw.contains("://") {
        raw.to_owned()
    } else {
        format!("http://{raw}")
    };
    // The URL is shown without userinfo or query: either may hold a credential.
    let url = Url::parse(&with_scheme).map_err(|e| ProviderConfigError::InvalidBaseUrl {
        provider: provider.to_owned(),
        url: crate::redact::display_url_text(raw),
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ProviderConfigError::InvalidBaseUrl {
            provider: provider.to_owned(),
            url: crate::redact::display_url_text(raw),
            reason: "expected an http:// or https:// URL with a host".to_owned(),
        });
    }
    Ok(url)
}

/// Whether a URL's host is a loopback address or `localhost`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
        None => false,
    }
}

/// Joins a base URL and an endpoint: a base without a path gets `version` first
/// (`http://127.0.0.1:8080` → `/v1/messages`); a base already ending in `version` or
/// carrying its own path keeps it (`https://openrouter.ai/api/v1` → `/chat/completions`).
fn endpoint(base: &Url, version: &str, path: &str) -> String {
    let mut out = base.clone();
    out.set_query(None);
    out.set_fragment(None);
    let current = out.path().trim_end_matches('/').to_owned();
    let joined = if current.is_empty() {
        format!("{version}{path}")
    } else if current.ends_with(version) || current.contains("/v1") || current.contains("/api") {
        format!("{current}{path}")
    } else {
        format!("{current}{version}{path}")
    };
    out.set_path(&joined);
    out.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint(&url("http://127.0.0.1:9"), "/v1", "/messages"),
            "http://127.0.0.1:9/v1/messages"
        );
        assert_eq!(
            endpoint(&url("https://api.anthropic.com"), "/v1", "/messages"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            endpoint(
                &url("https://api.openai.com/v1/"),
                "/v1",
                "/chat/completions"
            ),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            endpoint(
                &url("https://openrouter.ai/api/v1"),
                "/v1",
                "/chat/completions"
            ),
            "https://openrouter.ai/api/v1/chat/completions"
        );
        assert_eq!(
            endpoint(&url("http://localhost:11434"), "/api", "/chat"),
            "http://localhost:11434/api/chat"
        );
        assert_eq!(
            endpoint(&url("http://localhost:11434/api"), "/api", "/chat"),
            "http://localhost:11434/api/chat"
        );
        assert_eq!(
            endpoint(&url("http://proxy.local/openai"), "/v1", "/responses"),
            "http://proxy.local/openai/v1/responses"
        );
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback(&url("http://127.0.0.1:1")));
        assert!(is_loopback(&url("http://127.8.9.1:1")));
        assert!(is_loopback(&url("http://[::1]:1")));
        assert!(is_loopback(&url("http://localhost:1")));
        assert!(!is_loopback(&url("https://api.openai.com")));
        assert!(!is_loopback(&url("http://10.0.0.1")));
        assert!(!is_loopback(&url("http://127.0.0.1.evil.com")));
    }
}
