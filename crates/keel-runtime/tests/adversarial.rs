//! Seed 000 §9.4's fuzz and adversarial cases as scripted-model runs, and the fuzz
//! survival figure of its release gate (§10: ≥ 95%).
//!
//! A seeded generator combines mutations into cases, each a script run through a real
//! `ToolAgent` with real tools:
//! - prompt fuzz: dropped required arguments, invalid JSON, truncated JSON, non-object
//!   arguments, huge values;
//! - tool fuzz: wrong enums and types, extra unknown fields; and tools that answer with a
//!   wrong enum, a missing or extra field, an empty page 1, a truncated (oversized)
//!   payload, a string where a number belongs, an error, or a panic;
//! - protocol fuzz: unknown tool names, several tools in one call, nested tool calls (a
//!   call's arguments holding another call), many calls in one turn, repeated call ids.
//!
//! A case survives when the run reaches an end state without a panic or hang, no call
//! that breaks its tool's input contract reached the tool (each tool checks its arguments
//! with its own hand-written oracle, independent of the executor's validator), no
//! mutating call ran twice, every request pairs each tool call with exactly one result,
//! and every invalid call came back as an error the model can act on (its code and the
//! field, tool or JSON problem named in what the model sees), or ended the run with a
//! question for the user.
//!
//! `KEEL_ADVERSARIAL_SEED` and `KEEL_ADVERSARIAL_CASES` change the generated set.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use keel_core::{
    DynTool, Effect, EndState, EventKind, EventStore, MemoryStore, Message, Part, RetryPolicy,
    Role, ToolContext, ToolError, ToolErrorCode, ToolRegistry, ToolResultKind, ToolSpec, TypedTool,
};
use keel_runtime::{RunContext, RunOutcome, Thread, ToolAgent};
use keel_testkit::scripted::ScriptToolCall;
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

const DEFAULT_SEED: u64 = 94;
const DEFAULT_CASES: usize = 200;
const REQUIRED_SURVIVAL: f64 = 0.95;
/// A run that has not ended by then hangs (a scripted run takes milliseconds).
const HANG_DEADLINE: Duration = Duration::from_secs(120);

const STATUSES: [&str; 3] = ["open", "shipped", "cancelled"];

// --- the tools and their oracles ------------------------------------------------------

/// What the tools saw: calls that broke their contract yet reached them, and how often
/// each mutating call ran.
#[derive(Default)]
struct Oracle {
    invalid_reached: Mutex<Vec<String>>,
    mutating_runs: Mutex<BTreeMap<String, u32>>,
    executed: AtomicU32,
}

impl Oracle {
    fn reached(&self, tool: &str, args: &Value, problem: &str) {
        self.invalid_reached
            .lock()
            .unwrap()
            .push(format!("{tool} ran with {args}: {problem}"));
    }
}

/// `search_orders`'s contract, checked by hand: an object with exactly the declared keys,
/// `status` one of the enum, `customer` a non-empty string, `page` an integer ≥ 1.
fn search_args_problem(args: &Value) -> Option<String> {
    let Some(map) = args.as_object() else {
        return Some("arguments are not an object".into());
    };
    if let Some(extra) = map
        .keys()
        .find(|k| !["status", "customer", "page"].contains(&k.as_str()))
    {
        return Some(format!("undeclared argument `{extra}`"));
    }
    match map.get("status").and_then(Value::as_str) {
        Some(s) if STATUSES.contains(&s) => {}
        _ => return Some("status missing or not one of the enum".into()),
    }
    match map.get("customer").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => {}
        _ => return Some("customer missing or empty".into()),
    }
    if let Some(page) = map.get("page") {
        let ok = page.as_f64().is_some_and(|p| p.fract() == 0.0 && p >= 1.0);
        if !ok {
            return Some(format!("page {page} is not an integer ≥ 1"));
        }
    }
    None
}

