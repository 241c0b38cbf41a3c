//! The JSON-RPC endpoint: parsing, version negotiation, dispatch to the backend, and the
//! answers (JSON or an SSE stream) in the request's protocol version.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;

use super::{CallContext, Inner, TaskRun};
use crate::jsonrpc::{
    self, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, RpcError, RpcRequest,
    RpcResponse,
};
use crate::types::{Message, SendResult, StreamEvent};
use crate::version::{Method, ProtocolVersion, VERSION_HEADER};

fn json_response(status: StatusCode, response: &RpcResponse) -> Response {
    (status, axum::Json(response)).into_response()
}

fn error_response(id: Option<Value>, error: RpcError) -> Response {
    json_response(StatusCode::OK, &RpcResponse::err(id, error))
}

/// `POST /a2a/{agent}`.
pub(crate) async fn handle(
    State(inner): State<Arc<Inner>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            return error_response(
                None,
                RpcError::new(PARSE_ERROR, format!("invalid JSON: {e}")),
            );
        }
    };
    let id = value
        .get("id")
        .cloned()
        .filter(|id| id.is_string() || id.is_number());
    let request: RpcRequest = match serde_json::from_value(value) {
        Ok(request) => request,
        Err(e) => {
            return error_response(
                id,
                RpcError::new(INVALID_REQUEST, format!("not a JSON-RPC request: {e}")),
            );
        }
    };
    if request.jsonrpc != "2.0" {
        return error_response(
            id,
            RpcError::new(INVALID_REQUEST, "`jsonrpc` must be \"2.0\""),
        );
    }
    let Some((method, version)) = Method::parse(&request.method) else {
        return error_response(
            id,
            RpcError::new(
                METHOD_NOT_FOUND,
                format!(
                    "method `{}` not found; this agent answers SendMessage, SendStreamingMessage, \
                     GetTask, CancelTask, SubscribeToTask (A2A 1.0) and message/send, \
                     message/stream, tasks/get, tasks/cancel, tasks/resubscribe (0.3)",
                    request.method
                ),
            ),
        );
    };
    if let Err(error) = negotiate(&headers, method, version) {
        return error_response(id, error);
    }
    let Some(_descriptor) = inner.agent(&agent) else {
        let names: Vec<String> = inner.backend.agents().into_iter().map(|a| a.name).collect();
        return json_response(
            StatusCode::NOT_FOUND,
            &RpcResponse::err(
                id,
                RpcError::new(
                    METHOD_NOT_FOUND,
                    format!(
                        "no agent `{agent}` is served here; agents: {}",
                        names.join(", ")
                    ),
                ),
            ),
        );
    };
    let ctx = CallContext {
        agent,
        version,
        headers,
        extensions,
    };
    let params = request.params.unwrap_or(Value::Null);
    match method {
        Method::Send => match send(&inner, &ctx, &params).await {
            Ok(result) => json_response(
                StatusCode::OK,
                &RpcResponse::ok(id, version.encode_send_result(&result)),
            ),
            Err(error) => error_response(id, error),
        },
        Method::Stream | Method::Subscribe => {
            let run = match method {
                Method::Stream => match message_param(&params) {
                    Ok(message) => inner.backend.send_message(&ctx, message).await,
                    Err(error) => Err(error),
                },
                _ => match task_id_param(&params) {
                    Ok(task_id) => inner.backend.subscribe(&ctx, &task_id).await,
                    Err(error) => Err(error),
                },
            };
            match run {
                Ok(run) => sse_response(id, version, run, inner.keep_alive),
                Err(error) => error_response(id, error),
            }
        }
        Method::GetTask => {
            let result = match task_id_param(&params) {
                Ok(task_id) => inner.backend.get_task(&ctx, &task_id).await,
                Err(error) => Err(error),
            };
            match result {
                Ok(mut task) => {
                    task.truncate_history(history_length(&params));
                    json_response(
                        StatusCode::OK,
                        &RpcResponse::ok(id, version.encode_task(&task)),
                    )
                }
                Err(error) => error_response(id, error),
            }
        }
        Method::CancelTask => {
            let result = match task_id_param(&params) {
                Ok(task_id) => inner.backend.cancel_task(&ctx, &task_id).await,
                Err(error) => Err(error),
            };
            match result {
                Ok(task) => json_response(
                    StatusCode::OK,
                    &RpcResponse::ok(id, version.encode_task(&task)),
                ),
                Err(error) => error_response(id, error),
            }
        }
    }
}

