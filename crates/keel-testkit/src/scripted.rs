//! [`ScriptedModel`]: a deterministic [`Model`] that replays a script of responses — text,
//! tool calls (including deliberately malformed ones), errors and delays — records every
//! request it receives, and can check expectations about those requests.
//!
//! Script files are JSON: either a list of steps or `{"steps": [...]}`. A step:
//!
//! ```json
//! {
//!   "text": "optional answer text (streamed word by word)",
//!   "tool_calls": [
//!     {"name": "calculator", "arguments": {"expression": "2*(3+4)"}},
//!     {"name": "calculator", "arguments_raw": "{not json", "id": "call_7"}
//!   ],
//!   "error": {"kind": "rate_limited", "message": "slow down", "retry_after_ms": 10},
//!   "delay_ms": 50,
//!   "usage": {"input_tokens": 12, "output_tokens": 3},
//!   "expect": {"tool_result_contains": ["14"], "last_user_contains": ["2*(3+4)"]}
//! }
//! ```
//!
//! `expect` is checked against the request that consumes the step; a failed expectation is
//! returned as a model error so the run fails visibly.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use keel_core::message::{Message, Role, ToolCall, Usage};
use keel_core::model::{
    Model, ModelCapabilities, ModelError, ModelErrorKind, ModelRequest, StopReason, StreamEvent,
    ToolChoice,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool call in a script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// Call id (default `call_<step>_<index>`).
    #[serde(default)]
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Arguments as JSON.
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Arguments as raw text, used verbatim (may be invalid JSON on purpose).
    #[serde(default)]
    pub arguments_raw: Option<String>,
}

/// A scripted model failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptError {
    /// The error class (`rate_limited`, `server`, `context_overflow`, ...).
    pub kind: ModelErrorKind,
    /// Message.
    #[serde(default)]
    pub message: Option<String>,
    /// HTTP status to report.
    #[serde(default)]
    pub status: Option<u16>,
    /// Retry-after hint.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
}

/// Expectations checked against the request that consumes a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptExpect {
    /// Each string must appear in some tool result of the request's last message.
    #[serde(default)]
    pub tool_result_contains: Vec<String>,
    /// Each string must appear in the last user message of the request.
    #[serde(default)]
    pub last_user_contains: Vec<String>,
    /// These tools must be offered.
    #[serde(default)]
    pub tools_offered: Vec<String>,
}

/// One scripted response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    /// Answer text.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ScriptToolCall>,
    /// Fail instead of answering.
    #[serde(default)]
    pub error: Option<ScriptError>,
    /// Wait before answering.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Usage to report (default: estimated).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Checks on the request.
    #[serde(default)]
    pub expect: Option<ScriptExpect>,
}

impl ScriptStep {
    /// A text-only answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// One tool call with JSON arguments.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            tool_calls: vec![ScriptToolCall {
                id: None,
                name: name.into(),
                arguments: Some(arguments),
                arguments_raw: None,
            }],
            ..Self::default()
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Steps(Vec<ScriptStep>),
    // `turns`: the key of `keel mock-llm` scripts, so one file drives both.
    Object {
        #[serde(alias = "turns")]
        steps: Vec<ScriptStep>,
    },
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScriptLoadError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a valid script.
    #[error(
        "invalid script {path}: {source} (expected a JSON list of steps or {{\"steps\": [...]}}; see keel_testkit::scripted docs)"
    )]
    Parse {
        /// Path.
        path: String,
        /// Cause.
        source: serde_json::Error,
    },
}

/// A request as the scripted model received it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedRequest {
    /// System prompt.
    pub system: Option<String>,
    /// Messages.
    pub messages: Vec<Message>,
    /// Names of the tools offered.
    pub tools: Vec<String>,
    /// Tool choice.
    pub tool_choice: ToolChoice,
    /// The offered tools the runtime said it would refuse now (call rules).
    pub withheld_tools: Vec<String>,
    /// The offered tools the call rules still expected (their declared sequence).
    pub expected_tools: Vec<String>,
    /// What the grounded arguments of the offered tools could cite (call rules).
    pub grounded_arguments: Vec<keel_core::GroundedArgument>,
}

impl RecordedRequest {
    /// All tool result contents of the request, in order.
    pub fn tool_result_contents(&self) -> Vec<&str> {
        self.messages
            .iter()
            .flat_map(|m| m.tool_results())
            .map(|r| r.content.as_str())
            .collect()
    }
}

/// A model that replays a script.
#[derive(Debug)]
pub struct ScriptedModel {
    name: String,
    steps: Vec<ScriptStep>,
    next: AtomicUsize,
    requests: Mutex<Vec<RecordedRequest>>,
    capabilities: ModelCapabilities,
}

impl ScriptedModel {
    /// A model replaying these steps.
    pub fn new(steps: Vec<ScriptStep>) -> Self {
        Self {
            name: "scripted".into(),
            steps,
            next: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            capabilities: ModelCapabilities::default(),
        }
    }

