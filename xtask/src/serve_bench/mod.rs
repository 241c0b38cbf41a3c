//! `cargo xtask bench-serve`: the load benchmark of `keel serve` (issue 17) — a benchmark,
//! not a test: it reports figures (docs/server.md, "Load") and fails only on errors, never
//! on a timing.
//!
//! What runs, all on loopback, every process a release build of the `keel` binary:
//! 1. `keel mock-llm` with one scripted answer (`--words` words streamed as OpenAI Chat
//!    Completions chunks of two words) after `--latency-ms` (50) before the headers and
//!    `--chunk-delay-ms` between frames;
//! 2. `keel keys create` and `keel serve` over a fresh store (SQLite in a temporary
//!    directory, or Postgres in a fresh schema of `$DATABASE_URL`), a keel.toml whose agent
//!    uses the mock, `--workers` embedded workers (default: the concurrency) and tenant
//!    limits raised so the load is allowed;
//! 3. the **baseline**: the same answer asked of the mock directly, `--chats` streams
//!    `--concurrency` at a time, from this process's client;
//! 4. the **load**: `--chats` `POST /v1/chat` with `stream: true`, `--concurrency` at a
//!    time, recording when every SSE event arrives.
//!
//! Reported: the latency the server adds to each event over the mock (see [`analysis`]
//! for the definition) as p50 / p99 / max, overall and by phase; chats and HTTP requests
//! per second; SSE events per second; the server's peak resident memory (`VmHWM`) and
//! CPU time; errors (must be 0: every stream answers 200, ends with an `outcome` of a run
//! ended `done`, has no gap in its ids and carries every text delta). The report is
//! printed and written to `target/bench-serve/report.{md,json}`.

pub mod analysis;
pub mod client;
pub mod procs;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use sqlx::{Connection, Executor};
use tokio::process::Command;

use analysis::{Phase, Problems, Reference, Spread, added_latencies, ms, problems};
use client::{AGENT, ChatTimeline, Kind, MockTimeline, chat, http_client, mock_stream, run_many};
use procs::Proc;

/// How long the idle server's CPU use is measured.
pub const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// The tenant of the benchmark's key.
const TENANT: &str = "bench";

/// The agent's instructions (also the baseline's system prompt).
const INSTRUCTIONS: &str = "You are a concise assistant. Answer in a few sentences.";

/// Which store `keel serve` runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ServeStore {
    /// SQLite in a temporary directory (the default store).
    #[default]
    Sqlite,
    /// Postgres at `$DATABASE_URL`, in a fresh schema dropped at the end.
    Postgres,
}

impl std::fmt::Display for ServeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ServeBenchOptions {
    /// Chats of the measured load (and streams of the baseline).
    pub chats: usize,
    /// Chats in flight at once.
    pub concurrency: usize,
    /// Embedded workers of `keel serve` (default: the concurrency).
    pub workers: Option<usize>,
    /// The mock's latency before the response headers, in ms.
    pub latency_ms: u64,
    /// The mock's pause between stream frames, in ms.
    pub chunk_delay_ms: u64,
    /// Words of the answer (streamed two per chunk).
    pub words: usize,
    /// Chats (and baseline streams) before the measured phases.
    pub warmup: usize,
    /// The store.
    pub store: ServeStore,
    /// The agent's model (an `openai:` spec: the mock speaks Chat Completions).
    pub model: String,
    /// A `keel` binary to use instead of building the release one.
    pub keel: Option<PathBuf>,
    /// Where to write `report.md` and `report.json` (default `target/bench-serve`).
    pub out: Option<PathBuf>,
    /// The longest one chat may take.
    pub timeout: Duration,
}

impl Default for ServeBenchOptions {
    /// The issue's figures: 500 concurrent streaming chats, a mock with 50 ms latency.
    fn default() -> Self {
        Self {
            chats: 500,
            concurrency: 500,
            workers: None,
            latency_ms: 50,
            chunk_delay_ms: 5,
            words: 40,
            warmup: 20,
            store: ServeStore::Sqlite,
            model: "openai:gpt-4.1-mini".into(),
            keel: None,
            out: None,
            timeout: Duration::from_secs(300),
        }
    }
}