/// Checks the `A2A-Version` header against the method's version: an unknown version is
/// refused, and 1.0 methods need `A2A-Version: 1.0` (no header means 0.3).
fn negotiate(
    headers: &HeaderMap,
    method: Method,
    version: ProtocolVersion,
) -> Result<(), RpcError> {
    let header = headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    let requested = match header {
        None => ProtocolVersion::V0_3,
        Some(text) => ProtocolVersion::parse(text).ok_or_else(|| {
            RpcError::new(
                jsonrpc::VERSION_NOT_SUPPORTED,
                format!("A2A version `{text}` is not supported; supported versions: 0.3, 1.0"),
            )
            .with_reason(
                "VERSION_NOT_SUPPORTED",
                serde_json::json!({ "supportedVersions": ["0.3", "1.0"] }),
            )
        })?,
    };
    if version == ProtocolVersion::V1_0 && requested != ProtocolVersion::V1_0 {
        return Err(RpcError::new(
            jsonrpc::VERSION_NOT_SUPPORTED,
            format!(
                "`{}` is an A2A 1.0 method: send the header `A2A-Version: 1.0` (without it a \
                 request is 0.3, whose method is `{}`)",
                method.name(ProtocolVersion::V1_0),
                method.name(ProtocolVersion::V0_3)
            ),
        ));
    }
    Ok(())
}

fn message_param(params: &Value) -> Result<Message, RpcError> {
    let message = params
        .get("message")
        .cloned()
        .ok_or_else(|| RpcError::invalid_params("`params.message` is required"))?;
    let message: Message = serde_json::from_value(message)
        .map_err(|e| RpcError::invalid_params(format!("`params.message`: {e}")))?;
    if message.parts.is_empty() {
        return Err(RpcError::invalid_params("`params.message.parts` is empty"));
    }
    Ok(message)
}

fn task_id_param(params: &Value) -> Result<String, RpcError> {
    params
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "`params.id` (the task id) is required"))
}

fn history_length(params: &Value) -> Option<u32> {
    params
        .get("historyLength")
        .or_else(|| params.pointer("/configuration/historyLength"))
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Whether a send waits for its task: 1.0 `returnImmediately` (default false), 0.3
/// `blocking` (default true).
fn blocking(params: &Value) -> bool {
    let config = params.get("configuration");
    let flag = |key| config.and_then(|c| c.get(key)).and_then(Value::as_bool);
    match (flag("returnImmediately"), flag("blocking")) {
        (Some(immediately), _) => !immediately,
        (None, Some(blocking)) => blocking,
        (None, None) => true,
    }
}

async fn send(inner: &Inner, ctx: &CallContext, params: &Value) -> Result<SendResult, RpcError> {
    let message = message_param(params)?;
    let TaskRun {
        mut task,
        mut events,
    } = inner.backend.send_message(ctx, message).await?;
    if blocking(params) && !task.status.state.ends_turn() {
        let deadline = tokio::time::sleep(inner.blocking_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(event) => {
                        task.apply(&event);
                        if task.status.state.ends_turn() {
                            break;
                        }
                    }
                    None => break,
                },
                () = &mut deadline => break,
            }
        }
        // The backend's snapshot is the whole task (history included).
        if let Ok(snapshot) = inner.backend.get_task(ctx, &task.id).await {
            task = snapshot;
        }
    }
    task.truncate_history(history_length(params));
    Ok(SendResult::Task(task))
}

enum Frame {
    Event(Box<StreamEvent>),
    KeepAlive,
}

fn sse_response(
    id: Option<Value>,
    version: ProtocolVersion,
    run: TaskRun,
    keep_alive: std::time::Duration,
) -> Response {
    let TaskRun { task, events } = run;
    let done = task.status.state.ends_turn();
    let first = futures::stream::iter([Frame::Event(Box::new(StreamEvent::Task(task)))]);
    let rest: BoxStream<'static, Frame> = if done {
        futures::stream::empty().boxed()
    } else {
        until_turn_ends(events, keep_alive)
    };
    let frames = first.chain(rest).map(move |frame| {
        let text = match frame {
            Frame::KeepAlive => ": keep-alive\n\n".to_string(),
            Frame::Event(event) => {
                let response = RpcResponse::ok(id.clone(), version.encode_stream_event(&event));
                let json = serde_json::to_string(&response).unwrap_or_default();
                format!("data: {json}\n\n")
            }
        };
        Ok::<_, std::convert::Infallible>(Bytes::from(text))
    });
    let mut response = Response::new(Body::from_stream(frames));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The task's events until one ends its turn (terminal or interrupted), with keep-alive
/// frames while it is quiet.
fn until_turn_ends(
    events: BoxStream<'static, crate::types::TaskEvent>,
    keep_alive: std::time::Duration,
) -> BoxStream<'static, Frame> {
    futures::stream::unfold((events, false), move |(mut events, finished)| async move {
        if finished {
            return None;
        }
        tokio::select! {
            event = events.next() => {
                let event = event?;
                let ends = event.state().is_some_and(|s| s.ends_turn());
                Some((Frame::Event(Box::new(event.into())), (events, ends)))
            }
            () = tokio::time::sleep(keep_alive) => Some((Frame::KeepAlive, (events, false))),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_defaults_to_true_in_both_versions() {
        assert!(blocking(&serde_json::json!({})));
        assert!(!blocking(
            &serde_json::json!({"configuration": {"returnImmediately": true}})
        ));
        assert!(!blocking(
            &serde_json::json!({"configuration": {"blocking": false}})
        ));
    }
}
