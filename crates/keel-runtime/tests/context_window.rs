//! Context window management through whole runs: a 200-turn tool-using conversation under
//! a small context window for each strategy, the reactive context-overflow path, and
//! importance pruning keeping a tool error.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;

use keel_core::context::summarize::SUMMARY_INSTRUCTIONS;
use keel_core::context::units::find_orphan;
use keel_core::context::{StrategyKind, TokenBudget};
use keel_core::model::estimate_request_tokens;
use keel_core::{
    Budget, EndState, Event, EventKind, EventStore, MemoryStore, Message, ModelCapabilities,
    ModelErrorKind, ModelRequest, Part, Role, ToolRegistry,
};
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_testkit::scripted::{ScriptError, ScriptToolCall};
use keel_testkit::{RecordedRequest, ScriptStep, ScriptedModel};
use serde_json::json;

const OUTPUT_TOKENS: u32 = 256;
const FIRST_USER: &str = "Run the long arithmetic and ping drill, then say done.";

fn tools() -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    tools.register_typed(keel_tools::PingPong).unwrap();
    tools
}

fn builder(model: Arc<ScriptedModel>) -> keel_runtime::ToolAgentBuilder {
    ToolAgent::builder("context", model)
        .instructions("Follow the drill exactly.")
        .tools(tools())
        .budget(Budget::unlimited().with_max_turns(400))
}

/// Tokens of the fixed part (system prompt and tool definitions) of the agent's requests.
fn fixed_tokens() -> u64 {
    let agent = builder(Arc::new(ScriptedModel::new(vec![]))).build();
    let mut request = ModelRequest::new(&[]);
    request.system = Some(agent.system_prompt());
    request.tools = agent.tool_definitions();
    estimate_request_tokens(&request)
}

/// A window leaving about `history` tokens for the conversation.
fn window_for(history: u64) -> u32 {
    let needed = fixed_tokens() + u64::from(OUTPUT_TOKENS) + history;
    u32::try_from((needed * 10).div_ceil(9) + 1).unwrap()
}

fn caps(window: u32) -> ModelCapabilities {
    ModelCapabilities {
        context_window: window,
        max_output_tokens: OUTPUT_TOKENS,
        ..ModelCapabilities::default()
    }
}

fn drill(turns: usize) -> Vec<ScriptStep> {
    let mut steps: Vec<ScriptStep> = (0..turns)
        .map(|i| {
            if i % 3 == 2 {
                ScriptStep::tool_call("ping_pong", json!({"message": format!("ping number {i} with some padding text"), "count": 4}))
            } else {
                ScriptStep::tool_call("calculator", json!({"expression": format!("{i}*3+{}", i % 7)}))
            }
        })
        .collect();
    steps.push(ScriptStep::text("done"));
    steps
}

async fn run(agent: &ToolAgent, text: &str) -> (keel_runtime::RunOutcome, Vec<Event>) {
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user(text)], &mut thread, &ctx)
        .await
        .unwrap();
    let events = store.load(thread.id()).await.unwrap();
    (outcome, events)
}

fn request_tokens(agent: &ToolAgent, request: &RecordedRequest) -> u64 {
    let mut model_request = ModelRequest::new(&request.messages);
    model_request.system = request.system.as_deref();
    model_request.tools = agent.tool_definitions();
    estimate_request_tokens(&model_request)
}

/// The invariants every strategy must keep over a long run.
fn check_long_run(
    agent: &ToolAgent,
    model: &ScriptedModel,
    events: &[Event],
    window: u32,
    strategy: &str,
) {
    let limit = TokenBudget::new(u64::from(window), u64::from(OUTPUT_TOKENS), 0).request_limit();
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        201,
        "{strategy}: every scripted turn is requested once"
    );
    for (i, request) in requests.iter().enumerate() {
        let tokens = request_tokens(agent, request);
        assert!(
            tokens <= limit,
            "{strategy}: request {i} is {tokens} tokens, over the {limit}-token budget"
        );
        assert_eq!(
            request.messages[0],
            Message::user(FIRST_USER),
            "{strategy}: request {i} lost the first user message"
        );
        assert_eq!(
            find_orphan(&request.messages),
            None,
            "{strategy}: request {i} has an orphan"
        );
        let last = request.messages.last().unwrap();
        assert!(
            last.tool_calls().next().is_none(),
            "{strategy}: request {i} ends with unanswered calls"
        );
    }
    // Map requests to their ModelRequested events; a context that is not the previous one
    // plus new messages must have a Compacted event (with exactly that context) in between.
    let mut compactions_since = Vec::new();
    let mut latest_compacted: Vec<Option<Vec<Message>>> = Vec::new();
    let (mut count, mut compacted) = (0, None);
    for event in events {
        match &event.kind {
            EventKind::Compacted {
                strategy: name,
                messages,
                replaced,
            } => {
                assert!(*replaced > 0, "{strategy}: a compaction replaced nothing");
                assert!(
                    name == strategy || name == "tool_result_truncation",
                    "{strategy}: unexpected {name}"
                );
                count += 1;
                compacted = Some(messages.clone());
            }
            EventKind::ModelRequested { .. } => {
                compactions_since.push(count);
                latest_compacted.push(compacted.take());
                count = 0;
            }
            _ => {}
        }
    }
    assert_eq!(compactions_since.len(), requests.len());
    let mut shrunk = 0;
    for i in 1..requests.len() {
        let (prev, next) = (&requests[i - 1].messages, &requests[i].messages);
        if !next.starts_with(prev) {
            shrunk += 1;
            assert!(
                compactions_since[i] > 0,
                "{strategy}: request {i} changed the context without a Compacted event"
            );
            let recorded = latest_compacted[i].as_ref().unwrap();
            assert_eq!(
                recorded, next,
                "{strategy}: request {i} differs from the recorded compacted context"
            );
        }
    }
    assert!(
        shrunk >= 3,
        "{strategy}: the window was never exceeded (only {shrunk} compactions); make it smaller"
    );
    let notices = events
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "context_compacted"),
        )
        .count();
    assert!(
        notices >= shrunk,
        "{strategy}: every compaction names what it replaced"
    );
}

