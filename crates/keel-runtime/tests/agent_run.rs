//! Library-level tests of `ToolAgent::run`: durability before action, observers, threads
//! continued across runs, cancellation, and registration rules.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::{
    CancellationToken, DynTool, EndState, Event, EventKind, EventStore, MemoryStore, Message,
    ToolContext, ToolError, ToolRegistry, ToolSpec,
};
use keel_runtime::{RunContext, RunObserver, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl RunObserver for Recorder {
    fn on_event(&self, event: &Event) {
        self.0.lock().unwrap().push(event.clone());
    }
}

fn calculator_agent(model: Arc<ScriptedModel>) -> ToolAgent {
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    ToolAgent::builder("test", model)
        .instructions("Be exact.")
        .tools(tools)
        .build()
}

#[tokio::test]
async fn every_event_is_stored_and_observed_in_order() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("42"),
    ]));
    let agent = calculator_agent(model.clone());
    let store = Arc::new(MemoryStore::new());
    let recorder = Arc::new(Recorder::default());
    let ctx = RunContext::new(store.clone()).with_observer(recorder.clone());
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    model.assert_consumed();

    let stored = store.load(thread.id()).await.unwrap();
    let observed = recorder.0.lock().unwrap().clone();
    assert_eq!(stored, observed);
    assert!(stored.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    let kinds: Vec<&str> = stored.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "user_message",
            "model_requested",
            "model_responded",
            "tool_call_requested",
            "tool_call_started",
            "tool_call_finished",
            "model_requested",
            "model_responded",
            "run_ended"
        ]
    );
    // Every event of the run shares its trace id; tool results carry thread and run ids.
    assert!(
        stored
            .iter()
            .all(|e| *e.trace_id == *outcome.trace_id && e.trace_id.len() == 32)
    );
    let finished = stored.iter().find_map(|e| match &e.kind {
        EventKind::ToolCallFinished { result } => Some(result.clone()),
        _ => None,
    });
    let result = finished.unwrap();
    assert_eq!(result.outcome.thread_id, thread.id());
    assert_eq!(result.outcome.run_id, outcome.run_id);
    // The folded state equals a fold of the stored log.
    let reloaded = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    assert_eq!(reloaded, thread);
}

#[tokio::test]
async fn a_thread_continues_across_runs() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text("Hello Ada."),
        ScriptStep::text("Your name is Ada."),
    ]));
    let agent = calculator_agent(model.clone());
    let ctx = RunContext::new(Arc::new(MemoryStore::new()));
    let mut thread = Thread::new();
    agent
        .run(vec![Message::user("I am Ada.")], &mut thread, &ctx)
        .await
        .unwrap();
    let second = agent
        .run(vec![Message::user("What is my name?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(second.final_text.as_deref(), Some("Your name is Ada."));
    let requests = model.requests();
    let texts: Vec<String> = requests[1].messages.iter().map(Message::text).collect();
    assert_eq!(texts, ["I am Ada.", "Hello Ada.", "What is my name?"]);
    assert_ne!(second.run_id, "");
}

#[tokio::test]
async fn cancelling_during_a_model_call_ends_cancelled() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep {
        delay_ms: Some(60_000),
        ..ScriptStep::text("late")
    }]));
    let agent = calculator_agent(model);
    let cancel = CancellationToken::new();
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone()).with_cancel(cancel.clone());
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let mut thread = Thread::new();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        agent.run(vec![Message::user("hi")], &mut thread, &ctx),
    )
    .await
    .expect("the run must stop promptly")
    .unwrap();
    canceller.await.unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Cancelled));
    let events = store.load(thread.id()).await.unwrap();
    assert!(matches!(
        events.last().unwrap().kind,
        EventKind::RunEnded {
            end_state: EndState::Cancelled,
            ..
        }
    ));
}

struct Declared(ToolSpec);

impl DynTool for Declared {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn call<'a>(
        &'a self,
        _: serde_json::Value,
        _: &'a ToolContext,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, ToolError>> {
        Box::pin(async { Ok(json!({})) })
    }
}

#[test]
fn registration_rejects_bad_names_empty_guidance_and_duplicates() {
    let mut registry = ToolRegistry::new();
    let error = registry
        .register(Arc::new(Declared(ToolSpec::new("BadName", "d", "guide"))))
        .unwrap_err();
    assert_eq!(error.tool, "BadName");
    assert!(
        error
            .to_string()
            .contains("tool `BadName`: name must be lowercase_snake_case"),
        "{error}"
    );
    assert!(
        error.to_string().contains("`bad_name`"),
        "suggests a fix: {error}"
    );

    let error = registry
        .register(Arc::new(Declared(ToolSpec::new("quiet", "d", "  "))))
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("tool `quiet`: usage guidance must not be empty"),
        "{error}"
    );

    let bad_schema = ToolSpec::new("typo", "d", "g")
        .with_input_schema(json!({"type": "object", "properties": {"x": {"type": "strng"}}}));
    let error = registry
        .register(Arc::new(Declared(bad_schema)))
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("input schema is not a valid JSON Schema"),
        "{error}"
    );

    registry
        .register(Arc::new(Declared(ToolSpec::new("ok_tool", "d", "g"))))
        .unwrap();
    let error = registry
        .register(Arc::new(Declared(ToolSpec::new("ok_tool", "d", "g"))))
        .unwrap_err();
    assert!(error.to_string().contains("already registered"), "{error}");
    let long = "a".repeat(65);
    assert!(
        registry
            .register(Arc::new(Declared(ToolSpec::new(long, "d", "g"))))
            .is_err()
    );
}

