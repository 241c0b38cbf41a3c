//! The tool executor against seed 000 §9.1: happy path, invalid input, output mismatch
//! repaired and not repairable, timeout, 429/5xx retried with jitter (virtual clock), empty
//! results, pagination over three pages, payload over the cap; plus parallelism and
//! mutual exclusion of mutating tools.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use keel_core::{
    CancellationToken, DynTool, Effect, PageRequest, RetryPolicy, ToolCall, ToolContext, ToolError,
    ToolErrorCode, ToolRegistry, ToolResultKind, ToolSpec, paginate,
};
use keel_runtime::ToolExecutor;
use keel_runtime::executor::CallEnv;
use serde_json::{Value, json};

type Handler =
    Arc<dyn Fn(Value, u32) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync>;

/// A tool whose behaviour is a closure of (args, attempt number).
struct FnTool {
    spec: ToolSpec,
    calls: AtomicU32,
    handler: Handler,
}

impl FnTool {
    fn new(
        spec: ToolSpec,
        handler: impl Fn(Value, u32) -> BoxFuture<'static, Result<Value, ToolError>>
        + Send
        + Sync
        + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            spec,
            calls: AtomicU32::new(0),
            handler: Arc::new(handler),
        })
    }
}

impl DynTool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        let attempt = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        (self.handler)(args, attempt)
    }
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec::new(name, "A test tool.", "test guidance").with_input_schema(json!({
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1}, "page_token": {"type": ["string", "null"]}},
        "required": ["query"],
        "additionalProperties": false
    }))
}

fn executor(tools: Vec<Arc<FnTool>>) -> ToolExecutor {
    let mut registry = ToolRegistry::new();
    for tool in tools {
        registry.register(tool).unwrap();
    }
    ToolExecutor::new(&registry)
}

async fn run(
    executor: &ToolExecutor,
    name: &str,
    args: Value,
) -> keel_runtime::executor::Execution {
    let cancel = CancellationToken::new();
    let call = ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: args.to_string(),
    };
    executor
        .execute(
            &call,
            CallEnv {
                thread_id: "thr",
                run_id: "run",
                cancel: &cancel,
                extras: None,
            },
        )
        .await
}

fn ok_data(execution: &keel_runtime::executor::Execution) -> &Value {
    match &execution.outcome.result {
        ToolResultKind::Ok { data, .. } => data,
        other => panic!("expected ok, got {other:?}"),
    }
}

fn error_code(execution: &keel_runtime::executor::Execution) -> ToolErrorCode {
    execution
        .outcome
        .error_code()
        .unwrap_or_else(|| panic!("expected an error, got {:?}", execution.outcome))
}

#[tokio::test]
async fn happy_path_validates_output_and_records_provenance() {
    let tool = FnTool::new(
        spec("search").with_output_schema(Some(json!({"type": "object", "required": ["hits"], "properties": {"hits": {"type": "integer"}}}))),
        |_, _| Box::pin(async { Ok(json!({"hits": 3})) }),
    );
    let execution = run(&executor(vec![tool]), "search", json!({"query": "keel"})).await;
    assert_eq!(ok_data(&execution), &json!({"hits": 3}));
    assert!(matches!(
        execution.outcome.result,
        ToolResultKind::Ok {
            schema_validated: true,
            truncated: false,
            ..
        }
    ));
    assert_eq!(execution.outcome.attempts, 1);
    assert_eq!(
        (
            execution.outcome.thread_id.as_str(),
            execution.outcome.run_id.as_str()
        ),
        ("thr", "run")
    );
    assert!(execution.retries.is_empty());
}

