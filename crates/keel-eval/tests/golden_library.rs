//! The golden record/replay library API (`keel_eval::golden`): a run of a keel.toml agent
//! on a scripted model is recorded with `Cassette::from_run`, saved, and replayed with
//! `replay` — identical without any model or tool doing work, and failing with the
//! differences named once the agent's tools change.

use std::path::Path;
use std::sync::Arc;

use keel_app::App;
use keel_app::recipe::Recipe;
use keel_core::{EventStore, MemoryStore, Message};
use keel_eval::golden::{Cassette, ReplayOptions, replay};
use keel_runtime::Thread;
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

fn app(dir: &Path, tools: &str) -> App {
    let toml = format!(
        "[agents.math]\ninstructions = \"Use the calculator for arithmetic.\"\ntools = [{tools}]\n"
    );
    App::from_toml_str(&toml, dir, Arc::new(|_: &str| None)).unwrap()
}

/// Runs agent `math` on a script (a calculator call, then the answer) and records it.
async fn record(app: &App, path: &Path) -> Cassette {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "17*23"})),
        ScriptStep::text("17*23 = 391"),
    ]));
    let recipe = Recipe {
        agent_name: Some("math".into()),
        ..Recipe::default()
    };
    let built = recipe.build_agent(app, Some(model)).await.unwrap();
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = app.run_context(store.clone(), None, built.approve);
    let mut thread = Thread::new();
    let outcome = built
        .agent
        .run(vec![Message::user("What is 17*23?")], &mut thread, &context)
        .await
        .unwrap();
    let events = store.load(thread.id()).await.unwrap();
    let cassette = Cassette::from_run(
        &events,
        &outcome.run_id,
        path,
        "2026-11-26T00:00:00Z".into(),
    )
    .unwrap();
    cassette.save(path).unwrap();
    cassette
}

#[tokio::test]
async fn a_recorded_run_replays_identically_and_a_changed_agent_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("math.json");
    let recording_app = app(dir.path(), "\"calculator\", \"ping_pong\"");
    let cassette = record(&recording_app, &path).await;
    assert_eq!(cassette.input, ["What is 17*23?"]);
    assert_eq!(cassette.tools_offered, ["calculator", "ping_pong"]);
    assert_eq!(cassette.model_responses.len(), 2);
    assert_eq!(cassette.tool_outputs.len(), 1);
    assert_eq!(cassette.expected.calls[0].tool, "calculator");
    assert_eq!(cassette.expected.calls[0].outcome, "ok");
    assert_eq!(cassette.expected.end_state, "done");
    assert_eq!(Cassette::load(&path).unwrap(), cassette);

    let report = replay(&recording_app, &path, &ReplayOptions::default())
        .await
        .unwrap();
    assert!(report.passed, "{}", report.render());
    assert_eq!(report.responses_used, 2);
    assert_eq!(report.replayed, cassette.expected);

    // The agent no longer has the calculator: the recorded call now fails.
    let changed = app(dir.path(), "\"ping_pong\"");
    let report = replay(&changed, &path, &ReplayOptions::default())
        .await
        .unwrap();
    assert!(!report.passed);
    let at: Vec<&str> = report.differences.iter().map(|d| d.at.as_str()).collect();
    assert_eq!(
        at,
        ["tools offered to the model", "call 1 (calculator): outcome"],
        "{}",
        report.render()
    );
    assert_eq!(report.differences[1].replayed, "error:not_found");
    assert!(
        report.render().starts_with("FAILED  "),
        "{}",
        report.render()
    );
}
