//! What a replay puts in place of the outside world: a model answering with the recorded
//! responses ([`ReplayModel`]), a summarizer answering with the recorded summaries, tools
//! that keep the agent's real contracts (schemas, effects, timeouts, normalizers) but
//! answer with the recorded outputs ([`replay_tools`]), and the recorded human decisions
//! and answers. Nothing here touches the network.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use keel_core::observation::Observation;
use keel_core::{
    DynTool, Model, ModelCapabilities, ModelError, ModelErrorKind, ModelRequest, Part, StopReason,
    StreamEvent, ToolCall, ToolContext, ToolError, ToolErrorCode, ToolOutcome, ToolRegistry,
    ToolResultKind, ToolSpec, Usage,
};
use keel_runtime::{ApprovalDecision, ApprovalHandler, UserInputSource};
use serde_json::Value;

use super::cassette::{Cassette, RecordedApproval, RecordedResponse, RecordedToolOutput};

/// A model that answers the n-th request with the n-th recorded response, under the
/// recorded model's id. A request past the last response is a non-retryable error naming
/// the counts (the replayed run asked the model more often than the recorded one did).
pub struct ReplayModel {
    id: String,
    context_window: Option<u32>,
    responses: Vec<RecordedResponse>,
    next: AtomicUsize,
}

impl ReplayModel {
    /// The cassette's model.
    pub fn new(cassette: &Cassette) -> Self {
        Self {
            id: cassette.model.clone(),
            context_window: cassette.context_window,
            responses: cassette.model_responses.clone(),
            next: AtomicUsize::new(0),
        }
    }

    /// How many responses were served.
    pub fn served(&self) -> usize {
        self.next.load(Ordering::SeqCst).min(self.responses.len())
    }
}

impl Model for ReplayModel {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn capabilities(&self) -> ModelCapabilities {
        let defaults = ModelCapabilities::default();
        ModelCapabilities {
            context_window: self.context_window.unwrap_or(defaults.context_window),
            ..defaults
        }
    }

    fn stream<'a>(
        &'a self,
        _request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let events = match self.responses.get(index) {
            Some(response) => response_events(response).into_iter().map(Ok).collect(),
            None => vec![Err(ModelError::new(
                ModelErrorKind::Other,
                format!(
                    "replay: the cassette has {} model responses and the replayed run asked \
                     for response {}",
                    self.responses.len(),
                    index + 1
                ),
            ))],
        };
        Box::pin(futures::stream::iter(events))
    }
}

/// The stream that yields `response`'s message as it was recorded.
fn response_events(response: &RecordedResponse) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    for part in &response.message.parts {
        match part {
            Part::Text { text } => events.push(StreamEvent::TextDelta(text.clone())),
            Part::ToolCall(call) => events.push(StreamEvent::ToolCall(call.clone())),
            Part::ProviderItem { provider, item } => events.push(StreamEvent::ProviderItem {
                provider: provider.clone(),
                item: item.clone(),
            }),
            Part::ToolResult(_) | Part::Summary { .. } => {}
        }
    }
    events.push(StreamEvent::Usage(response.usage));
    events.push(StreamEvent::Stop {
        reason: response.stop_reason,
        response_id: None,
    });
    events
}

/// The summarizer of a replayed `summarize` context strategy: the recorded summaries in
/// order (an empty summary once they run out, which the comparison then shows).
pub struct ReplaySummarizer {
    id: String,
    summaries: Vec<String>,
    next: AtomicUsize,
}

impl ReplaySummarizer {
    /// The cassette's summaries.
    pub fn new(cassette: &Cassette) -> Self {
        Self {
            id: format!("{} (summaries)", cassette.model),
            summaries: cassette.summaries.clone(),
            next: AtomicUsize::new(0),
        }
    }
}

impl Model for ReplaySummarizer {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn capabilities(&self) -> ModelCapabilities {
        ModelCapabilities::default()
    }

    fn stream<'a>(
        &'a self,
        _request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let text = self.summaries.get(index).cloned().unwrap_or_default();
        Box::pin(futures::stream::iter([
            Ok(StreamEvent::TextDelta(text)),
            Ok(StreamEvent::Usage(Usage::default())),
            Ok(StreamEvent::Stop {
                reason: StopReason::EndTurn,
                response_id: None,
            }),
        ]))
    }
}

/// The recorded outputs, each handed out once. A call finds its output by call id, else by
/// tool and equal arguments, else by tool in recorded order (a live model's calls have new
/// ids and may word arguments differently).
#[derive(Default)]
pub struct RecordedOutputs {
    outputs: Vec<RecordedToolOutput>,
    used: Mutex<HashSet<usize>>,
}

