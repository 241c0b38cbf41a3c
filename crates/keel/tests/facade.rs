//! The facade's contract: how runs that do not end `done` surface as errors (and can be
//! continued), when configuration problems are reported, typed-answer repair bounds, and
//! that an `Agent` can be shared across tasks.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel::core::store::ThreadFilter;
use keel::core::{ApprovalMode, Effect, EndState, ModelErrorKind};
use keel::prelude::*;
use keel_testkit::scripted::ScriptError;
use keel_testkit::{ScriptStep, ScriptedModel};
use serde::{Deserialize, Serialize};

fn scripted(steps: Vec<ScriptStep>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(steps))
}

#[tokio::test]
async fn a_failed_run_is_an_error_with_end_state_reason_and_thread() {
    let model = scripted(vec![ScriptStep {
        error: Some(ScriptError {
            kind: ModelErrorKind::InvalidRequest,
            message: Some("model does not exist".into()),
            status: Some(404),
            retry_after_ms: None,
        }),
        ..ScriptStep::default()
    }]);
    let agent = Agent::builder("a", model).build().unwrap();
    let error = agent.prompt("hi").await.unwrap_err();
    let Error::RunEnded {
        end_state,
        reason,
        thread_id,
        ..
    } = &error
    else {
        panic!("not RunEnded: {error}");
    };
    assert_eq!(*end_state, EndState::Failed);
    assert!(
        reason.as_deref().unwrap().contains("model does not exist"),
        "{reason:?}"
    );
    assert_eq!(error.thread_id(), Some(thread_id.as_str()));
    assert_eq!(error.end_state(), Some(EndState::Failed));
    assert!(
        error
            .to_string()
            .starts_with("the run ended failed on thread thr_")
    );
    // The whole story is in the store.
    let thread = agent.load_thread(thread_id).await.unwrap();
    assert!(!thread.is_empty());
}

#[tokio::test]
async fn a_run_out_of_budget_ends_budget_exceeded() {
    let model = scripted(vec![
        ScriptStep::tool_call("ping_pong", serde_json::json!({"message": "x"})),
        ScriptStep::text("never reached"),
    ]);
    let agent = Agent::builder("a", model)
        .tool(keel::tools::PingPong)
        .budget(Budget {
            max_turns: Some(1),
            ..Budget::default()
        })
        .build()
        .unwrap();
    let error = agent.prompt("ping").await.unwrap_err();
    assert_eq!(error.end_state(), Some(EndState::BudgetExceeded), "{error}");
}

#[derive(Deserialize, JsonSchema)]
struct DeleteArgs {
    /// The release to delete.
    release: String,
}

#[derive(Serialize, JsonSchema)]
struct Deleted {
    deleted: String,
}

/// A mutating tool that needs a human's approval, counting its executions.
struct DeleteRelease(Arc<AtomicUsize>);

impl Tool for DeleteRelease {
    type Args = DeleteArgs;
    type Output = Deleted;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "delete_release",
            "Delete a release.",
            "delete_release — Usage Guide\n\nDeletes a release; needs approval.",
        )
        .with_effect(Effect::Mutating)
        .with_approval(ApprovalMode::Always)
    }

    async fn call(&self, args: DeleteArgs, _ctx: &ToolContext) -> Result<Deleted, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Deleted {
            deleted: args.release,
        })
    }
}

#[tokio::test]
async fn a_run_waiting_for_approval_is_an_error_and_resumes_once_approved() {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = scripted(vec![
        ScriptStep::tool_call("delete_release", serde_json::json!({"release": "v1"})),
        ScriptStep::text("v1 is deleted."),
    ]);
    let agent = Agent::builder("admin", model)
        .tool(DeleteRelease(Arc::clone(&calls)))
        .build()
        .unwrap();
    let error = agent.prompt("Delete v1").await.unwrap_err();
    let Error::AwaitingApproval {
        thread_id,
        call_id,
        tool,
        ..
    } = error
    else {
        panic!("not AwaitingApproval: {error}");
    };
    assert_eq!(tool, "delete_release");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing ran before approval"
    );

    let context = agent.context().await.unwrap();
    let mut thread = agent.load_thread(&thread_id).await.unwrap();
    thread.approve(&context, &call_id, None).await.unwrap();
    let outcome = agent.resume(&mut thread).await.unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("v1 is deleted."));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Score {
    score: u8,
}

