//! Agent composition at the library level: an agent offered as a tool (child thread in the
//! same store, nested span, exactly-once on a repeated call, failures as data) and
//! handoffs (the target continues the same thread, the limit stops a ping-pong, the
//! owner of the thread is read from the log).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_core::{
    CancellationToken, DynTool, EndState, Event, EventKind, EventStore, MemoryStore, Message,
    ToolContext, ToolErrorCode, ToolRegistry,
};
use keel_runtime::executor::CallExtras;
use keel_runtime::{Agent, AgentTool, HandoffGroup, RunContext, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

fn scripted(steps: Vec<ScriptStep>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(steps))
}

fn run_started_parent(event: &Event) -> Option<Option<String>> {
    match &event.kind {
        EventKind::RunStarted { parent_span_id, .. } => Some(parent_span_id.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn an_agent_called_as_a_tool_runs_on_a_child_thread_nested_under_the_call() {
    let research_model = scripted(vec![ScriptStep::text("Paris is the capital.")]);
    let research = ToolAgent::builder("research", research_model.clone())
        .description("Looks facts up.")
        .build();
    let mut tools = ToolRegistry::new();
    tools
        .register(Arc::new(AgentTool::new(Arc::new(research))))
        .unwrap();
    let main_model = scripted(vec![
        ScriptStep::tool_call("research", json!({"task": "Capital of France?"})),
        ScriptStep::text("It is Paris."),
    ]);
    let main = ToolAgent::builder("main", main_model.clone())
        .tools(tools)
        .build();
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = main
        .run(vec![Message::user("Capital?")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(outcome.final_text.as_deref(), Some("It is Paris."));
    research_model.assert_consumed();
    main_model.assert_consumed();

    let parent = store.load(thread.id()).await.unwrap();
    let call_id = parent
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCallStarted { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .unwrap();
    let call_span = parent
        .iter()
        .find(|e| matches!(e.kind, EventKind::ToolCallStarted { .. }))
        .unwrap()
        .span_id
        .clone();
    let child_id = AgentTool::child_thread_id(thread.id(), &call_id);
    let child = store.load(&child_id).await.unwrap();
    assert_eq!(child[0].trace_id, parent[0].trace_id, "one trace");
    assert_eq!(run_started_parent(&child[0]), Some(Some(call_span)));
    assert_eq!(run_started_parent(&parent[0]), Some(None));
    let result = parent
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some(result.clone()),
            _ => None,
        })
        .unwrap();
    assert!(result.outcome.is_ok());
    assert!(result.content.contains("Paris is the capital."));

    // The spans nest: main's run > execute_tool research > research's run.
    let events: Vec<Event> = parent.iter().chain(child.iter()).cloned().collect();
    let spans: Vec<_> = keel_telemetry::spans_for_events(&events, Default::default())
        .into_iter()
        .filter_map(|c| match c {
            keel_telemetry::spans::Completed::Span(s) => Some(s),
            _ => None,
        })
        .collect();
    let tool_span = spans
        .iter()
        .find(|s| s.name == "execute_tool research")
        .unwrap();
    let research_root = spans
        .iter()
        .find(|s| s.name == "invoke_agent research")
        .unwrap();
    let main_root = spans
        .iter()
        .find(|s| s.name == "invoke_agent main")
        .unwrap();
    assert_eq!(
        research_root.parent_span_id.as_deref(),
        Some(tool_span.span_id.as_str())
    );
    assert_eq!(
        tool_span.parent_span_id.as_deref(),
        Some(main_root.span_id.as_str())
    );
}

fn tool_context(store: Arc<MemoryStore>, thread: &str, call: &str) -> ToolContext {
    let lent: Arc<dyn std::any::Any + Send + Sync> = Arc::new(RunContext::new(store));
    let mut ctx = ToolContext::new(thread, "run_1", call, CancellationToken::new());
    let extras = CallExtras {
        trace_id: "0123456789abcdef0123456789abcdef".into(),
        spans: Default::default(),
        keys: Default::default(),
        runtime: Some(lent),
        credentials: None,
    };
    ctx.trace_id = extras.trace_id.clone();
    ctx.runtime = extras.runtime.clone();
    ctx
}

#[tokio::test]
async fn a_repeated_call_returns_the_recorded_answer_without_running_again() {
    // One scripted answer: a second run would find the script empty and fail.
    let model = scripted(vec![ScriptStep::text("done once")]);
    let tool = AgentTool::new(Arc::new(
        ToolAgent::builder("worker", model.clone()).build(),
    ));
    let store = Arc::new(MemoryStore::new());
    let ctx = tool_context(store.clone(), "thr_parent", "call_7");
    let first = tool.call(json!({"task": "do it"}), &ctx).await.unwrap();
    let second = tool.call(json!({"task": "do it"}), &ctx).await.unwrap();
    assert_eq!(first["answer"], "done once");
    assert_eq!(first, second);
    model.assert_consumed();
    let child = AgentTool::child_thread_id("thr_parent", "call_7");
    let runs = store
        .load(&child)
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    assert_eq!(runs, 1);
}

#[tokio::test]
async fn a_failing_sub_agent_is_a_tool_error_and_bad_arguments_are_invalid_input() {
    let model = scripted(vec![ScriptStep::text("a"), ScriptStep::text("b")]);
    let agent = ToolAgent::builder("tight", model)
        .budget(keel_core::Budget {
            max_turns: Some(0),
            ..Default::default()
        })
        .build();
    let tool = AgentTool::new(Arc::new(agent));
    let store = Arc::new(MemoryStore::new());
    let ctx = tool_context(store, "thr_p", "call_1");
    let error = tool.call(json!({"task": "x"}), &ctx).await.unwrap_err();
    assert_ne!(error.code, ToolErrorCode::ToolBug, "{error:?}");
    assert!(error.message.contains("`tight` agent ended"), "{error:?}");
    let error = tool.call(json!({"nope": 1}), &ctx).await.unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput);
    // Outside a run there is no context to run the agent with: an error, not a panic.
    let bare = ToolContext::new("t", "r", "c", CancellationToken::new());
    let error = tool.call(json!({"task": "x"}), &bare).await.unwrap_err();
    assert_eq!(error.code, ToolErrorCode::ToolBug);
}

fn triage_and_billing(
    triage_steps: Vec<ScriptStep>,
    billing_steps: Vec<ScriptStep>,
    back: bool,
) -> (HandoffGroup, Arc<ScriptedModel>, Arc<ScriptedModel>) {
    let triage_model = scripted(triage_steps);
    let billing_model = scripted(billing_steps);
    let triage = ToolAgent::builder("triage", triage_model.clone())
        .handoff("billing", "Handles invoices and refunds.")
        .max_handoffs(2)
        .build();
    let mut billing = ToolAgent::builder("billing", billing_model.clone()).max_handoffs(2);
    if back {
        billing = billing.handoff("triage", "Routes requests.");
    }
    let group = HandoffGroup::new(Arc::new(triage)).with_agent(Arc::new(billing.build()));
    (group, triage_model, billing_model)
}

#[tokio::test]
async fn a_handoff_passes_the_thread_to_the_target_whose_answer_is_final() {
    let (group, triage_model, billing_model) = triage_and_billing(
        vec![ScriptStep::tool_call(
            "transfer_to_billing",
            json!({"reason": "an invoice question"}),
        )],
        vec![ScriptStep::text("Your invoice is paid.")],
        false,
    );
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = group
        .run(
            vec![Message::user("Is my invoice paid?")],
            &mut thread,
            &context,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("Your invoice is paid."));
    triage_model.assert_consumed();
    billing_model.assert_consumed();
    // Billing saw the whole conversation, ending with the transfer's result.
    let request = &billing_model.requests()[0];
    assert!(
        request
            .tool_result_contents()
            .iter()
            .any(|c| c.contains("Transferred to `billing`"))
    );

    let events = store.load(thread.id()).await.unwrap();
    let handoff = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::Handoff { .. }))
        .unwrap();
    let EventKind::Handoff {
        from, to, reason, ..
    } = &handoff.kind
    else {
        unreachable!()
    };
    assert_eq!((from.as_str(), to.as_str()), ("triage", "billing"));
    assert_eq!(reason.as_deref(), Some("an invoice question"));
    let starts: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1].trace_id, starts[0].trace_id);
    assert_eq!(
        run_started_parent(starts[1]),
        Some(Some(handoff.span_id.clone()))
    );
    // A follow-up goes to the agent that owns the thread now: billing.
    assert_eq!(group.active_agent(&thread).name(), "billing");
}

