//! Call rules enforced by the runner (`ToolAgentBuilder::call_rule`): a report filed before
//! its reads, with findings that cite nothing the tools returned, or a second time in the
//! run is answered with an `invalid_input` error telling the model what to do — and the
//! mutating tool never runs for it. The same goes for a question to the user asked beside
//! calls whose results may answer it (a rule of the runner itself).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use keel_core::{
    CallRule, DynTool, Effect, EndState, EventKind, EventStore, MemoryStore, Message, ToolContext,
    ToolError, ToolErrorCode, ToolRegistry, ToolResultKind, ToolSpec,
};
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

/// A tool answering `answer`, counting its executions.
struct Fake {
    spec: ToolSpec,
    answer: Value,
    runs: Arc<AtomicUsize>,
}

impl DynTool for Fake {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(&'a self, _: Value, _: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.clone();
        Box::pin(async move { Ok(answer) })
    }
}

fn tool(name: &str, effect: Effect, answer: Value) -> (Arc<dyn DynTool>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let spec = ToolSpec::new(
        name,
        format!("{name} (test)"),
        format!("{name} — usage guide"),
    )
    .with_input_schema(json!({"type": "object"}))
    .with_effect(effect);
    let fake = Fake {
        spec,
        answer,
        runs: runs.clone(),
    };
    (Arc::new(fake), runs)
}

fn report(findings: &[&str]) -> ScriptStep {
    ScriptStep::tool_call(
        "file_risk_report",
        json!({"release_id": "v2.1.0", "severity": "high", "findings": findings}),
    )
}

fn read(name: &str) -> ScriptStep {
    ScriptStep::tool_call(name, json!({"release_id": "v2.1.0"}))
}

/// Runs the agent on "Assess release v2.1.0" in a new thread over a memory store.
#[allow(clippy::unwrap_used)]
async fn assess(agent: &ToolAgent) -> (keel_runtime::RunOutcome, Arc<MemoryStore>, Thread) {
    let store = Arc::new(MemoryStore::new());
    let mut thread = Thread::new();
    let outcome = agent
        .run(
            vec![Message::user("Assess release v2.1.0")],
            &mut thread,
            &RunContext::new(store.clone()),
        )
        .await
        .unwrap();
    (outcome, store, thread)
}