#[tokio::test]
async fn invalid_input_names_the_failing_path_and_never_calls_the_tool() {
    let tool = FnTool::new(spec("search"), |_, _| Box::pin(async { Ok(json!({})) }));
    let exec = executor(vec![tool.clone()]);
    let execution = run(&exec, "search", json!({"query": 42, "extra": true})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::InvalidInput);
    let ToolResultKind::Error {
        message, details, ..
    } = &execution.outcome.result
    else {
        unreachable!()
    };
    assert!(message.contains("/query"), "{message}");
    assert!(
        details.as_ref().unwrap()["errors"]
            .as_array()
            .unwrap()
            .len()
            >= 2,
        "both problems reported: {details:?}"
    );
    let missing = run(&exec, "search", json!({})).await;
    let ToolResultKind::Error { message, .. } = &missing.outcome.result else {
        unreachable!()
    };
    assert!(
        message.contains("\"query\" is a required property"),
        "{message}"
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(execution.outcome.attempts, 0);
}

#[tokio::test]
async fn output_mismatch_is_repaired_when_a_coercion_suffices() {
    let schema = json!({"type": "object", "required": ["count", "unit"], "properties": {"count": {"type": "integer"}, "unit": {"type": "string", "default": "items"}}});
    let tool = FnTool::new(spec("count").with_output_schema(Some(schema)), |_, _| {
        Box::pin(async { Ok(json!({"count": "3"})) })
    });
    let execution = run(&executor(vec![tool]), "count", json!({"query": "x"})).await;
    assert_eq!(ok_data(&execution), &json!({"count": 3, "unit": "items"}));
    assert_eq!(
        execution.outcome.repairs.len(),
        2,
        "{:?}",
        execution.outcome.repairs
    );
    assert!(
        execution
            .outcome
            .repairs
            .iter()
            .any(|r| r.contains("coerced /count from \"3\" to 3")),
        "{:?}",
        execution.outcome.repairs
    );
    assert!(
        execution
            .outcome
            .repairs
            .iter()
            .any(|r| r.contains("filled missing /unit"))
    );
}

#[tokio::test]
async fn output_mismatch_that_needs_invented_data_is_not_repaired() {
    let schema = json!({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "count": {"type": "integer"}}});
    let tool = FnTool::new(spec("lookup").with_output_schema(Some(schema)), |_, _| {
        Box::pin(async { Ok(json!({"count": "many"})) })
    });
    let execution = run(&executor(vec![tool]), "lookup", json!({"query": "x"})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::OutputSchemaMismatch);
    assert!(execution.outcome.repairs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_tool_times_out_on_each_attempt() {
    let tool = FnTool::new(
        spec("slow")
            .with_timeout(Duration::from_secs(2))
            .with_retry(RetryPolicy {
                max_attempts: 2,
                base_delay_ms: 100,
                max_delay_ms: 1_000,
            }),
        |_, _| Box::pin(std::future::pending()),
    );
    let started = tokio::time::Instant::now();
    let execution = run(&executor(vec![tool.clone()]), "slow", json!({"query": "x"})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::Timeout);
    assert_eq!(execution.outcome.attempts, 2);
    assert_eq!(tool.calls.load(Ordering::SeqCst), 2);
    // Two 2 s timeouts plus one jittered wait, on the virtual clock.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(4) && elapsed < Duration::from_secs(6),
        "{elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limits_and_server_errors_are_retried_with_decorrelated_jitter() {
    let tool = FnTool::new(
        spec("flaky").with_retry(RetryPolicy {
            max_attempts: 4,
            base_delay_ms: 100,
            max_delay_ms: 2_000,
        }),
        |_, attempt| {
            Box::pin(async move {
                match attempt {
                    1 => Err(ToolError::new(ToolErrorCode::RateLimited, "429")),
                    2 => Err(ToolError::new(ToolErrorCode::RetryableServer, "503")),
                    3 => Err(ToolError::new(ToolErrorCode::RateLimited, "429")
                        .with_retry_after_ms(1_500)),
                    _ => Ok(json!({"ok": true})),
                }
            })
        },
    );
    let started = tokio::time::Instant::now();
    let execution = run(&executor(vec![tool]), "flaky", json!({"query": "x"})).await;
    assert_eq!(ok_data(&execution), &json!({"ok": true}));
    assert_eq!(execution.outcome.attempts, 4);
    let waits: Vec<u64> = execution.retries.iter().map(|r| r.wait_ms).collect();
    let codes: Vec<ToolErrorCode> = execution.retries.iter().map(|r| r.code).collect();
    assert_eq!(
        codes,
        [
            ToolErrorCode::RateLimited,
            ToolErrorCode::RetryableServer,
            ToolErrorCode::RateLimited
        ]
    );
    // Decorrelated jitter: each wait is within [base, 3 × previous], capped; the server's
    // retry-after is honoured exactly.
    assert!((100..300).contains(&waits[0]), "{waits:?}");
    assert!(
        waits[1] >= 100 && waits[1] < waits[0].max(100) * 3,
        "{waits:?}"
    );
    assert_eq!(waits[2], 1_500);
    let total: u64 = waits.iter().sum();
    let elapsed = started.elapsed().as_millis() as u64;
    assert!(
        elapsed >= total && elapsed < total + 50,
        "virtual time {elapsed} vs waits {total}"
    );
}

#[tokio::test]
async fn non_retryable_errors_and_empty_results_are_not_retried() {
    let empty = FnTool::new(spec("find"), |_, _| {
        Box::pin(async {
            Err(ToolError::new(
                ToolErrorCode::NoResults,
                "nothing matched `zzz`",
            ))
        })
    });
    let exec = executor(vec![empty.clone()]);
    let execution = run(&exec, "find", json!({"query": "zzz"})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::NoResults);
    assert_eq!(execution.outcome.attempts, 1);
    assert_eq!(empty.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn pagination_walks_three_pages() {
    let items: Vec<u32> = (0..250).collect();
    let tool = FnTool::new(spec("list"), move |args, _| {
        let items = items.clone();
        Box::pin(async move {
            let request = PageRequest {
                page_token: args["page_token"].as_str().map(str::to_string),
                page_size: None,
            };
            let page = paginate(&items, &request, 100)
                .map_err(|e| ToolError::invalid_input(e.to_string()))?;
            Ok(serde_json::to_value(page).unwrap())
        })
    });
    let exec = executor(vec![tool]);
    let mut token: Option<String> = None;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let execution = run(&exec, "list", json!({"query": "all", "page_token": token})).await;
        let data = ok_data(&execution).clone();
        seen.extend(
            data["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap()),
        );
        token = data["next_token"].as_str().map(str::to_string);
    }
    assert_eq!(seen, (0..250).collect::<Vec<u64>>());
    assert!(token.is_none(), "the third page is the last");
}

#[tokio::test]
async fn payload_over_the_cap_is_truncated_with_a_notice() {
    let tool = FnTool::new(spec("dump").with_max_payload_bytes(1_000), |_, _| {
        Box::pin(async { Ok(json!({"text": "x".repeat(5_000)})) })
    });
    let execution = run(&executor(vec![tool]), "dump", json!({"query": "x"})).await;
    let ToolResultKind::Ok {
        data, truncated, ..
    } = &execution.outcome.result
    else {
        panic!()
    };
    assert!(*truncated);
    let text = data.as_str().unwrap();
    assert!(
        text.contains("[OUTPUT TRUNCATED: showing 1000 of 5011 bytes from dump"),
        "{}",
        &text[text.len() - 120..]
    );
    assert!(text.len() < 1_200);
}

#[tokio::test]
async fn three_read_only_tools_run_concurrently_and_results_keep_call_order() {
    let make = |name: &str, ms: u64| {
        FnTool::new(spec(name), move |_, _| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(json!({"slept": ms}))
            })
        })
    };
    let exec = executor(vec![make("a", 200), make("b", 200), make("c", 200)]);
    let cancel = CancellationToken::new();
    let calls: Vec<ToolCall> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, name)| ToolCall {
            id: format!("c{i}"),
            name: name.to_string(),
            arguments: "{\"query\":\"q\"}".into(),
        })
        .collect();
    let started = Instant::now();
    let results: Vec<_> = exec
        .execute_ordered(
            calls,
            CallEnv {
                thread_id: "t",
                run_id: "r",
                cancel: &cancel,
                extras: None,
            },
        )
        .collect()
        .await;
    let wall = started.elapsed();
    assert!(
        wall < Duration::from_millis(450),
        "three 200 ms tools took {wall:?}"
    );
    let order: Vec<&str> = results.iter().map(|(call, _)| call.id.as_str()).collect();
    assert_eq!(order, ["c0", "c1", "c2"]);
    assert!(results.iter().all(|(_, e)| e.outcome.is_ok()));
}

