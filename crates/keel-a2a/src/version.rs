//! Protocol versions: which methods each speaks, the `A2A-Version` header, and writing the
//! data model in each version's shapes.
//!
//! | operation | 0.3 method | 1.0 method |
//! | --- | --- | --- |
//! | send | `message/send` | `SendMessage` |
//! | stream | `message/stream` | `SendStreamingMessage` |
//! | get | `tasks/get` | `GetTask` |
//! | cancel | `tasks/cancel` | `CancelTask` |
//! | resubscribe | `tasks/resubscribe` | `SubscribeToTask` |
//!
//! 1.0 requests carry `A2A-Version: 1.0`; a request without the header is 0.3.

use serde_json::{Map, Value, json};

use crate::types::{
    Artifact, Message, Part, PartContent, SendResult, StreamEvent, Task, TaskArtifactUpdateEvent,
    TaskStatus, TaskStatusUpdateEvent,
};

/// The version header.
pub const VERSION_HEADER: &str = "A2A-Version";

/// A protocol version this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProtocolVersion {
    /// 0.3 (a2a-sdk 0.3.x): slash method names, `kind` discriminators.
    V0_3,
    /// 1.0 (a2a-sdk 1.x): PascalCase methods, ProtoJSON shapes.
    V1_0,
}

/// An operation of the JSON-RPC binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Send a message, answer with a task or message.
    Send,
    /// Send a message, answer with a stream of events.
    Stream,
    /// A task's current state.
    GetTask,
    /// Cancel a task.
    CancelTask,
    /// Follow a running task's events.
    Subscribe,
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 5] = [
        Self::Send,
        Self::Stream,
        Self::GetTask,
        Self::CancelTask,
        Self::Subscribe,
    ];

    /// The method's name in `version`.
    pub fn name(self, version: ProtocolVersion) -> &'static str {
        match (version, self) {
            (ProtocolVersion::V0_3, Self::Send) => "message/send",
            (ProtocolVersion::V0_3, Self::Stream) => "message/stream",
            (ProtocolVersion::V0_3, Self::GetTask) => "tasks/get",
            (ProtocolVersion::V0_3, Self::CancelTask) => "tasks/cancel",
            (ProtocolVersion::V0_3, Self::Subscribe) => "tasks/resubscribe",
            (ProtocolVersion::V1_0, Self::Send) => "SendMessage",
            (ProtocolVersion::V1_0, Self::Stream) => "SendStreamingMessage",
            (ProtocolVersion::V1_0, Self::GetTask) => "GetTask",
            (ProtocolVersion::V1_0, Self::CancelTask) => "CancelTask",
            (ProtocolVersion::V1_0, Self::Subscribe) => "SubscribeToTask",
        }
    }

    /// The method and version a method name belongs to.
    pub fn parse(name: &str) -> Option<(Self, ProtocolVersion)> {
        [ProtocolVersion::V0_3, ProtocolVersion::V1_0]
            .into_iter()
            .flat_map(|v| Self::ALL.into_iter().map(move |m| (m, v)))
            .find(|(m, v)| m.name(*v) == name)
    }

    /// Whether it answers with a stream.
    pub fn streams(self) -> bool {
        matches!(self, Self::Stream | Self::Subscribe)
    }
}

impl ProtocolVersion {
    /// `0.3` or `1.0` (the `A2A-Version` value).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_3 => "0.3",
            Self::V1_0 => "1.0",
        }
    }

    /// Parses `Major.Minor[.patch]` (the patch is ignored); `None` for versions this crate
    /// does not speak.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.trim();
        let minor = parts.next().unwrap_or("0").trim();
        match (major, minor) {
            ("0", "3") => Some(Self::V0_3),
            ("1", "0") => Some(Self::V1_0),
            _ => None,
        }
    }

    /// Writes a send result.
    pub fn encode_send_result(self, result: &SendResult) -> Value {
        match (self, result) {
            (Self::V1_0, SendResult::Task(task)) => json!({ "task": to_value(task) }),
            (Self::V1_0, SendResult::Message(message)) => json!({ "message": to_value(message) }),
            (Self::V0_3, SendResult::Task(task)) => task_v03(task),
            (Self::V0_3, SendResult::Message(message)) => message_v03(message),
        }
    }

    /// Writes a stream item.
    pub fn encode_stream_event(self, event: &StreamEvent) -> Value {
        match (self, event) {
            (Self::V1_0, StreamEvent::Task(task)) => json!({ "task": to_value(task) }),
            (Self::V1_0, StreamEvent::Message(message)) => json!({ "message": to_value(message) }),
            (Self::V1_0, StreamEvent::Status(update)) => {
                json!({ "statusUpdate": to_value(update) })
            }
            (Self::V1_0, StreamEvent::Artifact(update)) => {
                json!({ "artifactUpdate": to_value(update) })
            }
            (Self::V0_3, StreamEvent::Task(task)) => task_v03(task),
            (Self::V0_3, StreamEvent::Message(message)) => message_v03(message),
            (Self::V0_3, StreamEvent::Status(update)) => status_update_v03(update),
            (Self::V0_3, StreamEvent::Artifact(update)) => artifact_update_v03(update),
        }
    }

    /// Writes a task (the result of get and cancel).
    pub fn encode_task(self, task: &Task) -> Value {
        match self {
            Self::V1_0 => to_value(task),
            Self::V0_3 => task_v03(task),
        }
    }

    /// Writes a message (the parameter of send and stream).
    pub fn encode_message(self, message: &Message) -> Value {
        match self {
            Self::V1_0 => to_value(message),
            Self::V0_3 => message_v03(message),
        }
    }
}