#[tokio::test]
async fn reports_are_refused_until_grounded_in_this_runs_reads_and_filed_once() {
    let (summary, _) = tool(
        "get_release_summary",
        Effect::ReadOnly,
        json!({"version": "v2.1.0", "tests": {"passed": 142, "failed": 2},
               "deployment_metrics": {"error_rate": 0.02}}),
    );
    let (details, _) = tool(
        "get_test_details",
        Effect::ReadOnly,
        json!({"failing_tests": [{"name": "payments::capture::test_capture_partial_refund"}]}),
    );
    let (file, filed) = tool(
        "file_risk_report",
        Effect::Mutating,
        json!({"report_id": "rr-1"}),
    );
    let mut tools = ToolRegistry::new();
    for t in [summary, details, file] {
        tools.register(t).unwrap();
    }
    let model = Arc::new(ScriptedModel::new(vec![
        // Copying the usage guide's example without reading anything.
        report(&["2 payment tests fail"]),
        read("get_release_summary"),
        read("get_test_details"),
        // Findings that cite nothing the tools returned.
        report(&["passed", "failed"]),
        report(&["error rate 2%", "test_capture_partial_refund fails"]),
        // Filing again.
        report(&["142 tests pass"]),
        ScriptStep::text("Filed rr-1: high."),
    ]));
    let agent = ToolAgent::builder("detective", model.clone())
        .tools(tools)
        .call_rule(CallRule {
            tool: "file_risk_report".into(),
            after: vec!["get_release_summary".into(), "get_test_details".into()],
            same: vec!["release_id".into()],
            max_successes: Some(1),
            grounded: vec!["/findings".into()],
        })
        .build();
    let (outcome, store, thread) = assess(&agent).await;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(
        filed.load(Ordering::SeqCst),
        1,
        "the report ran exactly once"
    );

    let events = store.load(thread.id()).await.unwrap();
    let reports: Vec<(bool, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } if result.name == "file_risk_report" => {
                Some(match &result.outcome.result {
                    ToolResultKind::Ok { .. } => (true, String::new()),
                    ToolResultKind::Error { code, message, .. } => {
                        assert_eq!(*code, ToolErrorCode::InvalidInput);
                        (false, message.clone())
                    }
                })
            }
            _ => None,
        })
        .collect();
    assert_eq!(reports.len(), 4, "{reports:#?}");
    assert!(
        reports[0]
            .1
            .contains("still missing: `get_release_summary` and `get_test_details`"),
        "{}",
        reports[0].1
    );
    assert!(
        reports[1].1.contains("/findings/0 \"passed\"")
            && reports[1].1.contains("/findings/1 \"failed\""),
        "{}",
        reports[1].1
    );
    assert!(reports[2].0, "the grounded report is filed");
    assert!(
        reports[3].1.contains("already succeeded once in this run"),
        "{}",
        reports[3].1
    );
    // A refused call never started: no tool_call_started for it.
    let started = events
        .iter()
        .filter(|e| {
            matches!(&e.kind, EventKind::ToolCallStarted { name, .. } if name == "file_risk_report")
        })
        .count();
    assert_eq!(started, 1);
    // The model saw each refusal as the call's result.
    let requests = model.requests();
    assert!(
        requests[1].tool_result_contents()[0].contains("was not run"),
        "{:?}",
        requests[1].tool_result_contents()
    );
    // The requests say which tool the rules would refuse whatever its arguments: the
    // report until both reads succeeded, and again once it was filed.
    let withheld: Vec<bool> = requests
        .iter()
        .map(|r| r.withheld_tools == ["file_risk_report"])
        .collect();
    assert_eq!(
        withheld,
        [true, true, true, false, false, true, true],
        "{requests:#?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.tools.iter().any(|t| t == "file_risk_report")),
        "the prompt keeps every tool"
    );
    // And where the run stands in the sequence the rule declares: both reads, the one
    // still missing, then the report (again after a refusal a corrected call can fix),
    // then nothing once it was filed.
    let expected: Vec<Vec<String>> = requests.iter().map(|r| r.expected_tools.clone()).collect();
    let reads = vec![
        "get_release_summary".to_string(),
        "get_test_details".to_string(),
    ];
    let report = vec!["file_risk_report".to_string()];
    assert_eq!(
        expected,
        [
            reads.clone(),
            reads,
            vec!["get_test_details".to_string()],
            report.clone(),
            report,
            vec![],
            vec![],
        ],
        "{requests:#?}"
    );
    // And what the report's findings could cite, once a filing was refused after the
    // report was no longer withheld (the first filing, before the reads, does not count):
    // the reads' words and figures, never the release id they were called with.
    let grounded: Vec<bool> = requests
        .iter()
        .map(|r| !r.grounded_arguments.is_empty())
        .collect();
    assert_eq!(
        grounded,
        [false, false, false, false, true, false, false],
        "{requests:#?}"
    );
    let argument = &requests[4].grounded_arguments[0];
    assert_eq!(
        (argument.tool.as_str(), argument.pointer.as_str()),
        ("file_risk_report", "/findings")
    );
    for cited in ["test_capture_partial_refund", "payments", "142", "0.02"] {
        assert!(
            argument.citations.iter().any(|c| c == cited),
            "{cited}: {argument:?}"
        );
    }
    assert!(
        !argument.citations.iter().any(|c| c.contains("2.1.0")),
        "{argument:?}"
    );
}

/// A question asked beside calls that will run is refused (their results may answer it):
/// the run goes on with the results instead of stopping for the user, and the model is
/// told why. A question asked on its own still stops the run for the user.
#[tokio::test]
async fn a_question_asked_beside_running_calls_waits_for_their_results() {
    let (details, runs) = tool(
        "get_test_details",
        Effect::ReadOnly,
        json!({"error_rate": 0.02}),
    );
    let mut tools = ToolRegistry::new();
    tools.register(details).unwrap();
    let call = |name: &str, arguments: Value| keel_testkit::scripted::ScriptToolCall {
        id: None,
        name: name.into(),
        arguments: Some(arguments),
        arguments_raw: None,
    };
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep {
            tool_calls: vec![
                call("get_test_details", json!({"release_id": "v2.1.0"})),
                call(
                    "ask_user",
                    json!({"question": "What is the error rate?", "missing_fields": ["error_rate"]}),
                ),
            ],
            ..ScriptStep::default()
        },
        ScriptStep::tool_call("ask_user", json!({"question": "Which region?"})),
    ]));
    let agent = ToolAgent::builder("detective", model.clone())
        .tools(tools)
        .build();
    let (outcome, store, thread) = assess(&agent).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The second, lone question stops the run as before.
    assert_eq!(
        outcome.end_state(),
        Some(EndState::ClarifyNeeded),
        "{outcome:?}"
    );
    let events = store.load(thread.id()).await.unwrap();
    let asked: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserAsked { question, .. } => Some(question.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["Which region?"]);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let seen = requests[1].tool_result_contents();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].contains("0.02"), "{seen:?}");
    assert!(
        seen[1].contains("not asked") && seen[1].contains("`get_test_details`"),
        "{seen:?}"
    );
}
