//! `cargo xtask soak`: N conversations × T turns (one run per user turn), C conversations
//! at a time, with the `summarize` context strategy and a small context window so the
//! history is compacted again and again (summaries come from a second mock). Half the
//! conversations run on `openai:`, half on `anthropic:`; each finished conversation's
//! thread is deleted from the store, as a service purging old threads would.
//!
//! Measured: resident memory (`VmRSS`), live tokio tasks and open file descriptors —
//! before anything ran; as the warm-up share of the conversations has finished (the others
//! keep running: memory is compared in the same steady state); at every tenth of the
//! conversations; after all of them (quiet); and once the agents are dropped (quiet).
//!
//! Asserted ([`SoakReport::failures`]): every run ends `done`; compaction happened; memory
//! never exceeds its level after warm-up by the drift limit (default 5%); once the agents
//! are dropped, tokio tasks and file descriptors are back to what they were before
//! anything ran (nothing that ran is left behind).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use keel_core::context::StrategyKind;
use keel_core::{EndState, EventKind, EventStore, Message, ToolRegistry};
use keel_providers::{ProviderOptions, model_from_spec};
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_testkit::mock_llm::{
    MockLlmServer, MockScript, MockServerOptions, MockTurn, TurnBy, WhenExhausted,
};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::process::{Sample, sample, settle};
use crate::stats::secs;
use crate::store::{OpenStore, StoreKind};

/// How long a quiet point may take to settle (connections winding down) before the
/// figures are taken anyway.
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Conversations in total.
    pub conversations: usize,
    /// User turns (runs) per conversation.
    pub turns: usize,
    /// Conversations running at once.
    pub concurrency: usize,
    /// Conversations of the warm-up (default: a fifth, at least twice `concurrency`).
    pub warmup: Option<usize>,
    /// The agents' context window, in tokens: small, so compaction happens.
    pub context_window: u32,
    /// The event store.
    pub store: StoreKind,
    /// Largest allowed growth of resident memory after warm-up, in percent.
    pub max_rss_drift_percent: f64,
}

impl Default for SoakOptions {
    /// The figures: 1000 conversations × 50 turns; 32 at a time.
    fn default() -> Self {
        Self {
            conversations: 1000,
            turns: 50,
            concurrency: 32,
            warmup: None,
            context_window: 3_000,
            store: StoreKind::Memory,
            max_rss_drift_percent: 5.0,
        }
    }
}

impl SoakOptions {
    /// Conversations of the warm-up phase.
    pub fn warmup_conversations(&self) -> usize {
        self.warmup
            .unwrap_or_else(|| (self.conversations / 5).max(self.concurrency * 2))
            .min(self.conversations.saturating_sub(1))
    }
}

/// The result of a soak run.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// What ran.
    pub options: SoakOptions,
    /// Runs driven.
    pub runs: u64,
    /// Runs that ended `done`.
    pub done: u64,
    /// The first few runs that did not, with why.
    pub not_done: Vec<String>,
    /// `compacted` events recorded.
    pub compactions: u64,
    /// Model requests the two mocks received.
    pub model_requests: usize,
    /// Before anything ran.
    pub baseline: Sample,
    /// When the warm-up conversations had finished (the others running).
    pub warm: Sample,
    /// After all conversations (quiet; agents alive, their idle connections open).
    pub end: Sample,
    /// After the agents were dropped (quiet).
    pub released: Sample,
    /// Resident memory (KiB) at every tenth of the conversations: (conversations done, KiB).
    pub rss_series: Vec<(usize, u64)>,
    /// The highest resident memory seen after warm-up.
    pub peak_rss_kib: u64,
    /// Whole run.
    pub wall: Duration,
}

impl SoakReport {
    /// How far resident memory rose above its level after warm-up (the highest sample
    /// after it, the end included), in percent.
    pub fn rss_drift_percent(&self) -> f64 {
        if self.warm.rss_kib == 0 {
            return 0.0;
        }
        (self.peak_rss_kib as f64 - self.warm.rss_kib as f64) * 100.0 / self.warm.rss_kib as f64
    }

