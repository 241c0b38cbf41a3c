//! The shared streaming driver: one [`HttpModel`] runs any wire [`Protocol`] over HTTP
//! with connect and idle timeouts, error classification, the retry policy, restarts after
//! partial output, and cost computation from the pricing table.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use keel_core::{
    Model, ModelCapabilities, ModelError, ModelErrorKind, ModelRequest, StreamEvent, Usage,
};
use reqwest::RequestBuilder;
use serde_json::Value;

use crate::errors::{classify_http, classify_transport};
use crate::framing::{Frame, FrameParser, Framing};
use crate::pricing::{ModelPricing, PricingTable};
use crate::retry::{RetryConfig, Sleeper};

/// One wire protocol: how to build the request and how to read the answer.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// Provider name used in ids and messages (`anthropic`, `openai`, …).
    fn provider(&self) -> &'static str;
    /// The full endpoint URL.
    fn url(&self) -> &str;
    /// Adds authentication and protocol headers.
    fn headers(&self, builder: RequestBuilder) -> RequestBuilder;
    /// The JSON request body.
    fn body(&self, model: &str, max_output: u32, request: &ModelRequest<'_>) -> Value;
    /// How the streamed body is framed.
    fn framing(&self) -> Framing;
    /// A fresh decoder for one attempt.
    fn decoder(&self) -> Box<dyn Decoder>;
}

/// Turns frames of one streamed answer into [`StreamEvent`]s.
pub(crate) trait Decoder: Send {
    /// Handles one frame, pushing the events it completes.
    fn frame(&mut self, frame: Frame, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
    /// The body ended. Pushes the final events, or fails when the answer is incomplete.
    fn end(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), ModelError>;
}

/// The error for an answer that ended before it was complete.
pub(crate) fn truncated(provider: &str) -> ModelError {
    ModelError::new(
        ModelErrorKind::StreamInterrupted,
        format!("{provider}: the stream ended before the answer was complete"),
    )
}

/// The error for a chunk that is not valid JSON.
pub(crate) fn malformed(provider: &str, data: &str, error: &serde_json::Error) -> ModelError {
    let mut shown: String = data.chars().take(200).collect();
    if shown.len() < data.len() {
        shown.push('…');
    }
    let mut e = ModelError::new(
        ModelErrorKind::StreamInterrupted,
        format!("{provider}: malformed chunk ({error}): {shown}"),
    );
    e.body = Some(data.to_owned());
    e
}

/// A model reached over HTTP through a [`Protocol`].
pub(crate) struct HttpModel {
    pub(crate) protocol: Box<dyn Protocol>,
    pub(crate) model: String,
    pub(crate) client: reqwest::Client,
    pub(crate) retry: RetryConfig,
    pub(crate) idle_timeout: Duration,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) pricing: Option<ModelPricing>,
    pub(crate) capabilities: ModelCapabilities,
}

impl std::fmt::Debug for HttpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModel")
            .field("provider", &self.protocol.provider())
            .field("model", &self.model)
            .field("url", &self.protocol.url())
            .finish_non_exhaustive()
    }
}

impl HttpModel {
    pub(crate) fn pricing_for(
        table: &PricingTable,
        provider: &str,
        model: &str,
    ) -> Option<ModelPricing> {
        table.lookup(provider, model).cloned()
    }

