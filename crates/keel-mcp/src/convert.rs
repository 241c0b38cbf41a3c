//! Pure translations between MCP and Keel: tool names, schemas, specs, call results and
//! errors. Nothing here does I/O, so every rule is unit-tested directly.

use std::time::Duration;

use keel_core::tool::suggest_snake_case;
use keel_core::{ApprovalMode, Effect, RetryPolicy, ToolError, ToolErrorCode, ToolSpec};
use serde_json::{Map, Value, json};

/// Largest base64 payload of an image/audio/blob kept in a tool's output; larger ones are
/// replaced by their size (a model cannot read base64 anyway, and it would eat the
/// payload cap).
pub const MAX_INLINE_BINARY_CHARS: usize = 64 * 1024;

/// The Keel name of tool `tool` of server `server`: `<server>__<tool>`, both halves
/// sanitized to `lowercase_snake_case`, at most 64 characters (long names are shortened
/// with a stable hash suffix so they stay unique).
pub fn proxied_tool_name(server: &str, tool: &str) -> String {
    let server = truncate_name(&suggest_snake_case(server), 24);
    let tool_name = suggest_snake_case(tool);
    let full = format!("{server}__{tool_name}");
    if full.len() <= 64 {
        return full;
    }
    let hash = format!("{:08x}", fnv1a(tool) as u32);
    let room = 64usize.saturating_sub(server.len() + 2 + 1 + hash.len());
    let head = truncate_name(&tool_name, room);
    format!("{server}__{head}_{hash}")
}

fn truncate_name(name: &str, max: usize) -> String {
    name.chars()
        .take(max)
        .collect::<String>()
        .trim_end_matches('_')
        .to_string()
}

fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Makes an MCP input schema acceptable to every provider and to Keel's registry:
/// drops `$schema`, forces `"type": "object"`, adds empty `properties`, drops a malformed
/// `required`. A schema that is still not a valid JSON Schema becomes a permissive
/// object schema (the server still validates its own arguments).
pub fn normalize_input_schema(schema: &Value) -> Value {
    let mut map = match schema {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    map.remove("$schema");
    map.remove("$id");
    map.insert("type".into(), Value::String("object".into()));
    match map.get("properties") {
        Some(Value::Object(_)) => {}
        _ => {
            map.insert("properties".into(), json!({}));
        }
    }
    if let Some(required) = map.get("required")
        && !required
            .as_array()
            .is_some_and(|items| items.iter().all(Value::is_string))
    {
        map.remove("required");
    }
    let normalized = Value::Object(map);
    if jsonschema::meta::validate(&normalized).is_ok() {
        normalized
    } else {
        json!({"type": "object", "properties": {}, "additionalProperties": true})
    }
}

/// Keeps an MCP output schema (without `$schema`) when it is a valid JSON Schema.
pub fn normalize_output_schema(schema: Option<&Value>) -> Option<Value> {
    let Value::Object(map) = schema? else {
        return None;
    };
    let mut map = map.clone();
    map.remove("$schema");
    map.remove("$id");
    let normalized = Value::Object(map);
    jsonschema::meta::validate(&normalized)
        .is_ok()
        .then_some(normalized)
}

/// Effect and approval from MCP tool annotations: `readOnlyHint` → read-only;
/// `destructiveHint` → mutating with approval always (even when also idempotent: a human
/// approves it, and it runs alone); `idempotentHint` → idempotent; no hints → mutating
/// without approval (MCP's defaults say an unannotated tool may change the world, so it
/// is never silently repeated, see [`retry_for_effect`]).
pub fn effect_from_annotations(annotations: Option<&Value>) -> (Effect, ApprovalMode) {
    let hint = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .and_then(Value::as_bool)
    };
    if hint("readOnlyHint") == Some(true) {
        (Effect::ReadOnly, ApprovalMode::Never)
    } else if hint("destructiveHint") == Some(true) {
        (Effect::Mutating, ApprovalMode::Always)
    } else if hint("idempotentHint") == Some(true) {
        (Effect::Idempotent, ApprovalMode::Never)
    } else {
        (Effect::Mutating, ApprovalMode::Never)
    }
}

/// The `_meta` key of a `tools/call` request that carries the call's idempotency key:
/// the key fixed by the call's durable start (`thread:call`), the same on every attempt
/// and every resume. A server that deduplicates effects can take it (Keel's own `keel mcp
/// serve` does); others ignore an unknown `_meta` key, as the protocol says they must.
pub const IDEMPOTENCY_KEY_META: &str = "dev.keel/idempotencyKey";

