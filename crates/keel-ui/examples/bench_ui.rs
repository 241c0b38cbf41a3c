//! Benchmark of the web UI over a big store (issue 18: "pages render under 200 ms for a
//! store with 10,000 runs"). Not a test: it prints figures, it asserts nothing.
//!
//! ```sh
//! cargo run --release -p keel-ui --example bench_ui -- [--runs 10000] [--requests 30] \
//!     [--store sqlite|postgres|both] [--keep]
//! ```
//!
//! For SQLite (a temporary file) and, when `DATABASE_URL` is set, Postgres (a throw-away
//! schema), it seeds RUNS threads of realistic size — a user message, 1 to 8 model calls,
//! tool calls with results of a few hundred words (some failing), a final answer; ~80%
//! done, the rest failed, over budget, running or waiting for an approval — plus one run
//! of 500 spans (250 model calls, 249 tool calls), serves `keel_ui::router` on a loopback
//! port, and times pages over real HTTP (reqwest, one request at a time): the first
//! listing (which builds the store's runs index from the whole log), then REQUESTS times
//! each of the runs page (first page, filtered, searched, sorted, a deep page), its live
//! refresh, the 500-span run page and one of its span details and the dashboard (whole
//! and filtered; it then checks that the dashboard shows `keel stats`' figures, computed
//! from every log); then a listing after 100 new runs (the index catching up). Median,
//! p95 and max per page.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use keel_core::event::{Event, EventKind};
use keel_core::model::StopReason;
use keel_core::outcome::{ToolErrorCode, ToolOutcome, ToolResultKind};
use keel_core::tool::Effect;
use keel_core::{Budget, EndState, EventStore, Message, Part, Role, ToolCall, ToolResult, Usage};
use keel_store::{PostgresOptions, PostgresStore, SqliteStore};

/// A small deterministic generator (xorshift64*): the same store every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "the",
    "build",
    "failed",
    "because",
    "of",
    "a",
    "missing",
    "dependency",
    "in",
    "crate",
    "we",
    "should",
    "check",
    "logs",
    "for",
    "service",
    "request",
    "returned",
    "status",
    "code",
    "database",
    "migration",
    "retry",
    "after",
    "queue",
    "worker",
    "deploy",
    "release",
    "branch",
    "test",
    "suite",
    "passed",
    "error",
    "message",
    "latency",
    "p95",
    "increased",
    "cache",
    "invalidated",
    "customer",
    "report",
    "summary",
    "incident",
    "resolved",
    "rollback",
    "config",
    "value",
    "parser",
    "module",
    "refactor",
    "function",
    "returns",
    "null",
    "pointer",
    "memory",
    "usage",
    "spike",
    "alert",
    "fired",
    "threshold",
    "exceeded",
    "metrics",
    "dashboard",
    "trace",
];

fn words(rng: &mut Rng, n: u64) -> String {
    let mut out = String::new();
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(rng.pick(WORDS));
    }
    out
}

const AGENTS: &[&str] = &["triage", "coder", "support", "researcher", "ops"];
const MODELS: &[&str] = &[
    "openai:gpt-4o",
    "openai:gpt-4o-mini",
    "anthropic:claude-sonnet-4",
    "local:qwen2.5-coder-1.5b",
];
const TOOLS: &[&str] = &[
    "read_file",
    "search_logs",
    "http_get",
    "run_tests",
    "sql_query",
];

