//! Workflows of keel.toml: a workflow naming an unknown agent fails before any model is
//! called with an error naming the file, the key and its line (and `keel config check`
//! reports it the same way); a valid one runs its agents against a mock provider, and its
//! run records the recipe `keel resume` rebuilds it from.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_app::workflow::{WorkflowRequest, recorded_workflow};
use keel_app::{App, AppError};
use keel_config::DiagnosticCode;
use keel_core::{EndState, Message};
use keel_runtime::{Agent, RunContext, Thread};
use keel_testkit::mock_llm::{MockLlmServer, MockScript};

const AGENTS: &str = r#"
[agents.researcher]
model = "openai:gpt-4.1"
instructions = "Research."
tools = []

[agents.summarizer]
model = "openai:gpt-4.1"
instructions = "Summarize."
tools = []
"#;

fn app(mock: &MockLlmServer, dir: &std::path::Path, workflows: &str) -> App {
    let toml = format!(
        "[providers.openai]\nbase_url = \"{}/v1\"\n{AGENTS}{workflows}",
        mock.base_url()
    );
    let env = Arc::new(|n: &str| (n == "OPENAI_API_KEY").then(|| "sk".to_string()));
    App::from_toml_str(&toml, dir, env).unwrap()
}

#[tokio::test]
async fn an_unknown_agent_is_located_before_any_model_call() {
    let mock =
        MockLlmServer::start(MockScript::from_json(r#"{"turns": [{"text": "hi"}]}"#).unwrap())
            .await
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = app(
        &mock,
        dir.path(),
        "\n[workflows.review]\nkind = \"parallel\"\nagents = [\"researcher\", \"reseacher2\"]\nthen = \"summarizer\"\n",
    );
    let error = app
        .workflow(&WorkflowRequest::new("review"))
        .await
        .unwrap_err();
    let AppError::Located(diagnostics) = &error else {
        panic!("not located: {error}");
    };
    assert_eq!(diagnostics.len(), 1, "{error}");
    let d = &diagnostics[0];
    assert_eq!(d.code, DiagnosticCode::UnknownReference);
    assert_eq!(d.file, "keel.toml");
    assert_eq!(d.key.as_deref(), Some("workflows.review.agents[1]"));
    let line = app
        .loaded()
        .source
        .text
        .lines()
        .position(|l| l.contains("reseacher2"))
        .unwrap()
        + 1;
    assert_eq!(d.line, Some(line));
    let text = error.to_string();
    assert!(text.starts_with(&format!("keel.toml:{line}:")), "{text}");
    assert!(text.contains("unknown agent `reseacher2`"), "{text}");
    assert!(text.contains("did you mean `researcher`"), "{text}");
    assert_eq!(mock.request_count(), 0, "no model was called");

    // `keel config check` finds the same problem at the same place.
    let checked = keel_config::check_str(
        &app.loaded().source.text,
        "keel.toml",
        dir.path(),
        &|_: &str| Some("sk".to_string()),
    );
    assert!(
        checked
            .iter()
            .any(|c| c.key.as_deref() == Some("workflows.review.agents[1]") && c.line == Some(line)),
        "{checked:?}"
    );

    // An unknown workflow names the known ones.
    let unknown = app
        .workflow(&WorkflowRequest::new("reviwe"))
        .await
        .unwrap_err();
    assert!(
        unknown.to_string().contains("did you mean `review`"),
        "{unknown}"
    );
}

#[tokio::test]
async fn misplaced_and_missing_keys_are_load_errors() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "{AGENTS}\n[workflows.a]\nkind = \"sequential\"\nagents = [\"researcher\"]\n\n[workflows.b]\nagents = [\"researcher\"]\n"
    );
    let env = Arc::new(|_: &str| None);
    let error = App::from_toml_str(&toml, dir.path(), env).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("`workflows.a.agents` does not apply to a sequential workflow"),
        "{text}"
    );
    assert!(
        text.contains("`workflows.a` (sequential) needs `steps"),
        "{text}"
    );
    assert!(text.contains("`workflows.b` needs `kind"), "{text}");
}

#[tokio::test]
async fn a_parallel_workflow_runs_and_records_its_recipe() {
    let mock = MockLlmServer::start(
        MockScript::from_json(r#"{"turn_by": "conversation", "turns": [{"text": "finding"}]}"#)
            .unwrap(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = app(
        &mock,
        dir.path(),
        "\n[workflows.review]\nkind = \"parallel\"\nagents = [\"researcher\", \"researcher\"]\nthen = \"summarizer\"\n",
    );
    let request = WorkflowRequest::new("review").with_overrides(None, None, Some(3));
    let workflow = app.workflow(&request).await.unwrap();
    // The same agent twice: two steps, told apart.
    let names: Vec<&str> = workflow.plan().steps().iter().map(|s| s.name()).collect();
    assert_eq!(names, ["researcher", "researcher-2", "summarizer"]);
    let context = RunContext::default();
    let mut thread = Thread::new();
    let outcome = workflow
        .run(vec![Message::user("topic")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(outcome.final_text.as_deref(), Some("finding"));
    assert_eq!(mock.request_count(), 3);
    let recorded = recorded_workflow(thread.run_events()).unwrap();
    assert_eq!(recorded.workflow, "review");
    assert_eq!(recorded.max_turns, Some(3));
    // A step's run records an agent recipe `keel resume STEP_THREAD` can rebuild.
    let step = context
        .store
        .load(&keel_runtime::workflow::step_thread_id(
            thread.id(),
            "summarizer",
        ))
        .await
        .unwrap();
    let recipe = match &step[0].kind {
        keel_core::EventKind::RunStarted {
            definition: Some(definition),
            ..
        } => definition.recipe.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(recipe["agent_name"], "summarizer");
    assert_eq!(recipe["model"], "openai:gpt-4.1");
    assert!(
        recorded_workflow(
            &step
                .iter()
                .cloned()
                .map(std::sync::Arc::new)
                .collect::<Vec<_>>()
        )
        .is_none()
    );
}