async fn long_run(
    kind: StrategyKind,
    summarizer: Option<Arc<ScriptedModel>>,
) -> (ToolAgent, Arc<ScriptedModel>, Vec<Event>, u32) {
    let window = window_for(1_500);
    let model = Arc::new(ScriptedModel::new(drill(200)).with_capabilities(caps(window)));
    let mut builder = builder(model.clone())
        .context_strategy(kind)
        .max_tool_result_chars(400);
    if let Some(summarizer) = summarizer {
        builder = builder.summarizer_model(summarizer);
    }
    let agent = builder.build();
    let (outcome, events) = run(&agent, FIRST_USER).await;
    assert_eq!(
        outcome.end_state(),
        Some(EndState::Done),
        "{kind}: {events:#?}"
    );
    model.assert_consumed();
    (agent, model, events, window)
}

#[tokio::test]
async fn truncate_keeps_a_200_turn_run_within_budget() {
    let (agent, model, events, window) = long_run(StrategyKind::Truncate, None).await;
    check_long_run(&agent, &model, &events, window, "truncate");
}

#[tokio::test]
async fn importance_keeps_a_200_turn_run_within_budget() {
    let (agent, model, events, window) = long_run(StrategyKind::Importance, None).await;
    check_long_run(&agent, &model, &events, window, "importance");
}

#[tokio::test]
async fn summarize_keeps_a_200_turn_run_within_budget() {
    let summaries: Vec<ScriptStep> = (0..400)
        .map(|i| ScriptStep::text(format!("Summary {i}: the drill computed calculator results and pong replies; no open questions.")))
        .collect();
    let summarizer = Arc::new(ScriptedModel::new(summaries));
    let (agent, model, events, window) =
        long_run(StrategyKind::Summarize, Some(summarizer.clone())).await;
    check_long_run(&agent, &model, &events, window, "summarize");
    // The summaries are in the context, and the summarizer saw a transcript with the rules.
    let with_summary = model
        .requests()
        .iter()
        .filter(|r| {
            r.messages
                .iter()
                .any(|m| m.parts.iter().any(|p| matches!(p, Part::Summary { .. })))
        })
        .count();
    assert!(
        with_summary > 100,
        "only {with_summary} requests carried a summary"
    );
    let summary_requests = summarizer.requests();
    assert!(!summary_requests.is_empty());
    for request in &summary_requests {
        assert_eq!(request.system.as_deref(), Some(SUMMARY_INSTRUCTIONS));
        let prompt = request.messages[0].text();
        assert!(
            prompt.contains("<transcript>") && prompt.contains("calculator"),
            "{prompt}"
        );
        assert!(
            prompt.contains("<working_memory>"),
            "the decision log is carried into the summary: {prompt}"
        );
    }
    // A later summary folds the earlier one in, so the context holds at most one.
    for request in model.requests() {
        let summaries = request
            .messages
            .iter()
            .filter(|m| m.parts.iter().any(|p| matches!(p, Part::Summary { .. })))
            .count();
        assert!(summaries <= 1);
        assert!(request.messages.iter().all(|m| m.role != Role::System));
    }
}

fn overflow_step() -> ScriptStep {
    ScriptStep {
        error: Some(ScriptError {
            kind: ModelErrorKind::ContextOverflow,
            message: Some("prompt is too long: 250000 tokens > 200000 maximum".into()),
            status: Some(400),
            retry_after_ms: None,
        }),
        ..ScriptStep::default()
    }
}

fn calc(i: usize) -> ScriptStep {
    ScriptStep::tool_call("calculator", json!({"expression": format!("{i}+{i}")}))
}

