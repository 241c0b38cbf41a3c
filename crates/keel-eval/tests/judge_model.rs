//! `ModelJudge` against keel-testkit's `ScriptedModel`: the verdict is validated against
//! its schema (one repair, then `JudgeError`), and verdicts are cached by content hash so
//! a second identical judgement makes no model call.

use std::sync::Arc;

use keel_eval::judge::ModelJudge;
use keel_eval::suite::Scenario;
use keel_eval::{Judge, RunTrace};
use keel_testkit::{ScriptStep, ScriptedModel};

fn scenario() -> Scenario {
    Scenario {
        id: "s1".into(),
        description: None,
        input: "what is 6*7?".into(),
        setup: None,
        expect: Default::default(),
    }
}

fn trace(answer: &str) -> RunTrace {
    let mut trace = RunTrace::from_events(&[]);
    trace.final_text = Some(answer.into());
    trace
}

fn judge(model: &Arc<ScriptedModel>, cache: Option<&std::path::Path>) -> ModelJudge {
    ModelJudge::new(model.clone(), "openai:judge")
        .unwrap()
        .with_cache_dir(cache.map(std::path::Path::to_path_buf))
}

#[tokio::test]
async fn a_valid_verdict_is_returned_and_the_prompt_carries_the_rubric() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text(
        r#"{"score": 0.75, "rationale": "mostly right"}"#,
    )]));
    let verdict = judge(&model, None)
        .judge("States 42.", &scenario(), &trace("It is 42."))
        .await
        .unwrap();
    assert_eq!(verdict.score, 0.75);
    assert_eq!(verdict.rationale, "mostly right");
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    let prompt = requests[0].messages[0].text();
    for part in ["States 42.", "what is 6*7?", "It is 42.", "(no tool calls)"] {
        assert!(prompt.contains(part), "{part} missing from {prompt}");
    }
}

#[tokio::test]
async fn a_second_identical_judgement_is_served_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text(
        r#"{"score": 1, "rationale": "correct"}"#,
    )]));
    let first = judge(&model, Some(dir.path()))
        .judge("States 42.", &scenario(), &trace("42"))
        .await
        .unwrap();
    // A new judge over the same directory: no model call.
    let second = judge(&model, Some(dir.path()))
        .judge("States 42.", &scenario(), &trace("42"))
        .await
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(model.requests().len(), 1);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // A different answer is a different key: the model is asked (and the script is out).
    let other = judge(&model, Some(dir.path()))
        .judge("States 42.", &scenario(), &trace("41"))
        .await;
    assert!(other.is_err());
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn a_score_outside_0_1_is_sent_back_once_and_the_repair_is_used() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text(r#"{"score": 7, "rationale": "great"}"#),
        ScriptStep::text(r#"{"score": 0.7, "rationale": "great"}"#),
    ]));
    let verdict = judge(&model, None)
        .judge("States 42.", &scenario(), &trace("42"))
        .await
        .unwrap();
    assert_eq!(verdict.score, 0.7);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let repair = requests[1].messages.last().unwrap().text();
    assert!(repair.contains("/score"), "{repair}");
}

#[tokio::test]
async fn two_invalid_verdicts_are_a_judge_error_and_nothing_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::text(r#"{"score": -1, "rationale": "bad"}"#),
        ScriptStep::text("I think it is fine."),
    ]));
    let error = judge(&model, Some(dir.path()))
        .judge("States 42.", &scenario(), &trace("42"))
        .await
        .unwrap_err();
    assert!(error.0.contains("no valid verdict"), "{error}");
    assert_eq!(model.requests().len(), 2);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
