//! The facts of `keel stats`' metrics per run ([`RunFacts`]), folded one event at a time
//! ([`ThreadMetrics::fold`]) so a store can keep them up to date incrementally (the SQL
//! stores keep them in their run index, see `keel-store`) and a dashboard can combine the
//! facts of many runs without reading their logs. `keel_telemetry::compute_metrics` is this
//! fold followed by `keel_telemetry::metrics_from_facts`, so the dashboard and `keel stats`
//! compute the same figures.
//!
//! A log is cut into *segments*: maximal stretches of consecutive events of one run
//! (`run_id`); a thread's runs follow each other, so a thread has one segment per run.
//! A segment holds what the report sums (tool calls, latencies, errors, retries, every
//! model answer in order — float sums are order-sensitive, so the combination replays
//! them in log order) and what joins segments of one run (its end state, and for repairs
//! the tools whose last call failed repairably and the outcome of each tool's first call).
//! What the fold itself needs to go on (each run's model and requested turns) is kept
//! apart ([`ThreadMetrics::state`]): a reader of the facts never needs it.
//!
//! Folded per thread (as a store does), a run found in two threads — a fork copies its
//! parent's events, run ids included — attributes each model answer from its own thread's
//! `run_started` and `model_requested` events; a fork's copy holds those of every answer it
//! copied, so the combined report is the one-pass report over both threads' events.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::{Event, EventKind};
use crate::outcome::ToolErrorCode;
use crate::store::{EventStore, StoreError, ThreadFilter};

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// An optional `f64` stored as its bits: exact through JSON whatever the parser.
mod f64_bits {
    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)]
    pub(super) fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_some(&x.to_bits()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(f64::from_bits))
    }
}

/// One tool's calls within a segment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolFacts {
    /// Calls.
    #[serde(rename = "c")]
    pub calls: u64,
    /// Failed calls.
    #[serde(rename = "e", default, skip_serializing_if = "is_zero")]
    pub errors: u64,
    /// Σ (attempts − 1).
    #[serde(rename = "r", default, skip_serializing_if = "is_zero")]
    pub retries: u64,
    /// Each call's latency, ms, in log order.
    #[serde(rename = "l", default)]
    pub latencies_ms: Vec<u64>,
}

/// One model answer (`model_responded`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelAnswer {
    /// The model it is counted for: the requested turn's model, else the run's.
    #[serde(rename = "m")]
    pub model: String,
    /// Latency, ms.
    #[serde(rename = "l")]
    pub latency_ms: u64,
    /// Input tokens.
    #[serde(rename = "i")]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(rename = "o")]
    pub output_tokens: u64,
    /// Reported cost in US dollars.
    #[serde(rename = "c", default, with = "f64_bits")]
    pub cost_usd: Option<f64>,
    /// The context window the request named.
    #[serde(rename = "w", default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

/// The metrics facts of one segment of a log: consecutive events of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFacts {
    /// The run.
    #[serde(rename = "id")]
    pub run_id: String,
    /// Time of the segment's first event.
    #[serde(rename = "t")]
    pub started_at: DateTime<Utc>,
    /// The end state of the segment's last `run_ended`.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub end_state: Option<String>,
    /// Per tool.
    #[serde(rename = "tl", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolFacts>,
    /// Tool errors by taxonomy code.
    #[serde(rename = "te", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_errors: BTreeMap<String, u64>,
    /// Repairs attempted within the segment.
    #[serde(rename = "ra", default, skip_serializing_if = "is_zero")]
    pub repair_attempts: u64,
    /// Repairs that worked within the segment.
    #[serde(rename = "rs", default, skip_serializing_if = "is_zero")]
    pub repairs_succeeded: u64,
    /// Tools whose last call in the segment failed with `invalid_input` or
    /// `output_schema_mismatch` (a repair is attempted by that tool's next call).
    #[serde(rename = "rp", default, skip_serializing_if = "BTreeSet::is_empty")]
    pub repair_pending: BTreeSet<String>,
    /// Whether each tool's first call in the segment succeeded (it completes a repair
    /// pending from an earlier segment of the run).
    #[serde(rename = "fc", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub first_calls: BTreeMap<String, bool>,
    /// Model answers, in log order.
    #[serde(rename = "ma", default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<ModelAnswer>,
    /// Model failures by model.
    #[serde(rename = "mf", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_failures: BTreeMap<String, u64>,
    /// Model failures by error kind.
    #[serde(rename = "me", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_errors: BTreeMap<String, u64>,
    /// `retry` events by scope.
    #[serde(rename = "re", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retry_events: BTreeMap<String, u64>,
}

