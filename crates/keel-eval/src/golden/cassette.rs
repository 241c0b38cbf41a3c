//! The cassette: one recorded run as a file — the agent it ran (its recipe, with the agent
//! file relative to the cassette), the user's input, every model response, every tool
//! output, the human decisions, and the action trace replays are held to, plus the
//! differences a replay may show ([`Allowances`]). Written by `keel run --record FILE`
//! ([`Cassette::from_run`] over the run's events) and read by `keel eval replay`.

use std::path::{Component, Path, PathBuf};

use keel_core::{Event, EventKind, Message, Part, StopReason, ToolResultKind, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::trace::{CallOutcome, RunTrace};

/// The format marker and version every cassette carries.
pub const CASSETTE_FORMAT: &str = "keel-cassette/1";

/// One recorded run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cassette {
    /// Always [`CASSETTE_FORMAT`].
    pub format: String,
    /// When it was recorded (RFC 3339), for people; never compared.
    #[serde(default)]
    pub recorded_at: String,
    /// The agent's name when it ran.
    pub agent: String,
    /// The recipe the run recorded (`keel_app::recipe::Recipe` as JSON), with `agent` (an
    /// agent file) relative to the cassette's directory and no base URL or script.
    #[serde(default)]
    pub recipe: Value,
    /// The model the run used (`provider:model`): the replayed run reports the same id.
    pub model: String,
    /// The model's context window when it ran, when known (the replay budgets with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// The user messages that started the run.
    pub input: Vec<String>,
    /// The tools offered to the model (sorted names; control tools excluded).
    #[serde(default)]
    pub tools_offered: Vec<String>,
    /// SHA-256 of the system prompt the run used (a replay notes when it changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_sha256: Option<String>,
    /// Every model response, in order.
    pub model_responses: Vec<RecordedResponse>,
    /// Every tool output, in the order the calls finished.
    #[serde(default)]
    pub tool_outputs: Vec<RecordedToolOutput>,
    /// Summaries the `summarize` context strategy wrote, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summaries: Vec<String>,
    /// Human decisions on calls that needed approval, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<RecordedApproval>,
    /// The user's answers to the agent's questions, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_answers: Vec<String>,
    /// What a replay must reproduce.
    pub expected: ExpectedTrace,
    /// The differences a replay may show.
    #[serde(default)]
    pub allow: Allowances,
}

/// One model response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedResponse {
    /// The 1-based model call of the run it answered.
    pub turn: u32,
    /// The assistant message (text, tool calls, provider items).
    pub message: Message,
    /// Token usage reported.
    #[serde(default)]
    pub usage: Usage,
    /// Why generation stopped.
    pub stop_reason: StopReason,
}

/// One tool output: what the tool answered (after the executor's retries), keyed by its
/// call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedToolOutput {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The call's arguments (the raw text as a JSON string when it was not JSON).
    pub arguments: Value,
    /// The data or typed error.
    #[serde(flatten)]
    pub result: ToolResultKind,
}

/// A human decision on a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedApproval {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Approved (true) or denied.
    pub approved: bool,
    /// Why it was denied, when said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The action trace a replay is held to: tool names, order, arguments and outcomes, the
/// end state and the final text. Ids and timestamps are not part of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpectedTrace {
    /// The calls in the order the runner accepted them.
    pub calls: Vec<ExpectedCall>,
    /// `done`, `failed`, …, `awaiting_approval`, `awaiting_user`, `incomplete`.
    pub end_state: String,
    /// The run's final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<String>,
}

/// One call of the expected trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpectedCall {
    /// The tool as the model named it.
    pub tool: String,
    /// The arguments.
    pub arguments: Value,
    /// `ok`, `error:<code>` or `pending`.
    pub outcome: String,
}

/// The differences a replay may show without failing. Ids (thread, run, call, trace,
/// response) and timestamps are never compared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allowances {
    /// The final text may differ.
    #[serde(default)]
    pub final_text: bool,
    /// Argument fields that may differ, each `TOOL:/json/pointer` (`*:/pointer` for every
    /// tool).
    #[serde(default)]
    pub arguments: Vec<String>,
}

