//! Exactly-once under a crash, in process (issue 44): a run is "crashed" by dropping its
//! future at the worst moment — right after a tool's effect happened, before the tool
//! answered — and resumed from the stored log alone in a fresh agent, as a new process
//! would. The model is hosted-like: it picks its answer by the conversation's turn and
//! gives every answer fresh call ids, so a re-asked model never repeats an id. Effects are
//! counted at the "service" (the tools' shared ledger), not in Keel's log.
//!
//! The crash is deterministic: the tool signals once its effect is recorded and then never
//! answers; the test's `select!` polls the signal first, so the run future is dropped
//! before it is polled again (nothing the run had staged can be written in between).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use keel_core::{
    CancellationToken, DynTool, Effect, EndState, Event, EventKind, EventStore, MemoryStore,
    Message, Model, ModelCapabilities, ModelError, ModelRequest, PolicyTable, RetryPolicy, Role,
    StopReason, StreamEvent, ToolCall, ToolContext, ToolError, ToolErrorCode, ToolRegistry,
    ToolResultKind, ToolSpec, Usage,
};
use keel_runtime::{RunContext, Thread, ToolAgent};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One answer of the hosted-like model: text, or calls of these tools (with arguments).
#[derive(Clone)]
enum Turn {
    Calls(Vec<(&'static str, Value)>),
    Text(&'static str),
}

/// Answers request N of a conversation with turn N (N = assistant messages so far), each
/// tool call with an id never given before (`call_<request number>_<index>`, numbered
/// across every instance: a resumed "process" gets a new model, the provider is the same),
/// as hosted providers do.
struct HostedLike {
    turns: Vec<Turn>,
}

/// Requests answered by every [`HostedLike`] of this test binary.
static REQUESTS: AtomicUsize = AtomicUsize::new(0);

impl HostedLike {
    fn new(turns: Vec<Turn>) -> Arc<Self> {
        Arc::new(Self { turns })
    }
}

impl Model for HostedLike {
    fn id(&self) -> String {
        "mock:hosted-like".into()
    }

    fn capabilities(&self) -> ModelCapabilities {
        ModelCapabilities::default()
    }

    fn stream<'a>(
        &'a self,
        request: ModelRequest<'a>,
    ) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        let number = REQUESTS.fetch_add(1, Ordering::SeqCst) + 1;
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let mut events = Vec::new();
        let reason = match self.turns.get(turn).cloned() {
            Some(Turn::Calls(calls)) => {
                for (index, (name, arguments)) in calls.into_iter().enumerate() {
                    events.push(Ok(StreamEvent::ToolCall(ToolCall {
                        id: format!("call_{number}_{index}"),
                        name: name.into(),
                        arguments: arguments.to_string(),
                    })));
                }
                StopReason::ToolUse
            }
            Some(Turn::Text(text)) => {
                events.push(Ok(StreamEvent::TextDelta(text.into())));
                StopReason::EndTurn
            }
            None => {
                events.push(Ok(StreamEvent::TextDelta("(no more turns)".into())));
                StopReason::EndTurn
            }
        };
        events.push(Ok(StreamEvent::Usage(Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        })));
        events.push(Ok(StreamEvent::Stop {
            reason,
            response_id: Some(format!("resp_{number}")),
        }));
        Box::pin(futures::stream::iter(events))
    }
}

/// What the outside world saw: every effect, keyed by the idempotency key it came with.
#[derive(Default)]
struct Ledger {
    /// Executions per tool (every attempt that reached the service).
    executions: Mutex<HashMap<&'static str, usize>>,
    /// Effects the service kept: a repeated key is deduplicated by tools that honour it.
    effects: Mutex<Vec<(&'static str, String)>>,
}

impl Ledger {
    fn executions(&self, tool: &str) -> usize {
        self.executions
            .lock()
            .unwrap()
            .get(tool)
            .copied()
            .unwrap_or(0)
    }

    fn effects(&self, tool: &str) -> Vec<String> {
        self.effects
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| *name == tool)
            .map(|(_, key)| key.clone())
            .collect()
    }
}

/// How a test tool behaves when called.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Records its effect and answers.
    Answer,
    /// Records its effect, signals the crash, never answers.
    CrashAfterEffect,
    /// Fails with a retryable server error (no effect).
    Fail,
    /// Never answers (the executor's timeout ends it).
    Hang,
}

struct ServiceTool {
    spec: ToolSpec,
    name: &'static str,
    ledger: Arc<Ledger>,
    behaviour: Behaviour,
    crashed: mpsc::UnboundedSender<()>,
}