impl ServeBenchOptions {
    fn workers(&self) -> usize {
        self.workers.unwrap_or(self.concurrency).max(1)
    }
}

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct ServeBenchReport {
    /// What ran.
    pub options: ServeBenchOptions,
    /// When (UTC, from `date`).
    pub when: String,
    /// Logical CPUs of the machine.
    pub cpus: usize,
    /// Load averages (1, 5, 15 min) before the benchmark and after the measured load.
    pub load: [(f64, f64, f64); 2],
    /// Text chunks per answer (what the baseline received).
    pub chunks: usize,
    /// Baseline streams that failed.
    pub baseline_errors: usize,
    /// Baseline: wall time.
    pub baseline_wall: Duration,
    /// Baseline: first text chunk (ms since the request).
    pub mock_first: Spread,
    /// Baseline: end of the answer.
    pub mock_end: Spread,
    /// Through the server: the response's headers (the run is queued).
    pub headers: Spread,
    /// Through the server: first event (`run_started`).
    pub first_event: Spread,
    /// Through the server: first `text_delta`.
    pub first_delta: Spread,
    /// Through the server: the `outcome` (the whole chat).
    pub chat_end: Spread,
    /// Added latency per event, every event.
    pub added: Spread,
    /// … events before the answer.
    pub added_before: Spread,
    /// … text deltas.
    pub added_deltas: Spread,
    /// … events after the answer.
    pub added_after: Spread,
    /// Chats that ended with a `done` outcome.
    pub completed: usize,
    /// SSE events received.
    pub events: usize,
    /// Wall time of the measured load.
    pub wall: Duration,
    /// What went wrong.
    pub problems: Problems,
    /// Server: resident memory after the warm-up (KiB).
    pub idle_rss_kib: u64,
    /// Server: peak resident memory (`VmHWM`, KiB).
    pub peak_rss_kib: u64,
    /// Server: CPU time (user + system) during the measured load.
    pub server_cpu: Duration,
    /// Server: share of one CPU it used while idle after the warm-up (its workers polling
    /// the queue), over [`IDLE_WINDOW`].
    pub idle_cpu_percent: f64,
    /// Whether the server was still running at the end.
    pub server_alive: bool,
}

