//! `serve_stdio` round trip driven by Keel's own MCP client.
//!
//! This test binary has no libtest harness: started with `KEEL_MCP_TEST_SERVE=1` it *is*
//! the MCP server (a few typed test tools served by `keel_mcp::serve_stdio`); otherwise it
//! spawns itself in that mode and drives it with `McpManager` (initialize, tools/list,
//! tools/call with valid and invalid arguments, cancellation, oversized errors) and a raw
//! rmcp client (annotations, output schema, unknown tool → -32602). Started with
//! `KEEL_MCP_TEST_LOUD_ERRORS=1` it is instead a bare rmcp server whose one tool answers
//! with a JSON-RPC error carrying megabytes of `data`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use keel_core::{
    CancellationToken, Effect, Tool, ToolContext, ToolError, ToolErrorCode, ToolRegistry, ToolSpec,
};
use keel_mcp::{McpManager, McpServerConfig, McpServerState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddArgs {
    /// First addend.
    a: i64,
    /// Second addend.
    b: i64,
}

#[derive(Serialize, JsonSchema)]
struct AddOutput {
    sum: i64,
}

struct AddNumbers;

impl Tool for AddNumbers {
    type Args = AddArgs;
    type Output = AddOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "add_numbers",
            "Adds two integers.",
            "Call with {a, b}; returns {sum}.",
        )
    }

    async fn call(&self, args: AddArgs, _ctx: &ToolContext) -> Result<AddOutput, ToolError> {
        let sum = args
            .a
            .checked_add(args.b)
            .ok_or_else(|| ToolError::invalid_input("sum overflows i64"))?;
        Ok(AddOutput { sum })
    }
}

#[derive(Deserialize, JsonSchema)]
struct WaitArgs {
    /// File to create when the call is cancelled.
    marker: String,
}

#[derive(Serialize, JsonSchema)]
struct WaitOutput {
    finished: bool,
}

struct WaitForCancel;

impl Tool for WaitForCancel {
    type Args = WaitArgs;
    type Output = WaitOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "wait_for_cancel",
            "Waits until cancelled.",
            "Test tool; never finishes on its own.",
        )
        .with_effect(Effect::Mutating)
    }

    async fn call(&self, args: WaitArgs, ctx: &ToolContext) -> Result<WaitOutput, ToolError> {
        tokio::select! {
            _ = ctx.cancel.cancelled() => {
                std::fs::write(&args.marker, "cancelled").map_err(|e| ToolError::new(ToolErrorCode::ToolBug, e.to_string()))?;
                Err(ToolError::new(ToolErrorCode::Cancelled, "cancelled"))
            }
            _ = tokio::time::sleep(Duration::from_secs(25)) => Ok(WaitOutput { finished: true }),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

/// Fails with a megabyte of message and details.
struct FailLoudly;

impl Tool for FailLoudly {
    type Args = NoArgs;
    type Output = serde_json::Value;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "fail_loudly",
            "Fails with a huge error.",
            "Test tool; always fails.",
        )
    }

    async fn call(
        &self,
        _args: NoArgs,
        _ctx: &ToolContext,
    ) -> Result<serde_json::Value, ToolError> {
        Err(
            ToolError::new(ToolErrorCode::ToolBug, "m".repeat(1_000_000))
                .with_details(json!({"dump": "d".repeat(1_000_000)})),
        )
    }
}

#[derive(Serialize, JsonSchema)]
struct KeyOutput {
    idempotency_key: String,
}

/// Answers with the idempotency key its call was given on the server's side.
struct EchoKey;

impl Tool for EchoKey {
    type Args = NoArgs;
    type Output = KeyOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "echo_key",
            "Returns the call's idempotency key.",
            "Call with {}; returns {idempotency_key}.",
        )
        .with_effect(Effect::Mutating)
    }

    async fn call(&self, _args: NoArgs, ctx: &ToolContext) -> Result<KeyOutput, ToolError> {
        Ok(KeyOutput {
            idempotency_key: ctx.idempotency_key.clone(),
        })
    }
}

fn registry() -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    registry.register_typed(AddNumbers).unwrap();
    registry.register_typed(EchoKey).unwrap();
    registry.register_typed(WaitForCancel).unwrap();
    registry.register_typed(FailLoudly).unwrap();
    registry
}

/// A bare rmcp server with one tool, `jsonrpc_error`, that answers every call with a
/// JSON-RPC error whose message and `data` are a megabyte each.
struct LoudErrors;