fn event(
    thread: &str,
    run: &str,
    trace: &str,
    seq: u64,
    ts: DateTime<Utc>,
    kind: EventKind,
) -> Event {
    Event {
        v: keel_core::EVENT_SCHEMA_VERSION,
        seq,
        ts,
        thread_id: thread.to_string().into(),
        run_id: run.to_string().into(),
        trace_id: trace.to_string().into(),
        span_id: format!("{:016x}", seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        kind,
    }
}

/// Builds one thread's log, event by event.
struct Log {
    thread: String,
    run: String,
    trace: String,
    ts: DateTime<Utc>,
    events: Vec<Event>,
}

impl Log {
    fn new(thread: String, start: DateTime<Utc>) -> Self {
        let trace = format!(
            "{:032x}",
            thread.len() as u128 * 0x1234_5678_9abc_def1 + start.timestamp_micros() as u128
        );
        Self {
            run: format!("run_{thread}"),
            thread,
            trace,
            ts: start,
            events: Vec::new(),
        }
    }

    fn push(&mut self, rng: &mut Rng, max_gap_ms: u64, kind: EventKind) {
        self.ts += chrono::Duration::milliseconds(rng.between(5, max_gap_ms) as i64);
        let seq = self.events.len() as u64;
        self.events.push(event(
            &self.thread,
            &self.run,
            &self.trace,
            seq,
            self.ts,
            kind,
        ));
    }

    fn model_call(&mut self, rng: &mut Rng, turn: u32, model: &str, message: Message) {
        let input = rng.between(500, 8000);
        let output = rng.between(20, 800);
        self.push(
            rng,
            50,
            EventKind::ModelRequested {
                turn,
                model: model.into(),
                message_count: turn * 2,
                tool_count: 5,
                estimated_input_tokens: input,
                provider: model.split(':').next().map(str::to_string),
                temperature: Some(0.2),
                max_tokens: Some(4096),
                context_window: Some(128_000),
            },
        );
        let cost = (!model.starts_with("local:"))
            .then(|| (input as f64 * 2.5 + output as f64 * 10.0) / 1_000_000.0);
        let kind = serde_json::from_value(serde_json::json!({
            "type": "model_responded", "turn": turn, "message": message,
            "usage": Usage { input_tokens: input, output_tokens: output, cache_read_tokens: 0, cache_write_tokens: 0 },
            "latency_ms": rng.between(300, 6000), "stop_reason": StopReason::EndTurn,
            "response_id": format!("resp_{turn}"), "cost_usd": cost,
        }))
        .unwrap();
        self.push(rng, 6000, kind);
    }

    fn tool_call(&mut self, rng: &mut Rng, n: u32, ok: bool, result: String) -> ToolCall {
        let name = rng.pick(TOOLS);
        let call = ToolCall {
            id: format!("call_{n}"),
            name: name.into(),
            arguments: serde_json::json!({"query": words(rng, 12), "limit": 20}).to_string(),
        };
        self.push(
            rng,
            20,
            EventKind::ToolCallRequested {
                call: call.clone(),
                effect: Some(Effect::ReadOnly),
                requires_approval: false,
            },
        );
        self.push(rng, 20, EventKind::tool_call_started(call.id.clone(), name));
        let outcome = ToolOutcome {
            tool: name.into(),
            call_id: call.id.clone(),
            thread_id: self.thread.clone(),
            run_id: self.run.clone(),
            attempts: 1,
            latency_ms: rng.between(5, 3000),
            repairs: Vec::new(),
            result: if ok {
                ToolResultKind::Ok {
                    data: serde_json::Value::String(result.clone()),
                    schema_validated: true,
                    truncated: false,
                }
            } else {
                ToolResultKind::Error {
                    code: ToolErrorCode::Timeout,
                    message: result.clone(),
                    details: None,
                }
            },
        };
        self.push(
            rng,
            3000,
            EventKind::ToolCallFinished {
                result: std::sync::Arc::new(ToolResult {
                    call_id: call.id.clone(),
                    name: name.into(),
                    outcome,
                    content: result,
                }),
            },
        );
        call
    }
}

fn assistant_with_call(text: String, call: ToolCall) -> Message {
    Message {
        role: Role::Assistant,
        parts: vec![Part::Text { text }, Part::ToolCall(call)],
    }
}

/// One realistic thread.
fn realistic_run(i: u64, start: DateTime<Utc>) -> Vec<Event> {
    let mut rng =
        Rng(0x9E37_79B9_7F4A_7C15 ^ (i.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9)));
    let thread = format!("thr_bench_{i:06}");
    let mut log = Log::new(thread, start);
    let agent = rng.pick(AGENTS);
    let model = rng.pick(MODELS);
    let n_words = rng.between(40, 120);
    let goal = format!("ticket-{i}: {}", words(&mut rng, n_words));
    log.push(
        &mut rng,
        5,
        EventKind::RunStarted {
            agent: agent.into(),
            model: model.into(),
            goal: goal.clone(),
            constraints: vec!["stay read-only".into()],
            budget: Budget::unlimited().with_max_turns(12),
            definition: None,
            parent_span_id: None,
        },
    );
    log.push(
        &mut rng,
        5,
        EventKind::UserMessage {
            message: Message::user(goal),
        },
    );
    let turns = [1, 2, 2, 3, 3, 3, 4, 4, 5, 6, 8][rng.below(11) as usize];
    let state = rng.below(100);
    for turn in 1..=turns {
        if turn < turns {
            let ok = rng.below(10) != 0;
            let n_words = rng.between(50, 400);
            let result = if ok {
                words(&mut rng, n_words)
            } else {
                format!("timeout after 30 s: {}", words(&mut rng, 12))
            };
            // The call is recorded in the answer first, then run.
            let call = ToolCall {
                id: format!("call_{turn}"),
                name: String::new(),
                arguments: String::new(),
            };
            let preamble = words(&mut rng, 15);
            let mut answer = assistant_with_call(preamble, call);
            let idx = log.events.len();
            log.model_call(&mut rng, turn, model, answer.clone());
            let made = log.tool_call(&mut rng, turn, ok, result);
            answer.parts[1] = Part::ToolCall(made);
            if let EventKind::ModelResponded { message, .. } = &mut log.events[idx + 1].kind {
                *message = answer;
            }
        } else if state >= 97 {
            // Waits for an approval.
            let call = log.tool_call(&mut rng, turn, true, String::new());
            log.events.truncate(log.events.len() - 2);
            log.push(
                &mut rng,
                10,
                EventKind::ApprovalRequested {
                    call_id: call.id,
                    name: call.name,
                    arguments: call.arguments,
                },
            );
        } else {
            let n_words = rng.between(30, 150);
            let text = words(&mut rng, n_words);
            log.model_call(&mut rng, turn, model, Message::assistant(text.clone()));
            let end = match state {
                0..82 => Some(EndState::Done),
                82..90 => Some(EndState::Failed),
                90..94 => Some(EndState::BudgetExceeded),
                _ => None, // still running
            };
            if let Some(end_state) = end {
                log.push(
                    &mut rng,
                    5,
                    EventKind::RunEnded {
                        end_state,
                        reason: None,
                        final_text: Some(text),
                    },
                );
            }
        }
    }
    log.events
}