#[tokio::test]
async fn context_overflow_once_compacts_and_retries() {
    let model = Arc::new(ScriptedModel::new(vec![
        calc(1),
        calc(2),
        calc(3),
        overflow_step(),
        ScriptStep::text("6"),
    ]));
    let agent = builder(model.clone())
        .context_strategy(StrategyKind::Truncate)
        .build();
    let (outcome, events) = run(&agent, "add things").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    model.assert_consumed();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    let overflow = events
        .iter()
        .position(
            |e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "context_overflow"),
        )
        .expect("the overflow is recorded");
    let compacted = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::Compacted { .. }))
        .expect("compacted");
    assert!(compacted > overflow, "{kinds:?}");
    assert_eq!(kinds[compacted + 1], "model_requested", "{kinds:?}");
    let requests = model.requests();
    assert!(
        requests[4].messages.len() < requests[3].messages.len(),
        "the retry sent a smaller context"
    );
    assert_eq!(requests[4].messages[0], Message::user("add things"));
    assert_eq!(find_orphan(&requests[4].messages), None);
}

#[tokio::test]
async fn context_overflow_twice_fails_with_sizes() {
    let model = Arc::new(ScriptedModel::new(vec![
        calc(1),
        calc(2),
        calc(3),
        overflow_step(),
        overflow_step(),
    ]));
    let agent = builder(model.clone())
        .context_strategy(StrategyKind::Truncate)
        .build();
    let (outcome, events) = run(&agent, "add things").await;
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    model.assert_consumed();
    let failure = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ModelFailed { error, .. } => Some(error.clone()),
            _ => None,
        })
        .expect("model_failed");
    assert_eq!(failure.kind, ModelErrorKind::ContextOverflow);
    let budget = TokenBudget::new(128_000, 4_096, 0);
    let limit = budget.request_limit().to_string();
    assert!(
        failure.message.contains(&limit),
        "the limit {limit} is stated: {}",
        failure.message
    );
    assert!(
        failure.message.contains("estimated tokens")
            && failure.message.contains("even after compaction"),
        "{}",
        failure.message
    );
    let stated = failure
        .message
        .split("(~")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap();
    assert!(
        stated.parse::<u64>().unwrap() > 0,
        "the request size is stated: {}",
        failure.message
    );
    let ended = events.iter().find_map(|e| match &e.kind {
        EventKind::RunEnded {
            end_state, reason, ..
        } => Some((*end_state, reason.clone())),
        _ => None,
    });
    let (end_state, reason) = ended.unwrap();
    assert_eq!(end_state, EndState::Failed);
    assert!(reason.unwrap().contains("context_overflow"));
}

#[tokio::test]
async fn importance_keeps_an_early_tool_error_and_drops_older_successes() {
    let mut steps = vec![calc(1), calc(2)];
    steps.push(ScriptStep {
        tool_calls: vec![ScriptToolCall {
            id: Some("bad_turn_3".into()),
            name: "calculator".into(),
            arguments: None,
            arguments_raw: Some("{not json".into()),
        }],
        ..ScriptStep::default()
    });
    for i in 4..=40 {
        steps.push(calc(i));
    }
    steps.push(ScriptStep::text("done"));
    let window = window_for(900);
    let model = Arc::new(ScriptedModel::new(steps).with_capabilities(caps(window)));
    let agent = builder(model.clone())
        .context_strategy(StrategyKind::Importance)
        .build();
    let (outcome, events) = run(&agent, "add a lot").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert!(events.iter().any(
        |e| matches!(&e.kind, EventKind::Compacted { strategy, .. } if strategy == "importance")
    ));
    let last = model.requests().pop().unwrap();
    let ids: Vec<String> = last
        .messages
        .iter()
        .flat_map(|m| {
            m.tool_results()
                .map(|r| r.call_id.clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        ids.contains(&"bad_turn_3".to_string()),
        "the turn-3 error is kept: {ids:?}"
    );
    let error = last
        .messages
        .iter()
        .flat_map(|m| m.tool_results())
        .find(|r| r.call_id == "bad_turn_3")
        .unwrap();
    assert!(error.is_error());
    assert!(
        !ids.contains(&"call_0_0".to_string()) && !ids.contains(&"call_1_0".to_string()),
        "older successes dropped: {ids:?}"
    );
    assert!(ids.len() < 39, "successful results were pruned: {ids:?}");
    assert_eq!(last.messages[0], Message::user("add a lot"));
    assert_eq!(find_orphan(&last.messages), None);
}

#[tokio::test]
async fn oversized_tool_results_are_cut_with_the_seed_notice() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call(
            "ping_pong",
            json!({"message": "x".repeat(500), "count": 10}),
        ),
        ScriptStep::text("ok"),
    ]));
    let agent = builder(model.clone()).max_tool_result_chars(1_000).build();
    let (outcome, events) = run(&agent, "ping big").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let requests = model.requests();
    let content = requests[1].tool_result_contents()[0].to_string();
    assert!(
        content.contains("[OUTPUT TRUNCATED: Showing 1,000 of "),
        "{content}"
    );
    assert!(content.ends_with("characters from ping_pong]"), "{content}");
    assert!(events.iter().any(
        |e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "tool_result_truncated")
    ));
    // The full result stays in the log.
    let full = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolCallFinished { result } => Some(result.content.clone()),
        _ => None,
    });
    assert!(full.unwrap().len() > 5_000);
}