/// `cancel_order`'s contract: exactly `{"order_id": "o<1-6 digits>"}`.
fn cancel_args_problem(args: &Value) -> Option<String> {
    let Some(map) = args.as_object() else {
        return Some("arguments are not an object".into());
    };
    if map.len() != 1 {
        return Some("expected exactly one argument".into());
    }
    let id = map.get("order_id").and_then(Value::as_str).unwrap_or("");
    let digits = id.strip_prefix('o').unwrap_or("");
    if digits.is_empty() || digits.len() > 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Some(format!("order_id {id:?} does not match o<digits>"));
    }
    None
}

/// `calculator`'s contract: exactly `{"expression": <1 to 1000 characters>}`.
fn calculator_args_problem(args: &Value) -> Option<String> {
    let Some(map) = args.as_object() else {
        return Some("arguments are not an object".into());
    };
    if map.len() != 1 {
        return Some("expected exactly one argument".into());
    }
    match map.get("expression").and_then(Value::as_str) {
        Some(e) if (1..=1000).contains(&e.chars().count()) => None,
        _ => Some("expression missing or of the wrong length".into()),
    }
}

/// How `search_orders` answers in a case (tool fuzz).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Normal,
    EmptyFirstPage,
    WrongEnum,
    MissingField,
    ExtraField,
    NumberAsString,
    Oversized,
    RateLimited,
    NoResults,
    Panics,
}

const ANSWERS: [Answer; 10] = [
    Answer::Normal,
    Answer::EmptyFirstPage,
    Answer::WrongEnum,
    Answer::MissingField,
    Answer::ExtraField,
    Answer::NumberAsString,
    Answer::Oversized,
    Answer::RateLimited,
    Answer::NoResults,
    Answer::Panics,
];

struct SearchOrders {
    spec: ToolSpec,
    oracle: Arc<Oracle>,
    answer: Answer,
}

impl SearchOrders {
    fn new(oracle: Arc<Oracle>, answer: Answer) -> Self {
        let order = json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "status": {"type": "string", "enum": STATUSES}
            },
            "required": ["id", "status"],
            "additionalProperties": false
        });
        let spec = ToolSpec::new(
            "search_orders",
            "Find a customer's orders by status, one page at a time.",
            "search_orders — Usage Guide\nArguments: status (open, shipped or cancelled), \
             customer (name), page (from 1).",
        )
        .with_input_schema(json!({
            "type": "object",
            "properties": {
                "status": {"type": "string", "enum": STATUSES},
                "customer": {"type": "string", "minLength": 1},
                "page": {"type": "integer", "minimum": 1}
            },
            "required": ["status", "customer"],
            "additionalProperties": false
        }))
        .with_output_schema(Some(json!({
            "type": "object",
            "properties": {
                "orders": {"type": "array", "items": order},
                "next_page": {"type": ["integer", "null"]}
            },
            "required": ["orders", "next_page"],
            "additionalProperties": false
        })))
        .with_max_payload_bytes(4_000)
        .with_retry(RetryPolicy {
            max_attempts: 2,
            base_delay_ms: 1,
            max_delay_ms: 5,
        });
        Self {
            spec,
            oracle,
            answer,
        }
    }
}

impl DynTool for SearchOrders {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        _: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            self.oracle.executed.fetch_add(1, Ordering::SeqCst);
            if let Some(problem) = search_args_problem(&args) {
                self.oracle.reached("search_orders", &args, &problem);
            }
            let status = args["status"].as_str().unwrap_or("open").to_string();
            let order = |i: usize| json!({"id": format!("o{i}"), "status": status});
            match self.answer {
                Answer::Normal => Ok(json!({"orders": [order(1), order(2)], "next_page": 2})),
                Answer::EmptyFirstPage => Ok(json!({"orders": [], "next_page": null})),
                Answer::WrongEnum => {
                    Ok(json!({"orders": [{"id": "o1", "status": "misplaced"}], "next_page": null}))
                }
                Answer::MissingField => Ok(json!({"orders": [{"id": "o1"}]})),
                Answer::ExtraField => {
                    Ok(json!({"orders": [order(1)], "next_page": null, "debug": "x"}))
                }
                Answer::NumberAsString => Ok(json!({"orders": [order(1)], "next_page": "2"})),
                Answer::Oversized => Ok(json!({
                    "orders": (0..400).map(order).collect::<Vec<_>>(),
                    "next_page": 2
                })),
                Answer::RateLimited => Err(ToolError {
                    retry_after_ms: Some(1),
                    ..ToolError::new(ToolErrorCode::RateLimited, "slow down")
                }),
                Answer::NoResults => Err(ToolError::new(
                    ToolErrorCode::NoResults,
                    "no orders match; try another status",
                )),
                Answer::Panics => panic!("search_orders: index out of range (injected)"),
            }
        })
    }
}

