//! Conformance cases of [`EventStore::list_runs`]: the figures of every row, each filter,
//! each order walked page by page (equal to a full sort of the seeded threads), and an
//! index that follows appends, forks and deletes; and of [`EventStore::run_facts`]: the
//! metrics facts of each thread equal the fold of its log, through the same changes.

use std::sync::Arc;

use keel_core::event::{Event, EventKind};
use keel_core::model::StopReason;
use keel_core::outcome::{ToolErrorCode, ToolOutcome, ToolResultKind};
use keel_core::run_metrics::{FactsQuery, run_facts_by_folding};
use keel_core::runs::{RunQuery, RunSort, RunSummary};
use keel_core::store::{EventStore, StoreError, ThreadStatus};
use keel_core::{EndState, Message, ToolResult, Usage};

use super::fixtures::{at, event, run_ended};
use super::{ConformanceError, ensure, ensure_eq, fail};

/// What a seeded thread does.
struct Spec {
    id: &'static str,
    agent: &'static str,
    model: &'static str,
    start_ms: i64,
    user: &'static str,
    /// Model calls: input tokens, output tokens, cost.
    calls: &'static [(u64, u64, Option<f64>)],
    /// Tool calls: success, result text.
    tools: &'static [(bool, &'static str)],
    end: Option<EndState>,
}

const SPECS: &[Spec] = &[
    Spec {
        id: "acme.r1",
        agent: "triage",
        model: "openai:GPT-4o",
        start_ms: 0,
        user: "Why did the nightly build fail?",
        calls: &[(100, 20, Some(0.01)), (150, 30, Some(0.02))],
        tools: &[(true, "build log: linker error in crate foo")],
        end: Some(EndState::Done),
    },
    Spec {
        id: "acme.r2",
        agent: "triage",
        model: "mock:small",
        start_ms: 1_000,
        user: "summarise the incident",
        calls: &[(500, 100, None)],
        tools: &[
            (false, "connection refused"),
            (true, "incident #42 resolved"),
        ],
        end: Some(EndState::Failed),
    },
    Spec {
        id: "acme.r3",
        agent: "coder",
        model: "openai:gpt-4o-mini",
        start_ms: 2_000,
        user: "write a test",
        calls: &[(10, 5, Some(0.5)), (10, 5, None), (10, 5, Some(0.25))],
        tools: &[],
        end: None,
    },
    Spec {
        id: "acme.r4",
        agent: "coder",
        model: "mock:small",
        start_ms: 3_000,
        user: "refactor the PARSER module",
        calls: &[(120, 33, Some(0.01))],
        tools: &[
            (true, "ok"),
            (true, "discount 50%_OFF applied"),
            (true, "ok"),
        ],
        end: Some(EndState::Done),
    },
    Spec {
        id: "other.r5",
        agent: "triage",
        model: "mock:small",
        start_ms: 4_000,
        user: "a thread of another tenant",
        calls: &[(1, 1, None)],
        tools: &[],
        end: Some(EndState::Done),
    },
];

fn tool_result(thread: &str, n: usize, ok: bool, text: &str) -> EventKind {
    let call_id = format!("call_{n}");
    EventKind::ToolCallFinished {
        result: std::sync::Arc::new(ToolResult {
            call_id: call_id.clone(),
            name: "probe".into(),
            outcome: ToolOutcome {
                tool: "probe".into(),
                call_id,
                thread_id: thread.into(),
                run_id: format!("run-{thread}"),
                attempts: 1,
                latency_ms: 3,
                repairs: Vec::new(),
                result: if ok {
                    ToolResultKind::Ok {
                        data: serde_json::Value::String(text.into()),
                        schema_validated: false,
                        truncated: false,
                    }
                } else {
                    ToolResultKind::Error {
                        code: ToolErrorCode::RetryableServer,
                        message: text.into(),
                        details: None,
                    }
                },
            },
            content: text.into(),
        }),
    }
}