/// The longest idempotency key a served call accepts from a client's `_meta`.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 512;

/// The `_meta` of a `tools/call` carrying `key` ([`IDEMPOTENCY_KEY_META`]).
pub fn idempotency_meta(key: &str) -> rmcp::model::RequestMetaObject {
    let mut map = serde_json::Map::new();
    map.insert(IDEMPOTENCY_KEY_META.into(), Value::String(key.to_string()));
    rmcp::model::RequestMetaObject(rmcp::model::MetaObject(map))
}

/// The idempotency key a client sent in a `tools/call`'s `_meta`, when it sent a usable
/// one (a non-empty string of at most [`MAX_IDEMPOTENCY_KEY_LEN`] bytes).
pub fn idempotency_key_from_meta(meta: Option<&rmcp::model::RequestMetaObject>) -> Option<String> {
    let key = meta?.0.0.get(IDEMPOTENCY_KEY_META)?.as_str()?;
    (!key.trim().is_empty() && key.len() <= MAX_IDEMPOTENCY_KEY_LEN).then(|| key.to_string())
}

/// The executor's retry policy for an MCP tool with this effect.
///
/// Keel retries a mutating call only when the tool honours the call's idempotency key
/// (and then with the same key). The key goes to every server in `_meta`
/// ([`IDEMPOTENCY_KEY_META`]), but MCP has no way for a server to say it honours it, so a
/// mutating MCP tool gets exactly one attempt: a retryable failure (timeout, server
/// restart) comes back as data, and the model or the run's policy decides whether to
/// repeat a call that may already have taken effect. Read-only and idempotent tools can be
/// repeated safely, so they get one extra attempt, which covers a server restarted
/// between calls.
pub fn retry_for_effect(effect: Effect) -> RetryPolicy {
    match effect {
        Effect::ReadOnly | Effect::Idempotent => RetryPolicy {
            max_attempts: 2,
            base_delay_ms: 250,
            max_delay_ms: 2_000,
        },
        Effect::Mutating => RetryPolicy::none(),
    }
}

/// Builds the Keel spec of an MCP tool (`tool` is the MCP `Tool` object as JSON).
pub fn spec_from_mcp_tool(
    keel_name: &str,
    server: &str,
    tool: &Value,
    call_timeout: Duration,
) -> ToolSpec {
    let remote = tool
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(keel_name);
    let annotations = tool.get("annotations");
    let title = tool
        .get("title")
        .and_then(Value::as_str)
        .or_else(|| {
            annotations
                .and_then(|a| a.get("title"))
                .and_then(Value::as_str)
        })
        .filter(|t| !t.trim().is_empty());
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .or_else(|| title.map(str::to_string))
        .unwrap_or_else(|| format!("Tool `{remote}` of the MCP server `{server}`."));
    let input_schema = normalize_input_schema(tool.get("inputSchema").unwrap_or(&Value::Null));
    let output_schema = normalize_output_schema(tool.get("outputSchema"));
    let (effect, approval) = effect_from_annotations(annotations);
    let usage = usage_guidance(
        keel_name,
        server,
        remote,
        title,
        &description,
        annotations,
        &input_schema,
    );
    let retry = retry_for_effect(effect);
    ToolSpec::new(keel_name, description, usage)
        .with_input_schema(input_schema)
        .with_output_schema(output_schema)
        .with_effect(effect)
        .with_approval(approval)
        .with_timeout(call_timeout)
        .with_retry(retry)
}

fn usage_guidance(
    keel_name: &str,
    server: &str,
    remote: &str,
    title: Option<&str>,
    description: &str,
    annotations: Option<&Value>,
    input_schema: &Value,
) -> String {
    let heading = title
        .map(|t| format!("{keel_name} ({t})"))
        .unwrap_or_else(|| keel_name.to_string());
    let mut out = format!(
        "{heading} — Usage Guide\nProvided by the MCP server `{server}` (remote tool `{remote}`).\n{description}\n"
    );
    let hint = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .and_then(Value::as_bool)
    };
    let mut hints = Vec::new();
    match hint("readOnlyHint") {
        Some(true) => hints.push("read-only: safe to call whenever useful"),
        _ => hints.push("may change state: call it only when the task needs that change"),
    }
    if hint("readOnlyHint") != Some(true) && hint("destructiveHint") == Some(true) {
        hints.push("destructive: a human must approve each call");
    }
    if hint("idempotentHint") == Some(true) {
        hints.push("idempotent: repeating the same call has no further effect");
    }
    if hint("openWorldHint") == Some(true) {
        hints.push("open world: talks to systems outside this machine");
    }
    out.push_str(&format!("Behaviour: {}.\n", hints.join("; ")));
    let required: Vec<&str> = input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if required.is_empty() {
        out.push_str("Arguments: a JSON object matching the input schema.\n");
    } else {
        out.push_str(&format!(
            "Arguments: a JSON object matching the input schema; required: {}.\n",
            required.join(", ")
        ));
    }
    let repeatable = hint("readOnlyHint") == Some(true)
        || (hint("destructiveHint") != Some(true) && hint("idempotentHint") == Some(true));
    if repeatable {
        out.push_str(
            "Errors come back as data with a code (invalid_input: fix the arguments; \
             retryable_server or timeout: try again later).",
        );
    } else {
        out.push_str(
            "Errors come back as data with a code (invalid_input: fix the arguments; \
             retryable_server or timeout: the change may already have been made, so check \
             before calling again). Failed calls are not repeated automatically.",
        );
    }
    out
}