#[tokio::test]
async fn mutating_tools_never_overlap() {
    let intervals: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let make = |name: &str| {
        let intervals = intervals.clone();
        FnTool::new(spec(name).with_effect(Effect::Mutating), move |_, _| {
            let intervals = intervals.clone();
            Box::pin(async move {
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(100)).await;
                intervals.lock().unwrap().push((start, Instant::now()));
                Ok(json!({"written": true}))
            })
        })
    };
    let exec = executor(vec![make("write_a"), make("write_b")]);
    let cancel = CancellationToken::new();
    let calls = vec![
        ToolCall {
            id: "1".into(),
            name: "write_a".into(),
            arguments: "{\"query\":\"q\"}".into(),
        },
        ToolCall {
            id: "2".into(),
            name: "write_b".into(),
            arguments: "{\"query\":\"q\"}".into(),
        },
    ];
    let results: Vec<_> = exec
        .execute_ordered(
            calls,
            CallEnv {
                thread_id: "t",
                run_id: "r",
                cancel: &cancel,
                extras: None,
            },
        )
        .collect()
        .await;
    assert!(results.iter().all(|(_, e)| e.outcome.is_ok()));
    let mut recorded = intervals.lock().unwrap().clone();
    recorded.sort();
    assert_eq!(recorded.len(), 2);
    assert!(
        recorded[0].1 <= recorded[1].0,
        "mutating tools overlapped: {recorded:?}"
    );
}

#[tokio::test]
async fn unknown_tools_and_panics_become_outcomes() {
    let panicking = FnTool::new(spec("boom"), |_, _| Box::pin(async { panic!("kaboom") }));
    let exec = executor(vec![panicking]);
    let execution = run(&exec, "boom", json!({"query": "x"})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::ToolBug);
    let execution = run(&exec, "nope", json!({})).await;
    assert_eq!(error_code(&execution), ToolErrorCode::NotFound);
}

