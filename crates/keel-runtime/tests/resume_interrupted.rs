//! `ToolAgent::resume` after a crash in the middle of a tool call: the interrupted read-only
//! call runs again, the interrupted mutating call does NOT (it gets an outcome saying it
//! may or may not have run, with its idempotency key), and the log stays consistent.
//! Also: approvals recorded out of band through `Thread::approve`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use keel_core::{
    DynTool, Effect, EndState, EventKind, EventStore, MemoryStore, Message, ToolContext, ToolError,
    ToolErrorCode, ToolRegistry, ToolResultKind, ToolSpec,
};
use keel_runtime::{RunContext, RunStatus, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

/// Counts calls; blocks forever while `block` is set (to simulate a crash mid-call).
struct Counting {
    spec: ToolSpec,
    calls: Arc<AtomicUsize>,
    block: bool,
}

impl Counting {
    fn new(name: &str, effect: Effect, block: bool) -> (Arc<Self>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let spec = ToolSpec::new(
            name,
            "A counting test tool.",
            "Counts its calls.\n\nRules:\n- test only",
        )
        .with_effect(effect);
        (
            Arc::new(Self {
                spec,
                calls: calls.clone(),
                block,
            }),
            calls,
        )
    }
}

impl DynTool for Counting {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.block {
                std::future::pending::<()>().await;
            }
            Ok(json!({"key": ctx.idempotency_key}))
        })
    }
}

fn steps(tool: &str) -> Vec<ScriptStep> {
    vec![
        ScriptStep::tool_call(tool, json!({})),
        ScriptStep::text("finished"),
    ]
}

fn agent(
    model: Arc<ScriptedModel>,
    block: bool,
) -> (ToolAgent, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (reader, reads) = Counting::new("reader", Effect::ReadOnly, block);
    let (writer, writes) = Counting::new("writer", Effect::Mutating, block);
    let mut tools = ToolRegistry::new();
    tools.register(reader).unwrap();
    tools.register(writer).unwrap();
    (
        ToolAgent::builder("test", model).tools(tools).build(),
        reads,
        writes,
    )
}

/// Runs `tool` until it blocks, drops the run (the "crash"), then resumes in a fresh agent.
/// Returns the calls made by the first and the second agent, and the stored log.
async fn crash_then_resume(tool: &str) -> (usize, usize, String, Vec<keel_core::Event>) {
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let id = thread.id().to_string();
    let (first, reads, writes) = agent(Arc::new(ScriptedModel::new(steps(tool))), true);
    let crashed = tokio::time::timeout(
        Duration::from_millis(300),
        first.run(vec![Message::user("go")], &mut thread, &ctx),
    )
    .await;
    assert!(
        crashed.is_err(),
        "the run should still be blocked in its tool"
    );
    let first_calls = reads.load(Ordering::SeqCst) + writes.load(Ordering::SeqCst);
    assert_eq!(first_calls, 1);

    let model = Arc::new(ScriptedModel::new(steps(tool).split_off(1)));
    let (second, reads2, writes2) = agent(model.clone(), false);
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    assert!(thread.state().run_in_progress());
    let outcome = second.resume(&mut thread, &ctx).await.unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    model.assert_consumed();
    let events = store.load(&id).await.unwrap();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64);
    }
    let finished = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolCallFinished { .. }))
        .count();
    assert_eq!(finished, 1, "the call is answered exactly once");
    let ended = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunEnded { .. }))
        .count();
    assert_eq!(ended, 1);
    (
        first_calls,
        reads2.load(Ordering::SeqCst) + writes2.load(Ordering::SeqCst),
        id,
        events,
    )
}

#[tokio::test]
async fn interrupted_read_only_call_is_run_again_on_resume() {
    let (_, again, _, events) = crash_then_resume("reader").await;
    assert_eq!(again, 1, "a read-only call is re-executed");
    let result = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.clone()),
            _ => None,
        })
        .unwrap();
    assert!(result.outcome.is_ok());
}

#[tokio::test]
async fn interrupted_mutating_call_is_not_repeated_on_resume() {
    let (_, again, id, events) = crash_then_resume("writer").await;
    assert_eq!(again, 0, "a mutating call must not run again");
    let writer = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.clone()),
            _ => None,
        })
        .unwrap();
    match &writer.outcome.result {
        ToolResultKind::Error { code, details, .. } => {
            assert_eq!(*code, ToolErrorCode::Cancelled);
            let details = details.clone().unwrap();
            assert_eq!(details["interrupted"], true);
            assert_eq!(
                details["idempotency_key"],
                format!("{id}:{}", writer.call_id)
            );
        }
        other => panic!("expected an interrupted error, got {other:?}"),
    }
    assert!(
        writer.content.contains("may or may not"),
        "{}",
        writer.content
    );
}