fn model_call(
    turn: u32,
    model: &str,
    input: u64,
    output: u64,
    cost: Option<f64>,
) -> [EventKind; 2] {
    [
        EventKind::ModelRequested {
            turn,
            model: model.into(),
            message_count: turn,
            tool_count: 1,
            estimated_input_tokens: input,
            provider: None,
            temperature: None,
            max_tokens: None,
            context_window: None,
        },
        // Built from JSON so fields added to the event later (with defaults) do not matter.
        serde_json::from_value(serde_json::json!({
            "type": "model_responded", "turn": turn,
            "message": serde_json::to_value(Message::assistant(format!("answer {turn}"))).unwrap_or_default(),
            "usage": serde_json::to_value(Usage { input_tokens: input, output_tokens: output, cache_read_tokens: 0, cache_write_tokens: 0 }).unwrap_or_default(),
            "latency_ms": 7, "stop_reason": serde_json::to_value(StopReason::EndTurn).unwrap_or_default(),
            "cost_usd": cost
        }))
        .unwrap_or_else(|e| super::fixtures::notice("fixture_invalid", &e.to_string())),
    ]
}

fn log_of(spec: &Spec) -> Vec<Event> {
    let mut kinds = vec![
        EventKind::RunStarted {
            agent: spec.agent.into(),
            model: spec.model.into(),
            goal: spec.user.into(),
            constraints: Vec::new(),
            budget: keel_core::Budget::unlimited(),
            definition: None,
            parent_span_id: None,
        },
        EventKind::UserMessage {
            message: Message::user(spec.user),
        },
    ];
    for (turn, (input, output, cost)) in spec.calls.iter().enumerate() {
        let turn = u32::try_from(turn).unwrap_or(0) + 1;
        kinds.extend(model_call(turn, spec.model, *input, *output, *cost));
    }
    for (n, (ok, text)) in spec.tools.iter().enumerate() {
        kinds.push(tool_result(spec.id, n, *ok, text));
    }
    if let Some(end) = spec.end {
        kinds.push(run_ended(end));
    }
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| {
            let i = i as i64;
            // Spans of different lengths, so duration orders differ from start orders.
            event(
                spec.id,
                i as u64,
                spec.start_ms + i * (10 + spec.start_ms / 100),
                kind,
            )
        })
        .collect()
}

async fn seed(store: &Arc<dyn EventStore>) -> Result<(), ConformanceError> {
    for spec in SPECS {
        let log = log_of(spec);
        store
            .append(spec.id, 0, &log)
            .await
            .map_err(|e| fail("list_runs", format!("seeding {}: {e}", spec.id)))?;
    }
    Ok(())
}

/// Every row of `query`, following the pages.
async fn walk(
    case: &'static str,
    store: &Arc<dyn EventStore>,
    query: &RunQuery,
) -> Result<Vec<RunSummary>, ConformanceError> {
    let mut query = query.clone();
    let mut out = Vec::new();
    for _ in 0..100 {
        let page = store
            .list_runs(&query)
            .await
            .map_err(|e| fail(case, format!("list_runs({query:?}): {e}")))?;
        ensure(case, page.runs.len() <= query.page_size(), || {
            format!("page of {} rows for limit {}", page.runs.len(), query.limit)
        })?;
        out.extend(page.runs);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(out),
        }
    }
    Err(fail(case, "more than 100 pages"))
}

fn ids(runs: &[RunSummary]) -> Vec<&str> {
    runs.iter().map(|r| r.thread_id.as_str()).collect()
}

fn row<'a>(
    case: &'static str,
    runs: &'a [RunSummary],
    id: &str,
) -> Result<&'a RunSummary, ConformanceError> {
    runs.iter()
        .find(|r| r.thread_id == id)
        .ok_or_else(|| fail(case, format!("{id} is not listed: {:?}", ids(runs))))
}

