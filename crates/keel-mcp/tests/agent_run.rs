//! A run in which a scripted model calls MCP tools through Keel's normal executor:
//! argument validation against the MCP tool's schema, per-call timeout, outcome and events.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::sync::Arc;

use keel_core::{
    EndState, EventKind, EventStore, MemoryStore, Message, ToolErrorCode, ToolRegistry,
};
use keel_mcp::McpManager;
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_model_calls_mcp_tools_through_the_executor() {
    let manager = McpManager::connect_all(vec![common::everything()]).await;
    let mut registry = ToolRegistry::new();
    let errors = manager.register_tools(&mut registry);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        registry.get("everything__echo").is_some(),
        "tools: {:?}",
        registry.names().collect::<Vec<_>>()
    );

    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("everything__echo", json!({"message": "hello over MCP"})),
        // Wrong argument type: the executor rejects it against the MCP tool's input schema.
        ScriptStep::tool_call("everything__get_sum", json!({"a": "two", "b": 3})),
        ScriptStep::tool_call("everything__get_sum", json!({"a": 2, "b": 3})),
        ScriptStep::text("The echo worked and 2 + 3 = 5."),
    ]));
    let agent = ToolAgent::builder("mcp", model.clone())
        .tools(registry)
        .build();
    let store = Arc::new(MemoryStore::new());
    let mut thread = Thread::new();
    let outcome = agent
        .run(
            vec![Message::user("echo, then add 2 and 3")],
            &mut thread,
            &RunContext::new(store.clone()),
        )
        .await
        .unwrap();
    manager.shutdown().await;

    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    model.assert_consumed();
    let calls = &outcome.tool_calls;
    assert_eq!(calls.len(), 3);
    assert!(calls[0].ok, "{calls:?}");
    assert_eq!(calls[1].error_code, Some(ToolErrorCode::InvalidInput));
    assert_eq!(
        calls[1].attempts, 0,
        "validated before the server was called"
    );
    assert!(calls[2].ok);

    let requests = model.requests();
    let echo_result = requests[1].tool_result_contents().join("\n");
    assert!(echo_result.contains("hello over MCP"), "{echo_result}");
    let sum_result = requests[3]
        .messages
        .last()
        .unwrap()
        .tool_results()
        .next()
        .unwrap()
        .content
        .clone();
    assert!(sum_result.contains('5'), "{sum_result}");

    let events = store.load(thread.id()).await.unwrap();
    let started = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolCallStarted { .. }))
        .count();
    let finished = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolCallFinished { .. }))
        .count();
    assert_eq!((started, finished), (3, 3));
}