struct CancelOrder {
    spec: ToolSpec,
    oracle: Arc<Oracle>,
}

impl CancelOrder {
    fn new(oracle: Arc<Oracle>) -> Self {
        let spec = ToolSpec::new(
            "cancel_order",
            "Cancel one order by id.",
            "cancel_order — Usage Guide\nArguments: order_id (`o` and digits). Changes state.",
        )
        .with_input_schema(json!({
            "type": "object",
            "properties": {"order_id": {"type": "string", "pattern": "^o[0-9]{1,6}$"}},
            "required": ["order_id"],
            "additionalProperties": false
        }))
        .with_effect(Effect::Mutating);
        Self { spec, oracle }
    }
}

impl DynTool for CancelOrder {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            self.oracle.executed.fetch_add(1, Ordering::SeqCst);
            if let Some(problem) = cancel_args_problem(&args) {
                self.oracle.reached("cancel_order", &args, &problem);
            }
            *self
                .oracle
                .mutating_runs
                .lock()
                .unwrap()
                .entry(ctx.idempotency_key.clone())
                .or_default() += 1;
            Ok(json!({"cancelled": args["order_id"]}))
        })
    }
}

/// The real `calculator`, with its contract checked before it runs.
struct AuditedCalculator {
    inner: TypedTool<keel_tools::Calculator>,
    oracle: Arc<Oracle>,
}

impl DynTool for AuditedCalculator {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.oracle.executed.fetch_add(1, Ordering::SeqCst);
        if let Some(problem) = calculator_args_problem(&args) {
            self.oracle.reached("calculator", &args, &problem);
        }
        self.inner.call(args, ctx)
    }
}

// --- the generator --------------------------------------------------------------------

/// How one call is mutated (prompt and protocol fuzz).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    Valid,
    DropRequired,
    InvalidJson,
    TruncatedJson,
    UnknownTool,
    WrongEnum,
    WrongType,
    ExtraField,
    NestedCall,
    SeveralToolsInOne,
    NotAnObject,
    EmptyArguments,
    HugeValue,
}

const MUTATIONS: [Mutation; 13] = [
    Mutation::Valid,
    Mutation::DropRequired,
    Mutation::InvalidJson,
    Mutation::TruncatedJson,
    Mutation::UnknownTool,
    Mutation::WrongEnum,
    Mutation::WrongType,
    Mutation::ExtraField,
    Mutation::NestedCall,
    Mutation::SeveralToolsInOne,
    Mutation::NotAnObject,
    Mutation::EmptyArguments,
    Mutation::HugeValue,
];

/// One generated call and what must come of it.
#[derive(Debug, Clone)]
struct GenCall {
    call: ScriptToolCall,
    mutation: Mutation,
    /// `None` for a valid call; otherwise words of which the error the model sees must
    /// contain at least one.
    hints: Option<Vec<String>>,
    /// The id the run gives the call: the model's, or `<id>_<n>` for the n-th use of an id
    /// the model repeated in one answer.
    effective_id: String,
}

fn pick<'a, T>(rng: &mut fastrand::Rng, items: &'a [T]) -> &'a T {
    &items[rng.usize(..items.len())]
}