impl ServeBenchReport {
    /// Every failed check (empty: the run passed). Timings are never checked.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let p = &self.problems;
        if p.errors() > 0 {
            out.push(format!(
                "{} chat streams failed (HTTP status {}, transport {}, no outcome {}, not done {}, id gaps {}): {}",
                p.errors(),
                p.bad_status,
                p.transport,
                p.no_outcome,
                p.not_done,
                p.seq_gaps,
                p.examples.join("; ")
            ));
        }
        if p.delta_mismatch > 0 {
            out.push(format!(
                "{} streams' text deltas do not add up to the answer ({} bytes missing): {}",
                p.delta_mismatch,
                p.bytes_missing,
                p.examples.join("; ")
            ));
        }
        if self.completed != self.options.chats {
            out.push(format!(
                "{} of {} chats completed",
                self.completed, self.options.chats
            ));
        }
        if self.baseline_errors > 0 {
            out.push(format!(
                "{} baseline streams against the mock failed",
                self.baseline_errors
            ));
        }
        if !self.server_alive {
            out.push("keel serve exited during the benchmark".into());
        }
        out
    }

    /// Chats completed per second of the measured load.
    pub fn chats_per_second(&self) -> f64 {
        self.completed as f64 / self.wall.as_secs_f64().max(f64::EPSILON)
    }

    /// The report as Markdown (what is printed and written to `report.md`).
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut out = String::new();
        let load = |(a, b, c): (f64, f64, f64)| format!("{a:.2} {b:.2} {c:.2}");
        let _ = writeln!(
            out,
            "bench-serve {}: {} streaming chats, {} at once; store {}; {} embedded workers; model {}",
            self.when,
            o.chats,
            o.concurrency,
            o.store,
            o.workers(),
            o.model
        );
        let _ = writeln!(
            out,
            "mock: {} ms before the headers, {} ms between frames, {} text chunks per answer; \
             machine: {} CPUs, load average {} before, {} after\n",
            o.latency_ms,
            o.chunk_delay_ms,
            self.chunks,
            self.cpus,
            load(self.load[0]),
            load(self.load[1])
        );
        let _ = writeln!(out, "| ms since the request | p50 | p99 | max |");
        let _ = writeln!(out, "| --- | ---: | ---: | ---: |");
        let row = |out: &mut String, label: &str, s: &Spread| {
            let _ = writeln!(
                out,
                "| {label} | {:.1} | {:.1} | {:.1} |",
                s.p50, s.p99, s.max
            );
        };
        row(
            &mut out,
            "mock directly: first text chunk",
            &self.mock_first,
        );
        row(&mut out, "mock directly: end of the answer", &self.mock_end);
        row(
            &mut out,
            "keel serve: response headers (run queued)",
            &self.headers,
        );
        row(
            &mut out,
            "keel serve: first event (`run_started`)",
            &self.first_event,
        );
        row(
            &mut out,
            "keel serve: first `text_delta`",
            &self.first_delta,
        );
        row(
            &mut out,
            "keel serve: `outcome` (end of the chat)",
            &self.chat_end,
        );
        row(
            &mut out,
            &format!("**added per event** (all {} events)", self.added.count),
            &self.added,
        );
        row(
            &mut out,
            "added: events before the answer (run start, user message, model request)",
            &self.added_before,
        );
        row(
            &mut out,
            "added: `text_delta` over the mock's chunk",
            &self.added_deltas,
        );
        row(
            &mut out,
            "added: events after the answer (model response, run end, outcome)",
            &self.added_after,
        );
        let wall = self.wall.as_secs_f64().max(f64::EPSILON);
        let _ = writeln!(
            out,
            "\nthroughput: {} chats in {:.2} s = **{:.0} chats/s** = {:.0} HTTP requests/s \
             (one `POST /v1/chat` per chat); {:.0} SSE events/s; the baseline's {} streams \
             took {:.2} s",
            self.completed,
            wall,
            self.chats_per_second(),
            o.chats as f64 / wall,
            self.events as f64 / wall,
            o.chats,
            self.baseline_wall.as_secs_f64()
        );
        let per_chat_kib = (self.peak_rss_kib.saturating_sub(self.idle_rss_kib)) as f64
            / o.concurrency.max(1) as f64;
        let _ = writeln!(
            out,
            "server: **peak RSS {:.1} MB** (VmHWM; {:.1} MB after the warm-up, +{:.0} KiB per \
             concurrent chat); CPU {:.2} s for the load ({:.2} ms per chat); idle with {} \
             workers: {:.0}% of a CPU",
            self.peak_rss_kib as f64 / 1024.0,
            self.idle_rss_kib as f64 / 1024.0,
            per_chat_kib,
            self.server_cpu.as_secs_f64(),
            ms(self.server_cpu) / self.completed.max(1) as f64,
            o.workers(),
            self.idle_cpu_percent
        );
        let p = &self.problems;
        let _ = writeln!(
            out,
            "errors: {} (HTTP status {}, transport {}, no outcome {}, not done {}, id gaps {}); \
             streams whose text deltas miss part of the answer: {} ({} bytes)",
            p.errors(),
            p.bad_status,
            p.transport,
            p.no_outcome,
            p.not_done,
            p.seq_gaps,
            p.delta_mismatch,
            p.bytes_missing
        );
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(out, "PASS");
        } else {
            for failure in failures {
                let _ = writeln!(out, "FAIL: {failure}");
            }
        }
        out
    }

    /// The figures as JSON (`report.json`).
    pub fn json(&self) -> serde_json::Value {
        let spread = |s: &Spread| json!({"count": s.count, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max});
        let o = &self.options;
        json!({
            "when": self.when,
            "chats": o.chats,
            "concurrency": o.concurrency,
            "workers": o.workers(),
            "store": o.store.to_string(),
            "model": o.model,
            "mock": {"latency_ms": o.latency_ms, "chunk_delay_ms": o.chunk_delay_ms, "text_chunks": self.chunks},
            "machine": {"cpus": self.cpus, "load_before": [self.load[0].0, self.load[0].1, self.load[0].2],
                        "load_after": [self.load[1].0, self.load[1].1, self.load[1].2]},
            "mock_first_chunk": spread(&self.mock_first),
            "mock_end": spread(&self.mock_end),
            "headers": spread(&self.headers),
            "first_event": spread(&self.first_event),
            "first_delta": spread(&self.first_delta),
            "chat_end": spread(&self.chat_end),
            "added_per_event": spread(&self.added),
            "added_before_answer": spread(&self.added_before),
            "added_text_delta": spread(&self.added_deltas),
            "added_after_answer": spread(&self.added_after),
            "completed": self.completed,
            "events": self.events,
            "wall_s": self.wall.as_secs_f64(),
            "chats_per_s": self.chats_per_second(),
            "baseline_wall_s": self.baseline_wall.as_secs_f64(),
            "server": {"peak_rss_kib": self.peak_rss_kib, "idle_rss_kib": self.idle_rss_kib,
                       "cpu_s": self.server_cpu.as_secs_f64(), "idle_cpu_percent": self.idle_cpu_percent,
                       "alive": self.server_alive},
            "errors": self.problems.errors(),
            "streams_missing_text": self.problems.delta_mismatch,
            "failures": self.failures(),
        })
    }
}

