//! Resuming a stored thread from its log ([`keel_app::resume::resume_thread`]): the agent
//! is rebuilt from the recipe its run recorded (settings given override it, with a
//! notice), a run that already ended reports its outcome, and a missing thread is an
//! error.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::sync::Arc;

use keel_app::recipe::Recipe;
use keel_app::resume::{self, Latest, Runner};
use keel_app::{App, AppError};
use keel_core::{EndState, EventStore, MemoryStore, Message};
use keel_runtime::{RunApprovalMode, RunStatus, Thread};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

fn app() -> App {
    let env = Arc::new(|n: &str| (n == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    App::from_toml_str("", Path::new("."), env).unwrap()
}

fn scripted(steps: Vec<ScriptStep>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(steps))
}

/// A recipe asking approval for every call, run until its calculator call pauses it;
/// returns the store, the thread id and the paused call's id.
async fn paused_run(app: &App, recipe: &Recipe) -> (Arc<MemoryStore>, String, String) {
    let store = Arc::new(MemoryStore::new());
    let model = scripted(vec![ScriptStep::tool_call(
        "calculator",
        json!({"expression": "6*7"}),
    )]);
    let built = recipe.build_agent(app, Some(model)).await.unwrap();
    let context = app.run_context(store.clone(), recipe.approve, built.approve);
    let mut thread = Thread::new();
    let outcome = built
        .agent
        .run(vec![Message::user("6*7?")], &mut thread, &context)
        .await
        .unwrap();
    let RunStatus::AwaitingApproval { call_id, .. } = outcome.status else {
        panic!("not paused: {outcome:?}");
    };
    (store, thread.id().to_string(), call_id)
}

fn ask_calculator() -> Recipe {
    Recipe {
        tools: vec!["calculator".into()],
        approve: Some(RunApprovalMode::Ask),
        ..Recipe::default()
    }
}

#[tokio::test]
async fn a_paused_run_is_rebuilt_from_its_recipe_and_resumed() {
    let app = app();
    let (store, id, call_id) = paused_run(&app, &ask_calculator()).await;
    let mut thread = resume::load_existing(store.as_ref(), &id).await.unwrap();
    let Runner::Agent(Some(recorded)) = resume::recorded_runner(&thread).unwrap() else {
        panic!("no recorded recipe");
    };
    assert_eq!(recorded.tools, vec!["calculator".to_string()]);
    assert_eq!(recorded.approve, Some(RunApprovalMode::Ask));
    assert!(matches!(
        resume::latest_run(&thread).unwrap(),
        Latest::Continue {
            consumed_steps: 1,
            notice: None,
            ..
        }
    ));
    let context = keel_runtime::RunContext::new(store.clone());
    thread.approve(&context, &call_id, None).await.unwrap();

    let overrides = Recipe {
        max_turns: Some(5),
        ..Recipe::default()
    };
    let model = scripted(vec![ScriptStep::text("42")]);
    let resumed = resume::resume_thread(&app, store.clone(), &id, &overrides, Some(model), |c| c)
        .await
        .unwrap();
    assert_eq!(
        resumed.outcome.status,
        RunStatus::Ended {
            end_state: EndState::Done
        }
    );
    assert_eq!(resumed.outcome.final_text.as_deref(), Some("42"));
    assert_eq!(resumed.outcome.tool_calls.len(), 1, "{:?}", resumed.outcome);
    assert!(resumed.outcome.tool_calls[0].ok);
    assert_eq!(
        resumed.notices,
        vec!["--max-turns 5 overrides the run's recorded default".to_string()]
    );

    // Resuming again reports the ended run; nothing is rebuilt (no model is needed).
    let again = resume::resume_thread(&app, store, &id, &Recipe::default(), None, |c| c)
        .await
        .unwrap();
    assert_eq!(again.outcome.run_id, resumed.outcome.run_id);
    assert_eq!(again.outcome.final_text.as_deref(), Some("42"));
    assert!(again.notices.is_empty(), "{:?}", again.notices);
}

#[tokio::test]
async fn a_missing_thread_is_an_error() {
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let error = resume::resume_thread(&app(), store, "nope", &Recipe::default(), None, |c| c)
        .await
        .unwrap_err();
    assert!(matches!(error, AppError::Resume(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "thread nope does not exist in this store"
    );
}

#[tokio::test]
async fn a_script_recipe_needs_its_model() {
    let recipe = Recipe {
        script: Some("/tmp/script.json".into()),
        ..Recipe::default()
    };
    let error = recipe.build_agent(&app(), None).await.unwrap_err();
    assert!(error.to_string().contains("script"), "{error}");
}