fn valid_args(tool: &str, rng: &mut fastrand::Rng) -> Value {
    match tool {
        "search_orders" => {
            let mut args = json!({
                "status": *pick(rng, &STATUSES),
                "customer": *pick(rng, &["ada", "grace", "Linus T."]),
            });
            if rng.bool() {
                args["page"] = json!(rng.u32(1..5));
            }
            args
        }
        "cancel_order" => json!({"order_id": format!("o{}", rng.u32(1..999))}),
        _ => json!({"expression": *pick(rng, &["6*7", "2^10", "(1.5+2.25)/3", "sqrt(2)", "1/0"])}),
    }
}

fn required_of(tool: &str) -> &'static [&'static str] {
    match tool {
        "search_orders" => &["status", "customer"],
        "cancel_order" => &["order_id"],
        _ => &["expression"],
    }
}

fn hints(words: &[&str]) -> Option<Vec<String>> {
    Some(words.iter().map(|w| (*w).to_string()).collect())
}

fn generate_call(rng: &mut fastrand::Rng, id: String, mutation: Mutation) -> GenCall {
    let tool = *pick(
        rng,
        &[
            "search_orders",
            "search_orders",
            "cancel_order",
            "calculator",
        ],
    );
    let mut args = valid_args(tool, rng);
    let mut name = tool.to_string();
    let mut raw: Option<String> = None;
    let required = required_of(tool);
    let hints = match mutation {
        Mutation::Valid => None,
        Mutation::DropRequired => {
            let field = *pick(rng, required);
            args.as_object_mut().unwrap().remove(field);
            hints(&[field])
        }
        Mutation::InvalidJson => {
            raw = Some(
                (*pick(
                    rng,
                    &[
                        "{not json",
                        "{'status': 'open'}",
                        "{\"status\": open}",
                        "status=open",
                        "{}}",
                    ],
                ))
                .to_string(),
            );
            hints(&["JSON"])
        }
        Mutation::TruncatedJson => {
            let text = args.to_string();
            let cut = rng.usize(1..text.len());
            raw = Some(text[..cut].to_string());
            hints(&["JSON"])
        }
        Mutation::UnknownTool => {
            name = (*pick(
                rng,
                &[
                    "search_order",
                    "SearchOrders",
                    "delete_everything",
                    "search_orders_v2",
                    "",
                    "functions.search_orders",
                ],
            ))
            .to_string();
            // The error must list the real tools.
            hints(&["search_orders", "cancel_order", "calculator"])
        }
        Mutation::WrongEnum => match tool {
            "search_orders" => {
                args["status"] = json!(*pick(rng, &["pending", "OPEN", "", "open ", "closed"]));
                hints(&["status"])
            }
            "cancel_order" => {
                args["order_id"] = json!(*pick(rng, &["order-1", "O1", "o", "o1234567", "1"]));
                hints(&["order_id"])
            }
            _ => {
                args["expression"] = json!("");
                hints(&["expression"])
            }
        },
        Mutation::WrongType => {
            let field = match tool {
                "search_orders" => *pick(rng, &["status", "customer", "page"]),
                "cancel_order" => "order_id",
                _ => "expression",
            };
            args[field] = pick(
                rng,
                &[
                    json!(42),
                    json!(-1),
                    json!(0),
                    json!(1.5),
                    json!(true),
                    json!(null),
                    json!(["open"]),
                    json!({"v": 1}),
                ],
            )
            .clone();
            // `page: 42` is a valid page; everything else breaks the contract.
            let still_valid = match tool {
                "search_orders" => search_args_problem(&args).is_none(),
                _ => false,
            };
            if still_valid { None } else { hints(&[field]) }
        }
        Mutation::ExtraField => {
            let field = *pick(rng, &["limit", "verbose", "Status", "__proto__", "then"]);
            args[field] = json!(5);
            hints(&[field])
        }
        Mutation::NestedCall => {
            // A tool call inside a call's arguments: never executed, never unwrapped.
            let inner = json!({"name": "cancel_order", "arguments": {"order_id": "o1"}});
            match rng.u8(0..3) {
                0 => {
                    args = inner;
                    let words: Vec<&str> = required.to_vec();
                    Some(
                        words
                            .into_iter()
                            .chain(["name", "arguments"])
                            .map(str::to_string)
                            .collect(),
                    )
                }
                1 => {
                    args["tool_call"] = inner;
                    hints(&["tool_call"])
                }
                _ => {
                    let field = required[0];
                    args[field] = json!(inner.to_string());
                    if tool == "calculator" {
                        // A string is a valid expression argument; the tool itself refuses it.
                        None
                    } else {
                        hints(&[field])
                    }
                }
            }
        }
        Mutation::SeveralToolsInOne => {
            if rng.bool() {
                name = format!("{tool},cancel_order");
                hints(&["search_orders", "cancel_order", "calculator"])
            } else {
                raw = Some(
                    json!([
                        {"name": tool, "arguments": args},
                        {"name": "cancel_order", "arguments": {"order_id": "o2"}}
                    ])
                    .to_string(),
                );
                hints(&["object", "type"])
            }
        }
        Mutation::NotAnObject => {
            raw = Some((*pick(rng, &["null", "[]", "\"open\"", "42", "true"])).to_string());
            hints(&["object", "type"])
        }
        Mutation::EmptyArguments => {
            raw = Some((*pick(rng, &["", "  ", "{}"])).to_string());
            hints(required)
        }
        Mutation::HugeValue => {
            let field = required[0];
            args[field] = json!("x".repeat(rng.usize(20_000..120_000)));
            hints(&[field])
        }
    };
    GenCall {
        effective_id: id.clone(),
        call: ScriptToolCall {
            id: Some(id),
            name,
            arguments: if raw.is_some() { None } else { Some(args) },
            arguments_raw: raw,
        },
        mutation,
        hints,
    }
}