impl std::fmt::Display for ServeBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.markdown())
    }
}

/// The answer the mock streams: `words` words.
fn answer_text(words: usize) -> String {
    let text: Vec<String> = (1..=words.max(1)).map(|i| format!("word{i}")).collect();
    text.join(" ")
}

/// The mock's script: one answer of `words` words, repeated for every request.
fn script(options: &ServeBenchOptions) -> serde_json::Value {
    json!({
        "turns": [{
            "text": answer_text(options.words),
            "usage": {"input_tokens": 40, "output_tokens": options.words},
            "faults": {"latency_ms": options.latency_ms, "chunk_delay_ms": options.chunk_delay_ms},
        }],
        "when_exhausted": "repeat_last",
    })
}

/// keel.toml of the server.
fn keel_toml(options: &ServeBenchOptions, mock: &str) -> String {
    let headroom = (options.concurrency as u64).saturating_mul(2).max(16);
    let per_minute = ((options.chats + options.warmup) as u64).saturating_mul(100);
    let timeout_ms = u64::try_from(options.timeout.as_millis()).unwrap_or(u64::MAX);
    format!(
        r#"[providers.openai]
base_url = "http://{mock}/v1"

[agents.{AGENT}]
model = "{model}"
instructions = "{INSTRUCTIONS}"

[server]
workers = {workers}
stream_timeout_ms = {timeout_ms}
request_timeout_ms = {timeout_ms}
shutdown_grace_ms = 5000

# Raised so the benchmark's load is allowed (the checks still run on every chat).
[server.limits]
concurrent_runs = {headroom}
requests_per_minute = {per_minute}
"#,
        model = options.model,
        workers = options.workers(),
    )
}

/// A fresh store: its URL for the `keel` processes, and the Postgres schema to drop at
/// the end (database URL, schema).
struct Store {
    url: String,
    postgres: Option<(String, String)>,
}

