//! Workflow tests: the three compositions, the log they write, resume after a crash in
//! the middle of a parallel branch (finished steps not re-run, the interrupted mutating
//! call not run twice) and the refusals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::future::BoxFuture;
use keel_core::{
    DynTool, Effect, EndState, Event, EventKind, EventStore, MemoryStore, Message, ToolContext,
    ToolError, ToolRegistry, ToolSpec,
};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::*;
use crate::{RunStatus, ToolAgent};

/// Answers `<name>: <input>`.
struct Say(&'static str);

#[async_trait]
impl Agent for Say {
    fn name(&self) -> &str {
        self.0
    }

    fn description(&self) -> &str {
        "says things"
    }

    async fn run(
        &self,
        new_messages: Vec<Message>,
        thread: &mut Thread,
        context: &RunContext,
    ) -> Result<RunOutcome, RunError> {
        let text = new_messages
            .iter()
            .map(Message::text)
            .collect::<Vec<_>>()
            .join(" ");
        let answer = format!("{}: {}", self.0, text.lines().next().unwrap_or_default());
        crate::custom::finish_run(self.0, new_messages, answer, thread, context).await
    }
}

fn say(name: &'static str) -> Arc<dyn Agent> {
    Arc::new(Say(name))
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

#[tokio::test]
async fn sequential_steps_hand_their_output_on() {
    let workflow = Workflow::builder(
        "pipeline",
        Plan::Sequential(vec![Step::new(say("a")), Step::new(say("b"))]),
    )
    .build()
    .unwrap();
    let context = RunContext::default();
    let mut thread = Thread::new();
    let outcome = workflow
        .run(vec![Message::user("go")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("b: a: go"));
    let events = context.store.load(thread.id()).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "user_message",
            "workflow_step_started",
            "workflow_step_finished",
            "workflow_step_started",
            "workflow_step_finished",
            "agent_message",
            "run_ended"
        ]
    );
    let child = context
        .store
        .load(&step_thread_id(thread.id(), "b"))
        .await
        .unwrap();
    assert_eq!(child.first().unwrap().kind.name(), "run_started");
    // The workflow's answer joins its thread's conversation.
    assert_eq!(thread.state().messages().last().unwrap().text(), "b: a: go");
    // Each step's run nests under its step's span, in the workflow's trace.
    let step_span = events
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::WorkflowStepStarted { .. }))
        .unwrap();
    assert_eq!(child[0].trace_id, events[0].trace_id);
    match &child[0].kind {
        EventKind::RunStarted { parent_span_id, .. } => {
            assert_eq!(parent_span_id.as_deref(), Some(step_span.span_id.as_str()));
        }
        other => panic!("{other:?}"),
    }
    // In the trace: pipeline's run > workflow_step b > b's run.
    let all: Vec<Event> = events.iter().chain(&child).cloned().collect();
    let spans: Vec<_> = keel_telemetry::spans_for_events(&all, Default::default())
        .into_iter()
        .filter_map(|c| match c {
            keel_telemetry::spans::Completed::Span(s) => Some(s),
            _ => None,
        })
        .collect();
    let find = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
    let (root, step, run_b) = (
        find("invoke_agent pipeline"),
        find("workflow_step b"),
        find("invoke_agent b"),
    );
    assert_eq!(step.span_id, step_span.span_id);
    assert_eq!(step.parent_span_id.as_deref(), Some(root.span_id.as_str()));
    assert_eq!(run_b.parent_span_id.as_deref(), Some(step.span_id.as_str()));
    assert!(step.end >= run_b.end, "the step span outlives its run");
    // Every event survives the store's JSON form (no field clashes with the envelope).
    for event in events.iter().chain(&child) {
        let text = serde_json::to_string(event).unwrap();
        let back: Event = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, event);
    }
}

#[tokio::test]
async fn parallel_fans_out_and_in_in_branch_order() {
    let workflow = Workflow::builder(
        "review",
        Plan::Parallel {
            branches: vec![Step::new(say("x")), Step::new(say("y"))],
            then: Some(Step::named("sum", say("s"))),
        },
    )
    .build()
    .unwrap();
    let context = RunContext::default();
    let mut thread = Thread::new();
    let outcome = workflow
        .run(vec![Message::user("topic")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let summary_input = context
        .store
        .load(&step_thread_id(thread.id(), "sum"))
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::UserMessage { message } => Some(message.text()),
            _ => None,
        })
        .unwrap();
    let x = summary_input.find("## x (x)\nx: topic").unwrap();
    let y = summary_input.find("## y (y)\ny: topic").unwrap();
    assert!(x < y, "{summary_input}");
    assert_eq!(outcome.final_text.as_deref(), Some("s: Task:"));
}