#[tokio::test]
async fn a_ping_pong_stops_at_the_limit_and_the_model_answers_itself() {
    let transfer_billing = || ScriptStep::tool_call("transfer_to_billing", json!({}));
    let transfer_triage = || ScriptStep::tool_call("transfer_to_triage", json!({}));
    let (group, triage_model, billing_model) = triage_and_billing(
        vec![
            transfer_billing(),
            transfer_billing(),
            ScriptStep::text("I answer myself."),
        ],
        vec![transfer_triage()],
        true,
    );
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = group
        .run(vec![Message::user("help")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("I answer myself."));
    triage_model.assert_consumed();
    billing_model.assert_consumed();
    let events = store.load(thread.id()).await.unwrap();
    let handoffs = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Handoff { .. }))
        .count();
    assert_eq!(handoffs, 2, "the third transfer is refused");
    let refused = events.iter().any(|e| match &e.kind {
        EventKind::ToolCallFinished { result } => {
            result.outcome.error_code() == Some(ToolErrorCode::Denied)
        }
        _ => false,
    });
    assert!(refused);
}

#[tokio::test]
async fn resume_after_a_stop_between_handoff_and_takeover_continues_with_the_target() {
    let (group, _triage_model, billing_model) = triage_and_billing(
        vec![ScriptStep::tool_call("transfer_to_billing", json!({}))],
        vec![ScriptStep::text("billing here")],
        false,
    );
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::new();
    // Only triage runs (as if the process stopped right after the handoff).
    let triage = group.agent("triage").unwrap().clone();
    triage
        .run(vec![Message::user("invoice?")], &mut thread, &context)
        .await
        .unwrap();
    let mut reloaded = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    assert_eq!(reloaded.state().pending_handoff(), Some("billing"));
    assert_eq!(group.active_agent(&reloaded).name(), "billing");
    let outcome = group.resume(&mut reloaded, &context).await.unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("billing here"));
    billing_model.assert_consumed();
    // A run with no message is refused when nothing was handed to the agent.
    let mut fresh = Thread::new();
    let error = group
        .run(Vec::new(), &mut fresh, &context)
        .await
        .unwrap_err();
    assert!(matches!(error, keel_runtime::RunError::NoInput));
}

