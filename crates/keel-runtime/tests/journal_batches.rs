//! The journal's commits under the durability rule (an event is durable before any
//! effect outside the process that depends on it): a one-tool read-only run commits once,
//! when it returns; a mutating or idempotent call's start (with the model's answer before
//! it) is stored synchronously before the call runs, so such a run commits twice; a run
//! that pauses for approval commits once, at the pause; `RunDurability::Steps` commits
//! before every model call as well. A model and a tool that look into the store when they
//! are called check the "before". A read-only call's start is written while it runs only
//! when it runs for a while. An append that fails while events are staged leaves the
//! thread "diverged"; the next run reloads it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::BoxFuture;
use keel_core::store::{ThreadFilter, ThreadSummary};
use keel_core::{
    AppendDurability, DynTool, Effect, EndState, Event, EventKind, EventStore, MemoryStore,
    Message, StoreError, ToolContext, ToolError, ToolRegistry, ToolSpec,
};
use keel_runtime::{RunContext, RunError, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

/// A memory store that records each append's event kinds and can fail the next append.
#[derive(Default)]
struct RecordingStore {
    inner: MemoryStore,
    batches: Mutex<Vec<(Vec<String>, AppendDurability)>>,
    fail_next: AtomicBool,
}

fn kind_name(event: &Event) -> String {
    event.kind.name().to_string()
}

#[async_trait]
impl EventStore for RecordingStore {
    async fn append(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
    ) -> Result<(), StoreError> {
        self.append_with(
            thread_id,
            expected_next_seq,
            events,
            AppendDurability::Default,
        )
        .await
    }

    async fn append_with(
        &self,
        thread_id: &str,
        expected_next_seq: u64,
        events: &[Event],
        durability: AppendDurability,
    ) -> Result<(), StoreError> {
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Backend("injected append failure".into()));
        }
        self.inner
            .append(thread_id, expected_next_seq, events)
            .await?;
        self.batches
            .lock()
            .unwrap()
            .push((events.iter().map(kind_name).collect(), durability));
        Ok(())
    }

    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.load(thread_id).await
    }

    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads(filter).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        self.inner.delete_thread(thread_id).await
    }
}

/// A tool that, when called, records whether the model's request for it and its start
/// are in the store; with `wait_for_start` it keeps running until its start is stored.
struct Probe {
    spec: ToolSpec,
    store: Arc<RecordingStore>,
    thread_id: String,
    seen_requested: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
    wait_for_start: bool,
}

impl Probe {
    async fn request_and_start_stored(&self) -> bool {
        let stored = self.store.load(&self.thread_id).await.unwrap();
        let requested = stored
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolCallRequested { .. }));
        let started = stored
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolCallStarted { .. }));
        requested && started
    }
}

impl DynTool for Probe {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.seen_requested
                .store(self.request_and_start_stored().await, Ordering::SeqCst);
            if self.wait_for_start {
                // Paused test time: each sleep lets the runtime's clock jump ahead.
                while !self.request_and_start_stored().await {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            Ok(json!({"ok": true}))
        })
    }
}

fn probe_agent(
    store: &Arc<RecordingStore>,
    thread_id: &str,
    effect: Effect,
    model: Arc<ScriptedModel>,
) -> (ToolAgent, Arc<AtomicBool>, Arc<AtomicUsize>) {
    probe_agent_with(store, thread_id, effect, model, false)
}

fn probe_agent_with(
    store: &Arc<RecordingStore>,
    thread_id: &str,
    effect: Effect,
    model: Arc<ScriptedModel>,
    wait_for_start: bool,
) -> (ToolAgent, Arc<AtomicBool>, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let probe = Probe {
        spec: ToolSpec::new(
            "probe",
            "Looks into the store.",
            "Records what the store holds.\n\nRules:\n- test only",
        )
        .with_effect(effect),
        store: store.clone(),
        thread_id: thread_id.to_string(),
        seen_requested: seen.clone(),
        calls: calls.clone(),
        wait_for_start,
    };
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(probe)).unwrap();
    (
        ToolAgent::builder("test", model).tools(tools).build(),
        seen,
        calls,
    )
}

