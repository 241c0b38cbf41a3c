//! The A2A data model: agent cards, messages and parts, tasks, and the events of a task's
//! stream.
//!
//! The Rust types follow protocol 1.0 (the ProtoJSON form of `a2a.proto`: camelCase
//! fields, `TASK_STATE_*` / `ROLE_*` enum names, parts as `{"text": ..}` / `{"data": ..}`
//! / `{"url": ..}` / `{"raw": ..}`), which is what `serde` writes. Reading is tolerant:
//! every type also accepts the 0.3 shapes (`"kind"` discriminators, lower-case
//! `"completed"` / `"user"`, `{"kind": "file", "file": {..}}` parts), and unknown fields
//! are ignored, so one parser reads both versions. Writing 0.3 is [`crate::version`]'s
//! job ([`ProtocolVersion::encode`](crate::ProtocolVersion)).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// Free-form metadata (a JSON object).
pub type Metadata = Map<String, Value>;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The client (`ROLE_USER`, 0.3 `user`).
    User,
    /// The remote agent (`ROLE_AGENT`, 0.3 `agent`).
    Agent,
    /// Not set (`ROLE_UNSPECIFIED`).
    Unspecified,
}

impl Role {
    /// The 1.0 enum name.
    pub fn as_v1(self) -> &'static str {
        match self {
            Self::User => "ROLE_USER",
            Self::Agent => "ROLE_AGENT",
            Self::Unspecified => "ROLE_UNSPECIFIED",
        }
    }

    /// The 0.3 name (`user` / `agent`).
    pub fn as_v03(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::User | Self::Unspecified => "user",
        }
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_v1())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "ROLE_USER" | "user" => Self::User,
            "ROLE_AGENT" | "agent" => Self::Agent,
            "ROLE_UNSPECIFIED" | "" => Self::Unspecified,
            other => return Err(D::Error::custom(format!("unknown role `{other}`"))),
        })
    }
}

/// The state of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Received, not started.
    Submitted,
    /// In progress.
    Working,
    /// Finished successfully (terminal).
    Completed,
    /// Finished with an error (terminal).
    Failed,
    /// Cancelled (terminal).
    Canceled,
    /// The agent declined the task (terminal).
    Rejected,
    /// Paused until the client sends another message (interrupted).
    InputRequired,
    /// Paused until the client authenticates (interrupted).
    AuthRequired,
    /// Unknown or unset.
    Unspecified,
}

impl TaskState {
    /// Every state.
    pub const ALL: [TaskState; 9] = [
        Self::Submitted,
        Self::Working,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
        Self::Rejected,
        Self::InputRequired,
        Self::AuthRequired,
        Self::Unspecified,
    ];

    /// The 1.0 enum name (`TASK_STATE_COMPLETED`).
    pub fn as_v1(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::Rejected => "TASK_STATE_REJECTED",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            Self::Unspecified => "TASK_STATE_UNSPECIFIED",
        }
    }

    /// The 0.3 name (`completed`, `input-required`).
    pub fn as_v03(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Working => "working",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Rejected => "rejected",
            Self::InputRequired => "input-required",
            Self::AuthRequired => "auth-required",
            Self::Unspecified => "unknown",
        }
    }

    /// Parses either version's name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_v1() == name || s.as_v03() == name)
            .or_else(|| (name == "cancelled").then_some(Self::Canceled))
    }

    /// Completed, failed, canceled or rejected: nothing more will happen.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Canceled | Self::Rejected
        )
    }

    /// Input- or auth-required: the task waits for the client.
    pub fn is_interrupted(self) -> bool {
        matches!(self, Self::InputRequired | Self::AuthRequired)
    }

    /// Terminal or interrupted: a blocking send returns, a stream ends.
    pub fn ends_turn(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_v03())
    }
}

impl Serialize for TaskState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_v1())
    }
}

impl<'de> Deserialize<'de> for TaskState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).ok_or_else(|| D::Error::custom(format!("unknown task state `{text}`")))
    }
}

/// What a part carries.
#[derive(Debug, Clone, PartialEq)]
pub enum PartContent {
    /// Text.
    Text(String),
    /// Inline bytes, base64-encoded (0.3 `file.bytes`).
    Raw(String),
    /// A file by URL (0.3 `file.uri`).
    Url(String),
    /// Structured data.
    Data(Value),
}