/// The run of 500 spans: the run, 250 model calls and 249 tool calls.
fn big_run(start: DateTime<Utc>) -> Vec<Event> {
    let mut rng = Rng(42);
    let mut log = Log::new("thr_bench_500_spans".into(), start);
    log.push(
        &mut rng,
        5,
        EventKind::RunStarted {
            agent: "ops".into(),
            model: "openai:gpt-4o".into(),
            goal: "walk every service and collect its status".into(),
            constraints: Vec::new(),
            budget: Budget::unlimited(),
            definition: None,
            parent_span_id: None,
        },
    );
    log.push(
        &mut rng,
        5,
        EventKind::UserMessage {
            message: Message::user("walk every service and collect its status"),
        },
    );
    for turn in 1..=250u32 {
        if turn < 250 {
            let preamble = words(&mut rng, 10);
            let placeholder = ToolCall {
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            };
            let idx = log.events.len();
            log.model_call(
                &mut rng,
                turn,
                "openai:gpt-4o",
                assistant_with_call(preamble.clone(), placeholder),
            );
            let result = words(&mut rng, 120);
            let call = log.tool_call(&mut rng, turn, turn % 9 != 0, result);
            if let EventKind::ModelResponded { message, .. } = &mut log.events[idx + 1].kind {
                *message = assistant_with_call(preamble, call);
            }
        } else {
            let text = words(&mut rng, 100);
            log.model_call(
                &mut rng,
                turn,
                "openai:gpt-4o",
                Message::assistant(text.clone()),
            );
            log.push(
                &mut rng,
                5,
                EventKind::RunEnded {
                    end_state: EndState::Done,
                    reason: None,
                    final_text: Some(text),
                },
            );
        }
    }
    log.events
}

struct Seeded {
    events: usize,
    bytes: usize,
    seconds: f64,
}