impl rmcp::ServerHandler for LoudErrors {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(
            rmcp::model::ServerCapabilities::builder()
                .enable_tools()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let schema = json!({"type": "object", "properties": {}});
        let tool = rmcp::model::Tool::new(
            "jsonrpc_error",
            "Always fails with a JSON-RPC error.",
            std::sync::Arc::new(schema.as_object().unwrap().clone()),
        );
        Ok(rmcp::model::ListToolsResult {
            tools: vec![tool],
            ..Default::default()
        })
    }

    async fn call_tool(
        &self,
        _request: rmcp::model::CallToolRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        Err(rmcp::ErrorData::internal_error(
            "x".repeat(1_000_000),
            Some(json!({"trace": "y".repeat(1_000_000)})),
        ))
    }
}

fn ctx(call_id: &str) -> ToolContext {
    ToolContext::new("thr", "run", call_id, CancellationToken::new())
}

fn server_config() -> McpServerConfig {
    let exe = std::env::current_exe().unwrap().display().to_string();
    McpServerConfig::stdio("keel", exe, Vec::<String>::new()).with_env("KEEL_MCP_TEST_SERVE", "1")
}

async fn round_trip_with_keel_client() {
    let manager = McpManager::connect_all([server_config()]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    assert_eq!(
        status.tools,
        vec![
            "keel__add_numbers",
            "keel__echo_key",
            "keel__fail_loudly",
            "keel__wait_for_cancel"
        ]
    );
    assert_eq!(
        status
            .server_info
            .as_deref()
            .map(|s| s.starts_with("keel ")),
        Some(true),
        "{status:#?}"
    );
    // Keel's client prefers the discovery-based protocol when the server has it.
    assert_eq!(
        status.protocol_version.as_deref(),
        Some("2026-07-28"),
        "{status:#?}"
    );

    let tools = manager.tools();
    let add = tools
        .iter()
        .find(|t| t.spec().name == "keel__add_numbers")
        .unwrap();
    assert_eq!(add.spec().effect, Effect::ReadOnly);
    assert!(add.spec().output_schema.is_some());
    assert_eq!(add.spec().input_schema["required"], json!(["a", "b"]));

    let out = add.call(json!({"a": 2, "b": 3}), &ctx("v1")).await.unwrap();
    assert_eq!(out, json!({"sum": 5}));

    // The call's durable key reaches the server (`_meta`), the same on every attempt.
    let echo = tools
        .iter()
        .find(|t| t.spec().name == "keel__echo_key")
        .unwrap();
    let mut keyed = ctx("k1");
    keyed.idempotency_key = "thr_exact:call_9".into();
    for _ in 0..2 {
        let out = echo.call(json!({}), &keyed).await.unwrap();
        assert_eq!(out, json!({"idempotency_key": "thr_exact:call_9"}));
    }

    let error = add
        .call(json!({"a": "two", "b": 3}), &ctx("v2"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error:?}");
    assert!(error.message.contains("input schema"), "{error:?}");
    let error = add.call(json!({"a": 1}), &ctx("v3")).await.unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error:?}");

    // A megabyte of error text and details reaches the log and the prompt capped.
    let loud = tools
        .iter()
        .find(|t| t.spec().name == "keel__fail_loudly")
        .unwrap();
    let error = loud.call(json!({}), &ctx("v5")).await.unwrap_err();
    assert_eq!(
        error.code,
        ToolErrorCode::ToolBug,
        "{}",
        &error.message[..200]
    );
    assert_capped(&error);

    // Cancellation reaches the served tool as notifications/cancelled.
    let wait = tools
        .iter()
        .find(|t| t.spec().name == "keel__wait_for_cancel")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let marker: PathBuf = dir.path().join("cancelled");
    let context = ctx("v4");
    let cancel = context.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let error = wait
        .call(json!({"marker": marker.display().to_string()}), &context)
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Cancelled);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "the server never saw notifications/cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    manager.shutdown().await;
}

/// Servers that only speak older revisions are reached through the `initialize`
/// handshake at the version they offer.
async fn older_protocol_versions() {
    for version in ["2025-11-25", "2025-06-18", "2025-03-26"] {
        let config = server_config().with_env("KEEL_MCP_TEST_MAX_VERSION", version);
        let manager = McpManager::connect_all([config]).await;
        let status = &manager.statuses()[0];
        assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
        assert_eq!(
            status.protocol_version.as_deref(),
            Some(version),
            "{status:#?}"
        );
        let tools = manager.tools();
        let add = tools
            .iter()
            .find(|t| t.spec().name == "keel__add_numbers")
            .unwrap();
        let out = add
            .call(json!({"a": 1, "b": 2}), &ctx("old"))
            .await
            .unwrap();
        assert_eq!(out, json!({"sum": 3}), "{version}");
        manager.shutdown().await;
    }
}