/// The figures of each row are the fold of its log; every filter selects what it says.
pub async fn list_runs_figures_and_filters(
    store: Arc<dyn EventStore>,
) -> Result<(), ConformanceError> {
    const CASE: &str = "list_runs_figures_and_filters";
    let empty = walk(CASE, &store, &RunQuery::default()).await?;
    ensure_eq(
        CASE,
        "rows of an empty store",
        ids(&empty),
        Vec::<&str>::new(),
    )?;
    seed(&store).await?;
    let all = walk(CASE, &store, &RunQuery::default()).await?;
    ensure_eq(
        CASE,
        "default order (latest activity first)",
        ids(&all),
        vec!["other.r5", "acme.r4", "acme.r3", "acme.r2", "acme.r1"],
    )?;
    let r1 = row(CASE, &all, "acme.r1")?;
    ensure_eq(CASE, "r1 tokens", r1.tokens, 300)?;
    ensure_eq(CASE, "r1 turns", r1.turns, 2)?;
    ensure_eq(
        CASE,
        "r1 tool calls",
        (r1.tool_calls, r1.tool_errors),
        (1, 0),
    )?;
    ensure(
        CASE,
        r1.cost_usd.is_some_and(|c| (c - 0.03).abs() < 1e-12),
        || format!("r1 cost {:?}", r1.cost_usd),
    )?;
    ensure_eq(CASE, "r1 agent", r1.agent.as_deref(), Some("triage"))?;
    ensure_eq(CASE, "r1 model", r1.model.as_deref(), Some("openai:GPT-4o"))?;
    ensure_eq(
        CASE,
        "r1 models",
        r1.models.clone(),
        vec!["openai:GPT-4o".to_string()],
    )?;
    ensure_eq(
        CASE,
        "r1 goal",
        r1.goal.as_deref(),
        Some("Why did the nightly build fail?"),
    )?;
    ensure_eq(
        CASE,
        "r1 status",
        r1.status,
        ThreadStatus::Ended(EndState::Done),
    )?;
    ensure_eq(CASE, "r1 events", r1.event_count, 8)?;
    ensure_eq(CASE, "r1 start", r1.created_at, at(0))?;
    ensure_eq(CASE, "r1 runs", r1.runs, 1)?;
    let r2 = row(CASE, &all, "acme.r2")?;
    ensure_eq(
        CASE,
        "r2 tool calls",
        (r2.tool_calls, r2.tool_errors),
        (2, 1),
    )?;
    ensure_eq(CASE, "r2 cost", r2.cost_usd, None)?;
    let r3 = row(CASE, &all, "acme.r3")?;
    ensure_eq(CASE, "r3 status", r3.status, ThreadStatus::Running)?;
    ensure_eq(CASE, "r3 cost", r3.cost_usd, Some(0.5 + 0.25))?;
    ensure_eq(CASE, "r3 events", r3.event_count, 8)?;

    let only = |query: RunQuery| {
        let store = store.clone();
        async move { walk(CASE, &store, &query).await }
    };
    let cases: Vec<(&str, RunQuery, Vec<&str>)> = vec![
        (
            "status done",
            RunQuery {
                status: Some(ThreadStatus::Ended(EndState::Done)),
                ..RunQuery::default()
            },
            vec!["other.r5", "acme.r4", "acme.r1"],
        ),
        (
            "status running",
            RunQuery {
                status: Some(ThreadStatus::Running),
                ..RunQuery::default()
            },
            vec!["acme.r3"],
        ),
        (
            "agent",
            RunQuery {
                agent: Some("coder".into()),
                ..RunQuery::default()
            },
            vec!["acme.r4", "acme.r3"],
        ),
        (
            "model, any case",
            RunQuery {
                model: Some("GPT-4O".into()),
                ..RunQuery::default()
            },
            vec!["acme.r3", "acme.r1"],
        ),
        (
            "prefix",
            RunQuery {
                thread_prefix: Some("acme.".into()),
                ..RunQuery::default()
            },
            vec!["acme.r4", "acme.r3", "acme.r2", "acme.r1"],
        ),
        (
            "active since",
            RunQuery {
                active_since: Some(at(2_000)),
                ..RunQuery::default()
            },
            vec!["other.r5", "acme.r4", "acme.r3"],
        ),
        (
            "started before",
            RunQuery {
                started_before: Some(at(1_000)),
                ..RunQuery::default()
            },
            vec!["acme.r2", "acme.r1"],
        ),
        (
            "text in a tool result, any case",
            RunQuery {
                text: Some("LINKER error".into()),
                ..RunQuery::default()
            },
            vec!["acme.r1"],
        ),
        (
            "text in a failed tool's message and a user message",
            RunQuery {
                text: Some("refuse".into()),
                ..RunQuery::default()
            },
            vec!["acme.r2"],
        ),
        (
            "text in a user message",
            RunQuery {
                text: Some("parser mod".into()),
                ..RunQuery::default()
            },
            vec!["acme.r4"],
        ),
        (
            "text with LIKE's wildcards, literally",
            RunQuery {
                text: Some("0%_off".into()),
                ..RunQuery::default()
            },
            vec!["acme.r4"],
        ),
        (
            "a wildcard alone is a character",
            RunQuery {
                text: Some("%".into()),
                ..RunQuery::default()
            },
            vec!["acme.r4"],
        ),
        (
            "text nowhere",
            RunQuery {
                text: Some("xyzzy".into()),
                ..RunQuery::default()
            },
            vec![],
        ),
        (
            "text only in an agent name is not a message",
            RunQuery {
                text: Some("triage".into()),
                ..RunQuery::default()
            },
            vec![],
        ),
        (
            "filters together",
            RunQuery {
                thread_prefix: Some("acme.".into()),
                agent: Some("triage".into()),
                model: Some("mock".into()),
                text: Some("incident".into()),
                ..RunQuery::default()
            },
            vec!["acme.r2"],
        ),
    ];
    for (what, query, expected) in cases {
        let rows = only(query).await?;
        ensure_eq(CASE, what, ids(&rows), expected)?;
    }
    let bad = store
        .list_runs(&RunQuery {
            text: Some("two\nlines".into()),
            ..RunQuery::default()
        })
        .await;
    ensure(
        CASE,
        matches!(bad, Err(StoreError::InvalidQuery(_))),
        || format!("a text with a line break: {bad:?}"),
    )?;
    let one = store
        .list_runs(&RunQuery {
            limit: 0,
            ..RunQuery::default()
        })
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    ensure_eq(CASE, "limit 0 gives pages of one", one.runs.len(), 1)?;
    Ok(())
}

