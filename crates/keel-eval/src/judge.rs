//! The LLM judge: [`ModelJudge`] scores a scenario's rubric with any [`keel_core::Model`].
//! It sends the rubric, the scenario input, the final answer and a compact action trace,
//! asks for JSON `{"score": 0..1, "rationale": "..."}` (the schema is sent as the request's
//! `response_schema` and spelled out in the prompt), validates the answer with
//! `jsonschema`, sends the violations back once, and otherwise fails with a
//! [`JudgeError`] — a trial whose judge failed is `judge_error`, never passed.
//!
//! Verdicts are cached on disk by content hash: the file name is the SHA-256 of the judge
//! model spec, the rubric, the input, the answer and the trace, so rerunning a suite whose
//! runs did not change makes no judge call.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_core::model::complete;
use keel_core::{Message, Model, ModelRequest};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::score::{Judge, JudgeError, JudgeVerdict};
use crate::suite::Scenario;
use crate::trace::{CallOutcome, RunTrace};

/// Where verdicts are cached by default (relative to the working directory).
pub const DEFAULT_JUDGE_CACHE: &str = ".keel/eval/judge-cache";

/// At most this many characters of one tool result go into the judge's trace.
const RESULT_CHARS: usize = 300;

/// The JSON Schema of a verdict.
pub fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "rationale": {"type": "string", "minLength": 1}
        },
        "required": ["score", "rationale"],
        "additionalProperties": false
    })
}

/// An LLM judge over a model.
pub struct ModelJudge {
    model: Arc<dyn Model>,
    spec: String,
    cache_dir: Option<PathBuf>,
    validator: jsonschema::Validator,
    schema: Value,
}

impl std::fmt::Debug for ModelJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelJudge")
            .field("spec", &self.spec)
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

impl ModelJudge {
    /// A judge asking `model`, known as `spec` (part of the cache key), caching verdicts
    /// under [`DEFAULT_JUDGE_CACHE`].
    pub fn new(model: Arc<dyn Model>, spec: impl Into<String>) -> Result<Self, JudgeError> {
        let schema = verdict_schema();
        let validator = jsonschema::validator_for(&schema)
            .map_err(|e| JudgeError(format!("the verdict schema does not compile: {e}")))?;
        Ok(Self {
            model,
            spec: spec.into(),
            cache_dir: Some(PathBuf::from(DEFAULT_JUDGE_CACHE)),
            validator,
            schema,
        })
    }