impl Allowances {
    /// Checks every `arguments` entry's form; the message names the entry and the fix.
    pub fn validate(&self) -> Result<(), String> {
        for entry in &self.arguments {
            let Some((tool, pointer)) = entry.split_once(':') else {
                return Err(format!(
                    "allowed argument difference `{entry}` needs the form TOOL:/json/pointer \
                     (e.g. file_risk_report:/findings, or *:/pointer for every tool)"
                ));
            };
            if tool.is_empty() || !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(format!(
                    "allowed argument difference `{entry}` needs the form TOOL:/json/pointer \
                     (the pointer starts with `/`)"
                ));
            }
        }
        Ok(())
    }

    /// The pointers that may differ in calls of `tool`.
    pub fn pointers_for<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.arguments.iter().filter_map(move |entry| {
            let (name, pointer) = entry.split_once(':')?;
            (name == tool || name == "*").then_some(pointer)
        })
    }

    /// These allowances plus `more`'s.
    pub fn merged(&self, more: &Allowances) -> Allowances {
        let mut arguments = self.arguments.clone();
        for entry in &more.arguments {
            if !arguments.contains(entry) {
                arguments.push(entry.clone());
            }
        }
        Allowances {
            final_text: self.final_text || more.final_text,
            arguments,
        }
    }
}

/// Why a cassette could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CassetteError {
    /// The file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file is not a cassette this version reads.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line when the JSON parser knew it.
        message: String,
    },
    /// The events do not hold a run to record.
    #[error("nothing to record: {0}")]
    NoRun(String),
}

/// `outcome` of an expected call, from a traced one.
pub fn outcome_label(outcome: &CallOutcome) -> String {
    match outcome {
        CallOutcome::Ok => "ok".into(),
        CallOutcome::Error { code, .. } => format!("error:{code}"),
        CallOutcome::Pending => "pending".into(),
    }
}

impl ExpectedTrace {
    /// The action trace of `trace`.
    pub fn of(trace: &RunTrace) -> Self {
        Self {
            calls: trace
                .tool_calls
                .iter()
                .map(|call| ExpectedCall {
                    tool: call.name.clone(),
                    arguments: call.arguments.clone(),
                    outcome: outcome_label(&call.outcome),
                })
                .collect(),
            end_state: trace.end.as_str().to_string(),
            final_text: trace.final_text.clone(),
        }
    }
}