    async fn send(&self, body: &Bytes) -> Result<reqwest::Response, ModelError> {
        let provider = self.protocol.provider();
        let builder = self
            .client
            .post(self.protocol.url())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        let builder = self.protocol.headers(builder);
        let response = match tokio::time::timeout(self.idle_timeout, builder.send()).await {
            Err(_) => {
                return Err(ModelError::new(
                    ModelErrorKind::Timeout,
                    format!(
                        "{provider}: no response within the idle timeout of {} ms",
                        self.idle_timeout.as_millis()
                    ),
                ));
            }
            Ok(Err(error)) => return Err(classify_transport(provider, &error, false)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let text = match tokio::time::timeout(self.idle_timeout, response.text()).await {
            Ok(Ok(text)) => text,
            Ok(Err(_)) | Err(_) => String::new(),
        };
        Err(classify_http(provider, status.as_u16(), &headers, &text))
    }

    fn cost_of(&self, usage: &Usage) -> Option<f64> {
        self.pricing.as_ref().map(|p| p.cost(usage))
    }
}

impl Model for HttpModel {
    fn id(&self) -> String {
        format!("{}:{}", self.protocol.provider(), self.model)
    }

    fn capabilities(&self) -> ModelCapabilities {
        self.capabilities
    }

    fn estimate_tokens(&self, request: &ModelRequest<'_>) -> u64 {
        match self.protocol.provider() {
            "openai" | "openai-responses" | "openrouter" => {
                match crate::tokens::openai_tokenizer(&self.model) {
                    Some(bpe) => crate::tokens::count_request_tokens(bpe, request),
                    None => keel_core::model::estimate_request_tokens(request),
                }
            }
            _ => keel_core::model::estimate_request_tokens(request),
        }
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let provider = self.protocol.provider();
        let max_output = request
            .max_output_tokens
            .unwrap_or(self.capabilities.max_output_tokens);
        let body = serde_json::to_vec(&self.protocol.body(&self.model, max_output, &request));
        Box::pin(async_stream::stream! {
            let body = match body {
                Ok(body) => Bytes::from(body),
                Err(error) => {
                    yield Err(ModelError::new(
                        ModelErrorKind::InvalidRequest,
                        format!("{provider}: cannot serialize the request: {error}"),
                    ));
                    return;
                }
            };
            let mut attempt: u32 = 1;
            let mut previous_wait: Option<Duration> = None;
            loop {
                let mut produced_output = false;
                let mut cost_seen = false;
                let mut last_usage: Option<Usage> = None;
                let failure: ModelError = 'attempt: {
                    let response = match self.send(&body).await {
                        Ok(response) => response,
                        Err(error) => break 'attempt error,
                    };
                    let mut bytes = response.bytes_stream();
                    let mut parser = FrameParser::new(self.protocol.framing());
                    let mut decoder = self.protocol.decoder();
                    let mut out: Vec<StreamEvent> = Vec::new();
                    loop {
                        let next = tokio::time::timeout(self.idle_timeout, bytes.next()).await;
                        let (frames, ended) = match next {
                            Err(_) => {
                                break 'attempt ModelError::new(
                                    ModelErrorKind::Timeout,
                                    format!(
                                        "{provider}: no data for {} ms (idle timeout)",
                                        self.idle_timeout.as_millis()
                                    ),
                                );
                            }
                            Ok(None) => (parser.finish(), true),
                            Ok(Some(Err(error))) => {
                                break 'attempt classify_transport(provider, &error, true);
                            }
                            Ok(Some(Ok(chunk))) => (parser.push(&chunk), false),
                        };
                        let mut decode_error = None;
                        for frame in frames {
                            if let Err(error) = decoder.frame(frame, &mut out) {
                                decode_error = Some(error);
                                break;
                            }
                        }
                        if decode_error.is_none()
                            && ended
                            && let Err(error) = decoder.end(&mut out)
                        {
                            decode_error = Some(error);
                        }
                        for event in out.drain(..) {
                            match &event {
                                StreamEvent::Stop { .. } => {
                                    if !cost_seen
                                        && let Some(usage) = &last_usage
                                        && let Some(cost) = self.cost_of(usage)
                                    {
                                        yield Ok(StreamEvent::Cost(cost));
                                    }
                                    yield Ok(event);
                                    return;
                                }
                                StreamEvent::Usage(usage) => last_usage = Some(*usage),
                                StreamEvent::Cost(_) => cost_seen = true,
                                StreamEvent::TextDelta(_)
                                | StreamEvent::ToolCallDelta { .. }
                                | StreamEvent::ToolCall(_)
                                | StreamEvent::ProviderItem { .. } => produced_output = true,
                                StreamEvent::Retry { .. } | StreamEvent::Restart => {}
                            }
                            yield Ok(event);
                        }
                        if let Some(error) = decode_error {
                            break 'attempt error;
                        }
                        if ended {
                            break 'attempt crate::driver::truncated(provider);
                        }
                    }
                };
                match self.retry.next_wait(attempt, &failure, previous_wait) {
                    None => {
                        yield Err(failure);
                        return;
                    }
                    Some(wait) => {
                        tracing::warn!(
                            provider, attempt, error = %failure, wait_ms = wait.as_millis() as u64,
                            "model call failed; retrying"
                        );
                        yield Ok(StreamEvent::Retry {
                            attempt,
                            error: failure.kind,
                            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                            message: failure.message.clone(),
                        });
                        if produced_output {
                            yield Ok(StreamEvent::Restart);
                        }
                        self.sleeper.sleep(wait).await;
                        attempt = attempt.saturating_add(1);
                        previous_wait = Some(wait);
                    }
                }
            }
        })
    }
}