/// Runs one statement on a new connection to `url` (bounded).
async fn postgres_execute(url: &str, statement: String) -> anyhow::Result<()> {
    let work = async {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        conn.execute(sqlx::AssertSqlSafe(statement)).await?;
        conn.close().await
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .context("Postgres did not answer within 30 s")?
        .context("running a statement on DATABASE_URL")
}

async fn open_store(kind: ServeStore, dir: &Path) -> anyhow::Result<Store> {
    match kind {
        ServeStore::Sqlite => Ok(Store {
            url: format!("sqlite://{}", dir.join("keel.db").display()),
            postgres: None,
        }),
        ServeStore::Postgres => {
            let url = std::env::var("DATABASE_URL")
                .context("--store postgres needs DATABASE_URL (postgres://user@host:port/db)")?;
            // Only created here: the keel binary under test applies its own migrations.
            let schema = format!("keel_bench_serve_{}", std::process::id());
            postgres_execute(&url, format!("CREATE SCHEMA \"{schema}\"")).await?;
            let separator = if url.contains('?') { '&' } else { '?' };
            Ok(Store {
                url: format!("{url}{separator}options[search_path]={schema}"),
                postgres: Some((url, schema)),
            })
        }
    }
}

/// Runs the benchmark (see the module docs).
pub async fn run(options: ServeBenchOptions) -> anyhow::Result<ServeBenchReport> {
    if options.chats == 0 || options.concurrency == 0 {
        bail!("--chats and --concurrency must be at least 1");
    }
    let keel = match &options.keel {
        Some(path) => path.clone(),
        None => procs::build_keel().await?,
    };
    if !keel.is_file() {
        bail!("no keel binary at {}", keel.display());
    }
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let store = open_store(options.store, dir.path()).await?;
    let result = run_in(&options, &keel, dir.path(), &store.url).await;
    if let Some((url, schema)) = &store.postgres
        && let Err(error) =
            postgres_execute(url, format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await
    {
        eprintln!("bench-serve: could not drop the benchmark schema {schema}: {error:#}");
    }
    result
}

async fn run_in(
    options: &ServeBenchOptions,
    keel: &Path,
    dir: &Path,
    store_url: &str,
) -> anyhow::Result<ServeBenchReport> {
    let load_before = procs::load_average().unwrap_or_default();
    let script_path = dir.join("script.json");
    std::fs::write(&script_path, script(options).to_string()).context("writing script.json")?;
    let mut mock_cmd = Command::new(keel);
    mock_cmd
        .args(["mock-llm", "--port", "0", "--script"])
        .arg(&script_path)
        .current_dir(dir);
    let mock = Proc::start(mock_cmd, "mock-llm listening on", dir.join("mock.log")).await?;
    let config = dir.join("keel.toml");
    std::fs::write(&config, keel_toml(options, &mock.addr)).context("writing keel.toml")?;
    let key = procs::create_key(keel, dir, store_url, TENANT).await?;
    let mut serve_cmd = Command::new(keel);
    serve_cmd
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--store",
            store_url,
            "--config",
        ])
        .arg(&config)
        .env("OPENAI_API_KEY", "sk-mock")
        .env("KEEL_TEST_MODE", "1")
        .current_dir(dir);
    let mut server =
        Proc::start(serve_cmd, "keel serve listening on", dir.join("serve.log")).await?;
    let client = http_client(options.concurrency)?;
    let mock_base = format!("http://{}", mock.addr);
    let serve_base = format!("http://{}", server.addr);
    let timeout = options.timeout;

    // The baseline: the mock alone, warmed up, then the same load shape.
    let baseline = |count: usize| {
        let (client, base) = (client.clone(), mock_base.clone());
        run_many(count, options.concurrency, move |i| {
            mock_stream(
                client.clone(),
                base.clone(),
                INSTRUCTIONS.to_string(),
                i,
                timeout,
            )
        })
    };
    eprintln!(
        "bench-serve: baseline — {} streams straight from the mock",
        options.chats
    );
    let _ = baseline(options.warmup).await;
    let (mock_streams, baseline_wall) = baseline(options.chats).await;

    // The server, warmed up (connections, the agent built, the tokenizer loaded).
    let chats = |count: usize, concurrency: usize| {
        let (client, base, key) = (client.clone(), serve_base.clone(), key.clone());
        run_many(count, concurrency, move |i| {
            chat(client.clone(), base.clone(), key.clone(), i, timeout)
        })
    };
    let (warm, _) = chats(options.warmup, options.concurrency.min(16)).await;
    if let Some(failed) = warm.iter().find(|c| c.error.is_some()) {
        bail!(
            "a warm-up chat failed: {:?}; keel serve's log:\n{}",
            failed.error,
            server.stderr_tail(30)
        );
    }
    let idle_rss_kib = procs::status_kib(server.pid, "VmRSS").unwrap_or(0);
    let idle_start = procs::cpu_time(server.pid).unwrap_or_default();
    tokio::time::sleep(IDLE_WINDOW).await;
    let cpu_before = procs::cpu_time(server.pid).unwrap_or_default();
    let idle_cpu_percent =
        cpu_before.saturating_sub(idle_start).as_secs_f64() * 100.0 / IDLE_WINDOW.as_secs_f64();
    eprintln!(
        "bench-serve: load — {} streaming chats through keel serve, {} at once",
        options.chats, options.concurrency
    );
    let (streams, wall) = chats(options.chats, options.concurrency).await;
    let load_after = procs::load_average().unwrap_or_default();
    let peak_rss_kib = procs::status_kib(server.pid, "VmHWM").unwrap_or(0);
    let server_cpu = procs::cpu_time(server.pid)
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    let server_alive = server.alive();
    let when = date_utc().await;
    let report = summarize(
        options,
        Summary {
            mock: &mock_streams,
            chats: &streams,
            when,
            load: [load_before, load_after],
            baseline_wall,
            wall,
            idle_rss_kib,
            peak_rss_kib,
            server_cpu,
            idle_cpu_percent,
            server_alive,
        },
    );
    if !report.failures().is_empty() {
        eprintln!(
            "bench-serve: keel serve's log (last lines):\n{}",
            server.stderr_tail(30)
        );
    }
    server.stop(Duration::from_secs(30)).await;
    mock.stop(Duration::from_secs(5)).await;
    Ok(report)
}

/// The raw material of a report.
struct Summary<'a> {
    mock: &'a [MockTimeline],
    chats: &'a [ChatTimeline],
    when: String,
    load: [(f64, f64, f64); 2],
    baseline_wall: Duration,
    wall: Duration,
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    server_cpu: Duration,
    idle_cpu_percent: f64,
    server_alive: bool,
}

