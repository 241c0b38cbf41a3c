//! Planner modes, control tools and critics, driven by scripted models.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_core::planner::PlannerMode;
use keel_core::{
    Budget, EndState, EventKind, EventStore, MemoryStore, Message, RuleCritic, ToolRegistry,
};
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::json;

fn calculator() -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    tools
}

#[tokio::test]
async fn structured_planner_reasks_once_on_invalid_output_then_succeeds() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text("I will use the calculator to compute 6*7."),
        ScriptStep::text(
            "{\"action\": \"call_tool\", \"name\": \"calculator\", \"args\": {\"expression\": \"6*7\"}}",
        ),
        ScriptStep::text("```json\n{\"action\": \"stop\", \"reason\": \"6*7 = 42\"}\n```"),
    ]));
    let agent = ToolAgent::builder("planner", model.clone())
        .tools(calculator())
        .planner_mode(PlannerMode::Structured)
        .build();
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("what is 6*7?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(outcome.final_text.as_deref(), Some("6*7 = 42"));
    assert_eq!(outcome.tool_calls.len(), 1);
    assert!(outcome.tool_calls[0].ok);
    model.assert_consumed();

    let events = store.load(thread.id()).await.unwrap();
    let reasks = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "invalid_action"))
        .count();
    assert_eq!(reasks, 1, "exactly one re-ask");
    let requests = model.requests();
    // No native tools are offered in structured mode; the action protocol is in the prompt.
    assert!(requests[0].tools.is_empty());
    assert!(
        requests[0]
            .system
            .as_deref()
            .unwrap()
            .contains("\"action\": \"call_tool\"")
    );
    // The re-ask tells the model what was wrong.
    assert!(
        requests[1]
            .messages
            .last()
            .unwrap()
            .text()
            .contains("not a valid action")
    );
    // Tool results come back as observations in plain text.
    assert!(
        requests[2]
            .messages
            .last()
            .unwrap()
            .text()
            .starts_with("Observation: calculator")
    );
    assert!(requests[2].messages.last().unwrap().text().contains("42"));
}

#[tokio::test]
async fn structured_planner_gives_up_after_bounded_reasks() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text("no"),
        ScriptStep::text("still no"),
        ScriptStep::text("nope"),
    ]));
    let agent = ToolAgent::builder("planner", model)
        .tools(calculator())
        .planner_mode(PlannerMode::Structured)
        .build();
    let outcome = agent
        .run(
            vec![Message::user("6*7?")],
            &mut Thread::new(),
            &RunContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    assert!(
        outcome
            .reason
            .unwrap()
            .contains("no valid action after 2 re-asks")
    );
}

#[tokio::test]
async fn a_rule_critic_sends_an_unsupported_answer_back_with_its_gaps() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text("It is 42."),
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("Checked with the calculator: 42."),
    ]));
    let critic = RuleCritic::new().require_successful_call("calculator", &["expression"]);
    let agent = ToolAgent::builder("checked", model.clone())
        .tools(calculator())
        .critic(Arc::new(critic))
        .build();
    let store = Arc::new(MemoryStore::new());
    let mut thread = Thread::new();
    let outcome = agent
        .run(
            vec![Message::user("6*7?")],
            &mut thread,
            &RunContext::new(store.clone()),
        )
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("Checked with the calculator: 42.")
    );
    let feedback = model.requests()[1].messages.last().unwrap().text();
    assert!(
        feedback.contains("`calculator` was never called successfully"),
        "{feedback}"
    );
    let verdicts: Vec<bool> = store
        .load(thread.id())
        .await
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Critique { satisfied, .. } => Some(*satisfied),
            _ => None,
        })
        .collect();
    // Rejected answer, the calculator observation, then the accepted answer.
    assert_eq!(verdicts, [false, true, true]);
}

#[tokio::test]
async fn a_critic_that_is_never_satisfied_fails_the_run_after_the_limit() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text("42"),
        ScriptStep::text("42!"),
        ScriptStep::text("42!!"),
    ]));
    let critic =
        RuleCritic::new().require_in_answer("calculator", "mention that you used the calculator");
    let agent = ToolAgent::builder("strict", model.clone())
        .critic(Arc::new(critic))
        .max_critic_rejections(2)
        .budget(Budget::unlimited().with_max_turns(10))
        .build();
    let outcome = agent
        .run(
            vec![Message::user("6*7?")],
            &mut Thread::new(),
            &RunContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    assert!(
        outcome
            .reason
            .as_deref()
            .unwrap()
            .contains("rejected the final answer 3 time(s)"),
        "{outcome:?}"
    );
    model.assert_consumed();
}

#[tokio::test]
async fn replan_is_recorded_and_answered() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("replan", json!({"subgoals": ["compute", "report"]})),
        ScriptStep::text("done"),
    ]));
    let agent = ToolAgent::builder("planner", model)
        .tools(calculator())
        .build();
    let mut thread = Thread::new();
    let outcome = agent
        .run(
            vec![Message::user("plan")],
            &mut thread,
            &RunContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(
        thread.state().run().unwrap().subgoals,
        ["compute", "report"]
    );
}

#[test]
fn the_tools_section_of_the_system_prompt_is_stable() {
    let model = Arc::new(ScriptedModel::new(vec![]));
    let agent = ToolAgent::builder("snapshot", model)
        .instructions("You are a careful assistant.")
        .tools(keel_tools::builtin_registry().unwrap())
        .build();
    insta::assert_snapshot!("system_prompt_with_builtin_tools", agent.system_prompt());
}