impl Cassette {
    /// Records the run `run_id` of a thread's events (all of them, as the store returns
    /// them): from its `RunStarted` to its end or the end of the log. `cassette_path` is
    /// where the file will live (the agent file is stored relative to its directory).
    pub fn from_run(
        events: &[Event],
        run_id: &str,
        cassette_path: &Path,
        recorded_at: String,
    ) -> Result<Self, CassetteError> {
        let run: Vec<Event> = events
            .iter()
            .filter(|e| &*e.run_id == run_id)
            .cloned()
            .collect();
        let Some((agent, model, definition)) = run.iter().find_map(|e| match &e.kind {
            EventKind::RunStarted {
                agent,
                model,
                definition,
                ..
            } => Some((agent.clone(), model.clone(), definition.clone())),
            _ => None,
        }) else {
            return Err(CassetteError::NoRun(format!(
                "run {run_id} has no run_started event in the log"
            )));
        };
        if run
            .iter()
            .any(|e| matches!(e.kind, EventKind::Handoff { .. }))
        {
            return Err(CassetteError::NoRun(
                "the run handed the conversation to another agent; cassettes record one \
                 agent's run (record the agents of a handoff group one at a time)"
                    .into(),
            ));
        }
        let tools_offered = definition
            .as_ref()
            .map(|d| d.fingerprint.tools.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        let system_prompt_sha256 = definition
            .as_ref()
            .map(|d| d.fingerprint.system_prompt_sha256.clone());
        let recipe = definition
            .map(|d| portable_recipe(d.recipe, cassette_path))
            .unwrap_or(Value::Null);
        let mut cassette = Cassette {
            format: CASSETTE_FORMAT.into(),
            recorded_at,
            agent,
            recipe,
            model,
            context_window: None,
            input: Vec::new(),
            tools_offered,
            system_prompt_sha256,
            model_responses: Vec::new(),
            tool_outputs: Vec::new(),
            summaries: Vec::new(),
            approvals: Vec::new(),
            user_answers: Vec::new(),
            expected: ExpectedTrace::of(&RunTrace::from_events(&run)),
            allow: Allowances::default(),
        };
        let mut arguments_by_call = std::collections::HashMap::new();
        let mut tools_by_call = std::collections::HashMap::new();
        for event in &run {
            match &event.kind {
                EventKind::UserMessage { message } if cassette.model_responses.is_empty() => {
                    cassette.input.push(message.text());
                }
                EventKind::ModelRequested { context_window, .. }
                    if cassette.context_window.is_none() =>
                {
                    cassette.context_window = context_window.and_then(|w| u32::try_from(w).ok());
                }
                EventKind::ModelResponded {
                    turn,
                    message,
                    usage,
                    stop_reason,
                    ..
                } => cassette.model_responses.push(RecordedResponse {
                    turn: *turn,
                    message: message.clone(),
                    usage: *usage,
                    stop_reason: *stop_reason,
                }),
                EventKind::ToolCallRequested { call, .. } => {
                    let arguments = call
                        .parse_arguments()
                        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                    arguments_by_call.insert(call.id.clone(), arguments);
                    tools_by_call.insert(call.id.clone(), call.name.clone());
                }
                EventKind::ToolCallFinished { result } => {
                    cassette.tool_outputs.push(RecordedToolOutput {
                        call_id: result.call_id.clone(),
                        tool: result.name.clone(),
                        arguments: arguments_by_call
                            .get(&result.call_id)
                            .cloned()
                            .unwrap_or(Value::Null),
                        result: result.outcome.result.clone(),
                    });
                }
                EventKind::ApprovalGranted { call_id, .. } => {
                    cassette.approvals.push(RecordedApproval {
                        call_id: call_id.clone(),
                        tool: tools_by_call.get(call_id).cloned().unwrap_or_default(),
                        approved: true,
                        reason: None,
                    });
                }
                EventKind::ApprovalDenied {
                    call_id, reason, ..
                } => {
                    cassette.approvals.push(RecordedApproval {
                        call_id: call_id.clone(),
                        tool: tools_by_call.get(call_id).cloned().unwrap_or_default(),
                        approved: false,
                        reason: reason.clone(),
                    });
                }
                EventKind::UserAnswered { answer } => cassette.user_answers.push(answer.clone()),
                EventKind::Compacted { messages, .. } => {
                    cassette.summaries.extend(messages.iter().flat_map(|m| {
                        m.parts.iter().filter_map(|p| match p {
                            Part::Summary { text, .. } => Some(text.clone()),
                            _ => None,
                        })
                    }));
                }
                _ => {}
            }
        }
        if cassette.model_responses.is_empty() {
            return Err(CassetteError::NoRun(format!(
                "run {run_id} made no model call, so there is nothing to replay"
            )));
        }
        Ok(cassette)
    }

    /// Reads a cassette; errors name the file (and the line of a JSON error).
    pub fn load(path: &Path) -> Result<Self, CassetteError> {
        let text = std::fs::read_to_string(path).map_err(|e| CassetteError::Io {
            path: path.to_path_buf(),
            message: format!("cannot read the cassette: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses a cassette's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, CassetteError> {
        let invalid = |message: String| CassetteError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| {
            invalid(format!(
                "line {}, column {}: not valid JSON: {e}",
                e.line(),
                e.column()
            ))
        })?;
        match value.get("format").and_then(Value::as_str) {
            Some(CASSETTE_FORMAT) => {}
            Some(other) => {
                return Err(invalid(format!(
                    "`format` is `{other}`; this keel reads `{CASSETTE_FORMAT}` (record it again \
                     with `keel run --record`)"
                )));
            }
            None => {
                return Err(invalid(format!(
                    "no `format` field: not a keel cassette (expected `\"format\": \
                     \"{CASSETTE_FORMAT}\"`; record one with `keel run --record FILE`)"
                )));
            }
        }
        let cassette: Cassette = serde_json::from_str(text)
            .map_err(|e| invalid(format!("line {}, column {}: {e}", e.line(), e.column())))?;
        cassette.allow.validate().map_err(invalid)?;
        Ok(cassette)
    }

    /// Writes the cassette as pretty JSON (atomically: a temporary file renamed into place).
    pub fn save(&self, path: &Path) -> Result<(), CassetteError> {
        let io = |message: String| CassetteError::Io {
            path: path.to_path_buf(),
            message,
        };
        let mut json = serde_json::to_string_pretty(self)
            .map_err(|e| io(format!("cannot serialize the cassette: {e}")))?;
        json.push('\n');
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| io(format!("cannot create {}: {e}", dir.display())))?;
        }
        let temporary = path.with_extension("json.partial");
        std::fs::write(&temporary, json).map_err(|e| io(format!("cannot write: {e}")))?;
        std::fs::rename(&temporary, path).map_err(|e| io(format!("cannot write: {e}")))
    }

    /// The agent file the recipe names, resolved against the cassette's directory.
    pub fn agent_file(&self, cassette_path: &Path) -> Option<PathBuf> {
        let file = self.recipe.get("agent").and_then(Value::as_str)?;
        let file = Path::new(file);
        if file.is_absolute() {
            return Some(file.to_path_buf());
        }
        let dir = cassette_path.parent().unwrap_or_else(|| Path::new("."));
        Some(dir.join(file))
    }
}

/// The recipe with what a replay must not use (base URL, script, the submission id)
/// removed and the agent file made relative to the cassette's directory, so a cassette
/// committed to a repository replays from any clone.
fn portable_recipe(mut recipe: Value, cassette_path: &Path) -> Value {
    if let Some(object) = recipe.as_object_mut() {
        for key in ["base_url", "script", "submission"] {
            object.remove(key);
        }
        let relative = object
            .get("agent")
            .and_then(Value::as_str)
            .map(|file| relative_to(Path::new(file), cassette_dir(cassette_path).as_path()));
        if let Some(relative) = relative {
            object.insert(
                "agent".into(),
                Value::String(relative.to_string_lossy().into_owned()),
            );
        }
    }
    recipe
}

/// The cassette's directory as an absolute path.
fn cassette_dir(cassette_path: &Path) -> PathBuf {
    let dir = cassette_path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// `path` relative to the directory `base` (both absolute), with `..` where needed; `path`
/// unchanged when either is relative. (Hand-written: the standard library has no relative
/// path operation, and one function does not justify a dependency.)
fn relative_to(path: &Path, base: &Path) -> PathBuf {
    if !path.is_absolute() || !base.is_absolute() {
        return path.to_path_buf();
    }
    let path_parts: Vec<Component> = path.components().collect();
    let base_parts: Vec<Component> = base.components().collect();
    let common = path_parts
        .iter()
        .zip(&base_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = PathBuf::new();
    for _ in common..base_parts.len() {
        relative.push("..");
    }
    for part in path_parts.iter().skip(common) {
        relative.push(part.as_os_str());
    }
    relative
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_out_of_the_base() {
        assert_eq!(
            relative_to(
                Path::new("/r/agents/d/agent.toml"),
                Path::new("/r/agents/d/eval/golden")
            ),
            PathBuf::from("../../agent.toml")
        );
        assert_eq!(
            relative_to(Path::new("/r/a.toml"), Path::new("/r")),
            PathBuf::from("a.toml")
        );
        assert_eq!(
            relative_to(Path::new("x.toml"), Path::new("/r")),
            PathBuf::from("x.toml")
        );
    }

    #[test]
    fn allowances_name_the_bad_entry() {
        let bad = Allowances {
            final_text: false,
            arguments: vec!["file_risk_report/findings".into()],
        };
        let error = bad.validate().unwrap_err();
        assert!(error.contains("file_risk_report/findings"), "{error}");
        let good = Allowances {
            final_text: true,
            arguments: vec!["file_risk_report:/findings".into(), "*:/note".into()],
        };
        good.validate().unwrap();
        let pointers: Vec<&str> = good.pointers_for("file_risk_report").collect();
        assert_eq!(pointers, ["/findings", "/note"]);
        assert_eq!(good.pointers_for("other").count(), 1);
    }

    #[test]
    fn a_file_without_the_format_marker_is_refused_with_the_fix() {
        let error = Cassette::parse("{\"agent\": \"x\"}", Path::new("c.json")).unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("c.json: no `format` field"), "{text}");
        assert!(text.contains("keel run --record"), "{text}");
        let error = Cassette::parse("{\n  \"format\": ", Path::new("c.json")).unwrap_err();
        assert!(error.to_string().contains("line 2"), "{error}");
    }
}