/// Each order, walked two rows at a time in both directions, equals a full sort of the
/// rows by that key (ties by thread id).
pub async fn list_runs_sorted_pages(store: Arc<dyn EventStore>) -> Result<(), ConformanceError> {
    const CASE: &str = "list_runs_sorted_pages";
    seed(&store).await?;
    let all = walk(
        CASE,
        &store,
        &RunQuery {
            limit: 200,
            ..RunQuery::default()
        },
    )
    .await?;
    ensure_eq(CASE, "rows", all.len(), SPECS.len())?;
    for sort in RunSort::ALL {
        for ascending in [false, true] {
            let query = RunQuery {
                sort,
                ascending,
                limit: 2,
                ..RunQuery::default()
            };
            let mut expected = all.clone();
            expected.sort_by(|a, b| query.compare(a, b));
            let walked = walk(CASE, &store, &query).await?;
            ensure_eq(
                CASE,
                &format!(
                    "{} {}",
                    sort.as_str(),
                    if ascending { "asc" } else { "desc" }
                ),
                ids(&walked),
                ids(&expected),
            )?;
        }
    }
    // Independent of `compare`: the token totals by hand.
    let by_tokens = walk(
        CASE,
        &store,
        &RunQuery {
            sort: RunSort::Tokens,
            limit: 3,
            ..RunQuery::default()
        },
    )
    .await?;
    let tokens: Vec<u64> = by_tokens.iter().map(|r| r.tokens).collect();
    ensure_eq(
        CASE,
        "tokens, most first",
        tokens,
        vec![600, 300, 153, 45, 2],
    )?;
    let by_cost = walk(
        CASE,
        &store,
        &RunQuery {
            sort: RunSort::Cost,
            ascending: true,
            limit: 2,
            ..RunQuery::default()
        },
    )
    .await?;
    ensure_eq(
        CASE,
        "cost, least first (no cost counts as 0)",
        ids(&by_cost),
        vec!["acme.r2", "other.r5", "acme.r4", "acme.r1", "acme.r3"],
    )?;
    // A filtered, sorted walk.
    let triage_by_turns = walk(
        CASE,
        &store,
        &RunQuery {
            agent: Some("triage".into()),
            sort: RunSort::Turns,
            limit: 1,
            ..RunQuery::default()
        },
    )
    .await?;
    ensure_eq(
        CASE,
        "triage by turns",
        ids(&triage_by_turns),
        vec!["acme.r1", "acme.r2", "other.r5"],
    )?;
    Ok(())
}