    /// Caches verdicts in `dir` (`None`: no cache).
    #[must_use]
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// The cache key of a judgement (SHA-256, hex).
    pub fn cache_key(&self, rubric: &str, input: &str, answer: &str, trace: &str) -> String {
        let mut hasher = Sha256::new();
        for part in [self.spec.as_str(), rubric, input, answer, trace] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn cached(&self, key: &str) -> Option<JudgeVerdict> {
        let path = self.cache_dir.as_ref()?.join(format!("{key}.json"));
        let text = std::fs::read_to_string(path).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn store(&self, key: &str, verdict: &JudgeVerdict) -> Result<(), JudgeError> {
        let Some(dir) = &self.cache_dir else {
            return Ok(());
        };
        let write = |dir: &Path| -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            let text = serde_json::to_string_pretty(verdict).map_err(std::io::Error::other)?;
            // Written beside the entry and renamed into place: a run killed mid-write, or
            // two trials judging the same content at once, never leave a truncated entry.
            let partial = dir.join(format!(".{key}.{}.tmp", keel_core::new_id("w")));
            std::fs::write(&partial, text)?;
            std::fs::rename(&partial, dir.join(format!("{key}.json"))).inspect_err(|_| {
                let _ = std::fs::remove_file(&partial);
            })
        };
        write(dir).map_err(|e| {
            JudgeError(format!(
                "cannot write the judge cache {}: {e}",
                dir.display()
            ))
        })
    }

    /// The verdict in `answer`, or every way it fails the schema.
    fn check(&self, answer: &str) -> Result<JudgeVerdict, Vec<String>> {
        let value = extract_json(answer)
            .ok_or_else(|| vec!["the answer is not a JSON object".to_string()])?;
        let violations: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(8)
            .map(|error| {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() { "/".into() } else { path };
                format!("at `{path}`: {error}")
            })
            .collect();
        if !violations.is_empty() {
            return Err(violations);
        }
        serde_json::from_value(value).map_err(|e| vec![e.to_string()])
    }

    async fn ask(&self, messages: &[Message]) -> Result<String, JudgeError> {
        let system = "You are a strict, fair evaluator of an AI agent's work. Score how well \
                      the agent's run satisfies the rubric, from 0 (not at all) to 1 (fully).";
        let request = ModelRequest {
            system: Some(system),
            response_schema: Some(&self.schema),
            temperature: Some(0.0),
            ..ModelRequest::new(messages)
        };
        let response = complete(self.model.as_ref(), request).await.map_err(|e| {
            JudgeError(format!(
                "judge model `{}` could not be reached or failed: {e}",
                self.spec
            ))
        })?;
        Ok(response.message.text())
    }
}

/// A compact, deterministic text of the run's actions for the judge (and the cache key).
pub fn compact_trace(trace: &RunTrace) -> String {
    let mut out = String::new();
    for (i, call) in trace.tool_calls.iter().enumerate() {
        let outcome = match &call.outcome {
            CallOutcome::Ok => "ok".to_string(),
            CallOutcome::Error { code, message } => format!("error {code:?}: {message}"),
            CallOutcome::Pending => "no result".to_string(),
        };
        out.push_str(&format!(
            "{}. {}({}) -> {outcome}",
            i + 1,
            call.name,
            call.arguments
        ));
        if let Some(result) = &call.result_text {
            let short: String = result.chars().take(RESULT_CHARS).collect();
            let more = if result.chars().count() > RESULT_CHARS {
                "…"
            } else {
                ""
            };
            out.push_str(&format!(": {short}{more}"));
        }
        out.push('\n');
    }
    if out.is_empty() {
        out.push_str("(no tool calls)\n");
    }
    out.push_str(&format!("run ended: {}", trace.end.as_str()));
    out
}

fn extract_json(answer: &str) -> Option<Value> {
    let text = answer.trim();
    if let Ok(value) = serde_json::from_str(text) {
        return Some(value);
    }
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    serde_json::from_str(text.get(start..=end)?).ok()
}

#[async_trait::async_trait]
impl Judge for ModelJudge {
    async fn judge(
        &self,
        rubric: &str,
        scenario: &Scenario,
        trace: &RunTrace,
    ) -> Result<JudgeVerdict, JudgeError> {
        let actions = compact_trace(trace);
        let answer = trace.answer();
        let key = self.cache_key(rubric, &scenario.input, answer, &actions);
        if let Some(verdict) = self.cached(&key) {
            return Ok(verdict);
        }
        let schema = serde_json::to_string_pretty(&self.schema).unwrap_or_default();
        let prompt = format!(
            "## Rubric\n{rubric}\n\n## The user's request\n{}\n\n## The agent's actions\n{actions}\n\n\
             ## The agent's final answer\n{}\n\n\
             Answer with one JSON object matching this JSON Schema, and nothing else (no prose, \
             no Markdown code fence):\n{schema}",
            scenario.input,
            if answer.is_empty() { "(none)" } else { answer },
        );
        let mut messages = vec![Message::user(prompt)];
        let first = self.ask(&messages).await?;
        let verdict = match self.check(&first) {
            Ok(verdict) => verdict,
            Err(violations) => {
                messages.push(Message::assistant(first));
                messages.push(Message::user(format!(
                    "Your answer does not match the JSON Schema:\n{}\nReply again with only the \
                     corrected JSON object.",
                    violations
                        .iter()
                        .map(|v| format!("- {v}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                )));
                let second = self.ask(&messages).await?;
                self.check(&second).map_err(|violations| {
                    JudgeError(format!(
                        "judge model `{}` gave no valid verdict after one repair: {}",
                        self.spec,
                        violations.join("; ")
                    ))
                })?
            }
        };
        self.store(&key, &verdict)?;
        Ok(verdict)
    }
}
