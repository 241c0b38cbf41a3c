//! MCP message conversion (`keel_mcp::convert`) and the caps applied to what servers send.
//! Input: a server name, a generated MCP `Tool` object and a generated `CallToolResult`.
//! Invariants:
//! - the proxied tool name is always a valid Keel tool name of at most 64 characters;
//! - the spec built from any tool object keeps the tool contract (so no server tool is
//!   dropped for a malformed schema or description);
//! - a call result becomes an object output (or the declared structured content) or a
//!   typed error; inline binary data stays within `MAX_INLINE_BINARY_CHARS`;
//! - capped errors and values stay within their bounds (plus the truncation notice).
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use keel_core::tool::is_tool_name;
use keel_mcp::convert::{
    MAX_ERROR_DETAILS_CHARS, MAX_ERROR_MESSAGE_CHARS, MAX_INLINE_BINARY_CHARS, cap_text,
    cap_tool_error, cap_value, classify_error_text, classify_jsonrpc_error, map_call_result,
    proxied_tool_name, spec_from_mcp_tool,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const VOCAB: &[&str] = &[
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "readOnlyHint",
    "destructiveHint",
    "idempotentHint",
    "openWorldHint",
    "type",
    "object",
    "string",
    "integer",
    "array",
    "properties",
    "required",
    "items",
    "$schema",
    "$id",
    "$ref",
    "enum",
    "additionalProperties",
    "content",
    "text",
    "image",
    "audio",
    "resource",
    "resource_link",
    "uri",
    "mimeType",
    "data",
    "blob",
    "isError",
    "structuredContent",
    "not found",
    "rate limit",
    "invalid arguments",
    "-32602",
    "timeout",
];

/// Room for the truncation notice `[OUTPUT TRUNCATED: Showing X of Y characters from ...]`.
const NOTICE: usize = 512;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(server) = keel_fuzz::arb_string(&mut u, &["fs", "GitHub", "my-server", "", "a__b"])
    else {
        return;
    };
    let Ok(tool) = keel_fuzz::arb_object(&mut u, VOCAB, 4) else {
        return;
    };
    let Ok(result) = keel_fuzz::arb_object(&mut u, VOCAB, 4) else {
        return;
    };
    let has_output_schema = bool::arbitrary(&mut u).unwrap_or(false);
    let code = i32::arbitrary(&mut u).unwrap_or(0);
    let tool = Value::Object(tool);
    let result = Value::Object(result);

    let remote = tool.get("name").and_then(Value::as_str).unwrap_or("tool");
    let name = proxied_tool_name(&server, remote);
    assert!(
        is_tool_name(&name),
        "`{name}` from {server:?} / {remote:?} is not a tool name"
    );
    assert!(name.len() <= 64, "`{name}` is longer than 64");

    let spec = spec_from_mcp_tool(&name, &server, &tool, Duration::from_secs(30));
    let problems = spec.contract_violations();
    assert!(problems.is_empty(), "{problems:?} for {tool}");

    match map_call_result(&result, has_output_schema, &server, remote) {
        Ok(output) => {
            let structured = result.get("structuredContent").filter(|v| !v.is_null());
            if !(has_output_schema && structured.is_some()) {
                assert!(output.is_object(), "output {output} is not an object");
            }
            for item in output
                .get("content")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(data) = item.get("data_base64").and_then(Value::as_str) {
                    assert!(data.len() <= MAX_INLINE_BINARY_CHARS);
                }
            }
        }
        Err(error) => {
            assert!(!error.message.trim().is_empty());
            let capped = cap_tool_error(error, &name);
            assert!(capped.message.chars().count() <= MAX_ERROR_MESSAGE_CHARS + NOTICE);
            if let Some(details) = &capped.details {
                let size = details.to_string().chars().count();
                assert!(
                    size <= MAX_ERROR_DETAILS_CHARS + 4 * NOTICE,
                    "capped details are {size} characters"
                );
            }
        }
    }
    let _ = classify_error_text(&result.to_string());
    let _ = classify_jsonrpc_error(code, remote);

    // Caps with small limits, so generated values exceed them.
    let max = 16 + usize::from(u.arbitrary::<u8>().unwrap_or(0));
    let text = result.to_string();
    let capped = cap_text(text, max, "fuzz");
    // Caps count characters (what a prompt is made of), not bytes.
    let shown = capped.chars().count();
    assert!(shown <= max + NOTICE, "cap_text gave {shown} for {max}");
    let capped = cap_value(tool.clone(), max, "fuzz").to_string();
    let shown = capped.chars().count();
    assert!(
        shown <= max + 8 * NOTICE,
        "cap_value gave {shown} characters for a cap of {max}"
    );
});