impl RunFacts {
    /// An empty segment of `run_id` starting at `started_at`.
    pub fn new(run_id: String, started_at: DateTime<Utc>) -> Self {
        Self {
            run_id,
            started_at,
            end_state: None,
            tools: BTreeMap::new(),
            tool_errors: BTreeMap::new(),
            repair_attempts: 0,
            repairs_succeeded: 0,
            repair_pending: BTreeSet::new(),
            first_calls: BTreeMap::new(),
            answers: Vec::new(),
            model_failures: BTreeMap::new(),
            model_errors: BTreeMap::new(),
            retry_events: BTreeMap::new(),
        }
    }

    /// Tool calls of the segment.
    pub fn tool_calls(&self) -> u64 {
        self.tools.values().map(|t| t.calls).sum()
    }
}

/// What the fold needs to go on with a run (never read by a combination).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunFoldState {
    /// Model of the run's latest `run_started` (an answer to a turn not requested is
    /// counted for it).
    #[serde(rename = "m", default)]
    pub model: String,
    /// Requested turns: model id and context window.
    #[serde(rename = "r", default)]
    pub requested: BTreeMap<u32, (String, Option<u64>)>,
}

/// A log's metrics facts so far, folded one event at a time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadMetrics {
    /// The segments, in log order.
    pub runs: Vec<RunFacts>,
    /// The fold's state per run id.
    pub state: BTreeMap<String, RunFoldState>,
}

impl ThreadMetrics {
    /// The facts of a whole log (or of any stream of events, runs told apart by id).
    pub fn from_events<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut metrics = Self::default();
        for event in events {
            metrics.fold(event);
        }
        metrics
    }

    /// Adds one event (the next of the log).
    pub fn fold(&mut self, event: &Event) {
        if self.runs.last().is_none_or(|r| *r.run_id != *event.run_id) {
            self.runs
                .push(RunFacts::new(event.run_id.to_string(), event.ts));
        }
        let Some(run) = self.runs.last_mut() else {
            return;
        };
        let needs_state = matches!(
            event.kind,
            EventKind::RunStarted { .. }
                | EventKind::ModelRequested { .. }
                | EventKind::ModelResponded { .. }
                | EventKind::ModelFailed { .. }
        );
        if !needs_state {
            fold_plain(run, event);
            return;
        }
        if !self.state.contains_key(&*event.run_id) {
            self.state
                .insert(event.run_id.to_string(), RunFoldState::default());
        }
        let Some(state) = self.state.get_mut(&*event.run_id) else {
            return;
        };
        match &event.kind {
            EventKind::RunStarted { model, .. } => state.model.clone_from(model),
            EventKind::ModelRequested {
                turn,
                model,
                context_window,
                ..
            } => {
                state
                    .requested
                    .insert(*turn, (model.clone(), *context_window));
            }
            EventKind::ModelResponded {
                turn,
                usage,
                latency_ms,
                cost_usd,
                ..
            } => {
                let (model, window) = state
                    .requested
                    .get(turn)
                    .cloned()
                    .unwrap_or_else(|| (state.model.clone(), None));
                run.answers.push(ModelAnswer {
                    model,
                    latency_ms: *latency_ms,
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    cost_usd: *cost_usd,
                    context_window: window,
                });
            }
            EventKind::ModelFailed { turn, error } => {
                let model = state
                    .requested
                    .get(turn)
                    .map(|r| r.0.clone())
                    .unwrap_or_else(|| state.model.clone());
                *run.model_failures.entry(model).or_default() += 1;
                let kind = serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                *run.model_errors.entry(kind).or_default() += 1;
            }
            _ => {}
        }
    }
}