impl DynTool for ServiceTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            *self
                .ledger
                .executions
                .lock()
                .unwrap()
                .entry(self.name)
                .or_default() += 1;
            if self.behaviour == Behaviour::Fail {
                return Err(ToolError::new(
                    ToolErrorCode::RetryableServer,
                    "the service is down",
                ));
            }
            if self.behaviour == Behaviour::Hang {
                std::future::pending::<()>().await;
            }
            {
                let mut effects = self.ledger.effects.lock().unwrap();
                let repeated = self.spec.honours_idempotency_key
                    && effects
                        .iter()
                        .any(|(name, key)| *name == self.name && *key == ctx.idempotency_key);
                if !repeated {
                    effects.push((self.name, ctx.idempotency_key.clone()));
                }
            }
            if self.behaviour == Behaviour::CrashAfterEffect {
                let _ = self.crashed.send(());
                std::future::pending::<()>().await;
            }
            Ok(json!({"done": true, "key": ctx.idempotency_key}))
        })
    }
}

/// A tool declaration for [`agent`].
struct Declared {
    name: &'static str,
    effect: Effect,
    honours_key: bool,
    behaviour: Behaviour,
    timeout: Option<Duration>,
}

fn tool(name: &'static str, effect: Effect, behaviour: Behaviour) -> Declared {
    Declared {
        name,
        effect,
        honours_key: false,
        behaviour,
        timeout: None,
    }
}

fn agent(
    model: Arc<HostedLike>,
    tools: Vec<Declared>,
    policy: PolicyTable,
    ledger: &Arc<Ledger>,
) -> (ToolAgent, mpsc::UnboundedReceiver<()>) {
    let (crashed, crash) = mpsc::unbounded_channel();
    let mut registry = ToolRegistry::new();
    for declared in tools {
        let mut spec = ToolSpec::new(
            declared.name,
            "A service call.",
            "Calls the test service.\n\nRules:\n- test only",
        )
        .with_effect(declared.effect)
        .with_idempotency_key(declared.honours_key)
        .with_retry(RetryPolicy::none());
        if let Some(timeout) = declared.timeout {
            spec = spec.with_timeout(timeout);
        }
        registry
            .register(Arc::new(ServiceTool {
                spec,
                name: declared.name,
                ledger: ledger.clone(),
                behaviour: declared.behaviour,
                crashed: crashed.clone(),
            }))
            .unwrap();
    }
    let agent = ToolAgent::builder("shop", model)
        .tools(registry)
        .policy(policy)
        .build();
    (agent, crash)
}

/// Runs until a tool signals its crash, then drops the run: what was not stored is lost.
async fn run_until_crash(
    agent: &ToolAgent,
    mut crash: mpsc::UnboundedReceiver<()>,
    store: &Arc<MemoryStore>,
) -> String {
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let id = thread.id().to_string();
    let run = agent.run(vec![Message::user("order a book")], &mut thread, &ctx);
    tokio::pin!(run);
    tokio::select! {
        biased;
        _ = crash.recv() => {}
        outcome = &mut run => panic!("the run ended instead of crashing: {outcome:?}"),
    }
    id
}

/// Resumes the thread from the stored log in a fresh agent (a new process).
async fn resume(agent: &ToolAgent, store: &Arc<MemoryStore>, id: &str, cancel: bool) -> Vec<Event> {
    let token = CancellationToken::new();
    if cancel {
        token.cancel();
    }
    let ctx = RunContext::new(store.clone()).with_cancel(token);
    let mut thread = Thread::load(store.as_ref(), id).await.unwrap();
    let outcome = agent.resume(&mut thread, &ctx).await.unwrap();
    let expected = if cancel {
        EndState::Cancelled
    } else {
        EndState::Done
    };
    assert_eq!(outcome.end_state(), Some(expected), "{outcome:?}");
    let events = store.load(id).await.unwrap();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64, "the log is contiguous");
    }
    events
}

/// The results the model was given, in order: (call id, outcome details).
fn results(events: &[Event]) -> Vec<(String, ToolResultKind)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => {
                Some((result.call_id.clone(), result.outcome.result.clone()))
            }
            _ => None,
        })
        .collect()
}

fn may_have_run(result: &ToolResultKind) -> bool {
    matches!(result, ToolResultKind::Error { details: Some(details), .. }
        if details["may_have_run"] == json!(true))
}

fn order_then_done() -> Vec<Turn> {
    vec![
        Turn::Calls(vec![("place_order", json!({"item": "book"}))]),
        Turn::Text("Ordered."),
    ]
}