/// One generated case.
#[derive(Debug, Clone)]
struct Case {
    index: usize,
    answer: Answer,
    steps: Vec<ScriptStep>,
    calls: Vec<GenCall>,
    /// A turn whose calls share one id (protocol fuzz).
    repeated_ids: bool,
}

impl Case {
    fn describe(&self) -> String {
        let mut mutations: Vec<String> = self
            .calls
            .iter()
            .map(|c| format!("{:?}({})", c.mutation, c.call.name))
            .collect();
        mutations.dedup();
        format!(
            "case {} [tool answers {:?}{}]: {} turns, {} calls: {}",
            self.index,
            self.answer,
            if self.repeated_ids {
                ", repeated ids"
            } else {
                ""
            },
            self.steps.len(),
            self.calls.len(),
            mutations.join(" ")
        )
    }
}

fn generate_case(index: usize, rng: &mut fastrand::Rng) -> Case {
    let answer = *pick(rng, &ANSWERS);
    let turns = rng.usize(1..=3);
    let mut steps = Vec::new();
    let mut calls = Vec::new();
    let mut repeated_ids = false;
    for turn in 0..turns {
        let many = rng.u8(0..6) == 0;
        let count = if many {
            rng.usize(8..=40)
        } else {
            rng.usize(1..=2)
        };
        let repeat = many && rng.u8(0..4) == 0;
        repeated_ids |= repeat;
        let mut step = ScriptStep::default();
        for k in 0..count {
            let id = if repeat {
                format!("call_{index}_{turn}_dup")
            } else {
                format!("call_{index}_{turn}_{k}")
            };
            let mutation = *pick(rng, &MUTATIONS);
            let mut generated = generate_call(rng, id, mutation);
            if repeat && k > 0 {
                generated.effective_id = format!("{}_{}", generated.effective_id, k + 1);
            }
            step.tool_calls.push(generated.call.clone());
            calls.push(generated);
        }
        steps.push(step);
    }
    steps.push(ScriptStep::text("Done: here is what I found."));
    steps.push(ScriptStep::text("Done."));
    Case {
        index,
        answer,
        steps,
        calls,
        repeated_ids,
    }
}

// --- running and judging --------------------------------------------------------------