/// One piece of a message or artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The content.
    pub content: PartContent,
    /// Media type (`text/plain`, `application/json`; 0.3 `file.mimeType`).
    pub media_type: Option<String>,
    /// File name, for files.
    pub filename: Option<String>,
    /// Part metadata.
    pub metadata: Option<Metadata>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: PartContent::Text(text.into()),
            media_type: None,
            filename: None,
            metadata: None,
        }
    }

    /// A structured-data part.
    pub fn data(data: Value) -> Self {
        Self {
            content: PartContent::Data(data),
            media_type: None,
            filename: None,
            metadata: None,
        }
    }

    /// The text of the part as a reader sees it: text as is, data as JSON, files as a
    /// `[file …]` line.
    pub fn as_text(&self) -> String {
        match &self.content {
            PartContent::Text(text) => text.clone(),
            PartContent::Data(data) => data.to_string(),
            PartContent::Url(url) => format!(
                "[file {}{url}]",
                self.filename
                    .as_deref()
                    .map(|n| format!("{n} at "))
                    .unwrap_or_default()
            ),
            PartContent::Raw(raw) => format!(
                "[file {}({} bytes of base64)]",
                self.filename
                    .as_deref()
                    .map(|n| format!("{n} "))
                    .unwrap_or_default(),
                raw.len()
            ),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    raw: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    data: Option<Value>,
    #[serde(default)]
    file: Option<WireFile>,
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    filename: Option<String>,
    #[serde(default, alias = "mimeType")]
    media_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireFile {
    #[serde(default)]
    bytes: Option<String>,
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = WirePart::deserialize(d)?;
        let (mut media_type, mut filename) = (wire.media_type, wire.filename);
        let content = if let Some(file) = wire.file {
            media_type = media_type.or(file.mime_type);
            filename = filename.or(file.name);
            match (file.bytes, file.uri) {
                (Some(bytes), _) => PartContent::Raw(bytes),
                (None, Some(uri)) => PartContent::Url(uri),
                (None, None) => return Err(D::Error::custom("a file part needs bytes or uri")),
            }
        } else if let Some(text) = wire.text {
            PartContent::Text(text)
        } else if let Some(data) = wire.data {
            PartContent::Data(data)
        } else if let Some(url) = wire.url {
            PartContent::Url(url)
        } else if let Some(raw) = wire.raw {
            PartContent::Raw(raw)
        } else {
            return Err(D::Error::custom(format!(
                "a part needs text, data, url, raw or file{}",
                wire.kind
                    .map(|k| format!(" (kind `{k}`)"))
                    .unwrap_or_default()
            )));
        };
        Ok(Self {
            content,
            media_type,
            filename,
            metadata: wire.metadata,
        })
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = Map::new();
        let (key, value) = match &self.content {
            PartContent::Text(text) => ("text", Value::String(text.clone())),
            PartContent::Raw(raw) => ("raw", Value::String(raw.clone())),
            PartContent::Url(url) => ("url", Value::String(url.clone())),
            PartContent::Data(data) => ("data", data.clone()),
        };
        map.insert(key.into(), value);
        if let Some(media_type) = &self.media_type {
            map.insert("mediaType".into(), Value::String(media_type.clone()));
        }
        if let Some(filename) = &self.filename {
            map.insert("filename".into(), Value::String(filename.clone()));
        }
        if let Some(metadata) = &self.metadata {
            map.insert("metadata".into(), Value::Object(metadata.clone()));
        }
        map.serialize(s)
    }
}

/// The text of parts, joined by newlines.
pub fn parts_text(parts: &[Part]) -> String {
    parts
        .iter()
        .map(Part::as_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A message between a client and an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Unique id chosen by the sender.
    pub message_id: String,
    /// The conversation it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task it belongs to (set to continue a task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who wrote it.
    pub role: Role,
    /// The content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Message metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// Tasks this message refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
    /// Extensions used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

impl Message {
    /// A message of one text part, with a fresh id.
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Self {
            message_id: uuid::Uuid::new_v4().to_string(),
            context_id: None,
            task_id: None,
            role,
            parts: vec![Part::text(text)],
            metadata: None,
            reference_task_ids: Vec::new(),
            extensions: Vec::new(),
        }
    }

    /// A user message of one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Self::new(Role::User, text)
    }

    /// An agent message of one text part.
    pub fn agent(text: impl Into<String>) -> Self {
        Self::new(Role::Agent, text)
    }

    /// The text of its parts.
    pub fn text(&self) -> String {
        parts_text(&self.parts)
    }
}

/// A task's state at a moment, with the message that came with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// What the agent said with it (the question of `input-required`, the error of
    /// `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// When (ISO 8601, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

impl TaskStatus {
    /// A status without message or timestamp.
    pub fn new(state: TaskState) -> Self {
        Self {
            state,
            message: None,
            timestamp: None,
        }
    }

    /// With a message.
    #[must_use]
    pub fn with_message(mut self, message: Message) -> Self {
        self.message = Some(message);
        self
    }
}

/// An output of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    pub artifact_id: String,
    /// A name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Artifact metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// A unit of work of an agent: its status, outputs and history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Server-chosen id.
    pub id: String,
    /// The conversation it belongs to.
    #[serde(default)]
    pub context_id: String,
    /// Where it stands.
    pub status: TaskStatus,
    /// Outputs so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Messages exchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// Task metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

impl Task {
    /// The text a reader wants: the artifacts' text, else the status message's.
    pub fn reply_text(&self) -> String {
        let artifacts: Vec<String> = self
            .artifacts
            .iter()
            .map(|a| parts_text(&a.parts))
            .filter(|t| !t.is_empty())
            .collect();
        if artifacts.is_empty() {
            self.status
                .message
                .as_ref()
                .map(Message::text)
                .unwrap_or_default()
        } else {
            artifacts.join("\n")
        }
    }

    /// Applies a stream event to this snapshot (status replaced, artifacts added or
    /// appended to).
    pub fn apply(&mut self, event: &TaskEvent) {
        match event {
            TaskEvent::Status(update) => self.status = update.status.clone(),
            TaskEvent::Artifact(update) => {
                let existing = self
                    .artifacts
                    .iter_mut()
                    .find(|a| a.artifact_id == update.artifact.artifact_id);
                match existing {
                    Some(artifact) if update.append => {
                        artifact.parts.extend(update.artifact.parts.iter().cloned());
                    }
                    Some(artifact) => *artifact = update.artifact.clone(),
                    None => self.artifacts.push(update.artifact.clone()),
                }
            }
        }
    }

    /// Keeps the last `n` history messages (`0`: none; `None`: all).
    pub fn truncate_history(&mut self, n: Option<u32>) {
        if let Some(n) = n {
            let keep = usize::try_from(n).unwrap_or(usize::MAX);
            let drop = self.history.len().saturating_sub(keep);
            self.history.drain(..drop);
        }
    }
}

/// A task's status changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its context.
    #[serde(default)]
    pub context_id: String,
    /// The new status.
    pub status: TaskStatus,
    /// Event metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// A task produced (part of) an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    /// The task.
    pub task_id: String,
    /// Its context.
    #[serde(default)]
    pub context_id: String,
    /// The artifact (or its next chunk).
    pub artifact: Artifact,
    /// Append to an artifact of the same id instead of replacing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
    /// The artifact's last chunk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_chunk: bool,
    /// Event metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// An update of a running task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    /// Its status changed.
    Status(TaskStatusUpdateEvent),
    /// It produced an artifact.
    Artifact(TaskArtifactUpdateEvent),
}