#[tokio::test]
async fn routers_choose_by_function_or_agent() {
    let routes = || vec![Step::new(say("billing")), Step::new(say("tech"))];
    let by_function = Workflow::builder(
        "triage",
        Plan::Router {
            route_by: RouteBy::Function(Arc::new(|input: &str| {
                input.contains("invoice").then(|| "billing".to_string())
            })),
            routes: routes(),
            default: Some("tech".into()),
        },
    )
    .build()
    .unwrap();
    let context = RunContext::default();
    async fn answer(workflow: &Workflow, context: &RunContext, text: &str) -> RunOutcome {
        let mut thread = Thread::new();
        workflow
            .run(vec![Message::user(text)], &mut thread, context)
            .await
            .unwrap()
    }
    let billed = answer(&by_function, &context, "my invoice").await;
    assert_eq!(billed.final_text.as_deref(), Some("billing: my invoice"));
    let fallback = answer(&by_function, &context, "wifi down").await;
    assert_eq!(fallback.final_text.as_deref(), Some("tech: wifi down"));

    // An agent router: `Say("tech")` answers "tech: Request:" — one route named.
    let by_agent = Workflow::builder(
        "triage",
        Plan::Router {
            route_by: RouteBy::Agent(Step::named("route", say("tech"))),
            routes: vec![Step::new(say("billing")), Step::named("tech", say("t2"))],
            default: None,
        },
    )
    .build()
    .unwrap();
    let routed = answer(&by_agent, &context, "help").await;
    assert_eq!(routed.final_text.as_deref(), Some("t2: help"));

    // An answer naming no route and no default: the workflow fails, saying why.
    let lost = Workflow::builder(
        "triage",
        Plan::Router {
            route_by: RouteBy::Agent(Step::named("route", say("nobody"))),
            routes: routes(),
            default: None,
        },
    )
    .build()
    .unwrap();
    let failed = answer(&lost, &context, "help").await;
    assert_eq!(failed.end_state(), Some(EndState::Failed));
    assert!(
        failed
            .reason
            .as_deref()
            .unwrap()
            .contains("names none of the routes"),
        "{:?}",
        failed.reason
    );
}

#[test]
fn bad_plans_are_refused() {
    let duplicate = Workflow::builder(
        "w",
        Plan::Sequential(vec![Step::new(say("a")), Step::new(say("a"))]),
    )
    .build();
    assert!(matches!(
        duplicate,
        Err(WorkflowError::DuplicateStep { .. })
    ));
    let empty = Workflow::builder("w", Plan::Sequential(Vec::new())).build();
    assert!(matches!(empty, Err(WorkflowError::NoSteps(_))));
    let dotted =
        Workflow::builder("w", Plan::Sequential(vec![Step::named("a.b", say("a"))])).build();
    assert!(matches!(dotted, Err(WorkflowError::InvalidStepName { .. })));
    let default = Workflow::builder(
        "w",
        Plan::Router {
            route_by: RouteBy::Function(Arc::new(|_: &str| None)),
            routes: vec![Step::new(say("a"))],
            default: Some("b".into()),
        },
    )
    .build();
    assert!(matches!(
        default,
        Err(WorkflowError::UnknownDefaultRoute { .. })
    ));
}

/// A mutating tool counting its executions; the first one signals and never returns
/// while `hang` is set (the "crash" happens while it waits).
struct Append {
    spec: ToolSpec,
    calls: Arc<AtomicUsize>,
    hang: Option<Arc<Notify>>,
}

impl DynTool for Append {
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
            if let Some(hang) = &self.hang {
                hang.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(json!({"key": ctx.idempotency_key}))
        })
    }
}

fn tool_agent(
    name: &str,
    steps: Vec<ScriptStep>,
    calls: &Arc<AtomicUsize>,
    hang: Option<Arc<Notify>>,
) -> Arc<dyn Agent> {
    let spec = ToolSpec::new(
        "append",
        "Appends.",
        "Appends a line.\n\nRules:\n- test only",
    )
    .with_effect(Effect::Mutating);
    let mut tools = ToolRegistry::new();
    tools
        .register(Arc::new(Append {
            spec,
            calls: calls.clone(),
            hang,
        }))
        .unwrap();
    Arc::new(
        ToolAgent::builder(name, Arc::new(ScriptedModel::new(steps)))
            .tools(tools)
            .build(),
    )
}

