//! JSON-RPC 2.0 envelopes and the A2A error codes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// Server error.
pub const INTERNAL_ERROR: i64 = -32603;
/// `TaskNotFoundError`.
pub const TASK_NOT_FOUND: i64 = -32001;
/// `TaskNotCancelableError`.
pub const TASK_NOT_CANCELABLE: i64 = -32002;
/// `PushNotificationNotSupportedError`.
pub const PUSH_NOTIFICATION_NOT_SUPPORTED: i64 = -32003;
/// `UnsupportedOperationError`.
pub const UNSUPPORTED_OPERATION: i64 = -32004;
/// `ContentTypeNotSupportedError`.
pub const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
/// `InvalidAgentResponseError`.
pub const INVALID_AGENT_RESPONSE: i64 = -32006;
/// `ExtendedAgentCardNotConfiguredError`.
pub const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
/// `ExtensionSupportRequiredError`.
pub const EXTENSION_SUPPORT_REQUIRED: i64 = -32008;
/// `VersionNotSupportedError`.
pub const VERSION_NOT_SUPPORTED: i64 = -32009;

/// The A2A error name of a code (`TaskNotFoundError`), for messages.
pub fn error_name(code: i64) -> &'static str {
    match code {
        PARSE_ERROR => "JSONParseError",
        INVALID_REQUEST => "InvalidRequestError",
        METHOD_NOT_FOUND => "MethodNotFoundError",
        INVALID_PARAMS => "InvalidParamsError",
        INTERNAL_ERROR => "InternalError",
        TASK_NOT_FOUND => "TaskNotFoundError",
        TASK_NOT_CANCELABLE => "TaskNotCancelableError",
        PUSH_NOTIFICATION_NOT_SUPPORTED => "PushNotificationNotSupportedError",
        UNSUPPORTED_OPERATION => "UnsupportedOperationError",
        CONTENT_TYPE_NOT_SUPPORTED => "ContentTypeNotSupportedError",
        INVALID_AGENT_RESPONSE => "InvalidAgentResponseError",
        EXTENDED_CARD_NOT_CONFIGURED => "ExtendedAgentCardNotConfiguredError",
        EXTENSION_SUPPORT_REQUIRED => "ExtensionSupportRequiredError",
        VERSION_NOT_SUPPORTED => "VersionNotSupportedError",
        _ => "Error",
    }
}

/// A JSON-RPC error object: what a server answers and a client receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{} {code}: {message}", error_name(*code))]
pub struct RpcError {
    /// The code (see the constants of this module).
    pub code: i64,
    /// What went wrong.
    #[serde(default)]
    pub message: String,
    /// Details (1.0: an array of `{"@type": ..}` objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and message.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// `TaskNotFoundError` for `task_id`.
    pub fn task_not_found(task_id: &str) -> Self {
        Self::new(TASK_NOT_FOUND, format!("task `{task_id}` not found"))
            .with_reason("TASK_NOT_FOUND", json!({ "taskId": task_id }))
    }

    /// `TaskNotCancelableError` for `task_id`.
    pub fn not_cancelable(task_id: &str, state: &str) -> Self {
        Self::new(
            TASK_NOT_CANCELABLE,
            format!("task `{task_id}` is {state} and cannot be canceled"),
        )
        .with_reason("TASK_NOT_CANCELABLE", json!({ "taskId": task_id }))
    }

    /// `UnsupportedOperationError`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(UNSUPPORTED_OPERATION, message)
    }

    /// `InvalidParamsError`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    /// `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }

    /// Attaches a `google.rpc.ErrorInfo` detail (the 1.0 error detail form).
    #[must_use]
    pub fn with_reason(mut self, reason: &str, metadata: Value) -> Self {
        self.data = Some(json!([{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "a2a-protocol.org",
            "metadata": metadata,
        }]));
        self
    }
}

/// A JSON-RPC request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcRequest {
    /// Always `2.0`.
    pub jsonrpc: String,
    /// Request id (string or number; absent for notifications).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// The method.
    pub method: String,
    /// The parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl RpcRequest {
    /// A request with a fresh string id.
    pub fn new(method: &str, params: Value) -> Self {
        Self {
            jsonrpc: "2.0".into(),
            id: Some(Value::String(uuid::Uuid::new_v4().to_string())),
            method: method.into(),
            params: Some(params),
        }
    }
}

/// A JSON-RPC response: `result` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcResponse {
    /// Always `2.0`.
    #[serde(default)]
    pub jsonrpc: String,
    /// The request's id.
    #[serde(default)]
    pub id: Option<Value>,
    /// Success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl RpcResponse {
    /// A success.
    pub fn ok(id: Option<Value>, result: Value) -> Self {
        Self {
            jsonrpc: "2.0".into(),
            id,
            result: Some(result),
            error: None,
        }
    }

    /// A failure.
    pub fn err(id: Option<Value>, error: RpcError) -> Self {
        Self {
            jsonrpc: "2.0".into(),
            id,
            result: None,
            error: Some(error),
        }
    }

    /// The result, or the error.
    pub fn into_result(self) -> Result<Value, RpcError> {
        match (self.result, self.error) {
            (_, Some(error)) => Err(error),
            (Some(result), None) => Ok(result),
            (None, None) => Ok(Value::Null),
        }
    }
}
