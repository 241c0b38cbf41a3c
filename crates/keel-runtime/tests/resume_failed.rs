//! Issue 14, defect 17: a run that ended `failed` because a model call failed on a
//! retryable error (after the provider's own retries) says it is resumable, and
//! `ToolAgent::resume` continues the conversation to `done` in a new run that names the one it
//! continues; a run that failed on an error waiting cannot fix is not resumable.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_core::{
    EndState, EventKind, EventStore, MemoryStore, Message, ModelErrorKind, ToolRegistry,
};
use keel_runtime::runner::RUN_CONTINUED_NOTICE;
use keel_runtime::{RunContext, RunError, RunStatus, Thread, ToolAgent};
use keel_testkit::scripted::ScriptError;
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

fn failing(kind: ModelErrorKind) -> ScriptStep {
    ScriptStep {
        error: Some(ScriptError {
            kind,
            message: Some(format!("injected {kind}")),
            status: None,
            retry_after_ms: None,
        }),
        ..ScriptStep::default()
    }
}

fn agent(steps: Vec<ScriptStep>) -> (ToolAgent, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new(steps));
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    let agent = ToolAgent::builder("resumer", model.clone())
        .instructions("Compute, then answer.")
        .tools(tools)
        .build();
    (agent, model)
}

#[tokio::test]
async fn a_run_failed_on_a_retryable_model_error_is_resumable_and_resume_finishes_it() {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let (agent, model) = agent(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        failing(ModelErrorKind::Overloaded),
        ScriptStep::text("6*7 = 42"),
    ]);
    let mut thread = Thread::new();
    let failed = agent
        .run(vec![Message::user("what is 6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(failed.end_state(), Some(EndState::Failed), "{failed:?}");
    assert!(failed.resumable, "{failed:?}");
    let json = serde_json::to_value(&failed).unwrap();
    assert_eq!(json["resumable"], true);

    // A later process: the thread is loaded from the store and resumed.
    let mut loaded = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    let done = agent.resume(&mut loaded, &ctx).await.unwrap();
    assert_eq!(
        done.status,
        RunStatus::Ended {
            end_state: EndState::Done
        }
    );
    assert_eq!(done.final_text.as_deref(), Some("6*7 = 42"));
    assert!(!done.resumable);
    assert_ne!(
        done.run_id, failed.run_id,
        "the ended run is never reopened"
    );
    // The continuing request carries the whole conversation, tool result included.
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let last = requests.last().unwrap();
    assert_eq!(last.messages.len(), 3, "{:?}", last.messages);

    // The log: the failed run ended once; the new run names the run it continues.
    let events = store.load(thread.id()).await.unwrap();
    let ended: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RunEnded { end_state, .. } => Some((e.run_id.to_string(), *end_state)),
            _ => None,
        })
        .collect();
    assert_eq!(
        ended,
        vec![
            (failed.run_id.clone(), EndState::Failed),
            (done.run_id.clone(), EndState::Done)
        ]
    );
    let notice = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Notice { code, data, .. } if code == RUN_CONTINUED_NOTICE => {
                Some((e.run_id.to_string(), data.clone().unwrap()))
            }
            _ => None,
        })
        .expect("a run_continued notice");
    assert_eq!(notice.0, done.run_id);
    assert_eq!(notice.1["continues"], json!(failed.run_id));
    assert_eq!(notice.1["error"]["kind"], "overloaded");

    // Nothing is left to resume.
    let mut again = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    assert!(matches!(
        agent.resume(&mut again, &ctx).await,
        Err(RunError::NothingToResume(_))
    ));
}

#[tokio::test]
async fn a_run_failed_on_a_non_retryable_model_error_is_not_resumable() {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let (agent, _) = agent(vec![
        failing(ModelErrorKind::Authentication),
        ScriptStep::text("never"),
    ]);
    let mut thread = Thread::new();
    let failed = agent
        .run(vec![Message::user("hi")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(failed.end_state(), Some(EndState::Failed));
    assert!(!failed.resumable, "{failed:?}");
    let mut loaded = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    assert!(matches!(
        agent.resume(&mut loaded, &ctx).await,
        Err(RunError::NothingToResume(_))
    ));
}