    /// Every failed assertion, in words (empty: the run passed).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let expected = (self.options.conversations * self.options.turns) as u64;
        if self.runs != expected || self.done != self.runs {
            failures.push(format!(
                "{} of {expected} runs ended done: {}",
                self.done,
                self.not_done.join("; ")
            ));
        }
        if self.compactions == 0 {
            failures.push(
                "no compaction happened: the context window is too large for the soak".to_string(),
            );
        }
        if self.warm.rss_kib == 0 || self.end.rss_kib == 0 {
            failures.push("resident memory could not be read (/proc/self/status)".to_string());
        }
        let drift = self.rss_drift_percent();
        if drift >= self.options.max_rss_drift_percent {
            failures.push(format!(
                "resident memory grew {drift:.1}% after warm-up ({} → {} KiB at most; limit {}%)",
                self.warm.rss_kib, self.peak_rss_kib, self.options.max_rss_drift_percent
            ));
        }
        if self.released.tasks > self.baseline.tasks {
            failures.push(format!(
                "tokio tasks leak: {} alive before the soak, {} after it with its agents dropped",
                self.baseline.tasks, self.released.tasks
            ));
        }
        if self.released.fds > self.baseline.fds {
            failures.push(format!(
                "file descriptors leak: {} open before the soak, {} after it with its agents dropped",
                self.baseline.fds, self.released.fds
            ));
        }
        failures
    }
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = &self.options;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "soak: {} conversations × {} turns, {} at a time, warm-up {} conversations, context window {} tokens, store {}",
            o.conversations,
            o.turns,
            o.concurrency,
            o.warmup_conversations(),
            o.context_window,
            o.store
        );
        let _ = writeln!(
            out,
            "runs: {} ({} done); compactions {}; model requests {}",
            self.runs, self.done, self.compactions, self.model_requests
        );
        for (label, s) in [
            ("before", self.baseline),
            ("after warm-up", self.warm),
            ("end (quiet)", self.end),
            ("agents dropped", self.released),
        ] {
            let _ = writeln!(
                out,
                "  {label:<15} RSS {:>8} KiB   tasks {:>4}   fds {:>4}",
                s.rss_kib, s.tasks, s.fds
            );
        }
        let series: Vec<String> = self
            .rss_series
            .iter()
            .map(|(done, kib)| format!("{done}:{kib}"))
            .collect();
        let _ = writeln!(
            out,
            "RSS (conversations done:KiB): {}; highest after warm-up {} KiB",
            series.join(" "),
            self.peak_rss_kib
        );
        let _ = writeln!(
            out,
            "RSS drift after warm-up: {:+.2}% (limit {}%); wall {}",
            self.rss_drift_percent(),
            o.max_rss_drift_percent,
            secs(self.wall)
        );
        let failures = self.failures();
        if failures.is_empty() {
            let _ = writeln!(out, "PASS");
        } else {
            for failure in failures {
                let _ = writeln!(out, "FAIL: {failure}");
            }
        }
        f.write_str(&out)
    }
}

/// The main mock's script: a calculator call, then an answer, over and over (each
/// conversation on its own; compaction changes where in the cycle it is, which is fine).
fn script() -> MockScript {
    MockScript::new(vec![
        MockTurn::text("Let me compute that.")
            .with_tool_call("calculator", json!({"expression": "6*7"})),
        MockTurn::text(
            "6*7 = 42. Multiplying six by seven gives forty-two; the calculator confirmed it, \
             and the result is exact because both factors are integers.",
        ),
    ])
    .turn_by(TurnBy::Conversation)
    .when_exhausted(WhenExhausted::Cycle)
}

fn summarizer_script() -> MockScript {
    MockScript::new(vec![MockTurn::text(
        "Summary: the user asked for 6*7 several times; the calculator returned 42 each time \
         and the assistant explained the result.",
    )])
    .when_exhausted(WhenExhausted::RepeatLast)
}

/// The agents of one phase: one per provider, each with its own HTTP clients.
fn agents(main: &str, summaries: &str, window: u32) -> anyhow::Result<Vec<Arc<ToolAgent>>> {
    let options = |base: &str| ProviderOptions {
        base_url: Some(base.to_string()),
        api_key: Some("soak".into()),
        loopback_only: true,
        ..ProviderOptions::default()
    };
    let mut out = Vec::new();
    for spec in ["openai:gpt-4o-mini", "anthropic:claude-sonnet-4-5"] {
        let model = model_from_spec(spec, &options(main)).with_context(|| spec.to_string())?;
        let summarizer =
            model_from_spec(spec, &options(summaries)).with_context(|| spec.to_string())?;
        let mut tools = ToolRegistry::new();
        tools
            .register_typed(keel_tools::Calculator)
            .context("registering the calculator")?;
        out.push(Arc::new(
            ToolAgent::builder("soak", model)
                .instructions("Answer arithmetic questions with the calculator.")
                .tools(tools)
                .context_strategy(StrategyKind::Summarize)
                .summarizer_model(summarizer)
                .context_window(window)
                .build(),
        ));
    }
    Ok(out)
}

/// Counters shared by the conversations.
#[derive(Default)]
struct Tally {
    runs: AtomicU64,
    done: AtomicU64,
    compactions: AtomicU64,
    not_done: std::sync::Mutex<Vec<String>>,
}