fn probe_agent_builder(
    store: &Arc<RecordingStore>,
    thread_id: &str,
    effect: Effect,
    model: Arc<ScriptedModel>,
) -> keel_runtime::ToolAgentBuilder {
    let probe = Probe {
        spec: ToolSpec::new(
            "probe",
            "Looks into the store.",
            "Records what the store holds.\n\nRules:\n- test only",
        )
        .with_effect(effect),
        store: store.clone(),
        thread_id: thread_id.to_string(),
        seen_requested: Arc::new(AtomicBool::new(false)),
        calls: Arc::new(AtomicUsize::new(0)),
        wait_for_start: false,
    };
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(probe)).unwrap();
    ToolAgent::builder("test", model).tools(tools)
}

fn one_tool_script() -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("probe", json!({})),
        ScriptStep::text("done"),
    ]))
}

fn batch_kinds(store: &RecordingStore) -> Vec<Vec<String>> {
    store
        .batches
        .lock()
        .unwrap()
        .iter()
        .map(|(kinds, _)| kinds.clone())
        .collect()
}

const WHOLE_RUN: [&str; 10] = [
    "run_started",
    "user_message",
    "model_requested",
    "model_responded",
    "tool_call_requested",
    "tool_call_started",
    "tool_call_finished",
    "model_requested",
    "model_responded",
    "run_ended",
];

fn kinds(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

// Paused time: the staged start's flush timer can only fire when every task is idle, so
// a tool that finishes at once always finishes first, however loaded the machine.
#[tokio::test(start_paused = true)]
async fn a_one_tool_read_only_run_commits_once_when_it_returns() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let model = one_tool_script();
    let (agent, seen, calls) = probe_agent(&store, thread.id(), Effect::ReadOnly, model.clone());
    let outcome = agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        !seen.load(Ordering::SeqCst),
        "a read-only call that finishes at once has its start written with its result"
    );
    assert_eq!(
        batch_kinds(&store),
        vec![kinds(&WHOLE_RUN)],
        "one commit, before the outcome is returned"
    );
    // The log is the same as an unbatched run's: contiguous and complete.
    let events = store.load(thread.id()).await.unwrap();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.seq, i as u64);
    }
    assert_eq!(thread.state().next_seq(), events.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn steps_durability_commits_before_every_model_call() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let agent = probe_agent_builder(&store, thread.id(), Effect::ReadOnly, one_tool_script())
        .durability(keel_core::RunDurability::Steps)
        .build();
    agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(
        batch_kinds(&store),
        vec![
            kinds(&["run_started", "user_message", "model_requested"]),
            kinds(&[
                "model_responded",
                "tool_call_requested",
                "tool_call_started",
                "tool_call_finished",
                "model_requested"
            ]),
            kinds(&["model_responded", "run_ended"]),
        ],
        "unexpected commits"
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_only_call_that_keeps_running_has_its_start_written_while_it_runs() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let (agent, _, calls) = probe_agent_with(
        &store,
        thread.id(),
        Effect::ReadOnly,
        one_tool_script(),
        true,
    );
    let outcome = agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        batch_kinds(&store),
        vec![kinds(&WHOLE_RUN[..6]), kinds(&WHOLE_RUN[6..]),],
        "the start is written while the call runs, at the store's default durability"
    );
    let start = store.batches.lock().unwrap()[0].1;
    assert_eq!(start, AppendDurability::Default);
}

/// A call that is not read-only starts only once its start and the model's answer are
/// stored, synchronously; its result rides with the run's end: two commits.
async fn commits_twice_with_a_synchronous_start(effect: Effect) {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let (agent, seen, _) = probe_agent(&store, thread.id(), effect, one_tool_script());
    agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "{effect:?}: the call ran before its start was stored"
    );
    let batches = store.batches.lock().unwrap().clone();
    assert_eq!(
        batches,
        vec![
            (kinds(&WHOLE_RUN[..6]), AppendDurability::Sync),
            (kinds(&WHOLE_RUN[6..]), AppendDurability::Default),
        ],
        "{effect:?}"
    );
    let events = store.load(thread.id()).await.unwrap();
    let start = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCallStarted {
                effect: recorded,
                idempotency_key,
                ..
            } => Some((*recorded, idempotency_key.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(start.0, Some(effect), "the start records the effect");
    assert!(
        start
            .1
            .as_deref()
            .is_some_and(|key| key.starts_with(thread.id())),
        "the start records the idempotency key: {:?}",
        start.1
    );
}

#[tokio::test]
async fn a_one_tool_mutating_run_commits_twice_its_start_synchronously() {
    commits_twice_with_a_synchronous_start(Effect::Mutating).await;
}

#[tokio::test]
async fn a_one_tool_idempotent_run_commits_twice_its_start_synchronously() {
    commits_twice_with_a_synchronous_start(Effect::Idempotent).await;
}

#[tokio::test]
async fn a_run_paused_for_approval_commits_once_at_the_pause() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let (agent, _, calls) = probe_agent(&store, thread.id(), Effect::Mutating, one_tool_script());
    let ctx = ctx.with_approval_mode(keel_runtime::RunApprovalMode::Ask);
    let outcome = agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome.status,
            keel_runtime::RunStatus::AwaitingApproval { .. }
        ),
        "{:?}",
        outcome.status
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        batch_kinds(&store),
        vec![kinds(&[
            "run_started",
            "user_message",
            "model_requested",
            "model_responded",
            "tool_call_requested",
            "approval_requested"
        ])],
        "one commit, at the pause"
    );
}