pub use keel_core::cap::{
    MAX_ERROR_DETAILS_CHARS, MAX_ERROR_MESSAGE_CHARS, cap_text, cap_tool_error, cap_value,
};

/// Maps one MCP content block to Keel's JSON output form.
fn map_content_block(block: &Value) -> Value {
    let kind = block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let text = |key: &str| block.get(key).and_then(Value::as_str).map(str::to_string);
    match kind {
        "text" => json!({"type": "text", "text": text("text").unwrap_or_default()}),
        "image" | "audio" => binary_item(kind, text("mimeType"), text("data"), None),
        "resource" => {
            let resource = block.get("resource").cloned().unwrap_or(Value::Null);
            let field = |key: &str| {
                resource
                    .get(key)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            match field("text") {
                Some(body) => json!({
                    "type": "resource",
                    "uri": field("uri"),
                    "mime_type": field("mimeType"),
                    "text": body,
                }),
                None => binary_item("resource", field("mimeType"), field("blob"), field("uri")),
            }
        }
        "resource_link" => json!({
            "type": "resource_link",
            "uri": text("uri"),
            "name": text("name"),
            "mime_type": text("mimeType"),
            "description": text("description"),
        }),
        _ => block.clone(),
    }
}

fn binary_item(
    kind: &str,
    mime: Option<String>,
    data: Option<String>,
    uri: Option<String>,
) -> Value {
    let data = data.unwrap_or_default();
    let mut item = Map::new();
    item.insert("type".into(), Value::String(kind.into()));
    if let Some(uri) = uri {
        item.insert("uri".into(), Value::String(uri));
    }
    item.insert(
        "mime_type".into(),
        mime.map(Value::String).unwrap_or(Value::Null),
    );
    item.insert("size_bytes".into(), json!(data.len() / 4 * 3));
    if data.len() <= MAX_INLINE_BINARY_CHARS {
        item.insert("data_base64".into(), Value::String(data));
    } else {
        item.insert("data_omitted".into(), Value::Bool(true));
    }
    Value::Object(item)
}

/// The joined text of all text blocks (and text resources) of a result.
fn joined_text(content: &[Value]) -> String {
    content
        .iter()
        .filter_map(|item| item.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Turns a `CallToolResult` (as JSON) into a tool's output or a typed error.
///
/// Success: the `structuredContent` itself when the tool declares an output schema (so
/// Keel validates it against that schema), otherwise `{"content": [...]}` plus
/// `"structured_content"` when the server sent one. `isError: true` becomes a
/// [`ToolError`] whose code is read from the error text ([`classify_error_text`]).
pub fn map_call_result(
    result: &Value,
    has_output_schema: bool,
    server: &str,
    remote_tool: &str,
) -> Result<Value, ToolError> {
    let content: Vec<Value> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| blocks.iter().map(map_content_block).collect())
        .unwrap_or_default();
    let structured = result.get("structuredContent").filter(|v| !v.is_null());
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = joined_text(&content);
        let code = classify_error_text(&text);
        let message = if text.trim().is_empty() {
            format!(
                "MCP tool `{remote_tool}` of server `{server}` reported an error without a message"
            )
        } else {
            text
        };
        let mut details = json!({"server": server, "tool": remote_tool, "content": content});
        if let (Some(structured), Value::Object(map)) = (structured, &mut details) {
            map.insert("structured_content".into(), structured.clone());
        }
        return Err(ToolError::new(code, message).with_details(details));
    }
    if has_output_schema && let Some(structured) = structured {
        return Ok(structured.clone());
    }
    let mut out = Map::new();
    out.insert("content".into(), Value::Array(content));
    if let Some(structured) = structured {
        out.insert("structured_content".into(), structured.clone());
    }
    Ok(Value::Object(out))
}

/// Reads an error code from the text of an `isError` result. MCP gives tool errors only as
/// text, so this looks for the usual phrases; anything unrecognized is `tool_bug`.
pub fn classify_error_text(text: &str) -> ToolErrorCode {
    let t = text.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| t.contains(n));
    if any(&[
        "-32602",
        "input validation",
        "invalid arguments",
        "invalid params",
        "validation error",
    ]) {
        ToolErrorCode::InvalidInput
    } else if any(&["unauthorized", "unauthenticated", "401"]) {
        ToolErrorCode::Unauthorized
    } else if any(&[
        "access denied",
        "permission denied",
        "outside allowed",
        "not allowed",
        "forbidden",
        "eacces",
        "eperm",
    ]) {
        ToolErrorCode::Forbidden
    } else if any(&[
        "not found",
        "no such file",
        "enoent",
        "does not exist",
        "unknown tool",
    ]) {
        ToolErrorCode::NotFound
    } else if any(&["rate limit", "too many requests", "429"]) {
        ToolErrorCode::RateLimited
    } else if any(&["timed out", "timeout"]) {
        ToolErrorCode::Timeout
    } else if any(&["invalid", "must be", "expected"]) {
        ToolErrorCode::InvalidInput
    } else {
        ToolErrorCode::ToolBug
    }
}