fn summarize(options: &ServeBenchOptions, s: Summary<'_>) -> ServeBenchReport {
    let reference = Reference::from_baseline(s.mock);
    let chunks = reference.chunks.len();
    let answer = answer_text(options.words);
    let ok_mock = s.mock.iter().filter(|m| m.error.is_none());
    let mock_first: Vec<f64> = ok_mock
        .clone()
        .filter_map(|m| m.chunks.first().map(|(_, d)| ms(*d)))
        .collect();
    let mock_end: Vec<f64> = ok_mock.filter_map(|m| m.done.map(ms)).collect();
    let first = |pick: fn(&Kind) -> bool| -> Vec<f64> {
        s.chats
            .iter()
            .filter(|c| c.error.is_none())
            .filter_map(|c| c.arrivals.iter().find(|a| pick(&a.kind)).map(|a| ms(a.at)))
            .collect()
    };
    let headers: Vec<f64> = s
        .chats
        .iter()
        .filter(|c| c.error.is_none())
        .filter_map(|c| c.headers.map(ms))
        .collect();
    let first_event = first(|k| matches!(k, Kind::Stored { .. }));
    let first_delta = first(|k| matches!(k, Kind::Delta { .. }));
    let chat_end = first(|k| matches!(k, Kind::Outcome { .. }));
    let mut all = Vec::new();
    let mut by_phase: [Vec<f64>; 3] = Default::default();
    for stream in s.chats.iter().filter(|c| c.error.is_none()) {
        for (phase, added) in added_latencies(&reference, stream) {
            all.push(added);
            let slot = match phase {
                Phase::Before => &mut by_phase[0],
                Phase::Delta => &mut by_phase[1],
                Phase::After => &mut by_phase[2],
            };
            slot.push(added);
        }
    }
    let [before, deltas, after] = by_phase;
    let completed = s
        .chats
        .iter()
        .filter(|c| {
            c.error.is_none()
                && matches!(
                    c.arrivals.last().map(|a| &a.kind),
                    Some(Kind::Outcome { done: true })
                )
        })
        .count();
    ServeBenchReport {
        options: options.clone(),
        when: s.when,
        cpus: procs::cpus(),
        load: s.load,
        chunks,
        baseline_errors: s.mock.iter().filter(|m| m.error.is_some()).count()
            + options.chats.saturating_sub(s.mock.len()),
        baseline_wall: s.baseline_wall,
        mock_first: Spread::of(&mock_first),
        mock_end: Spread::of(&mock_end),
        headers: Spread::of(&headers),
        first_event: Spread::of(&first_event),
        first_delta: Spread::of(&first_delta),
        chat_end: Spread::of(&chat_end),
        added: Spread::of(&all),
        added_before: Spread::of(&before),
        added_deltas: Spread::of(&deltas),
        added_after: Spread::of(&after),
        completed,
        events: s.chats.iter().map(|c| c.arrivals.len()).sum(),
        wall: s.wall,
        problems: problems(s.chats, &answer),
        idle_rss_kib: s.idle_rss_kib,
        peak_rss_kib: s.peak_rss_kib,
        server_cpu: s.server_cpu,
        idle_cpu_percent: s.idle_cpu_percent,
        server_alive: s.server_alive,
    }
}

/// Now, UTC, to the minute (`date -u`).
async fn date_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .await
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Writes `report.md` and `report.json` to `options.out` (default
/// `target/bench-serve`); returns the directory.
pub fn write_report(report: &ServeBenchReport) -> anyhow::Result<PathBuf> {
    let dir = report
        .options
        .out
        .clone()
        .unwrap_or_else(|| procs::target_dir().join("bench-serve"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("report.md"), report.markdown()).context("writing report.md")?;
    let json = serde_json::to_string_pretty(&report.json())?;
    std::fs::write(dir.join("report.json"), json).context("writing report.json")?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_config_offers_the_agent_and_allows_the_load() {
        let options = ServeBenchOptions::default();
        let text = keel_toml(&options, "127.0.0.1:9");
        let loaded =
            keel_config::KeelConfig::loaded_from_str(&text, Path::new("."), &|_| None).unwrap();
        let config = loaded.config;
        assert!(config.agents.contains_key(AGENT));
        assert_eq!(config.server.workers, 500);
        let limits = config.server.limits_for(TENANT);
        assert!(limits.concurrent_runs >= options.concurrency as u64);
        assert!(limits.requests_per_minute >= (options.chats + options.warmup) as u64);
        let script = script(&options);
        assert_eq!(script["turns"][0]["faults"]["latency_ms"], 50);
        let words = script["turns"][0]["text"].as_str().unwrap();
        assert_eq!(words.split(' ').count(), 40);
    }
}