#[tokio::test]
async fn a_failed_append_with_staged_events_reloads_the_thread_before_the_next_run() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    // Two runs' answers: the first run asks the model before its only append fails.
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("probe", json!({})),
        ScriptStep::text("done"),
        ScriptStep::tool_call("probe", json!({})),
        ScriptStep::text("done"),
    ]));
    let (agent, _, calls) = probe_agent(&store, thread.id(), Effect::ReadOnly, model);
    // The first append carries the whole staged run (it read only): make it fail.
    store.fail_next.store(true, Ordering::SeqCst);
    let failed = agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await;
    assert!(
        matches!(failed, Err(RunError::Store(StoreError::Backend(_)))),
        "{failed:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the read-only call ran");
    assert!(store.load(thread.id()).await.unwrap().is_empty());
    // The in-memory thread folded events the store never got; the next run must not
    // build on them (it would append at a seq the store does not have).
    let outcome = agent
        .run(vec![Message::user("go again")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let events = store.load(thread.id()).await.unwrap();
    assert_eq!(events[0].seq, 0);
    assert!(matches!(events[0].kind, EventKind::RunStarted { .. }));
    let users: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage { message } => Some(message.text()),
            _ => None,
        })
        .collect();
    assert_eq!(users, vec!["go again".to_string()]);
    assert_eq!(thread.state().next_seq(), events.len() as u64);
}

/// A read-only tool that always fails with a retryable server error.
struct Failing {
    spec: ToolSpec,
}

impl DynTool for Failing {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        _args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            Err(ToolError::new(
                keel_core::ToolErrorCode::RetryableServer,
                "the search service is down",
            ))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_mutating_fallback_runs_only_once_the_staged_start_is_written_synchronously() {
    let store = Arc::new(RecordingStore::default());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let seen = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tools = ToolRegistry::new();
    tools
        .register(Arc::new(Failing {
            spec: ToolSpec::new("search", "Searches.", "Searches.\n\nRules:\n- test only")
                .with_effect(Effect::ReadOnly),
        }))
        .unwrap();
    tools
        .register(Arc::new(Probe {
            spec: ToolSpec::new(
                "search_cache",
                "Looks into the store.",
                "Records what the store holds.\n\nRules:\n- test only",
            )
            .with_effect(Effect::Mutating),
            store: store.clone(),
            thread_id: thread.id().to_string(),
            seen_requested: seen.clone(),
            calls: calls.clone(),
            wait_for_start: false,
        }))
        .unwrap();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("search", json!({})),
        ScriptStep::text("done"),
    ]));
    let agent = ToolAgent::builder("test", model)
        .tools(tools)
        .policy(keel_core::PolicyTable::default().with_fallback("search", "search_cache"))
        .build();
    let outcome = agent
        .run(vec![Message::user("go")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the fallback ran once");
    assert!(
        seen.load(Ordering::SeqCst),
        "the mutating fallback ran before the call's request and start were stored"
    );
    // The retries' waits outlast the staged start's flush timer: the start is written
    // while the call runs, and the fallback decision synchronously before the fallback.
    let batches = store.batches.lock().unwrap().clone();
    let fallback = batches
        .iter()
        .find(|(kinds, _)| kinds.contains(&"policy_applied".to_string()))
        .unwrap();
    assert_eq!(fallback.1, AppendDurability::Sync);
    assert!(
        !fallback.0.contains(&"tool_call_finished".to_string()),
        "{batches:?}"
    );
}
