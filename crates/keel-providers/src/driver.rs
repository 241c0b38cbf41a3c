//! The shared streaming driver: one [`HttpModel`] runs any wire [`Protocol`] over HTTP
//! with connect and idle timeouts, an overall deadline per call, a byte limit per streamed
//! line or event, error classification, the retry policy, restarts after partial output,
//! and cost computation from the pricing table.

use std::future::Future;
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
use tokio::time::Instant;

use crate::errors::{classify_http, classify_transport};
use crate::framing::{Frame, FrameParser, FrameTooLarge, Framing};
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

/// The error for a line or event larger than the limit. Not retryable: a server that
/// streams such an event is misbehaving, and asking again would download it again.
fn too_large(provider: &str, error: FrameTooLarge) -> ModelError {
    ModelError::new(
        ModelErrorKind::Other,
        format!(
            "{provider}: {error} (ProviderOptions::max_event_bytes); the server is sending an \
             endless or oversized event — raise max_event_bytes only if it really sends events \
             that large"
        ),
    )
}

/// How a wait bounded by the idle timeout and the call deadline ended.
enum Bounded<T> {
    /// The future finished in time.
    Ready(T),
    /// The idle timeout passed first.
    Idle,
    /// The call's overall deadline passed first.
    Deadline,
}

/// The longest `call_timeout` honoured as a deadline (a larger one means no deadline).
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A model reached over HTTP through a [`Protocol`].
pub(crate) struct HttpModel {
    pub(crate) protocol: Box<dyn Protocol>,
    pub(crate) model: String,
    pub(crate) client: Arc<reqwest::Client>,
    pub(crate) retry: RetryConfig,
    pub(crate) idle_timeout: Duration,
    /// Overall deadline of one call, retries and their waits included.
    pub(crate) call_timeout: Duration,
    /// Limit on one streamed line or event, in bytes.
    pub(crate) max_event_bytes: usize,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) pricing: Option<ModelPricing>,
    pub(crate) capabilities: ModelCapabilities,
}