    /// Loads a script file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ScriptLoadError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptLoadError::Io {
            path: shown.clone(),
            source,
        })?;
        let file: ScriptFile =
            serde_json::from_str(&text).map_err(|source| ScriptLoadError::Parse {
                path: shown.clone(),
                source,
            })?;
        let steps = match file {
            ScriptFile::Steps(steps) | ScriptFile::Object { steps } => steps,
        };
        let mut model = Self::new(steps);
        model.name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scripted".into());
        Ok(model)
    }

    /// Overrides the reported capabilities (e.g. a small context window).
    pub fn with_capabilities(mut self, capabilities: ModelCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock_requests().clone()
    }

    /// Steps not yet consumed.
    pub fn remaining(&self) -> usize {
        self.steps
            .len()
            .saturating_sub(self.next.load(Ordering::SeqCst))
    }

    /// Panics unless every step was consumed. A test assertion helper.
    #[allow(clippy::panic)] // An assertion for tests: failing loudly is the point.
    pub fn assert_consumed(&self) {
        let remaining = self.remaining();
        if remaining > 0 {
            panic!(
                "scripted model: {remaining} of {} steps were never requested",
                self.steps.len()
            );
        }
    }

    fn lock_requests(&self) -> std::sync::MutexGuard<'_, Vec<RecordedRequest>> {
        match self.requests.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

fn check_expectations(expect: &ScriptExpect, request: &RecordedRequest) -> Result<(), String> {
    let last_results: Vec<&str> = request
        .messages
        .last()
        .map(|m| m.tool_results().map(|r| r.content.as_str()).collect())
        .unwrap_or_default();
    for needle in &expect.tool_result_contains {
        if !last_results
            .iter()
            .any(|content| content.contains(needle.as_str()))
        {
            return Err(format!(
                "expected a tool result containing {needle:?}; the last message's tool results were {last_results:?}"
            ));
        }
    }
    let last_user = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(Message::text)
        .unwrap_or_default();
    for needle in &expect.last_user_contains {
        if !last_user.contains(needle.as_str()) {
            return Err(format!(
                "expected the last user message to contain {needle:?}; it was {last_user:?}"
            ));
        }
    }
    for tool in &expect.tools_offered {
        if !request.tools.contains(tool) {
            return Err(format!(
                "expected tool {tool:?} to be offered; offered: {:?}",
                request.tools
            ));
        }
    }
    Ok(())
}

fn step_events(index: usize, step: &ScriptStep, estimated_input: u64) -> Vec<StreamEvent> {
    let mut events = Vec::new();
    let mut output_chars = 0usize;
    if let Some(text) = &step.text {
        output_chars += text.len();
        for word in text.split_inclusive(' ') {
            events.push(StreamEvent::TextDelta(word.to_string()));
        }
    }
    for (call_index, call) in step.tool_calls.iter().enumerate() {
        let arguments = match (&call.arguments_raw, &call.arguments) {
            (Some(raw), _) => raw.clone(),
            (None, Some(value)) => value.to_string(),
            (None, None) => "{}".to_string(),
        };
        output_chars += arguments.len() + call.name.len();
        let id = call
            .id
            .clone()
            .unwrap_or_else(|| format!("call_{index}_{call_index}"));
        events.push(StreamEvent::ToolCallDelta {
            index: u32::try_from(call_index).unwrap_or(u32::MAX),
            id: Some(id.clone()),
            name: Some(call.name.clone()),
            arguments_delta: arguments.clone(),
        });
        events.push(StreamEvent::ToolCall(ToolCall {
            id,
            name: call.name.clone(),
            arguments,
        }));
    }
    let usage = step.usage.unwrap_or(Usage {
        input_tokens: estimated_input,
        output_tokens: (output_chars as u64).div_ceil(4).max(1),
        ..Usage::default()
    });
    events.push(StreamEvent::Usage(usage));
    let reason = if step.tool_calls.is_empty() {
        StopReason::EndTurn
    } else {
        StopReason::ToolUse
    };
    events.push(StreamEvent::Stop {
        reason,
        response_id: Some(format!("scripted_{index}")),
    });
    events
}

impl Model for ScriptedModel {
    fn id(&self) -> String {
        format!("script:{}", self.name)
    }

    fn capabilities(&self) -> ModelCapabilities {
        self.capabilities
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let recorded = RecordedRequest {
            system: request.system.map(str::to_string),
            messages: request.messages.to_vec(),
            tools: request.tools.iter().map(|t| t.name.clone()).collect(),
            tool_choice: request.tool_choice.clone(),
            withheld_tools: request.withheld_tools.to_vec(),
            expected_tools: request.expected_tools.to_vec(),
            grounded_arguments: request.grounded_arguments.to_vec(),
        };
        let estimated_input = self.estimate_tokens(&request);
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let step = self.steps.get(index).cloned();
        let expectation = step
            .as_ref()
            .and_then(|s| s.expect.as_ref())
            .map(|expect| check_expectations(expect, &recorded))
            .unwrap_or(Ok(()));
        self.lock_requests().push(recorded);
        let total = self.steps.len();
        Box::pin(
            futures::stream::once(async move {
                let Some(step) = step else {
                    return vec![Err(ModelError::new(
                        ModelErrorKind::Other,
                        format!("scripted model: script exhausted (it has {total} steps; request {} has none)", index + 1),
                    ))];
                };
                if let Some(ms) = step.delay_ms {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                if let Err(message) = expectation {
                    return vec![Err(ModelError::new(
                        ModelErrorKind::Other,
                        format!("script step {} expectation failed: {message}", index + 1),
                    ))];
                }
                if let Some(error) = &step.error {
                    let mut model_error = ModelError::new(
                        error.kind,
                        error.message.clone().unwrap_or_else(|| format!("scripted {}", error.kind)),
                    )
                    .with_retry_after_ms(error.retry_after_ms);
                    model_error.status = error.status;
                    return vec![Err(model_error)];
                }
                step_events(index, &step, estimated_input).into_iter().map(Ok).collect()
            })
            .flat_map(futures::stream::iter),
        )
    }
}