impl RecordedOutputs {
    /// The cassette's outputs.
    pub fn new(cassette: &Cassette) -> Self {
        Self {
            outputs: cassette.tool_outputs.clone(),
            used: Mutex::new(HashSet::new()),
        }
    }

    /// Takes the output recorded for this call, if there is one left.
    fn take(&self, tool: &str, call_id: &str, arguments: &Value) -> Option<ToolResultKind> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let free = |i: &usize| !used.contains(i);
        let of_tool = || {
            self.outputs
                .iter()
                .enumerate()
                .filter(|(_, o)| o.tool == tool)
                .map(|(i, _)| i)
        };
        let found = of_tool()
            .filter(free)
            .find(|&i| self.outputs.get(i).is_some_and(|o| o.call_id == call_id))
            .or_else(|| {
                of_tool().filter(free).find(|&i| {
                    self.outputs
                        .get(i)
                        .is_some_and(|o| &o.arguments == arguments)
                })
            })
            .or_else(|| of_tool().find(free))?;
        used.insert(found);
        self.outputs.get(found).map(|o| o.result.clone())
    }
}

/// A tool with the real tool's contract that answers with the recorded output.
struct ReplayTool {
    real: Arc<dyn DynTool>,
    outputs: Arc<RecordedOutputs>,
}

impl DynTool for ReplayTool {
    fn spec(&self) -> &ToolSpec {
        self.real.spec()
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        let name = &self.real.spec().name;
        let result = match self.outputs.take(name, &ctx.call_id, &args) {
            Some(ToolResultKind::Ok { data, .. }) => Ok(data),
            Some(ToolResultKind::Error {
                code,
                message,
                details,
            }) => {
                let mut error = ToolError::new(code, message);
                error.details = details;
                Err(error)
            }
            None => Err(ToolError::new(
                ToolErrorCode::NotFound,
                format!(
                    "replay: the cassette has no recorded output left for this call of \
                     `{name}` (arguments {args})"
                ),
            )),
        };
        Box::pin(async move { result })
    }

    fn normalize(&self, outcome: &ToolOutcome) -> Option<Observation> {
        self.real.normalize(outcome)
    }
}

/// `real`'s tools, each answering with the recorded outputs instead of acting.
pub fn replay_tools(real: ToolRegistry, outputs: &Arc<RecordedOutputs>) -> ToolRegistry {
    let mut replayed = ToolRegistry::new();
    for name in real.names() {
        if let Some(tool) = real.get(name) {
            let wrapped: Arc<dyn DynTool> = Arc::new(ReplayTool {
                real: Arc::clone(tool),
                outputs: Arc::clone(outputs),
            });
            // The real registry accepted the same contract, so this cannot be refused.
            let _ = replayed.register(wrapped);
        }
    }
    replayed
}

/// The recorded approval decisions: by call id, else by tool in order; a call with no
/// recorded decision waits (the run pauses, as the recorded one would have).
pub struct ReplayApprovals {
    decisions: Vec<RecordedApproval>,
    used: Mutex<HashSet<usize>>,
}

impl ReplayApprovals {
    /// The cassette's decisions.
    pub fn new(cassette: &Cassette) -> Self {
        Self {
            decisions: cassette.approvals.clone(),
            used: Mutex::new(HashSet::new()),
        }
    }
}

#[async_trait]
impl ApprovalHandler for ReplayApprovals {
    async fn decide(&self, _thread_id: &str, call: &ToolCall) -> ApprovalDecision {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let index = self
            .decisions
            .iter()
            .enumerate()
            .filter(|(i, d)| !used.contains(i) && d.tool == call.name)
            .find(|(_, d)| d.call_id == call.id)
            .or_else(|| {
                self.decisions
                    .iter()
                    .enumerate()
                    .find(|(i, d)| !used.contains(i) && d.tool == call.name)
            })
            .map(|(i, _)| i);
        let Some(index) = index else {
            return ApprovalDecision::Defer;
        };
        used.insert(index);
        match self.decisions.get(index) {
            Some(d) if d.approved => ApprovalDecision::Approve,
            Some(d) => ApprovalDecision::Deny {
                reason: d.reason.clone(),
            },
            None => ApprovalDecision::Defer,
        }
    }
}

/// The recorded answers to the agent's questions, in order; none left pauses the run.
pub struct ReplayAnswers {
    answers: Vec<String>,
    next: AtomicUsize,
}

impl ReplayAnswers {
    /// The cassette's answers.
    pub fn new(cassette: &Cassette) -> Self {
        Self {
            answers: cassette.user_answers.clone(),
            next: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl UserInputSource for ReplayAnswers {
    async fn answer(
        &self,
        _thread_id: &str,
        _question: &str,
        _missing_fields: &[String],
    ) -> Option<String> {
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        self.answers.get(index).cloned()
    }
}