impl std::fmt::Debug for HttpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModel")
            .field("provider", &self.protocol.provider())
            .field("model", &self.model)
            .field("url", &crate::redact::display_url_text(self.protocol.url()))
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

    /// When a call started now must end, or `None` for an unreachable deadline.
    fn deadline(&self) -> Option<Instant> {
        if self.call_timeout > MAX_CALL_TIMEOUT {
            return None;
        }
        Instant::now().checked_add(self.call_timeout)
    }

    /// Awaits `future` for at most the idle timeout, and never past `deadline`.
    async fn bounded<F: Future>(&self, deadline: Option<Instant>, future: F) -> Bounded<F::Output> {
        let idle_end = Instant::now().checked_add(self.idle_timeout);
        let (end, on_timeout) = match (idle_end, deadline) {
            (Some(idle), Some(deadline)) if deadline <= idle => (Some(deadline), Bounded::Deadline),
            (Some(idle), _) => (Some(idle), Bounded::Idle),
            (None, Some(deadline)) => (Some(deadline), Bounded::Deadline),
            (None, None) => (None, Bounded::Idle),
        };
        let Some(end) = end else {
            return Bounded::Ready(future.await);
        };
        match tokio::time::timeout_at(end, future).await {
            Ok(value) => Bounded::Ready(value),
            Err(_) => on_timeout,
        }
    }

    /// The error for a call that outlived its deadline. Final: the deadline covers the
    /// retries too, so there is no time left to try again.
    fn deadline_error(&self, provider: &str) -> ModelError {
        ModelError::new(
            ModelErrorKind::Timeout,
            format!(
                "{provider}: the call did not finish within its deadline of {} ms \
                 (ProviderOptions::call_timeout), retries included",
                self.call_timeout.as_millis()
            ),
        )
    }

    async fn send(
        &self,
        body: &Bytes,
        deadline: Option<Instant>,
    ) -> Result<reqwest::Response, ModelError> {
        let provider = self.protocol.provider();
        let builder = self
            .client
            .post(self.protocol.url())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        let builder = self.protocol.headers(builder);
        let response = match self.bounded(deadline, builder.send()).await {
            Bounded::Deadline => return Err(self.deadline_error(provider)),
            Bounded::Idle => {
                return Err(ModelError::new(
                    ModelErrorKind::Timeout,
                    format!(
                        "{provider}: no response within the idle timeout of {} ms",
                        self.idle_timeout.as_millis()
                    ),
                ));
            }
            Bounded::Ready(Err(error)) => return Err(classify_transport(provider, error, false)),
            Bounded::Ready(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        let text = match self.bounded(deadline, response.text()).await {
            Bounded::Ready(Ok(text)) => text,
            Bounded::Deadline => return Err(self.deadline_error(provider)),
            Bounded::Ready(Err(_)) | Bounded::Idle => String::new(),
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

    fn estimate_tokens_near(&self, request: &ModelRequest<'_>, precise_from: u64) -> u64 {
        let heuristic = keel_core::model::estimate_request_tokens(request);
        if crate::tokens::exact_count_at_most(heuristic) < precise_from {
            // Far from any decision: the tokenizer (tens of MB once loaded) is not needed.
            return heuristic;
        }
        self.estimate_tokens(request)
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let max_output = request
            .max_output_tokens
            .unwrap_or(self.capabilities.max_output_tokens);
        let body = serde_json::to_vec(&self.protocol.body(&self.model, max_output, &request));
        self.stream_body(body)
    }
}

impl HttpModel {
    /// Sends an already built request body and streams the answer, with the same
    /// timeouts, deadline, retries and cost reporting as [`Model::stream`] (for callers
    /// that adjust the protocol's body, like [`crate::StoredResponses`]).
    pub(crate) fn stream_body(
        &self,
        body: Result<Vec<u8>, serde_json::Error>,
    ) -> BoxStream<'_, Result<StreamEvent, ModelError>> {
        let provider = self.protocol.provider();
        Box::pin(async_stream::stream! {
            let body = match body {
                // Kept for the whole call (retries resend it): without the growth slack.
                Ok(body) => Bytes::from(body.into_boxed_slice()),
                Err(error) => {
                    yield Err(ModelError::new(
                        ModelErrorKind::InvalidRequest,
                        format!("{provider}: cannot serialize the request: {error}"),
                    ));
                    return;
                }
            };
            let deadline = self.deadline();
            let mut attempt: u32 = 1;
            let mut previous_wait: Option<Duration> = None;
            loop {
                let mut produced_output = false;
                let mut cost_seen = false;
                let mut last_usage: Option<Usage> = None;
                let failure: ModelError = 'attempt: {
                    let response = match self.send(&body, deadline).await {
                        Ok(response) => response,
                        Err(error) => break 'attempt error,
                    };
                    let mut bytes = response.bytes_stream();
                    let mut parser =
                        FrameParser::with_limit(self.protocol.framing(), self.max_event_bytes);
                    let mut decoder = self.protocol.decoder();
                    let mut out: Vec<StreamEvent> = Vec::new();
                    loop {
                        let next = self.bounded(deadline, bytes.next()).await;
                        let (frames, ended) = match next {
                            Bounded::Deadline => break 'attempt self.deadline_error(provider),
                            Bounded::Idle => {
                                break 'attempt ModelError::new(
                                    ModelErrorKind::Timeout,
                                    format!(
                                        "{provider}: no data for {} ms (idle timeout)",
                                        self.idle_timeout.as_millis()
                                    ),
                                );
                            }
                            Bounded::Ready(None) => (parser.finish(), true),
                            Bounded::Ready(Some(Err(error))) => {
                                break 'attempt classify_transport(provider, error, true);
                            }
                            Bounded::Ready(Some(Ok(chunk))) => (parser.push(&chunk), false),
                        };
                        let frames = match frames {
                            Ok(frames) => frames,
                            Err(error) => break 'attempt too_large(provider, error),
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
                                    // What follows the answer (`[DONE]`, the body's end)
                                    // is read in the background, so the connection goes
                                    // back to the pool instead of being closed.
                                    release_connection(bytes).await;
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
                let out_of_time = |wait: Duration| {
                    deadline.is_some_and(|end| {
                        Instant::now().checked_add(wait).is_none_or(|resume| resume >= end)
                    })
                };
                let past_deadline = deadline.is_some_and(|end| Instant::now() >= end);
                match self.retry.next_wait(attempt, &failure, previous_wait) {
                    _ if past_deadline => {
                        yield Err(failure);
                        return;
                    }
                    None => {
                        yield Err(failure);
                        return;
                    }
                    Some(wait) if out_of_time(wait) => {
                        let mut failure = failure;
                        failure.message.push_str(&format!(
                            " (not retried: waiting {} ms would pass the call deadline of {} ms)",
                            wait.as_millis(),
                            self.call_timeout.as_millis()
                        ));
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

/// Longest a finished answer's remaining body is read for its connection's reuse.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Longest the caller waits for the body's end after the answer's last event (servers end
/// the body right after it: this passes in microseconds; only a server that keeps the
/// body open after its final event makes the rest go to a task of its own).
const DRAIN_INLINE: Duration = Duration::from_secs(1);

/// Reads what is left of a response body whose answer is complete (a trailing `[DONE]`,
/// the chunked body's end): hyper returns a connection to the pool only once its response
/// was read to the end, so the next call (of this run or of any model with the same
/// client settings, see [`crate::clients`]) reuses it instead of opening a new one. The
/// end is awaited here, at most [`DRAIN_INLINE`] and only while nothing else arrives;
/// anything more is read on a task of its own, at most [`DRAIN_LIMIT`] and 1 MiB.
async fn release_connection<S>(mut rest: S)
where
    S: futures::Stream<Item = Result<Bytes, reqwest::Error>> + Send + Unpin + 'static,
{
    const MAX_BYTES: usize = 1 << 20;
    if let Ok(None | Some(Err(_))) = tokio::time::timeout(DRAIN_INLINE, rest.next()).await {
        // The body ended (the connection is back in the pool) or broke (it is closed).
        return;
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_LIMIT, async {
            let mut read = 0usize;
            while let Some(Ok(chunk)) = rest.next().await {
                read = read.saturating_add(chunk.len());
                if read > MAX_BYTES {
                    break;
                }
            }
        })
        .await;
    });
}