fn agent(model: Arc<ScriptedModel>, oracle: &Arc<Oracle>, answer: Answer) -> ToolAgent {
    let mut tools = ToolRegistry::new();
    tools
        .register(Arc::new(SearchOrders::new(oracle.clone(), answer)))
        .unwrap();
    tools
        .register(Arc::new(CancelOrder::new(oracle.clone())))
        .unwrap();
    tools
        .register(Arc::new(AuditedCalculator {
            inner: TypedTool::new(keel_tools::Calculator),
            oracle: oracle.clone(),
        }))
        .unwrap();
    ToolAgent::builder("adversarial", model)
        .instructions("Answer questions about orders.")
        .tools(tools)
        .build()
}

/// Why a case did not survive (empty when it did).
async fn judge(case: &Case) -> Vec<String> {
    let model = Arc::new(ScriptedModel::new(case.steps.clone()));
    let oracle = Arc::new(Oracle::default());
    let agent = agent(model.clone(), &oracle, case.answer);
    let store = Arc::new(MemoryStore::new());
    let ctx = RunContext::new(store.clone());
    let mut thread = Thread::new();
    let thread_id = thread.id().to_string();
    let run = tokio::spawn(async move {
        let outcome = agent
            .run(
                vec![Message::user("Which orders of ada are open?")],
                &mut thread,
                &ctx,
            )
            .await;
        (outcome, thread)
    });
    let mut problems = Vec::new();
    let (outcome, thread) = match tokio::time::timeout(HANG_DEADLINE, run).await {
        Err(_) => {
            let events = store.load(&thread_id).await.unwrap_or_default();
            let last: Vec<&str> = events.iter().rev().take(6).map(|e| e.kind.name()).collect();
            return vec![format!(
                "no end state within {HANG_DEADLINE:?} (hang): {} events so far, the last {last:?}",
                events.len()
            )];
        }
        Ok(Err(join)) => return vec![format!("the run panicked: {join}")],
        Ok(Ok((outcome, thread))) => (outcome, thread),
    };
    let outcome: RunOutcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => return vec![format!("the run failed to be driven: {error}")],
    };
    let Some(end_state) = outcome.end_state() else {
        return vec![format!("the run did not end: {:?}", outcome.status)];
    };

    for reached in oracle.invalid_reached.lock().unwrap().iter() {
        problems.push(format!("invalid call reached the tool: {reached}"));
    }
    // A mutating call runs at most once per idempotency key: a tool that deduplicates on
    // the key would otherwise answer a second, different call with the first one's result.
    for (key, runs) in oracle.mutating_runs.lock().unwrap().iter() {
        if *runs > 1 {
            problems.push(format!(
                "idempotency key {key} was used by {runs} executions"
            ));
        }
    }

    let requests = model.requests();
    for (n, request) in requests.iter().enumerate() {
        if let Some(problem) = pairing_problem(&request.messages) {
            problems.push(format!("request {}: {problem}", n + 1));
        }
    }

    // Every invalid call came back as an error the model can act on, or the run ended
    // with a reason (a question for the user, or a stop) before the model was asked again.
    let events = store.load(thread.id()).await.unwrap();
    let finished: BTreeMap<&str, &keel_core::ToolResult> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } => Some((result.call_id.as_str(), &**result)),
            _ => None,
        })
        .collect();
    let seen_by_model: BTreeMap<&str, &keel_core::ToolResult> = requests
        .iter()
        .flat_map(|r| r.messages.iter())
        .flat_map(Message::tool_results)
        .map(|r| (r.call_id.as_str(), r))
        .collect();
    let ended_with_reason = end_state != EndState::Done
        && (outcome.clarification.is_some()
            || outcome.reason.as_deref().is_some_and(|r| !r.is_empty()));
    for call in &case.calls {
        let id = call.effective_id.as_str();
        let Some(words) = &call.hints else { continue };
        let Some(result) = finished.get(id) else {
            if !ended_with_reason {
                problems.push(format!(
                    "invalid call {id} ({:?}) has no result",
                    call.mutation
                ));
            }
            continue;
        };
        let code = match &result.outcome.result {
            ToolResultKind::Error { code, .. } => *code,
            ToolResultKind::Ok { .. } => {
                problems.push(format!(
                    "invalid call {id} ({:?}, {}) succeeded: {}",
                    call.mutation, call.call.name, result.content
                ));
                continue;
            }
        };
        if !matches!(code, ToolErrorCode::InvalidInput | ToolErrorCode::NotFound) {
            problems.push(format!(
                "invalid call {id} ({:?}) failed as {code}",
                call.mutation
            ));
        }
        match seen_by_model.get(id) {
            Some(seen) => {
                let content = &seen.content;
                if !content.contains(code.as_str()) || !words.iter().any(|w| content.contains(w.as_str())) {
                    problems.push(format!(
                        "the model got no actionable error for {id} ({:?}, expected {code} and one of {words:?}): {}",
                        call.mutation,
                        content.chars().take(300).collect::<String>()
                    ));
                }
            }
            None if ended_with_reason => {}
            None => problems.push(format!(
                "the model never saw the error of {id} ({:?}) and the run ended {end_state:?} without a reason",
                call.mutation
            )),
        }
    }
    problems
}