#[test]
fn typed_tools_get_schemas_from_their_types() {
    let registry = keel_tools::builtin_registry().unwrap();
    let spec = registry.get("calculator").unwrap().spec();
    assert_eq!(spec.input_schema["type"], "object");
    assert_eq!(spec.input_schema["required"], json!(["expression"]));
    assert!(spec.output_schema.as_ref().unwrap()["properties"]["result"].is_object());
    assert!(spec.input_schema.get("$schema").is_none());
}

#[tokio::test]
async fn a_per_tool_approval_mode_overrides_the_runs_mode() {
    // The run's mode is `auto` (the calculator needs no approval), but the calculator's own
    // mode is `ask`: its call pauses the run awaiting approval.
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("42"),
    ]));
    let agent = calculator_agent(model.clone());
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone())
        .with_tool_approval_mode("calculator", keel_runtime::RunApprovalMode::Ask);
    assert_eq!(
        ctx.approval_mode_for("calculator"),
        keel_runtime::RunApprovalMode::Ask
    );
    assert_eq!(
        ctx.approval_mode_for("delay"),
        keel_runtime::RunApprovalMode::Auto
    );
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome.status,
            keel_runtime::RunStatus::AwaitingApproval { ref tool, .. } if tool == "calculator"
        ),
        "{:?}",
        outcome.status
    );

    // `deny` for the tool under an `ask` run: the call is denied without asking, the
    // model is told, and the run ends.
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("I was not allowed to calculate."),
    ]));
    let agent = calculator_agent(model.clone());
    let ctx = RunContext::new(store.clone())
        .with_approval_mode(keel_runtime::RunApprovalMode::Ask)
        .with_tool_approval_mode("calculator", keel_runtime::RunApprovalMode::Deny);
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let events = store.load(thread.id()).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ApprovalDenied { .. })),
        "the calculator call was denied"
    );
}

#[tokio::test]
async fn the_reminder_ends_the_latest_user_message_in_every_request_and_stays_out_of_the_log() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("42"),
        ScriptStep::text("43"),
    ]));
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    let agent = ToolAgent::builder("test", model.clone())
        .instructions("Be exact.")
        .reminder(Some("  Always use the calculator.\n".into()))
        .tools(tools)
        .build();
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    agent
        .run(vec![Message::user("6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    agent
        .run(vec![Message::user("and 43?")], &mut thread, &ctx)
        .await
        .unwrap();
    model.assert_consumed();

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    // First call: the user's message with the reminder (trimmed) after a blank line.
    assert_eq!(requests[0].messages.len(), 1);
    assert_eq!(
        requests[0].messages[0].text(),
        "6*7?\n\nAlways use the calculator."
    );
    // After the tool call the user's message is unchanged (so a prompt cache keeps the
    // prefix), the call and its result after it.
    assert_eq!(requests[1].messages.len(), 3);
    assert_eq!(requests[1].messages[0], requests[0].messages[0]);
    assert!(requests[1].tool_result_contents()[0].contains("42"));
    // A new user message takes it: once per request, on the latest user message only.
    let second = &requests[2].messages;
    let with_reminder: Vec<String> = second
        .iter()
        .map(Message::text)
        .filter(|text| text.contains("Always use the calculator."))
        .collect();
    assert_eq!(with_reminder, ["and 43?\n\nAlways use the calculator."]);
    assert_eq!(second.last().unwrap().text(), with_reminder[0]);
    // Never written to the log.
    let logged = serde_json::to_string(&store.load(thread.id()).await.unwrap()).unwrap();
    assert!(!logged.contains("Always use the calculator"), "{logged}");
}

#[tokio::test]
async fn a_blank_reminder_is_none_and_the_reminder_counts_in_the_fingerprint() {
    let build = |reminder: Option<&str>| {
        ToolAgent::builder("test", Arc::new(ScriptedModel::new(vec![])))
            .instructions("Be exact.")
            .reminder(reminder.map(str::to_string))
            .build()
    };
    let none = build(None);
    let blank = build(Some(" \n"));
    let some = build(Some("Check twice."));
    let fingerprint =
        |agent: &ToolAgent| agent.definition().fingerprint.system_prompt_sha256.clone();
    assert_eq!(fingerprint(&none), fingerprint(&blank));
    assert_ne!(fingerprint(&none), fingerprint(&some));
}