#[tokio::test]
async fn typed_answers_accept_fences_and_honour_the_repair_bound() {
    let model = scripted(vec![ScriptStep::text("```json\n{\"score\": 7}\n```")]);
    let agent = Agent::builder("a", model).build().unwrap();
    let score: Score = agent.prompt_typed("Score it").await.unwrap();
    assert_eq!(score.score, 7);

    // No repairs allowed: the first wrong answer fails, listing the violation.
    let model = scripted(vec![
        ScriptStep::text(r#"{"score": "high"}"#),
        ScriptStep::text(r#"{"score": 7}"#),
    ]);
    let agent = Agent::builder("a", model.clone())
        .build()
        .unwrap()
        .with_max_repairs(0);
    let error = agent.prompt_typed::<Score>("Score it").await.unwrap_err();
    let Error::InvalidOutput {
        attempts,
        violations,
        output,
        type_name,
        ..
    } = &error
    else {
        panic!("not InvalidOutput: {error}");
    };
    assert_eq!((*attempts, type_name.as_str()), (1, "Score"));
    assert!(violations[0].starts_with("at `/score`"), "{violations:?}");
    assert_eq!(output, r#"{"score": "high"}"#);
    assert_eq!(model.remaining(), 1, "no second request");
}

#[tokio::test]
async fn a_typed_answer_that_never_ends_done_fails_like_prompt() {
    let model = scripted(vec![ScriptStep {
        error: Some(ScriptError {
            kind: ModelErrorKind::Authentication,
            message: Some("bad key".into()),
            status: Some(401),
            retry_after_ms: None,
        }),
        ..ScriptStep::default()
    }]);
    let agent = Agent::builder("a", model).build().unwrap();
    let error = agent.prompt_typed::<Score>("Score it").await.unwrap_err();
    assert_eq!(error.end_state(), Some(EndState::Failed), "{error}");
}

#[test]
fn an_agent_is_shareable_and_its_prompts_run_in_spawned_tasks() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    let model = scripted(vec![ScriptStep::text("one"), ScriptStep::text("two")]);
    let agent = Agent::builder("a", model).build().unwrap();
    send_sync(&agent);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..2)
            .map(|i| {
                let agent = agent.clone();
                tokio::spawn(async move { agent.prompt(format!("question {i}")).await })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap().unwrap());
        }
        answers.sort();
        assert_eq!(answers, ["one", "two"]);
        // Each prompt ran on its own thread, in the shared store.
        let context = agent.context().await.unwrap();
        let threads = context
            .store
            .list_threads(&ThreadFilter::default())
            .await
            .unwrap();
        assert_eq!(threads.len(), 2);
    });
}

const CONFIG: &str = r#"
[store]
url = "memory:"

# A local address: nothing is called, and test mode (KEEL_TEST_MODE=1) refuses hosted ones.
[providers.openai]
base_url = "http://127.0.0.1:9/v1"

[agents.helper]
instructions = "Help."
model = "openai:gpt-4.1-mini"
tools = ["calculator"]

[agents.broken]
instructions = "Help."
model = "nowhere:model"
"#;

fn app(toml: &str) -> keel::app::App {
    let env = Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    keel::app::App::from_toml_str(toml, Path::new("."), env).unwrap()
}

#[tokio::test]
async fn inside_a_runtime_a_bad_definition_fails_when_the_agent_is_made() {
    let agent = Agent::from_app(app(CONFIG), "helper").unwrap();
    assert_eq!(agent.name(), "helper");
    let error = Agent::from_app(app(CONFIG), "broken").unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error}");
    assert!(error.to_string().contains("nowhere"), "{error}");
    let error = Agent::from_app(app(CONFIG), "nobody").unwrap_err();
    assert!(error.to_string().contains("nobody"), "{error}");
}

#[test]
fn outside_a_runtime_the_agent_is_built_on_first_use() {
    // No runtime: nothing that might need one runs yet, so the bad model is found on
    // the first prompt (still before any model call).
    let agent = Agent::from_app(app(CONFIG), "broken").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let error = runtime.block_on(agent.prompt("hi")).unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error}");
    assert!(error.to_string().contains("nowhere"), "{error}");
}

#[tokio::test]
async fn with_context_moves_runs_to_another_store() {
    let model = scripted(vec![ScriptStep::text("hi")]);
    let agent = Agent::builder("a", model).build().unwrap();
    let store = Arc::new(keel::core::MemoryStore::new());
    let moved = agent.with_context(RunContext::new(store.clone()));
    moved.prompt("hello").await.unwrap();
    let listed = keel::core::EventStore::list_threads(store.as_ref(), &ThreadFilter::default())
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let original = agent.context().await.unwrap();
    assert!(
        original
            .store
            .list_threads(&ThreadFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}
