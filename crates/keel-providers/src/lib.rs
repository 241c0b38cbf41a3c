//! `keel-providers` connects Keel to real language models over their own wire protocols:
//! Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, OpenRouter and Ollama.
//! Each adapter implements [`keel_core::Model`]; they share one HTTP driver with SSE and
//! NDJSON framing, error classification into [`keel_core::ModelError`], a retry policy
//! ([`RetryConfig`]) that reports every retry as a stream event, idle and connect
//! timeouts, an overall per-call deadline, a byte limit per streamed event, token estimates (tiktoken for OpenAI-family models) and a pricing table.
//!
//! The entry point is [`model_from_spec`] (`"anthropic:claude-sonnet-4-5"` → a model).
//! [`StoredResponses`] is the Responses API's stateful mode (the provider keeps the
//! conversation; requests continue it by `previous_response_id`), for service-backed agents.
//!
//! This crate must not decide anything about the agent loop (that is `keel-core`), must
//! not log secrets, and must never reach a non-loopback host when `loopback_only` (or
//! `KEEL_TEST_MODE=1`) is set.

mod anthropic;
mod clients;
mod config;
mod driver;
pub mod errors;
pub mod framing;
#[doc(hidden)]
pub mod fuzzing;
mod ollama;
mod openai_chat;
mod openai_responses;
pub mod pricing;
mod redact;
pub mod retry;
mod stored_responses;
pub mod tokens;

pub use anthropic::ANTHROPIC_VERSION;
pub use config::{
    DEFAULT_CALL_TIMEOUT, PROVIDERS, ProviderConfigError, ProviderOptions, TEST_MODE_VAR,
    is_loopback, model_from_spec, model_from_spec_with_env,
};
pub use framing::DEFAULT_MAX_EVENT_BYTES;
pub use pricing::{ModelPricing, PricingError, PricingTable};
pub use retry::{Jitter, RecordingSleeper, RetryConfig, Sleeper, TokioSleeper};
/// The secret type of [`ProviderOptions::api_key`], re-exported so callers need no
/// direct `secrecy` dependency.
pub use secrecy::{ExposeSecret, SecretString};
pub use stored_responses::{STORED_RESPONSES_PROVIDER, StoredResponses};