/// Each tool call of an assistant message is answered by exactly one tool result in the
/// messages after it, and every tool result answers a call.
fn pairing_problem(messages: &[Message]) -> Option<String> {
    let mut open: BTreeMap<String, u32> = BTreeMap::new();
    for message in messages {
        for part in &message.parts {
            match part {
                Part::ToolCall(call) if message.role == Role::Assistant => {
                    *open.entry(call.id.clone()).or_default() += 1;
                }
                Part::ToolResult(result) => match open.get_mut(&result.call_id) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => return Some(format!("orphan tool result for {}", result.call_id)),
                },
                _ => {}
            }
        }
    }
    open.into_iter()
        .find(|(_, n)| *n > 0)
        .map(|(id, n)| format!("tool call {id} has {n} unanswered occurrence(s)"))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_survival_of_generated_adversarial_cases_is_at_least_95_percent() {
    let seed = env_or("KEEL_ADVERSARIAL_SEED", DEFAULT_SEED);
    let count = env_or("KEEL_ADVERSARIAL_CASES", DEFAULT_CASES);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cases: Vec<Case> = (0..count).map(|i| generate_case(i, &mut rng)).collect();
    // `KEEL_ADVERSARIAL_ONLY=<index>` replays one case (to investigate a failure).
    if let Some(only) = std::env::var("KEEL_ADVERSARIAL_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        cases.retain(|c| c.index == only);
    }

    let mut survived = 0usize;
    let mut failures = String::new();
    let mut by_mutation: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    for case in &cases {
        let problems = judge(case).await;
        let ok = problems.is_empty();
        if ok {
            survived += 1;
        } else {
            writeln!(
                failures,
                "{}\n  - {}",
                case.describe(),
                problems.join("\n  - ")
            )
            .unwrap();
        }
        let mut kinds: BTreeSet<String> = case
            .calls
            .iter()
            .map(|c| format!("{:?}", c.mutation))
            .collect();
        kinds.insert(format!("answer:{:?}", case.answer));
        if case.calls.len() >= 8 {
            kinds.insert("many calls in one turn".into());
        }
        if case.repeated_ids {
            kinds.insert("repeated call ids".into());
        }
        for kind in kinds {
            let entry = by_mutation.entry(kind).or_default();
            entry.0 += 1;
            entry.1 += u32::from(ok);
        }
    }
    let calls: usize = cases.iter().map(|c| c.calls.len()).sum();
    let invalid = cases
        .iter()
        .flat_map(|c| &c.calls)
        .filter(|c| c.hints.is_some())
        .count();
    let rate = survived as f64 / cases.len() as f64;
    eprintln!(
        "adversarial fuzz (seed {seed}): {survived}/{} cases survived ({:.1}%), {calls} calls of which {invalid} invalid",
        cases.len(),
        rate * 100.0
    );
    for (kind, (total, ok)) in &by_mutation {
        eprintln!("  {kind:<26} {ok:>4}/{total:<4} survived");
    }
    if !failures.is_empty() {
        eprintln!("cases that did not survive:\n{failures}");
    }
    if cases.len() < count {
        return; // A replay of one case: nothing to assert about the set.
    }
    // Every kind of mutation was generated.
    for mutation in MUTATIONS {
        assert!(
            by_mutation.contains_key(&format!("{mutation:?}")),
            "{mutation:?} never generated"
        );
    }
    for answer in ANSWERS {
        assert!(
            by_mutation.contains_key(&format!("answer:{answer:?}")),
            "{answer:?} never generated"
        );
    }
    assert!(by_mutation.contains_key("many calls in one turn"));
    assert!(
        rate >= REQUIRED_SURVIVAL,
        "fuzz survival {:.1}% is below {:.0}%",
        rate * 100.0,
        REQUIRED_SURVIVAL * 100.0
    );
}