#[tokio::test]
async fn an_idempotent_call_keeps_its_key_across_a_crash_when_the_provider_issues_fresh_ids() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let declared = |behaviour| Declared {
        honours_key: true,
        ..tool("place_order", Effect::Idempotent, behaviour)
    };
    let (first, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![declared(Behaviour::CrashAfterEffect)],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    let (second, _) = agent(
        HostedLike::new(order_then_done()),
        vec![declared(Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let events = resume(&second, &store, &id, false).await;
    let keys = ledger.effects("place_order");
    assert_eq!(
        keys.len(),
        1,
        "one logical order, one effect at the service (keys {keys:?}, executions {})",
        ledger.executions("place_order")
    );
    assert_eq!(
        ledger.executions("place_order"),
        2,
        "re-run with the same key"
    );
    let answered = results(&events);
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(matches!(answered[0].1, ToolResultKind::Ok { .. }));
}

#[tokio::test]
async fn a_mutating_call_interrupted_by_a_crash_runs_at_most_once_and_says_it_may_have_run() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let (first, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![tool(
            "place_order",
            Effect::Mutating,
            Behaviour::CrashAfterEffect,
        )],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    let (second, _) = agent(
        HostedLike::new(order_then_done()),
        vec![tool("place_order", Effect::Mutating, Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let events = resume(&second, &store, &id, false).await;
    assert_eq!(ledger.executions("place_order"), 1);
    let answered = results(&events);
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(may_have_run(&answered[0].1), "{answered:?}");
}

#[tokio::test]
async fn a_started_mutating_fallback_is_not_run_again_on_resume() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let policy = PolicyTable::default().with_fallback("search", "book");
    let turns = || {
        vec![
            Turn::Calls(vec![("search", json!({"item": "book"}))]),
            Turn::Text("Booked."),
        ]
    };
    let (first, crash) = agent(
        HostedLike::new(turns()),
        vec![
            tool("search", Effect::ReadOnly, Behaviour::Fail),
            tool("book", Effect::Mutating, Behaviour::CrashAfterEffect),
        ],
        policy.clone(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    let (second, _) = agent(
        HostedLike::new(turns()),
        vec![
            tool("search", Effect::ReadOnly, Behaviour::Fail),
            tool("book", Effect::Mutating, Behaviour::Answer),
        ],
        policy,
        &ledger,
    );
    let events = resume(&second, &store, &id, false).await;
    assert_eq!(
        ledger.executions("book"),
        1,
        "the mutating fallback ran again on resume"
    );
    assert_eq!(
        ledger.executions("search"),
        1,
        "the original is not re-run either"
    );
    let answered = results(&events);
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(may_have_run(&answered[0].1), "{answered:?}");
    let fallback_start = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolCallStarted {
            name,
            fallback_for,
            idempotency_key,
            ..
        } if name == "book" => Some((fallback_for.clone(), idempotency_key.clone())),
        _ => None,
    });
    let (fallback_for, key) = fallback_start.expect("the fallback has a start of its own");
    assert_eq!(fallback_for.as_deref(), Some(answered[0].0.as_str()));
    assert!(key.is_some(), "the fallback has a key of its own");
}

#[tokio::test]
async fn a_relaxed_effect_does_not_re_run_a_call_that_started_as_mutating() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let (first, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![tool(
            "place_order",
            Effect::Mutating,
            Behaviour::CrashAfterEffect,
        )],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    // The tool is declared idempotent after the crash: the recorded effect governs.
    let (second, _) = agent(
        HostedLike::new(order_then_done()),
        vec![tool("place_order", Effect::Idempotent, Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let events = resume(&second, &store, &id, false).await;
    assert_eq!(
        ledger.executions("place_order"),
        1,
        "re-run after relaxing its effect"
    );
    let answered = results(&events);
    assert!(may_have_run(&answered[0].1), "{answered:?}");
    let ToolResultKind::Error { details, .. } = &answered[0].1 else {
        panic!("{answered:?}")
    };
    assert_eq!(
        details.as_ref().unwrap()["relaxed_since_start"],
        json!(true)
    );
    let hint = notices(&events, "relaxed_call_not_rerun");
    assert_eq!(hint.len(), 1, "the operator is told how to force it");
    assert!(hint[0].contains("--rerun-relaxed-calls"), "{hint:?}");
    assert!(notices(&events, "relaxed_call_rerun").is_empty());
}

/// The messages of the notices of `code` in a log.
fn notices(events: &[Event], code: &str) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Notice {
                code: c, message, ..
            } if c == code => Some(message.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_forced_resume_re_runs_a_relaxed_call_with_its_recorded_key_and_says_so() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let (first, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![tool(
            "place_order",
            Effect::Mutating,
            Behaviour::CrashAfterEffect,
        )],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    let (second, _) = agent(
        HostedLike::new(order_then_done()),
        vec![tool("place_order", Effect::Idempotent, Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let ctx = RunContext::new(store.clone()).with_rerun_relaxed_calls(true);
    let mut thread = Thread::load(store.as_ref(), &id).await.unwrap();
    let outcome = second.resume(&mut thread, &ctx).await.unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    let events = store.load(&id).await.unwrap();
    assert_eq!(ledger.executions("place_order"), 2, "forced: it runs again");
    let keys = ledger.effects("place_order");
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "with the key its start recorded: {keys:?}"
    );
    let said = notices(&events, "relaxed_call_rerun");
    assert_eq!(said.len(), 1, "the log says the call ran again on purpose");
    assert!(
        said[0].contains("may already have taken effect"),
        "{said:?}"
    );
    assert!(!may_have_run(&results(&events)[0].1));
}

#[tokio::test]
async fn a_cancelled_resume_records_a_started_mutating_call_as_may_have_run() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let (first, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![tool(
            "place_order",
            Effect::Mutating,
            Behaviour::CrashAfterEffect,
        )],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&first, crash, &store).await;
    let (second, _) = agent(
        HostedLike::new(order_then_done()),
        vec![tool("place_order", Effect::Mutating, Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let events = resume(&second, &store, &id, true).await;
    assert_eq!(ledger.executions("place_order"), 1);
    let answered = results(&events);
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(
        may_have_run(&answered[0].1),
        "a started mutating call is not 'ended before it ran': {answered:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_mutating_call_that_timed_out_gets_no_fallback_and_may_have_run() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let (agent, _crash) = agent(
        HostedLike::new(vec![
            Turn::Calls(vec![("pay", json!({"amount": 10}))]),
            Turn::Text("Paid?"),
        ]),
        vec![
            Declared {
                timeout: Some(Duration::from_millis(50)),
                ..tool("pay", Effect::Mutating, Behaviour::Hang)
            },
            tool("pay_backup", Effect::Mutating, Behaviour::Answer),
        ],
        PolicyTable::default().with_fallback("pay", "pay_backup"),
        &ledger,
    );
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("pay")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(
        ledger.executions("pay_backup"),
        0,
        "a fallback ran after a mutating call whose outcome is unknown"
    );
    let events = store.load(thread.id()).await.unwrap();
    let answered = results(&events);
    assert!(may_have_run(&answered[0].1), "{answered:?}");
}

/// A parent whose one call is a sub-agent (an agent as a tool) that places the order.
fn parent_of(child: ToolAgent) -> ToolAgent {
    let mut tools = ToolRegistry::new();
    tools
        .register(Arc::new(keel_runtime::AgentTool::new(Arc::new(child))))
        .unwrap();
    let model = HostedLike::new(vec![
        Turn::Calls(vec![("shop", json!({"task": "order a book"}))]),
        Turn::Text("The shop agent ordered it."),
    ]);
    ToolAgent::builder("front", model).tools(tools).build()
}

/// Agents as tools across a crash (issue 44): the sub-agent's idempotent order is
/// crashed right after the service recorded it. The parent's call of the sub-agent is
/// durable before it starts, so on resume the parent calls it again under the *recorded*
/// call id — the same child thread (named after that id), which resumes its own started
/// order with its recorded key — although the provider gives every answer fresh ids. One
/// logical order, one effect at the service.
#[tokio::test]
async fn a_sub_agents_idempotent_call_keeps_its_key_when_the_parent_is_crashed_and_resumed() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Arc::new(Ledger::default());
    let declared = |behaviour| Declared {
        honours_key: true,
        ..tool("place_order", Effect::Idempotent, behaviour)
    };
    let (child, crash) = agent(
        HostedLike::new(order_then_done()),
        vec![declared(Behaviour::CrashAfterEffect)],
        PolicyTable::default(),
        &ledger,
    );
    let id = run_until_crash(&parent_of(child), crash, &store).await;
    let (child, _) = agent(
        HostedLike::new(order_then_done()),
        vec![declared(Behaviour::Answer)],
        PolicyTable::default(),
        &ledger,
    );
    let events = resume(&parent_of(child), &store, &id, false).await;
    let keys = ledger.effects("place_order");
    assert_eq!(
        keys.len(),
        1,
        "one logical order, one effect at the service (keys {keys:?}, executions {})",
        ledger.executions("place_order")
    );
    assert_eq!(
        ledger.executions("place_order"),
        2,
        "re-run with the same key"
    );
    let answered = results(&events);
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert!(
        matches!(answered[0].1, ToolResultKind::Ok { .. }),
        "{answered:?}"
    );
    // One child thread: the resumed call found the run it had started.
    let threads = store
        .list_threads(&keel_core::store::ThreadFilter::default())
        .await
        .unwrap();
    let children: Vec<_> = threads
        .iter()
        .filter(|t| t.thread_id.starts_with(&format!("{id}.sub.")))
        .collect();
    assert_eq!(children.len(), 1, "{children:?}");
}