fn review(a: Arc<dyn Agent>, b: Arc<dyn Agent>, s: Arc<dyn Agent>) -> Workflow {
    Workflow::builder(
        "review",
        Plan::Parallel {
            branches: vec![Step::new(a), Step::new(b)],
            then: Some(Step::new(s)),
        },
    )
    .max_parallel(1)
    .build()
    .unwrap()
}

#[tokio::test]
async fn a_crash_mid_branch_resumes_without_rerunning_anything() {
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let calls_a = Arc::new(AtomicUsize::new(0));
    let calls_b = Arc::new(AtomicUsize::new(0));
    let calls_s = Arc::new(AtomicUsize::new(0));
    let use_tool = || ScriptStep::tool_call("append", json!({}));
    let hang = Arc::new(Notify::new());
    let first = review(
        tool_agent("a", vec![use_tool(), ScriptStep::text("A")], &calls_a, None),
        tool_agent(
            "b",
            vec![use_tool(), ScriptStep::text("B")],
            &calls_b,
            Some(hang.clone()),
        ),
        tool_agent("s", vec![ScriptStep::text("never")], &calls_s, None),
    );
    let mut thread = Thread::new();
    let id = thread.id().to_string();
    tokio::select! {
        outcome = first.run(vec![Message::user("go")], &mut thread, &context) => {
            panic!("the workflow should hang in b's tool: {outcome:?}")
        }
        () = hang.notified() => {}
    }
    // The crash: the run's future is dropped while b's mutating call is in flight.
    drop(thread);
    assert_eq!(calls_a.load(Ordering::SeqCst), 1);
    assert_eq!(calls_b.load(Ordering::SeqCst), 1);

    let second = review(
        tool_agent("a", Vec::new(), &calls_a, None),
        tool_agent("b", vec![ScriptStep::text("B")], &calls_b, None),
        tool_agent("s", vec![ScriptStep::text("summary")], &calls_s, None),
    );
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    assert!(thread.state().run_in_progress());
    let outcome = second.resume(&mut thread, &context).await.unwrap();
    assert_eq!(
        outcome.status,
        RunStatus::Ended {
            end_state: EndState::Done
        }
    );
    assert_eq!(outcome.final_text.as_deref(), Some("summary"));
    assert_eq!(
        calls_a.load(Ordering::SeqCst),
        1,
        "a finished: not run again"
    );
    assert_eq!(
        calls_b.load(Ordering::SeqCst),
        1,
        "b's mutating call not run twice"
    );
    let events = store.load(&id).await.unwrap();
    let count = |kind: &str| kinds(&events).iter().filter(|k| **k == kind).count();
    assert_eq!(count("workflow_step_started"), 3, "{:?}", kinds(&events));
    assert_eq!(count("workflow_step_finished"), 3);
    assert_eq!(count("run_started"), 1);
    assert_eq!(count("run_ended"), 1);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64);
    }
    let b = store.load(&step_thread_id(&id, "b")).await.unwrap();
    let b_runs = b
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    assert_eq!(b_runs, 1, "b's run continued, not restarted");

    // Nothing left to resume; a new run on the thread is a new workflow run.
    let again = second.resume(&mut thread, &context).await.unwrap_err();
    assert!(matches!(again, RunError::NothingToResume(_)));
}

#[tokio::test]
async fn resume_refuses_another_workflow_and_runs_refuse_a_busy_thread() {
    let store = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let hang = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let first = review(
        tool_agent(
            "a",
            vec![ScriptStep::tool_call("append", json!({}))],
            &calls,
            Some(hang.clone()),
        ),
        say("b"),
        say("s"),
    );
    let mut thread = Thread::new();
    let id = thread.id().to_string();
    tokio::select! {
        _ = first.run(vec![Message::user("go")], &mut thread, &context) => panic!("should hang"),
        () = hang.notified() => {}
    }
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    let busy = first
        .run(vec![Message::user("again")], &mut thread, &context)
        .await
        .unwrap_err();
    assert!(matches!(busy, RunError::RunInProgress { .. }));
    let other = Workflow::builder("review", Plan::Sequential(vec![Step::new(say("a"))]))
        .build()
        .unwrap();
    let refused = other.resume(&mut thread, &context).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("changed since the run started"),
        "{refused}"
    );
}