/// Appends `runs` realistic threads (8 at a time) plus the 500-span run.
async fn seed(store: Arc<dyn EventStore>, from: u64, runs: u64, big: bool) -> Seeded {
    let began = Instant::now();
    let now = Utc::now();
    let span = chrono::Duration::days(30);
    let mut logs: Vec<Vec<Event>> = (from..from + runs)
        .map(|i| {
            let start = now - span
                + span * i32::try_from(i % 10_000).unwrap() / 10_000
                + chrono::Duration::seconds((i / 10_000) as i64);
            realistic_run(i, start)
        })
        .collect();
    if big {
        logs.push(big_run(now - chrono::Duration::hours(2)));
    }
    let events = logs.iter().map(Vec::len).sum();
    let bytes = logs
        .iter()
        .flatten()
        .map(|e| serde_json::to_string(e).unwrap().len())
        .sum();
    futures::stream::iter(logs)
        .map(|log| {
            let store = store.clone();
            async move {
                let thread = log[0].thread_id.clone();
                store.append(&thread, 0, &log).await.unwrap();
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    Seeded {
        events,
        bytes,
        seconds: began.elapsed().as_secs_f64(),
    }
}

async fn serve(store: Arc<dyn EventStore>) -> String {
    let ui = keel_ui::Ui::new(keel_ui::RunSource::new(
        store,
        keel_telemetry::Redactor::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keel_ui::serve(
        listener,
        keel_ui::router(ui),
        std::future::pending(),
    ));
    base
}

async fn fetch(client: &reqwest::Client, url: &str) -> (Duration, String) {
    let began = Instant::now();
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    let body = response.text().await.unwrap();
    let took = began.elapsed();
    assert!(status.is_success(), "{url}: {status}: {body}");
    (took, body)
}

struct Figure {
    page: String,
    requests: usize,
    median_ms: f64,
    p95_ms: f64,
    max_ms: f64,
    /// Rows of a runs page, spans of a run page.
    rows: usize,
    kb: f64,
}

fn row_count(html: &str) -> usize {
    html.matches("<tr data-thread=").count() + html.matches("data-span-id=\"").count()
}

async fn time_page(
    client: &reqwest::Client,
    base: &str,
    label: &str,
    path: &str,
    n: usize,
) -> Figure {
    let url = format!("{base}{path}");
    for _ in 0..3 {
        fetch(client, &url).await;
    }
    let mut times = Vec::with_capacity(n);
    let mut body = String::new();
    for _ in 0..n {
        let (took, text) = fetch(client, &url).await;
        times.push(took.as_secs_f64() * 1000.0);
        body = text;
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize];
    Figure {
        page: label.to_string(),
        requests: n,
        median_ms: at(0.5),
        p95_ms: at(0.95),
        max_ms: at(1.0),
        rows: row_count(&body),
        kb: body.len() as f64 / 1024.0,
    }
}

fn single(label: &str, took: Duration, body: &str) -> Figure {
    let ms = took.as_secs_f64() * 1000.0;
    Figure {
        page: label.to_string(),
        requests: 1,
        median_ms: ms,
        p95_ms: ms,
        max_ms: ms,
        rows: row_count(body),
        kb: body.len() as f64 / 1024.0,
    }
}

/// The `href` of the element with `id` in `html`, unescaped.
fn link(html: &str, id: &str) -> Option<String> {
    html.split(&format!("id=\"{id}\" href=\""))
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(|href| href.replace("&amp;", "&"))
}

async fn bench(name: &str, store: Arc<dyn EventStore>, runs: u64, requests: usize) -> Vec<Figure> {
    eprintln!("bench-ui: {name}: seeding {runs} runs and a 500-span run…");
    let seeded = seed(store.clone(), 0, runs, true).await;
    eprintln!(
        "bench-ui: {name}: {} events, {:.0} MB of JSON, appended in {:.1} s",
        seeded.events,
        seeded.bytes as f64 / 1e6,
        seeded.seconds
    );
    let base = serve(store.clone()).await;
    let client = reqwest::Client::new();
    let mut figures = Vec::new();

    // The first listing indexes what it can in its time budget and leaves the rest to a
    // background task; pages are timed once the index is complete.
    let began = Instant::now();
    let (took, body) = fetch(&client, &format!("{base}/runs")).await;
    figures.push(single("first listing (starts indexing)", took, &body));
    let mut waiting = body.contains("id=\"indexing-notice\"");
    while waiting {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_, page) = fetch(&client, &format!("{base}/runs?limit=1")).await;
        waiting = page.contains("id=\"indexing-notice\"");
    }
    let built = began.elapsed();
    figures.push(Figure {
        page: format!(
            "every run indexed ({runs} runs, {:.0} MB)",
            seeded.bytes as f64 / 1e6
        ),
        requests: 1,
        median_ms: built.as_secs_f64() * 1000.0,
        p95_ms: built.as_secs_f64() * 1000.0,
        max_ms: built.as_secs_f64() * 1000.0,
        rows: 0,
        kb: 0.0,
    });

    let pages: [(&str, &str); 9] = [
        ("runs, first page", "/runs"),
        ("runs, live refresh (fragment=rows)", "/runs?fragment=rows"),
        (
            "filtered: state=failed, agent=triage",
            "/runs?state=failed&agent=triage",
        ),
        ("filtered: model=mini, from=7d", "/runs?model=mini&from=7d"),
        ("text search, common word (q=timeout)", "/runs?q=timeout"),
        (
            "text search, one run (q=ticket-4242:)",
            "/runs?q=ticket-4242%3A",
        ),
        ("sorted by tokens", "/runs?sort=tokens"),
        ("sorted by cost, smallest first", "/runs?sort=cost&dir=asc"),
        (
            "filtered + sorted: state=done by duration",
            "/runs?state=done&sort=duration",
        ),
    ];
    for (label, path) in pages {
        figures.push(time_page(&client, &base, label, path, requests).await);
    }

    // A deep page: follow 200 "next page" links of a sorted listing (rows 5,001-5,025).
    let mut url = format!("{base}/runs?sort=turns");
    for _ in 0..200 {
        let (_, html) = fetch(&client, &url).await;
        url = format!("{base}{}", link(&html, "next-page").expect("a next page"));
    }
    let deep = url.strip_prefix(&base).unwrap().to_string();
    figures.push(
        time_page(
            &client,
            &base,
            "sorted by turns, page 201 (rows 5,001-5,025)",
            &deep,
            requests,
        )
        .await,
    );

    let big = "/runs/thr_bench_500_spans";
    let (_, html) = fetch(&client, &format!("{base}{big}")).await;
    let spans = html.matches("data-span-id=\"").count();
    figures.push(
        time_page(
            &client,
            &base,
            &format!("run page, {spans} spans"),
            big,
            requests,
        )
        .await,
    );
    let tool_span = html
        .split("data-kind=\"tool\"")
        .next()
        .and_then(|before| before.rsplit("data-span-id=\"").next())
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    figures.push(
        time_page(
            &client,
            &base,
            "a span's details in the 500-span run",
            &format!("{big}/spans/{tool_span}"),
            requests,
        )
        .await,
    );
    figures.push(
        time_page(
            &client,
            &base,
            "run page, a typical run",
            "/runs/thr_bench_004242",
            requests,
        )
        .await,
    );

    // The dashboard combines each run's metrics facts from the run index.
    figures.push(time_page(&client, &base, "dashboard", "/dashboard", requests).await);
    figures.push(
        time_page(
            &client,
            &base,
            "dashboard, filtered: agent=triage, from=7d",
            "/dashboard?agent=triage&from=7d",
            requests,
        )
        .await,
    );
    // Its figures are `keel stats`': the report over every log, read once here.
    let (_, html) = fetch(&client, &format!("{base}/dashboard")).await;
    let mut events = Vec::new();
    for thread in store.list_threads(&Default::default()).await.unwrap() {
        events.extend(store.load(&thread.thread_id).await.unwrap());
    }
    let stats = keel_telemetry::render_summary(&keel_telemetry::compute_metrics(
        &events,
        &keel_telemetry::MetricsOptions::default(),
    ));
    let missing: Vec<&str> = stats
        .lines()
        .filter(|line| !line.is_empty() && !html.contains(line))
        .collect();
    eprintln!(
        "bench-ui: the dashboard shows keel stats' figures: {}",
        if missing.is_empty() {
            "yes".to_string()
        } else {
            format!("NO, missing {missing:?}")
        }
    );

    // The index catching up: 100 new runs, then one listing.
    seed(store.clone(), runs, 100, false).await;
    let (took, body) = fetch(&client, &format!("{base}/runs")).await;
    figures.push(single("listing after 100 new runs (catch-up)", took, &body));
    figures
}

fn print(name: &str, figures: &[Figure]) {
    println!("\n{name}\n");
    println!("| page | requests | median ms | p95 ms | max ms | rows/spans | KB |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for f in figures {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.0} |",
            f.page, f.requests, f.median_ms, f.p95_ms, f.max_ms, f.rows, f.kb
        );
    }
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = arg("--runs", 10_000);
    let requests = arg("--requests", 30) as usize;
    let stores = flag("--store").unwrap_or_else(|| "both".into());
    let keep = std::env::args().any(|a| a == "--keep");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "bench-ui: {runs} runs, {requests} requests per page, {} CPUs, load average {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    if stores != "postgres" {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let sqlite = SqliteStore::open(&path).await.unwrap();
        let figures = bench("SQLite", Arc::new(sqlite.clone()), runs, requests).await;
        sqlite.close().await;
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        print(
            &format!("SQLite ({:.0} MB file)", size as f64 / 1e6),
            &figures,
        );
        if keep {
            let kept = dir.keep();
            println!("(kept {})", kept.join("keel.db").display());
        }
    }
    if stores != "sqlite" {
        match std::env::var("DATABASE_URL") {
            Ok(url) => {
                let schema = format!("keel_bench_ui_{}", std::process::id());
                let pg = PostgresStore::connect_with(PostgresOptions::new(url).schema(&schema))
                    .await
                    .unwrap();
                let figures = bench("Postgres", Arc::new(pg.clone()), runs, requests).await;
                print("Postgres (local server)", &figures);
                if keep {
                    println!("(kept schema {schema})");
                    pg.close().await;
                } else {
                    pg.drop_schema().await.unwrap();
                }
            }
            Err(_) => println!("\n(Postgres skipped: DATABASE_URL is not set)"),
        }
    }
}