/// Runs a script on the adversarial agent; returns the outcome, the oracle and the model.
async fn run_script(steps: Vec<ScriptStep>) -> (RunOutcome, Arc<Oracle>, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new(steps));
    let oracle = Arc::new(Oracle::default());
    let agent = agent(model.clone(), &oracle, Answer::Normal);
    let ctx = RunContext::new(Arc::new(MemoryStore::new()));
    let mut thread = Thread::new();
    let run = agent.run(vec![Message::user("Cancel o1 and o2.")], &mut thread, &ctx);
    let outcome = tokio::time::timeout(HANG_DEADLINE, run)
        .await
        .expect("the run did not end (it loops on a call it cannot answer)")
        .unwrap();
    (outcome, oracle, model)
}

fn cancel_call(id: &str, order: &str) -> ScriptToolCall {
    ScriptToolCall {
        id: Some(id.into()),
        name: "cancel_order".into(),
        arguments: Some(json!({"order_id": order})),
        arguments_raw: None,
    }
}

#[tokio::test]
async fn calls_sharing_an_id_in_one_answer_each_run_once_and_get_their_own_result() {
    // Found by the generated cases: two calls with one id left the second forever pending,
    // and the run executed it in a loop (hundreds of thousands of events).
    let step = ScriptStep {
        tool_calls: vec![cancel_call("dup", "o1"), cancel_call("dup", "o2")],
        ..ScriptStep::default()
    };
    let (outcome, oracle, model) =
        run_script(vec![step, ScriptStep::text("Both cancelled.")]).await;
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let runs = oracle.mutating_runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "two idempotency keys: {runs:?}");
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
    let request = &model.requests()[1];
    assert_eq!(pairing_problem(&request.messages), None);
    let results: Vec<&str> = request
        .messages
        .iter()
        .flat_map(Message::tool_results)
        .map(|r| r.call_id.as_str())
        .collect();
    assert_eq!(results, ["dup", "dup_2"]);
}

#[tokio::test]
async fn a_call_id_reused_in_a_later_turn_gets_a_fresh_idempotency_key() {
    // Servers that number calls per answer (`call_0`, …) reuse ids across turns; a tool
    // deduplicating on the key would answer the second cancellation with the first's.
    let (outcome, oracle, _) = run_script(vec![
        ScriptStep {
            tool_calls: vec![cancel_call("call_0", "o1")],
            ..ScriptStep::default()
        },
        ScriptStep {
            tool_calls: vec![cancel_call("call_0", "o2")],
            ..ScriptStep::default()
        },
        ScriptStep::text("Both cancelled."),
    ])
    .await;
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    let runs = oracle.mutating_runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "two idempotency keys: {runs:?}");
    let ids: Vec<&str> = outcome
        .tool_calls
        .iter()
        .map(|c| c.call_id.as_str())
        .collect();
    assert_eq!(ids, ["call_0", "call_0_2"]);
}