/// The listing follows the log: a thread's new events, a fork, a deletion and a thread
/// created again under a deleted id.
pub async fn list_runs_follows_the_log(store: Arc<dyn EventStore>) -> Result<(), ConformanceError> {
    const CASE: &str = "list_runs_follows_the_log";
    seed(&store).await?;
    let query = RunQuery {
        limit: 200,
        ..RunQuery::default()
    };
    let before = walk(CASE, &store, &query).await?;
    ensure_eq(CASE, "r3 before", row(CASE, &before, "acme.r3")?.tokens, 45)?;
    // r3 (running) gets a model call and ends.
    let mut more: Vec<Event> = model_call(4, "openai:gpt-4o-mini", 1_000, 1, Some(1.0))
        .into_iter()
        .chain([
            EventKind::UserMessage {
                message: Message::user("a later QUESTION"),
            },
            run_ended(EndState::Done),
        ])
        .enumerate()
        .map(|(i, kind)| event("acme.r3", 8 + i as u64, 9_000 + i as i64, kind))
        .collect();
    store
        .append("acme.r3", 8, &more)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    let after = walk(CASE, &store, &query).await?;
    let r3 = row(CASE, &after, "acme.r3")?;
    ensure_eq(CASE, "r3 tokens after", r3.tokens, 1_046)?;
    ensure_eq(CASE, "r3 turns after", r3.turns, 4)?;
    ensure_eq(CASE, "r3 cost after", r3.cost_usd, Some(0.5 + 0.25 + 1.0))?;
    ensure_eq(
        CASE,
        "r3 status after",
        r3.status,
        ThreadStatus::Ended(EndState::Done),
    )?;
    ensure_eq(CASE, "r3 events after", r3.event_count, 12)?;
    ensure_eq(
        CASE,
        "r3 is the latest",
        after.first().map(|r| r.thread_id.as_str()),
        Some("acme.r3"),
    )?;
    let found = walk(
        CASE,
        &store,
        &RunQuery {
            text: Some("later question".into()),
            ..RunQuery::default()
        },
    )
    .await?;
    ensure_eq(CASE, "text of new events", ids(&found), vec!["acme.r3"])?;

    // A fork of r1 up to its first model answer.
    store
        .fork_thread("acme.r1", 3, "acme.f1")
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    let forked = walk(CASE, &store, &query).await?;
    let f1 = row(CASE, &forked, "acme.f1")?;
    ensure_eq(CASE, "fork tokens", f1.tokens, 120)?;
    ensure_eq(CASE, "fork status", f1.status, ThreadStatus::Running)?;

    // Deleting removes the row and its text; a new thread under the same id is new.
    store
        .delete_thread("acme.r1")
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    let deleted = walk(CASE, &store, &query).await?;
    ensure(CASE, !ids(&deleted).contains(&"acme.r1"), || {
        format!("deleted thread still listed: {:?}", ids(&deleted))
    })?;
    more = log_of(&Spec {
        id: "acme.r1",
        agent: "reborn",
        model: "mock:small",
        start_ms: 20_000,
        user: "a new thread",
        calls: &[(1, 2, None)],
        tools: &[],
        end: Some(EndState::Done),
    });
    store
        .append("acme.r1", 0, &more)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    let reborn = walk(CASE, &store, &query).await?;
    let r1 = row(CASE, &reborn, "acme.r1")?;
    ensure_eq(CASE, "new r1 tokens", r1.tokens, 3)?;
    ensure_eq(CASE, "new r1 agent", r1.agent.as_deref(), Some("reborn"))?;
    let old_text = walk(
        CASE,
        &store,
        &RunQuery {
            text: Some("linker error".into()),
            ..RunQuery::default()
        },
    )
    .await?;
    ensure_eq(CASE, "old r1's text is gone", ids(&old_text), vec![])?;
    Ok(())
}