/// Records what the call's credential source answers for `TOKEN`.
struct WhoAmI {
    spec: keel_core::ToolSpec,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

impl DynTool for WhoAmI {
    fn spec(&self) -> &keel_core::ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        _args: serde_json::Value,
        ctx: &'a ToolContext,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, keel_core::ToolError>> {
        let answer = match ctx.lookup_credential("whoami", "TOKEN") {
            keel_core::CredentialLookup::Found(secret) => secret,
            keel_core::CredentialLookup::Missing { fix } => format!("missing: {fix}"),
            keel_core::CredentialLookup::Unmanaged => "unmanaged".into(),
        };
        self.seen.lock().unwrap().push(answer);
        Box::pin(async { Ok(json!({"ok": true})) })
    }
}

#[tokio::test]
async fn a_runs_credentials_reach_its_tools_and_the_runs_it_starts() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let whoami = || -> Arc<dyn DynTool> {
        Arc::new(WhoAmI {
            spec: keel_core::ToolSpec::new(
                "whoami",
                "Says who calls.",
                "whoami — call it with no arguments.",
            ),
            seen: seen.clone(),
        })
    };
    let main = || {
        let mut tools = ToolRegistry::new();
        tools.register(whoami()).unwrap();
        tools
            .register(Arc::new(AgentTool::new(Arc::new(
                ToolAgent::builder(
                    "research",
                    scripted(vec![
                        ScriptStep::tool_call("whoami", json!({})),
                        ScriptStep::text("checked"),
                    ]),
                )
                .description("Checks.")
                .tools({
                    let mut t = ToolRegistry::new();
                    t.register(whoami()).unwrap();
                    t
                })
                .build(),
            ))))
            .unwrap();
        ToolAgent::builder(
            "main",
            scripted(vec![
                ScriptStep::tool_call("whoami", json!({})),
                ScriptStep::tool_call("research", json!({"task": "check"})),
                ScriptStep::text("done"),
            ]),
        )
        .tools(tools)
        .build()
    };
    let store = Arc::new(MemoryStore::new());
    // With a source: the run's tools and its child run's tools get its answer.
    let source = keel_core::tool::StaticCredentials(
        [(
            ("whoami".to_string(), "TOKEN".to_string()),
            "t-1".to_string(),
        )]
        .into(),
    );
    let context = RunContext::new(store.clone()).with_credentials(Arc::new(source));
    let outcome = main()
        .run(vec![Message::user("go")], &mut Thread::new(), &context)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(*seen.lock().unwrap(), ["t-1", "t-1"]);
    // Without: the tools read their own environment, as before.
    seen.lock().unwrap().clear();
    let context = RunContext::new(store);
    main()
        .run(vec![Message::user("go")], &mut Thread::new(), &context)
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), ["unmanaged", "unmanaged"]);
}