/// Maps a JSON-RPC error of a `tools/call` to the taxonomy.
pub fn classify_jsonrpc_error(code: i32, message: &str) -> ToolErrorCode {
    match code {
        -32602 if message.to_ascii_lowercase().contains("not found") => ToolErrorCode::NotFound,
        -32602 => ToolErrorCode::InvalidInput,
        -32601 | -32002 => ToolErrorCode::NotFound,
        -32001 => ToolErrorCode::Timeout,
        -32600 | -32700 | -32603 => ToolErrorCode::ToolBug,
        -32099..=-32000 => ToolErrorCode::RetryableServer,
        _ => ToolErrorCode::ToolBug,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_namespaced_and_valid() {
        assert_eq!(
            proxied_tool_name("everything", "get-sum"),
            "everything__get_sum"
        );
        assert_eq!(
            proxied_tool_name("My Server", "readFile"),
            "my_server__read_file"
        );
        let long = proxied_tool_name("server", &"x".repeat(100));
        assert!(long.len() <= 64, "{long}");
        assert!(keel_core::tool::is_tool_name(&long), "{long}");
        assert_ne!(long, proxied_tool_name("server", &"x".repeat(101)));
        for (server, tool) in [("9lives", "__Weird--Name__"), ("a", "b"), ("x-y", "1tool")] {
            let name = proxied_tool_name(server, tool);
            assert!(keel_core::tool::is_tool_name(&name), "{name}");
        }
    }

    #[test]
    fn input_schema_is_normalized() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {"type": "number"}},
            "required": ["a"]
        });
        let normalized = normalize_input_schema(&schema);
        assert!(normalized.get("$schema").is_none());
        assert_eq!(normalized["required"], json!(["a"]));
        assert_eq!(
            normalize_input_schema(&Value::Null),
            json!({"type": "object", "properties": {}})
        );
        let broken =
            normalize_input_schema(&json!({"type": "object", "properties": {"a": {"type": 7}}}));
        assert_eq!(broken["additionalProperties"], json!(true));
    }

    #[test]
    fn annotations_map_to_effects() {
        assert_eq!(
            effect_from_annotations(Some(&json!({"readOnlyHint": true}))).0,
            Effect::ReadOnly
        );
        assert_eq!(
            effect_from_annotations(Some(&json!({"destructiveHint": true}))),
            (Effect::Mutating, ApprovalMode::Always)
        );
        assert_eq!(
            effect_from_annotations(Some(
                &json!({"destructiveHint": false, "idempotentHint": true})
            )),
            (Effect::Idempotent, ApprovalMode::Never)
        );
        assert_eq!(
            effect_from_annotations(None),
            (Effect::Mutating, ApprovalMode::Never)
        );
    }

    #[test]
    fn only_repeatable_tools_are_retried() {
        let spec = |annotations: Value| {
            let tool = json!({"name": "t", "annotations": annotations});
            spec_from_mcp_tool("s__t", "s", &tool, Duration::from_secs(5))
        };
        // No annotations: MCP says the tool may change the world; one attempt only.
        let unannotated = spec(json!({}));
        assert_eq!(unannotated.effect, Effect::Mutating);
        assert_eq!(unannotated.retry.max_attempts, 1, "{unannotated:?}");
        assert!(unannotated.usage.contains("may already have been made"));
        let destructive = spec(json!({"destructiveHint": true, "idempotentHint": true}));
        assert_eq!(destructive.effect, Effect::Mutating);
        assert_eq!(destructive.retry.max_attempts, 1);
        let read_only = spec(json!({"readOnlyHint": true}));
        assert_eq!(read_only.effect, Effect::ReadOnly);
        assert_eq!(read_only.retry.max_attempts, 2);
        assert!(read_only.usage.contains("try again later"));
        let idempotent = spec(json!({"destructiveHint": false, "idempotentHint": true}));
        assert_eq!(idempotent.effect, Effect::Idempotent);
        assert_eq!(idempotent.retry.max_attempts, 2);
    }

    #[test]
    fn server_error_text_and_details_are_capped() {
        let huge = "e".repeat(1_000_000);
        let error = ToolError::new(ToolErrorCode::ToolBug, huge.clone()).with_details(json!({
            "server": "s",
            "tool": "t",
            "jsonrpc_code": -32603,
            "data": {"trace": huge},
        }));
        let error = cap_tool_error(error, "s__t");
        assert!(
            error.message.len() < MAX_ERROR_MESSAGE_CHARS + 200,
            "{}",
            error.message.len()
        );
        assert!(
            error
                .message
                .ends_with("[OUTPUT TRUNCATED: Showing 8,192 of 1,000,000 characters from s__t]"),
            "{}",
            &error.message[error.message.len() - 100..]
        );
        let details = error.details.unwrap();
        assert!(
            details.to_string().len() < MAX_ERROR_DETAILS_CHARS + 300,
            "{}",
            details.to_string().len()
        );
        assert_eq!(details["server"], "s");
        assert_eq!(details["jsonrpc_code"], -32603);
        let data = details["data"].as_str().unwrap();
        assert!(data.contains("characters from s__t (data)]"), "{data}");

        // Small errors are untouched.
        let small = ToolError::new(ToolErrorCode::NotFound, "gone").with_details(json!({"a": 1}));
        assert_eq!(cap_tool_error(small.clone(), "x"), small);
        // A huge non-object value becomes a cut string.
        let cut = cap_value(json!([huge]), 100, "x");
        assert!(cut.as_str().unwrap().len() < 200);
    }

    #[test]
    fn spec_is_compliant_with_usage() {
        let tool = json!({"name": "get-sum", "inputSchema": {"type": "object", "properties": {}}});
        let spec = spec_from_mcp_tool(
            "everything__get_sum",
            "everything",
            &tool,
            Duration::from_secs(5),
        );
        assert!(
            spec.contract_violations().is_empty(),
            "{:?}",
            spec.contract_violations()
        );
        assert!(spec.usage.contains("everything"));
        assert_eq!(spec.timeout_ms, 5_000);
    }

    #[test]
    fn results_map_to_output_or_errors() {
        let ok = json!({"content": [{"type": "text", "text": "hi"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}]});
        let out = map_call_result(&ok, false, "s", "t").unwrap();
        assert_eq!(out["content"][0]["text"], "hi");
        assert_eq!(out["content"][1]["mime_type"], "image/png");
        let structured = json!({"content": [], "structuredContent": {"x": 1}});
        assert_eq!(
            map_call_result(&structured, true, "s", "t").unwrap(),
            json!({"x": 1})
        );
        assert_eq!(
            map_call_result(&structured, false, "s", "t").unwrap()["structured_content"],
            json!({"x": 1})
        );
        let error = json!({"isError": true, "content": [{"type": "text", "text": "Access denied - path outside allowed directories"}]});
        let error = map_call_result(&error, false, "s", "t").unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Forbidden);
        assert_eq!(
            classify_error_text("MCP error -32602: Input validation error"),
            ToolErrorCode::InvalidInput
        );
        assert_eq!(
            classify_error_text("ENOENT: no such file"),
            ToolErrorCode::NotFound
        );
        assert_eq!(classify_error_text("boom"), ToolErrorCode::ToolBug);
        assert_eq!(
            classify_jsonrpc_error(-32602, "bad"),
            ToolErrorCode::InvalidInput
        );
        assert_eq!(
            classify_jsonrpc_error(-32601, "no"),
            ToolErrorCode::NotFound
        );
    }
}