/// The events that need no fold state.
fn fold_plain(run: &mut RunFacts, event: &Event) {
    match &event.kind {
        EventKind::ToolCallFinished { result } => {
            let o = &result.outcome;
            let code = o.error_code();
            let ok = code.is_none();
            let tool = run.tools.entry(result.name.clone()).or_default();
            tool.calls += 1;
            tool.retries += u64::from(o.attempts.saturating_sub(1));
            tool.latencies_ms.push(o.latency_ms);
            if let Some(c) = code {
                tool.errors += 1;
                *run.tool_errors.entry(c.as_str().to_string()).or_default() += 1;
            }
            if run.repair_pending.remove(&result.name) {
                run.repair_attempts += 1;
                if ok {
                    run.repairs_succeeded += 1;
                }
            } else if !run.first_calls.contains_key(&result.name) {
                run.first_calls.insert(result.name.clone(), ok);
            }
            if matches!(
                code,
                Some(ToolErrorCode::InvalidInput | ToolErrorCode::OutputSchemaMismatch)
            ) {
                run.repair_pending.insert(result.name.clone());
            }
        }
        EventKind::Retry { scope, .. } => *run.retry_events.entry(scope.clone()).or_default() += 1,
        EventKind::RunEnded { end_state, .. } => {
            run.end_state = Some(end_state.as_str().to_string());
        }
        _ => {}
    }
}

/// Which threads' facts [`EventStore::run_facts`] returns: the filters of the dashboard
/// (and of `keel stats`), with the meaning of [`ThreadFilter`]'s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FactsQuery {
    /// Only threads whose id starts with this (a tenant's namespace).
    pub thread_prefix: Option<String>,
    /// Only threads whose latest run used this agent (exact name).
    pub agent: Option<String>,
    /// Only threads active at or after this time (last event at or after it).
    pub active_since: Option<DateTime<Utc>>,
}

/// One thread's metrics facts.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadFacts {
    /// Thread id.
    pub thread_id: String,
    /// Its segments, in log order.
    pub runs: Vec<RunFacts>,
}

/// The answer of [`EventStore::run_facts`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FactsPage {
    /// The threads, in [`EventStore::list_threads`]' order (most recently updated first).
    pub threads: Vec<ThreadFacts>,
    /// Threads (within the prefix) the store has not indexed yet, left out (see
    /// [`crate::runs::RunPage::unindexed`]). 0 when every thread is in.
    pub unindexed: u64,
}

/// [`EventStore::run_facts`] for a store without an index: folds the log of every thread
/// [`EventStore::list_threads`] lets through.
pub async fn run_facts_by_folding<S: EventStore + ?Sized>(
    store: &S,
    query: &FactsQuery,
) -> Result<FactsPage, StoreError> {
    let threads = store
        .list_threads(&ThreadFilter {
            agent: query.agent.clone(),
            updated_since: query.active_since,
            status: None,
            limit: None,
            id_prefix: None,
        })
        .await?;
    let mut out = Vec::new();
    for thread in threads {
        if query
            .thread_prefix
            .as_deref()
            .is_some_and(|p| !thread.thread_id.starts_with(p))
        {
            continue;
        }
        let events = store.load(&thread.thread_id).await?;
        out.push(ThreadFacts {
            thread_id: thread.thread_id,
            runs: ThreadMetrics::from_events(&events).runs,
        });
    }
    Ok(FactsPage {
        threads: out,
        unindexed: 0,
    })
}