/// Runs the harness. Call it on a multi-threaded tokio runtime that runs nothing else, so
/// the task count is the harness's own.
pub async fn run(options: SoakOptions) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let quiet = MockServerOptions {
        no_log: true,
        on_request: None,
    };
    let main = MockLlmServer::start_with(script(), 0, quiet.clone())
        .await
        .context("starting the mock LLM")?;
    let summaries = MockLlmServer::start_with(summarizer_script(), 0, quiet)
        .await
        .context("starting the summarizer mock")?;
    let opened = OpenStore::open(options.store).await?;
    let tally = Arc::new(Tally::default());
    // The servers' own tasks start as they are first polled.
    let baseline = settle(usize::MAX, SETTLE_DEADLINE).await;

    let agents = agents(
        &main.base_url(),
        &summaries.base_url(),
        options.context_window,
    )?;
    let (warm, series) = drive(&agents, &opened.store, &options, &tally).await?;
    let end = settle(usize::MAX, SETTLE_DEADLINE).await;
    // Dropping the agents drops their HTTP clients and closes every connection.
    drop(agents);
    let released = settle(baseline.fds, SETTLE_DEADLINE).await;

    let not_done = match tally.not_done.lock() {
        Ok(list) => list.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    let report = SoakReport {
        runs: tally.runs.load(Ordering::SeqCst),
        done: tally.done.load(Ordering::SeqCst),
        not_done,
        compactions: tally.compactions.load(Ordering::SeqCst),
        model_requests: main.request_count() + summaries.request_count(),
        baseline,
        warm,
        end,
        released,
        peak_rss_kib: series
            .iter()
            .filter(|(done, _)| *done >= options.warmup_conversations())
            .map(|(_, kib)| *kib)
            .chain([warm.rss_kib, end.rss_kib])
            .max()
            .unwrap_or(0),
        rss_series: series,
        wall: started.elapsed(),
        options,
    };
    main.shutdown().await;
    summaries.shutdown().await;
    opened.close().await?;
    Ok(report)
}

/// Drives every conversation, C at a time. Returns the sample taken as the warm-up
/// conversations had finished, and resident memory at every tenth of them.
async fn drive(
    agents: &[Arc<ToolAgent>],
    store: &Arc<dyn EventStore>,
    options: &SoakOptions,
    tally: &Arc<Tally>,
) -> anyhow::Result<(Sample, Vec<(usize, u64)>)> {
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let total = options.conversations;
    let warmup = options.warmup_conversations();
    let mut tasks = tokio::task::JoinSet::new();
    let mut finished = 0usize;
    let mut next_tenth = 1usize;
    let mut warm = None;
    let mut series = Vec::new();
    let mut on_finished = |finished: usize| {
        if finished == warmup.max(1) {
            warm = Some(sample());
        }
        if finished * 10 >= next_tenth * total {
            series.push((finished, sample().rss_kib));
            next_tenth += 1;
        }
    };
    for index in 0..total {
        // Reap what finished, so the set holds only live conversations.
        while let Some(result) = tasks.try_join_next() {
            result.context("a soak conversation panicked")??;
            finished += 1;
            on_finished(finished);
        }
        let permit = gate.clone().acquire_owned().await?;
        let agent = agents
            .get(index % agents.len().max(1))
            .cloned()
            .context("no agent")?;
        let store = store.clone();
        let tally = tally.clone();
        let turns = options.turns;
        tasks.spawn(async move {
            let _permit = permit;
            conversation(&agent, store, index, turns, &tally).await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.context("a soak conversation panicked")??;
        finished += 1;
        on_finished(finished);
    }
    Ok((warm.unwrap_or_else(sample), series))
}

/// One conversation: `turns` runs on one thread, then the thread is deleted.
async fn conversation(
    agent: &ToolAgent,
    store: Arc<dyn EventStore>,
    index: usize,
    turns: usize,
    tally: &Tally,
) -> anyhow::Result<()> {
    let ctx = RunContext::new(store.clone());
    let id = format!("soak-{index:05}");
    let mut thread = Thread::with_id(id.clone());
    for turn in 0..turns {
        let message = Message::user(format!(
            "Turn {turn} of conversation {index}: what is 6*7? Use the calculator and explain \
             the result in a sentence, as you did before."
        ));
        let outcome = agent
            .run(vec![message], &mut thread, &ctx)
            .await
            .with_context(|| format!("conversation {index}, turn {turn}"))?;
        tally.runs.fetch_add(1, Ordering::SeqCst);
        if outcome.end_state() == Some(EndState::Done) {
            tally.done.fetch_add(1, Ordering::SeqCst);
        } else if let Ok(mut list) = tally.not_done.lock()
            && list.len() < 5
        {
            list.push(format!(
                "conversation {index} turn {turn}: {:?} {}",
                outcome.status,
                outcome.reason.unwrap_or_default()
            ));
        }
        let compacted = thread
            .run_events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Compacted { .. }))
            .count();
        tally
            .compactions
            .fetch_add(compacted as u64, Ordering::SeqCst);
    }
    store
        .delete_thread(&id)
        .await
        .with_context(|| format!("deleting thread {id}"))?;
    Ok(())
}