/// [`EventStore::run_facts`] equals the fold of every listed thread's log, in
/// `list_threads`' order, for each filter.
async fn facts_match_the_logs(
    case: &'static str,
    store: &Arc<dyn EventStore>,
    step: &str,
) -> Result<(), ConformanceError> {
    let queries = [
        FactsQuery::default(),
        FactsQuery {
            thread_prefix: Some("acme.".into()),
            ..FactsQuery::default()
        },
        FactsQuery {
            agent: Some("triage".into()),
            ..FactsQuery::default()
        },
        FactsQuery {
            active_since: Some(at(2_000)),
            ..FactsQuery::default()
        },
    ];
    for query in queries {
        let got = store
            .run_facts(&query)
            .await
            .map_err(|e| fail(case, format!("{step}: run_facts({query:?}): {e}")))?;
        let expected = run_facts_by_folding(store.as_ref(), &query)
            .await
            .map_err(|e| fail(case, format!("{step}: folding the logs: {e}")))?;
        ensure_eq(case, &format!("{step}: facts of {query:?}"), got, expected)?;
    }
    Ok(())
}

/// The metrics facts follow appends, a fork and a delete, like the runs list.
pub async fn run_facts_follow_the_log(store: Arc<dyn EventStore>) -> Result<(), ConformanceError> {
    const CASE: &str = "run_facts_follow_the_log";
    seed(&store).await?;
    facts_match_the_logs(CASE, &store, "seeded").await?;
    let page = store
        .run_facts(&FactsQuery::default())
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    ensure_eq(CASE, "threads", page.threads.len(), SPECS.len())?;
    ensure_eq(CASE, "unindexed", page.unindexed, 0)?;
    // r3 (running) gets a repairable tool failure, its repair, a model call and an end.
    let mut repair = tool_result("acme.r3", 7, false, "bad input");
    if let EventKind::ToolCallFinished { result } = &mut repair
        && let ToolResultKind::Error { code, .. } =
            &mut std::sync::Arc::make_mut(result).outcome.result
    {
        *code = ToolErrorCode::InvalidInput;
    }
    let mut more: Vec<Event> = [repair, tool_result("acme.r3", 8, true, "fixed")]
        .into_iter()
        .chain(model_call(4, "openai:gpt-4o-mini", 1_000, 1, Some(0.1)))
        .enumerate()
        .map(|(i, kind)| event("acme.r3", 8 + i as u64, 9_000 + i as i64, kind))
        .collect();
    let rest = more.split_off(1);
    store
        .append("acme.r3", 8, &more)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    facts_match_the_logs(CASE, &store, "after a failed call").await?;
    store
        .append("acme.r3", 9, &rest)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    let ended = [event("acme.r3", 12, 9_100, run_ended(EndState::Failed))];
    store
        .append("acme.r3", 12, &ended)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    facts_match_the_logs(CASE, &store, "after its repair").await?;
    // A fork of r1 (the same run id in two threads) and a delete.
    store
        .fork_thread("acme.r1", 3, "acme.f1")
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    facts_match_the_logs(CASE, &store, "after a fork").await?;
    store
        .delete_thread("acme.r1")
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    facts_match_the_logs(CASE, &store, "after a delete").await?;
    let reborn = log_of(&Spec {
        id: "acme.r1",
        agent: "reborn",
        model: "mock:small",
        start_ms: 20_000,
        user: "a new thread",
        calls: &[(1, 2, None)],
        tools: &[(false, "down")],
        end: Some(EndState::Done),
    });
    store
        .append("acme.r1", 0, &reborn)
        .await
        .map_err(|e| fail(CASE, e.to_string()))?;
    facts_match_the_logs(CASE, &store, "after a new thread of a deleted id").await?;
    Ok(())
}