#[tokio::test]
async fn approval_recorded_out_of_band_then_resumed() {
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone()).with_approval_mode(keel_runtime::RunApprovalMode::Ask);
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("writer", json!({})),
        ScriptStep::text("written"),
    ]));
    let (agent, _, writes) = agent(model.clone(), false);
    let mut thread = Thread::new();
    let paused = agent
        .run(vec![Message::user("write")], &mut thread, &ctx)
        .await
        .unwrap();
    let RunStatus::AwaitingApproval { call_id, .. } = paused.status.clone() else {
        panic!("expected a pause, got {paused:?}");
    };
    assert_eq!(writes.load(Ordering::SeqCst), 0);

    let mut reloaded = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    let err = reloaded.approve(&ctx, "unknown", None).await.unwrap_err();
    assert_eq!(err.code(), "not_awaiting_approval");
    reloaded
        .approve(&ctx, &call_id, Some("alice".into()))
        .await
        .unwrap();
    let err = reloaded.approve(&ctx, &call_id, None).await.unwrap_err();
    assert_eq!(err.code(), "not_awaiting_approval", "{err}");
    let done = agent.resume(&mut reloaded, &ctx).await.unwrap();
    assert_eq!(done.end_state(), Some(EndState::Done));
    assert_eq!(writes.load(Ordering::SeqCst), 1);
    assert!(done.tool_calls[0].ok);
}

/// A paused run on a memory store, and the agent that started it.
async fn paused_run() -> (Arc<MemoryStore>, RunContext, String, String) {
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone()).with_approval_mode(keel_runtime::RunApprovalMode::Ask);
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("writer", json!({})),
        ScriptStep::text("written"),
    ]));
    let (agent, _, _) = agent(model, false);
    let mut thread = Thread::new();
    let paused = agent
        .run(vec![Message::user("write")], &mut thread, &ctx)
        .await
        .unwrap();
    let RunStatus::AwaitingApproval { call_id, .. } = paused.status else {
        panic!("expected a pause, got {paused:?}");
    };
    (store, ctx, thread.id().to_string(), call_id)
}

#[tokio::test]
async fn the_run_records_its_agent_definition() {
    let (store, _, id, _) = paused_run().await;
    let events = store.load(&id).await.unwrap();
    let EventKind::RunStarted {
        definition: Some(definition),
        ..
    } = &events[0].kind
    else {
        panic!("the first event records the definition: {:?}", events[0]);
    };
    let names: Vec<&str> = definition
        .fingerprint
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, ["reader", "writer"]);
    assert_eq!(definition.fingerprint.tools[1].effect, Effect::Mutating);
}

#[tokio::test]
async fn resuming_with_an_agent_missing_a_tool_of_the_run_fails_before_any_model_call() {
    let (store, ctx, id, call_id) = paused_run().await;
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    thread.approve(&ctx, &call_id, None).await.unwrap();
    let before = store.load(&id).await.unwrap().len();
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("never")]));
    let (reader, _) = Counting::new("reader", Effect::ReadOnly, false);
    let mut tools = ToolRegistry::new();
    tools.register(reader).unwrap();
    let without_writer = ToolAgent::builder("test", model.clone())
        .tools(tools)
        .build();
    let error = without_writer.resume(&mut thread, &ctx).await.unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, keel_runtime::RunError::IncompatibleAgent { .. }),
        "{message}"
    );
    assert!(message.contains("`writer`"), "{message}");
    assert_eq!(model.requests().len(), 0, "no model call was made");
    assert_eq!(
        store.load(&id).await.unwrap().len(),
        before,
        "nothing appended"
    );
}

#[tokio::test]
async fn resuming_with_a_compatible_but_different_agent_records_a_notice() {
    let (store, ctx, id, call_id) = paused_run().await;
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    thread.approve(&ctx, &call_id, None).await.unwrap();
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("written")]));
    let (reader, _) = Counting::new("reader", Effect::ReadOnly, false);
    let (writer, writes) = Counting::new("writer", Effect::Mutating, false);
    let mut tools = ToolRegistry::new();
    tools.register(reader).unwrap();
    tools.register(writer).unwrap();
    let changed = ToolAgent::builder("test", model)
        .instructions("Other instructions.")
        .tools(tools)
        .build();
    let done = changed.resume(&mut thread, &ctx).await.unwrap();
    assert_eq!(done.end_state(), Some(EndState::Done));
    assert_eq!(writes.load(Ordering::SeqCst), 1);
    let events = store.load(&id).await.unwrap();
    let notice = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Notice { code, message, .. } if code == "agent_changed" => Some(message),
            _ => None,
        })
        .expect("an agent_changed notice");
    assert!(notice.contains("system prompt"), "{notice}");
}