/// A mutating tool failing with a retryable error on its first attempt.
fn failing_writer(honours_key: bool) -> Arc<FnTool> {
    FnTool::new(
        spec("writer")
            .with_effect(Effect::Mutating)
            .with_idempotency_key(honours_key)
            .with_retry(RetryPolicy {
                max_attempts: 3,
                base_delay_ms: 1,
                max_delay_ms: 2,
            }),
        |_, attempt| {
            Box::pin(async move {
                match attempt {
                    1 => Err(ToolError::new(
                        ToolErrorCode::RetryableServer,
                        "503 after the write",
                    )),
                    _ => Ok(json!({"written": true})),
                }
            })
        },
    )
}

#[tokio::test]
async fn a_mutating_call_is_not_retried_unless_the_tool_honours_the_idempotency_key() {
    let once = failing_writer(false);
    let execution = run(
        &executor(vec![once.clone()]),
        "writer",
        json!({"query": "x"}),
    )
    .await;
    assert_eq!(
        once.calls.load(Ordering::SeqCst),
        1,
        "the side effect ran once"
    );
    assert_eq!(execution.outcome.attempts, 1);
    assert!(execution.retries.is_empty());
    match &execution.outcome.result {
        ToolResultKind::Error { code, .. } => assert_eq!(*code, ToolErrorCode::RetryableServer),
        other => panic!("the failure is data for the model and policy: {other:?}"),
    }

    let deduplicating = failing_writer(true);
    let execution = run(
        &executor(vec![deduplicating.clone()]),
        "writer",
        json!({"query": "x"}),
    )
    .await;
    assert_eq!(deduplicating.calls.load(Ordering::SeqCst), 2);
    assert_eq!(ok_data(&execution), &json!({"written": true}));
}

#[tokio::test]
async fn raw_arguments_and_error_details_of_any_tool_are_capped() {
    let tool = FnTool::new(spec("noisy"), |_, _| {
        Box::pin(async move {
            Err(
                ToolError::new(ToolErrorCode::RetryableServer, "e".repeat(50_000))
                    .with_details(json!({"body": "b".repeat(50_000)})),
            )
        })
    });
    let noisy = run(&executor(vec![tool]), "noisy", json!({"query": "x"})).await;
    match &noisy.outcome.result {
        ToolResultKind::Error {
            message, details, ..
        } => {
            assert!(message.len() < 9_000, "{}", message.len());
            assert!(details.as_ref().unwrap().to_string().len() < 9_000);
        }
        other => panic!("{other:?}"),
    }
    // Malformed arguments are quoted back, bounded too.
    let tool = FnTool::new(spec("quiet"), |_, _| Box::pin(async { Ok(json!({})) }));
    let executor = executor(vec![tool]);
    let call = ToolCall {
        id: "c1".into(),
        name: "quiet".into(),
        arguments: format!("{{\"query\": \"{}", "a".repeat(100_000)),
    };
    let cancel = CancellationToken::new();
    let execution = executor
        .execute(
            &call,
            CallEnv {
                thread_id: "t",
                run_id: "r",
                cancel: &cancel,
                extras: None,
            },
        )
        .await;
    let text = serde_json::to_string(&execution.outcome.result).unwrap();
    assert!(text.len() < 20_000, "{}", text.len());
    assert!(text.contains("OUTPUT TRUNCATED"));
}

#[tokio::test]
async fn at_most_the_configured_number_of_calls_of_a_turn_run_at_once() {
    let active = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let tool = {
        let (active, peak) = (active.clone(), peak.clone());
        FnTool::new(spec("busy"), move |_, _| {
            let (active, peak) = (active.clone(), peak.clone());
            Box::pin(async move {
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                active.fetch_sub(1, Ordering::SeqCst);
                Ok(json!({"done": true}))
            })
        })
    };
    let exec = executor(vec![tool]).with_max_parallel_calls(3);
    let cancel = CancellationToken::new();
    let calls: Vec<ToolCall> = (0..20)
        .map(|i| ToolCall {
            id: format!("c{i:02}"),
            name: "busy".into(),
            arguments: "{\"query\":\"q\"}".into(),
        })
        .collect();
    let results: Vec<_> = exec
        .execute_ordered(
            calls,
            CallEnv {
                thread_id: "t",
                run_id: "r",
                cancel: &cancel,
                extras: None,
            },
        )
        .collect()
        .await;
    assert_eq!(results.len(), 20);
    assert_eq!(peak.load(Ordering::SeqCst), 3, "three at once, never more");
    let order: Vec<String> = results.iter().map(|(call, _)| call.id.clone()).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "results in call order");
}