impl TaskEvent {
    /// The new state, for a status event.
    pub fn state(&self) -> Option<TaskState> {
        match self {
            Self::Status(update) => Some(update.status.state),
            Self::Artifact(_) => None,
        }
    }
}

/// What `SendMessage` answers: a task, or a direct message.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    /// A task tracking the work.
    Task(Task),
    /// A direct reply, no task.
    Message(Message),
}

/// One item of a streamed response.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A task snapshot (the first item of a task's stream).
    Task(Task),
    /// A direct reply (the only item of a message stream).
    Message(Message),
    /// A status update.
    Status(TaskStatusUpdateEvent),
    /// An artifact update.
    Artifact(TaskArtifactUpdateEvent),
}

fn field<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

impl StreamEvent {
    /// Reads a stream item of either version: 1.0's `{"task": ..}` / `{"message": ..}` /
    /// `{"statusUpdate": ..}` / `{"artifactUpdate": ..}` wrappers, or 0.3's objects with
    /// their `kind`.
    pub fn from_value(value: Value) -> Result<Self, String> {
        let Value::Object(mut map) = value else {
            return Err("a stream item must be a JSON object".into());
        };
        for key in ["task", "message", "statusUpdate", "artifactUpdate"] {
            if let Some(inner) = map.remove(key).filter(Value::is_object) {
                return Ok(match key {
                    "task" => Self::Task(field(inner)?),
                    "message" => Self::Message(field(inner)?),
                    "statusUpdate" => Self::Status(field(inner)?),
                    _ => Self::Artifact(field(inner)?),
                });
            }
        }
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
        let value = Value::Object(map.clone());
        match kind {
            "task" => Ok(Self::Task(field(value)?)),
            "message" => Ok(Self::Message(field(value)?)),
            "status-update" => Ok(Self::Status(field(value)?)),
            "artifact-update" => Ok(Self::Artifact(field(value)?)),
            _ if map.contains_key("status") && map.contains_key("id") => {
                Ok(Self::Task(field(value)?))
            }
            _ if map.contains_key("messageId") => Ok(Self::Message(field(value)?)),
            other => Err(format!(
                "not an A2A task, message or update (kind `{other}`, keys: {})",
                map.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The task update inside, if it is one.
    pub fn as_task_event(&self) -> Option<TaskEvent> {
        match self {
            Self::Status(update) => Some(TaskEvent::Status(update.clone())),
            Self::Artifact(update) => Some(TaskEvent::Artifact(update.clone())),
            Self::Task(_) | Self::Message(_) => None,
        }
    }
}

impl SendResult {
    /// Reads a `SendMessage` result of either version.
    pub fn from_value(value: Value) -> Result<Self, String> {
        match StreamEvent::from_value(value)? {
            StreamEvent::Task(task) => Ok(Self::Task(task)),
            StreamEvent::Message(message) => Ok(Self::Message(message)),
            StreamEvent::Status(_) | StreamEvent::Artifact(_) => {
                Err("a send result must be a task or a message, not an update".into())
            }
        }
    }
}

impl From<TaskEvent> for StreamEvent {
    fn from(event: TaskEvent) -> Self {
        match event {
            TaskEvent::Status(update) => Self::Status(update),
            TaskEvent::Artifact(update) => Self::Artifact(update),
        }
    }
}
