//! Pure tests of the context strategies: units keep tool calls with their results, the
//! first user message is protected, importance keeps errors, and the overflow error states
//! both numbers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use futures::stream::BoxStream;
use keel_core::context::units::find_orphan;
use keel_core::context::{
    CompactionInput, ContextError, ImportanceStrategy, StrategyKind, TokenBudget, TruncateStrategy,
};
use keel_core::outcome::{ToolErrorCode, ToolOutcome, ToolResultKind};
use keel_core::{
    Message, Model, ModelCapabilities, ModelError, ModelRequest, Part, Role, StreamEvent, ToolCall,
    ToolResult,
};

struct Estimator;

impl Model for Estimator {
    fn id(&self) -> String {
        "test:estimator".into()
    }
    fn capabilities(&self) -> ModelCapabilities {
        ModelCapabilities::default()
    }
    fn stream<'a>(&'a self, _: ModelRequest<'a>) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        Box::pin(futures::stream::empty())
    }
}

fn exchange(turn: usize, error: bool) -> Vec<Message> {
    let id = format!("call_{turn}");
    let result = if error {
        ToolResultKind::Error {
            code: ToolErrorCode::InvalidInput,
            message: "bad".into(),
            details: None,
        }
    } else {
        ToolResultKind::Ok {
            data: serde_json::json!(turn),
            schema_validated: true,
            truncated: false,
        }
    };
    let outcome = ToolOutcome {
        tool: "calculator".into(),
        call_id: id.clone(),
        thread_id: "t".into(),
        run_id: "r".into(),
        attempts: 1,
        latency_ms: 0,
        repairs: Vec::new(),
        result,
    };
    vec![
        Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall(ToolCall {
                id: id.clone(),
                name: "calculator".into(),
                arguments: "{}".into(),
            })],
        },
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult(std::sync::Arc::new(ToolResult {
                call_id: id,
                name: "calculator".into(),
                outcome,
                content: format!("result of turn {turn}: {}", "x".repeat(200)),
            }))],
        },
    ]
}

fn conversation(turns: usize, error_at: Option<usize>) -> Vec<Message> {
    let mut messages = vec![Message::user("the goal")];
    for turn in 1..=turns {
        messages.extend(exchange(turn, Some(turn) == error_at));
    }
    messages
}

fn input(messages: &[Message], history_limit: u64, force: bool) -> CompactionInput<'_> {
    let window = history_limit * 10 / 9 + 20;
    let mut budget = TokenBudget::new(window, 0, 0);
    budget.fixed = budget.request_limit() - history_limit;
    CompactionInput {
        messages,
        budget,
        model: &Estimator,
        digest: "",
        force,
    }
}

#[test]
fn truncate_keeps_the_first_user_message_and_whole_exchanges() {
    let messages = conversation(30, None);
    let compaction = TruncateStrategy::default()
        .plan(&input(&messages, 800, false))
        .unwrap()
        .unwrap();
    assert_eq!(compaction.messages[0], Message::user("the goal"));
    assert_eq!(find_orphan(&compaction.messages), None);
    assert!(compaction.tokens_after <= 800);
    assert_eq!(compaction.messages.last(), messages.last());
    assert_eq!(
        compaction.replaced,
        vec![1..messages.len() - (compaction.messages.len() - 1)]
    );
    // Under the limit nothing happens.
    assert!(
        TruncateStrategy::default()
            .plan(&input(&messages, 100_000, false))
            .unwrap()
            .is_none()
    );
}

#[test]
fn importance_drops_successes_before_an_early_error() {
    let messages = conversation(20, Some(3));
    let compaction = ImportanceStrategy::default()
        .plan(&input(&messages, 900, false))
        .unwrap()
        .unwrap();
    let ids: Vec<&str> = compaction
        .messages
        .iter()
        .flat_map(|m| m.tool_results())
        .map(|r| r.call_id.as_str())
        .collect();
    assert!(ids.contains(&"call_3"), "{ids:?}");
    assert!(
        !ids.contains(&"call_1") && !ids.contains(&"call_2"),
        "{ids:?}"
    );
    assert_eq!(find_orphan(&compaction.messages), None);
}

#[test]
fn overflow_states_request_size_and_limit() {
    let mut messages = vec![Message::user("x".repeat(4_000))];
    messages.extend(exchange(1, false));
    let error = TruncateStrategy::default()
        .plan(&input(&messages, 300, false))
        .unwrap_err();
    let ContextError::Overflow {
        request_tokens,
        limit_tokens,
        ..
    } = error.clone()
    else {
        panic!()
    };
    assert!(request_tokens > limit_tokens);
    let text = error.to_string();
    assert!(
        text.contains(&request_tokens.to_string()) && text.contains(&limit_tokens.to_string()),
        "{text}"
    );
}

#[test]
fn strategies_parse_by_name() {
    assert_eq!(
        "summarize".parse::<StrategyKind>().unwrap(),
        StrategyKind::Summarize
    );
    assert_eq!(
        "importance"
            .parse::<StrategyKind>()
            .unwrap()
            .build(None)
            .name(),
        "importance"
    );
    assert!(
        "bogus"
            .parse::<StrategyKind>()
            .unwrap_err()
            .contains("truncate, summarize or importance")
    );
}