fn assert_capped(error: &ToolError) {
    assert!(
        error.message.len() < 9_000,
        "message of {} bytes",
        error.message.len()
    );
    assert!(
        error
            .message
            .contains("[OUTPUT TRUNCATED: Showing 8,192 of "),
        "{}",
        &error.message[error.message.len() - 200..]
    );
    let details = error.details.as_ref().unwrap().to_string();
    assert!(details.len() < 9_000, "details of {} bytes", details.len());
    assert!(details.contains("[OUTPUT TRUNCATED: Showing "), "{details}");
}

/// JSON-RPC errors (message and `error.data`) are capped too.
async fn jsonrpc_error_data_is_capped() {
    let config = server_config().with_env("KEEL_MCP_TEST_LOUD_ERRORS", "1");
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    let tool = manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "keel__jsonrpc_error")
        .unwrap();
    let error = tool.call(json!({}), &ctx("loud")).await.unwrap_err();
    assert_eq!(
        error.code,
        ToolErrorCode::ToolBug,
        "{}",
        &error.message[..200]
    );
    assert!(error.message.starts_with("MCP error -32603: xxx"));
    assert_capped(&error);
    let details = error.details.as_ref().unwrap();
    assert_eq!(details["jsonrpc_code"], -32603);
    assert!(
        details["data"]
            .as_str()
            .unwrap()
            .contains("{\"trace\":\"yyy")
    );
    manager.shutdown().await;
}

async fn raw_protocol_checks() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;

    let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
    cmd.env("KEEL_MCP_TEST_SERVE", "1");
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let tools = client.peer().list_all_tools().await.unwrap();
    let tools = serde_json::to_value(&tools).unwrap();
    let add = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "add_numbers")
        .unwrap();
    assert_eq!(add["annotations"]["readOnlyHint"], true, "{add}");
    assert_eq!(add["outputSchema"]["type"], "object", "{add}");
    assert!(
        add["description"]
            .as_str()
            .unwrap()
            .contains("returns {sum}"),
        "{add}"
    );
    let wait = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "wait_for_cancel")
        .unwrap();
    assert_eq!(wait["annotations"]["destructiveHint"], true, "{wait}");

    let mut params = CallToolRequestParams::new("add_numbers");
    params.arguments = Some(json!({"a": 20, "b": 22}).as_object().unwrap().clone());
    let result = serde_json::to_value(client.call_tool(params).await.unwrap()).unwrap();
    assert_eq!(result["structuredContent"], json!({"sum": 42}), "{result}");
    assert_eq!(result["content"][0]["text"], "{\"sum\":42}", "{result}");

    let mut params = CallToolRequestParams::new("add_numbers");
    params.arguments = Some(json!({"a": "x"}).as_object().unwrap().clone());
    let result = serde_json::to_value(client.call_tool(params).await.unwrap()).unwrap();
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["structuredContent"]["error"]["code"], "invalid_input",
        "{result}"
    );

    let error = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await
        .unwrap_err();
    match error {
        rmcp::ServiceError::McpError(data) => assert_eq!(data.code.0, -32602, "{data:?}"),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    client.cancel().await.unwrap();
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("KEEL_MCP_TEST_SERVE").is_some() {
        if std::env::var_os("KEEL_MCP_TEST_LOUD_ERRORS").is_some() {
            runtime
                .block_on(async {
                    use rmcp::ServiceExt;
                    let running = LoudErrors.serve(rmcp::transport::stdio()).await?;
                    running.waiting().await?;
                    Ok::<_, Box<dyn std::error::Error>>(())
                })
                .unwrap();
            return;
        }
        match std::env::var("KEEL_MCP_TEST_MAX_VERSION") {
            Ok(max) => {
                let server =
                    keel_mcp::KeelMcpServer::new(registry()).with_max_protocol_version(&max);
                runtime
                    .block_on(keel_mcp::serve(server, rmcp::transport::stdio()))
                    .unwrap();
            }
            Err(_) => runtime.block_on(keel_mcp::serve_stdio(registry())).unwrap(),
        }
        return;
    }
    // `cargo test -- --list` and filters: behave like a single test named serve_roundtrip.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("serve_roundtrip: test");
        return;
    }
    if let Some(filter) = args.iter().find(|a| !a.starts_with('-'))
        && !"serve_roundtrip".contains(filter.as_str())
    {
        return;
    }
    runtime.block_on(async {
        round_trip_with_keel_client().await;
        raw_protocol_checks().await;
        older_protocol_versions().await;
        jsonrpc_error_data_is_capped().await;
    });
    println!("test serve_roundtrip ... ok");
}