impl std::fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn put(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.into(), value);
    }
}

fn part_v03(part: &Part) -> Value {
    let mut map = Map::new();
    let file = |key: &str, value: &str| {
        let mut file = Map::new();
        file.insert(key.into(), Value::String(value.into()));
        put(
            &mut file,
            "mimeType",
            part.media_type.clone().map(Value::String),
        );
        put(&mut file, "name", part.filename.clone().map(Value::String));
        Value::Object(file)
    };
    match &part.content {
        PartContent::Text(text) => {
            map.insert("kind".into(), "text".into());
            map.insert("text".into(), Value::String(text.clone()));
        }
        PartContent::Data(data) => {
            map.insert("kind".into(), "data".into());
            // 0.3 data parts hold an object.
            let data = if data.is_object() {
                data.clone()
            } else {
                json!({ "value": data })
            };
            map.insert("data".into(), data);
        }
        PartContent::Raw(raw) => {
            map.insert("kind".into(), "file".into());
            map.insert("file".into(), file("bytes", raw));
        }
        PartContent::Url(url) => {
            map.insert("kind".into(), "file".into());
            map.insert("file".into(), file("uri", url));
        }
    }
    put(
        &mut map,
        "metadata",
        part.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn parts_v03(parts: &[Part]) -> Value {
    Value::Array(parts.iter().map(part_v03).collect())
}

fn message_v03(message: &Message) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), "message".into());
    map.insert(
        "messageId".into(),
        Value::String(message.message_id.clone()),
    );
    map.insert("role".into(), message.role.as_v03().into());
    map.insert("parts".into(), parts_v03(&message.parts));
    put(
        &mut map,
        "contextId",
        message.context_id.clone().map(Value::String),
    );
    put(
        &mut map,
        "taskId",
        message.task_id.clone().map(Value::String),
    );
    put(
        &mut map,
        "metadata",
        message.metadata.clone().map(Value::Object),
    );
    if !message.reference_task_ids.is_empty() {
        map.insert(
            "referenceTaskIds".into(),
            to_value(&message.reference_task_ids),
        );
    }
    if !message.extensions.is_empty() {
        map.insert("extensions".into(), to_value(&message.extensions));
    }
    Value::Object(map)
}

fn status_v03(status: &TaskStatus) -> Value {
    let mut map = Map::new();
    map.insert("state".into(), status.state.as_v03().into());
    put(
        &mut map,
        "message",
        status.message.as_ref().map(message_v03),
    );
    put(
        &mut map,
        "timestamp",
        status.timestamp.clone().map(Value::String),
    );
    Value::Object(map)
}

