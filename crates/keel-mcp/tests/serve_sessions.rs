//! `keel_mcp::serve` as a client sees it, over in-memory pipes: idempotency keys are
//! unique per session, tools that need human approval are refused, and a panicking tool
//! answers `tool_bug` while the session goes on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::{ApprovalMode, Effect, Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
use keel_mcp::KeelMcpServer;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Generous bound for one request: a hang (e.g. a request lost to a panic) fails the test
/// instead of blocking it.
const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Serialize, JsonSchema)]
struct Seen {
    call_id: String,
    idempotency_key: String,
}

/// Records the idempotency key of every call, like a tool that deduplicates by key.
struct RecordKey {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Tool for RecordKey {
    type Args = NoArgs;
    type Output = Seen;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "record_key",
            "Records the idempotency key it is called with.",
            "Test tool; returns the call id and idempotency key.",
        )
        .with_effect(Effect::Mutating)
    }

    async fn call(&self, _args: NoArgs, ctx: &ToolContext) -> Result<Seen, ToolError> {
        self.seen.lock().unwrap().push(ctx.idempotency_key.clone());
        Ok(Seen {
            call_id: ctx.call_id.clone(),
            idempotency_key: ctx.idempotency_key.clone(),
        })
    }
}

/// Needs approval for every call; counts the calls that actually ran.
struct NeedsApproval {
    runs: Arc<AtomicUsize>,
}

impl Tool for NeedsApproval {
    type Args = NoArgs;
    type Output = Value;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "delete_everything",
            "Deletes everything.",
            "Test tool; needs approval.",
        )
        .with_effect(Effect::Mutating)
        .with_approval(ApprovalMode::Always)
    }

    async fn call(&self, _args: NoArgs, _ctx: &ToolContext) -> Result<Value, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(json!({"deleted": true}))
    }
}

/// Panics on every call.
struct Explodes;

impl Tool for Explodes {
    type Args = NoArgs;
    type Output = Value;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new("explodes", "Panics.", "Test tool; always panics.")
    }

    async fn call(&self, _args: NoArgs, _ctx: &ToolContext) -> Result<Value, ToolError> {
        panic!("kaboom in the tool");
    }
}

struct Fixture {
    server: KeelMcpServer,
    seen: Arc<Mutex<Vec<String>>>,
    approval_runs: Arc<AtomicUsize>,
}

fn fixture() -> Fixture {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let approval_runs = Arc::new(AtomicUsize::new(0));
    let mut registry = ToolRegistry::new();
    registry
        .register_typed(RecordKey {
            seen: Arc::clone(&seen),
        })
        .unwrap();
    registry
        .register_typed(NeedsApproval {
            runs: Arc::clone(&approval_runs),
        })
        .unwrap();
    registry.register_typed(Explodes).unwrap();
    Fixture {
        server: KeelMcpServer::new(registry),
        seen,
        approval_runs,
    }
}

/// Starts one session of `server` on in-memory pipes and connects a plain rmcp client.
async fn session(server: KeelMcpServer) -> RunningService<rmcp::RoleClient, ()> {
    let (client_side, server_side) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        let _ = keel_mcp::serve(server, server_side).await;
    });
    tokio::time::timeout(REQUEST_DEADLINE, ().serve(client_side))
        .await
        .expect("handshake timed out")
        .expect("handshake failed")
}

async fn call(client: &RunningService<rmcp::RoleClient, ()>, tool: &str) -> Value {
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = Some(serde_json::Map::new());
    let result = tokio::time::timeout(REQUEST_DEADLINE, client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("tools/call {tool} got no answer"))
        .unwrap_or_else(|e| panic!("tools/call {tool} failed: {e}"));
    serde_json::to_value(result).unwrap()
}

/// A client's own key in `_meta` is the call's key, in any session; a blank or oversized
/// one is ignored for the session's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_key_in_meta_is_the_calls_key_in_every_session() {
    let fixture = fixture();
    let keyed = |key: &str| {
        let mut params = CallToolRequestParams::new("record_key".to_string());
        params.arguments = Some(serde_json::Map::new());
        params.meta = Some(keel_mcp::convert::idempotency_meta(key));
        params
    };
    let mut seen = Vec::new();
    for key in ["thr_1:call_4", "thr_1:call_4", " ", &"x".repeat(2_000)] {
        let client = session(fixture.server.clone()).await;
        let result = tokio::time::timeout(REQUEST_DEADLINE, client.call_tool(keyed(key)))
            .await
            .unwrap()
            .unwrap();
        let result = serde_json::to_value(result).unwrap();
        seen.push(
            result["structuredContent"]["idempotency_key"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        client.cancel().await.unwrap();
    }
    assert_eq!(seen[0], "thr_1:call_4");
    assert_eq!(
        seen[1], "thr_1:call_4",
        "a retry in a new session keeps the key"
    );
    assert!(seen[2].starts_with("mcp:"), "{seen:?}");
    assert!(seen[3].starts_with("mcp:"), "{:?}", &seen[3][..20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_differ_between_sessions_with_the_same_request_id() {
    let fixture = fixture();
    // A client that restarts sends the same JSON-RPC ids again.
    let first = session(fixture.server.clone()).await;
    let a = call(&first, "record_key").await;
    first.cancel().await.unwrap();
    let second = session(fixture.server.clone()).await;
    let b = call(&second, "record_key").await;
    second.cancel().await.unwrap();

    let (a, b) = (&a["structuredContent"], &b["structuredContent"]);
    assert_eq!(
        a["call_id"], b["call_id"],
        "both sessions must use the same request id for this test to mean anything: {a} {b}"
    );
    let seen = fixture.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(seen[0], seen[1], "keys collide across sessions: {seen:?}");
    let request_id = a["call_id"].as_str().unwrap();
    for key in &seen {
        assert!(key.starts_with("mcp:"), "{key}");
        assert!(key.ends_with(&format!(":{request_id}")), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_required_tools_are_refused_without_running() {
    let fixture = fixture();
    let client = session(fixture.server.clone()).await;
    let tools = client.peer().list_all_tools().await.unwrap();
    let listed = tools
        .iter()
        .find(|t| t.name == "delete_everything")
        .unwrap();
    assert!(
        listed
            .description
            .as_deref()
            .unwrap_or_default()
            .contains("human approval"),
        "{listed:?}"
    );

    let result = call(&client, "delete_everything").await;
    assert_eq!(result["isError"], true, "{result}");
    let error = &result["structuredContent"]["error"];
    assert_eq!(error["code"], "forbidden", "{result}");
    assert!(
        error["message"].as_str().unwrap().contains("approval"),
        "{result}"
    );
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("approval"),
        "{result}"
    );
    assert_eq!(fixture.approval_runs.load(Ordering::SeqCst), 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_answers_tool_bug_and_the_session_goes_on() {
    let fixture = fixture();
    let client = session(fixture.server.clone()).await;
    let result = call(&client, "explodes").await;
    assert_eq!(result["isError"], true, "{result}");
    let error = &result["structuredContent"]["error"];
    assert_eq!(error["code"], "tool_bug", "{result}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("kaboom in the tool"),
        "{result}"
    );
    // The same session still serves calls.
    let after = call(&client, "record_key").await;
    assert_ne!(after["isError"], true, "{after}");
    client.cancel().await.unwrap();
}
