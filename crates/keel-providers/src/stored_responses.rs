//! [`StoredResponses`]: the OpenAI Responses API in its stateful mode, where the provider
//! keeps the conversation. Each request sends only what is new since the last stored
//! response and names that response (`previous_response_id`, `store: true`); the
//! provider's answer carries the id the next request continues from.
//!
//! It runs on the same driver as every model adapter — connect, idle and per-call
//! timeouts, retries on 429/5xx honouring `Retry-After`, error classification — so a
//! caller streams [`StreamEvent`]s exactly as from [`keel_core::Model::stream`], the
//! response id arriving in [`StreamEvent::Stop`].

use futures::stream::BoxStream;
use keel_core::{Model, ModelCapabilities, ModelError, ModelRequest, StreamEvent};

use crate::config::{ProviderConfigError, ProviderOptions, http_model_from_spec};
use crate::driver::HttpModel;
use crate::openai_responses::stored_request_body;

/// The provider name a stored conversation lives on.
pub const STORED_RESPONSES_PROVIDER: &str = "openai-responses";

/// A client of the Responses API whose conversations are stored by the provider.
pub struct StoredResponses {
    inner: HttpModel,
}

impl std::fmt::Debug for StoredResponses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredResponses")
            .field("model", &self.inner)
            .finish()
    }
}

impl StoredResponses {
    /// A client for `model` (`gpt-5`, or `openai-responses:gpt-5`), reading the API key
    /// and base URL from the process environment as [`crate::model_from_spec`] does.
    pub fn new(model: &str, options: &ProviderOptions) -> Result<Self, ProviderConfigError> {
        Self::with_env(model, options, &|name| std::env::var(name).ok())
    }

    /// [`StoredResponses::new`] with an explicit environment lookup.
    pub fn with_env(
        model: &str,
        options: &ProviderOptions,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ProviderConfigError> {
        let prefix = format!("{STORED_RESPONSES_PROVIDER}:");
        let name = model.strip_prefix(&prefix).unwrap_or(model);
        let spec = format!("{prefix}{name}");
        Ok(Self {
            inner: http_model_from_spec(&spec, options, env)?,
        })
    }

    /// `openai-responses:<model>`.
    pub fn id(&self) -> String {
        self.inner.id()
    }

    /// Context window, output limit and the like (from the pricing table).
    pub fn capabilities(&self) -> ModelCapabilities {
        self.inner.capabilities()
    }

    /// Estimated input tokens of `request` (what is sent, not the stored conversation).
    pub fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        self.inner.estimate_tokens(request)
    }

    /// Streams the answer to `request`, whose messages continue the stored conversation
    /// ending with `previous_response_id` (`None` starts a new one). The answer is stored
    /// by the provider; its id is the `response_id` of the final [`StreamEvent::Stop`].
    pub fn stream<'a>(
        &'a self,
        previous_response_id: Option<&'a str>,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let max_output = request
            .max_output_tokens
            .unwrap_or(self.inner.capabilities.max_output_tokens);
        let body = serde_json::to_vec(&stored_request_body(
            &self.inner.model,
            max_output,
            &request,
            previous_response_id,
        ));
        self.inner.stream_body(body)
    }
}