fn artifact_v03(artifact: &Artifact) -> Value {
    let mut map = Map::new();
    map.insert(
        "artifactId".into(),
        Value::String(artifact.artifact_id.clone()),
    );
    put(&mut map, "name", artifact.name.clone().map(Value::String));
    put(
        &mut map,
        "description",
        artifact.description.clone().map(Value::String),
    );
    map.insert("parts".into(), parts_v03(&artifact.parts));
    put(
        &mut map,
        "metadata",
        artifact.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn task_v03(task: &Task) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), "task".into());
    map.insert("id".into(), Value::String(task.id.clone()));
    map.insert("contextId".into(), Value::String(task.context_id.clone()));
    map.insert("status".into(), status_v03(&task.status));
    if !task.artifacts.is_empty() {
        map.insert(
            "artifacts".into(),
            Value::Array(task.artifacts.iter().map(artifact_v03).collect()),
        );
    }
    if !task.history.is_empty() {
        map.insert(
            "history".into(),
            Value::Array(task.history.iter().map(message_v03).collect()),
        );
    }
    put(
        &mut map,
        "metadata",
        task.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn status_update_v03(update: &TaskStatusUpdateEvent) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), "status-update".into());
    map.insert("taskId".into(), Value::String(update.task_id.clone()));
    map.insert("contextId".into(), Value::String(update.context_id.clone()));
    map.insert("status".into(), status_v03(&update.status));
    map.insert("final".into(), Value::Bool(update.status.state.ends_turn()));
    put(
        &mut map,
        "metadata",
        update.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn artifact_update_v03(update: &TaskArtifactUpdateEvent) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), "artifact-update".into());
    map.insert("taskId".into(), Value::String(update.task_id.clone()));
    map.insert("contextId".into(), Value::String(update.context_id.clone()));
    map.insert("artifact".into(), artifact_v03(&update.artifact));
    if update.append {
        map.insert("append".into(), Value::Bool(true));
    }
    if update.last_chunk {
        map.insert("lastChunk".into(), Value::Bool(true));
    }
    put(
        &mut map,
        "metadata",
        update.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::types::{Role, TaskState};

    fn sample_task() -> Task {
        Task {
            id: "t1".into(),
            context_id: "c1".into(),
            status: TaskStatus::new(TaskState::InputRequired)
                .with_message(Message::agent("Which city?")),
            artifacts: vec![Artifact {
                artifact_id: "a1".into(),
                name: Some("answer".into()),
                description: None,
                parts: vec![Part::text("hello"), Part::data(json!({"n": 1}))],
                metadata: None,
            }],
            history: vec![Message::user("hi")],
            metadata: None,
        }
    }

    #[test]
    fn both_versions_round_trip_through_the_tolerant_reader() {
        let task = sample_task();
        for version in [ProtocolVersion::V0_3, ProtocolVersion::V1_0] {
            let wire = version.encode_send_result(&SendResult::Task(task.clone()));
            let SendResult::Task(read) = SendResult::from_value(wire.clone()).unwrap() else {
                panic!("not a task: {wire}");
            };
            assert_eq!(read, task, "{version}: {wire}");
        }
        let v03 = ProtocolVersion::V0_3.encode_task(&task);
        assert_eq!(v03["kind"], "task");
        assert_eq!(v03["status"]["state"], "input-required");
        assert_eq!(v03["status"]["message"]["role"], "agent");
        assert_eq!(v03["artifacts"][0]["parts"][0]["kind"], "text");
        let v1 = ProtocolVersion::V1_0.encode_task(&task);
        assert_eq!(v1["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
        assert_eq!(v1["history"][0]["role"], "ROLE_USER");
        assert_eq!(v1["artifacts"][0]["parts"][0], json!({"text": "hello"}));
        assert!(v1.get("kind").is_none());
    }

    #[test]
    fn stream_events_carry_final_in_0_3_and_a_wrapper_in_1_0() {
        let update = TaskStatusUpdateEvent {
            task_id: "t".into(),
            context_id: "c".into(),
            status: TaskStatus::new(TaskState::Completed),
            metadata: None,
        };
        let event = StreamEvent::Status(update);
        let v03 = ProtocolVersion::V0_3.encode_stream_event(&event);
        assert_eq!(v03["final"], true);
        assert_eq!(v03["kind"], "status-update");
        let v1 = ProtocolVersion::V1_0.encode_stream_event(&event);
        assert_eq!(
            v1["statusUpdate"]["status"]["state"],
            "TASK_STATE_COMPLETED"
        );
        for wire in [v03, v1] {
            assert_eq!(StreamEvent::from_value(wire).unwrap(), event);
        }
        let file = json!({"kind": "file", "file": {"uri": "http://x/f.pdf", "mimeType": "application/pdf"}});
        let part: Part = serde_json::from_value(file).unwrap();
        assert_eq!(part.content, PartContent::Url("http://x/f.pdf".into()));
        assert_eq!(part.media_type.as_deref(), Some("application/pdf"));
        assert_eq!(Role::User.as_v03(), "user");
    }

    #[test]
    fn method_names_name_their_version() {
        assert_eq!(
            Method::parse("message/send"),
            Some((Method::Send, ProtocolVersion::V0_3))
        );
        assert_eq!(
            Method::parse("SendStreamingMessage"),
            Some((Method::Stream, ProtocolVersion::V1_0))
        );
        assert_eq!(Method::parse("tasks/list"), None);
        assert_eq!(ProtocolVersion::parse("0.3.0"), Some(ProtocolVersion::V0_3));
        assert_eq!(ProtocolVersion::parse("1.0"), Some(ProtocolVersion::V1_0));
        assert_eq!(ProtocolVersion::parse("0.5"), None);
    }
}
