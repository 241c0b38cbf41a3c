//! Run metrics as pure functions over stored events (seed 000 §8, seed 004 §6): turn
//! survival, step and repair success, retries, tool latency percentiles, the error
//! taxonomy, tokens and cost per model, end states and context-window utilization; with a
//! Prometheus text rendering and a human summary for `keel stats`.
//!
//! Definitions (all per run, runs told apart by `run_id`):
//! - *survival after k tool calls*: the share of runs that did not end in a state other
//!   than `done` before finishing k tool calls (a run still going has not failed);
//! - *step success rate*: successful tool calls / tool calls;
//! - *repair*: a tool call failing with `invalid_input` or `output_schema_mismatch` that is
//!   followed, in the same run, by another call of the same tool; it succeeds when that
//!   next call succeeds;
//! - *mean retries*: Σ (attempts − 1) / tool calls;
//! - *p50/p95*: nearest-rank percentiles of `latency_ms`;
//! - *context utilization*: a model call's input tokens / the model's context window (from
//!   the `model_requested` event, else [`MetricsOptions::context_windows`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use keel_core::Event;
use keel_core::run_metrics::{RunFacts, ThreadMetrics};
use serde::Serialize;

/// Options of [`compute_metrics`].
#[derive(Debug, Clone, Serialize)]
pub struct MetricsOptions {
    /// Tool-call counts of the survival curve.
    pub survival_points: Vec<u32>,
    /// Context window by model id (`provider:model`) or bare model name.
    pub context_windows: BTreeMap<String, u64>,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        Self {
            survival_points: vec![2, 4, 8, 16],
            context_windows: BTreeMap::new(),
        }
    }
}

/// One point of the survival curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SurvivalPoint {
    /// Tool calls.
    pub tool_calls: u32,
    /// Runs that made at least this many tool calls.
    pub reached: u64,
    /// Runs that had not failed before this many tool calls.
    pub alive: u64,
    /// `alive / runs`.
    pub rate: f64,
}

/// Per-tool figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ToolStats {
    /// Calls.
    pub calls: u64,
    /// Failed calls.
    pub errors: u64,
    /// Median latency (nearest rank), ms.
    pub p50_ms: u64,
    /// 95th percentile latency (nearest rank), ms.
    pub p95_ms: u64,
    /// Σ (attempts − 1).
    pub retries: u64,
}

/// Per-model figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelStats {
    /// Successful calls.
    pub calls: u64,
    /// Failed calls.
    pub failures: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cost in US dollars (calls without a known cost count 0).
    pub cost_usd: f64,
    /// Median call latency, ms.
    pub p50_ms: u64,
    /// 95th percentile call latency, ms.
    pub p95_ms: u64,
    /// Mean input tokens / context window over calls with a known window.
    pub context_utilization_mean: Option<f64>,
    /// Largest utilization seen.
    pub context_utilization_max: Option<f64>,
}

/// Everything `keel stats` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricsReport {
    /// Runs seen.
    pub runs: u64,
    /// Runs by end state (`incomplete` for runs without `run_ended`).
    pub end_states: BTreeMap<String, u64>,
    /// Survival curve.
    pub survival: Vec<SurvivalPoint>,
    /// Tool calls.
    pub tool_calls: u64,
    /// Successful tool calls.
    pub tool_calls_ok: u64,
    /// `tool_calls_ok / tool_calls`.
    pub step_success_rate: Option<f64>,
    /// Repairs attempted.
    pub repair_attempts: u64,
    /// Repairs that worked.
    pub repairs_succeeded: u64,
    /// `repairs_succeeded / repair_attempts`.
    pub repair_success_rate: Option<f64>,
    /// Σ (attempts − 1) over tool calls.
    pub tool_retries: u64,
    /// `tool_retries / tool_calls`.
    pub mean_retries: Option<f64>,
    /// `retry` events by scope (`model`, `tool`).
    pub retry_events: BTreeMap<String, u64>,
    /// Tool errors by taxonomy code.
    pub tool_errors: BTreeMap<String, u64>,
    /// Model failures by error kind.
    pub model_errors: BTreeMap<String, u64>,
    /// Per tool.
    pub tools: BTreeMap<String, ToolStats>,
    /// Per model.
    pub models: BTreeMap<String, ModelStats>,
}

/// Nearest-rank percentile of sorted values (`p` in 0..=100); 0 for no values.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted.get(index).copied().unwrap_or(0)
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// A run's figures joined over its segments.
#[derive(Default)]
struct RunAcc {
    end_state: Option<String>,
    tool_calls: u64,
    // Tools whose last call so far failed repairably.
    repair_pending: BTreeSet<String>,
}

/// Computes the metrics of every run in `events` (any order of runs; each run's events
/// in log order): [`ThreadMetrics`]' fold, then [`metrics_from_facts`].
pub fn compute_metrics<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    options: &MetricsOptions,
) -> MetricsReport {
    let facts = ThreadMetrics::from_events(events);
    metrics_from_facts(&facts.runs, options)
}

/// Combines the facts of log segments ([`RunFacts`], see [`keel_core::run_metrics`]) into
/// the report, segments in the order their events would be read: the same report as
/// [`compute_metrics`] over those events. Segments of one run (same `run_id`, e.g. a
/// forked thread's copy of its parent's run) are joined: tool calls add up, the last end
/// state wins, a repair pending at the end of one completes with the next call of that
/// tool in the next.
pub fn metrics_from_facts<'a>(
    segments: impl IntoIterator<Item = &'a RunFacts>,
    options: &MetricsOptions,
) -> MetricsReport {
    let mut order: Vec<&str> = Vec::new();
    let mut runs: HashMap<&str, RunAcc> = HashMap::new();
    let mut report = MetricsReport::default();
    let mut tool_latency: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut model_latency: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut utilization: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for seg in segments {
        let run = match runs.entry(seg.run_id.as_str()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                order.push(seg.run_id.as_str());
                e.insert(RunAcc::default())
            }
        };
        if seg.end_state.is_some() {
            run.end_state.clone_from(&seg.end_state);
        }
        for (tool, ok) in &seg.first_calls {
            if run.repair_pending.remove(tool) {
                report.repair_attempts += 1;
                if *ok {
                    report.repairs_succeeded += 1;
                }
            }
        }
        // A tool called in this segment and not pending at its end is no longer pending.
        run.repair_pending
            .retain(|tool| !seg.tools.contains_key(tool));
        run.repair_pending
            .extend(seg.repair_pending.iter().cloned());
        report.repair_attempts += seg.repair_attempts;
        report.repairs_succeeded += seg.repairs_succeeded;
        for answer in &seg.answers {
            let model = answer.model.as_str();
            let bare = crate::spans::split_model(model).1;
            let window = answer
                .context_window
                .or_else(|| options.context_windows.get(model).copied())
                .or_else(|| options.context_windows.get(bare).copied());
            let m = report.models.entry(answer.model.clone()).or_default();
            m.calls += 1;
            m.input_tokens = m.input_tokens.saturating_add(answer.input_tokens);
            m.output_tokens = m.output_tokens.saturating_add(answer.output_tokens);
            m.cost_usd += answer.cost_usd.unwrap_or(0.0);
            model_latency
                .entry(model)
                .or_default()
                .push(answer.latency_ms);
            if let Some(w) = window.filter(|w| *w > 0) {
                utilization
                    .entry(model)
                    .or_default()
                    .push(answer.input_tokens as f64 / w as f64);
            }
        }
        for (model, n) in &seg.model_failures {
            report.models.entry(model.clone()).or_default().failures += n;
        }
        for (kind, n) in &seg.model_errors {
            *report.model_errors.entry(kind.clone()).or_default() += n;
        }
        for (name, facts) in &seg.tools {
            run.tool_calls += facts.calls;
            report.tool_calls += facts.calls;
            report.tool_calls_ok += facts.calls - facts.errors;
            report.tool_retries += facts.retries;
            let t = report.tools.entry(name.clone()).or_default();
            t.calls += facts.calls;
            t.errors += facts.errors;
            t.retries += facts.retries;
            tool_latency
                .entry(name.as_str())
                .or_default()
                .extend_from_slice(&facts.latencies_ms);
        }
        for (code, n) in &seg.tool_errors {
            *report.tool_errors.entry(code.clone()).or_default() += n;
        }
        for (scope, n) in &seg.retry_events {
            *report.retry_events.entry(scope.clone()).or_default() += n;
        }
    }
    report.runs = order.len() as u64;
    for id in &order {
        let Some(run) = runs.get(id) else { continue };
        let state = run.end_state.clone().unwrap_or_else(|| "incomplete".into());
        *report.end_states.entry(state).or_default() += 1;
    }
    for &k in &options.survival_points {
        let mut reached = 0;
        let mut alive = 0;
        for id in &order {
            let Some(run) = runs.get(id) else { continue };
            if run.tool_calls >= u64::from(k) {
                reached += 1;
            }
            let failed = run.end_state.as_deref().is_some_and(|s| s != "done");
            if !(failed && run.tool_calls < u64::from(k)) {
                alive += 1;
            }
        }
        report.survival.push(SurvivalPoint {
            tool_calls: k,
            reached,
            alive,
            rate: ratio(alive, report.runs).unwrap_or(0.0),
        });
    }
    report.step_success_rate = ratio(report.tool_calls_ok, report.tool_calls);
    report.repair_success_rate = ratio(report.repairs_succeeded, report.repair_attempts);
    report.mean_retries = ratio(report.tool_retries, report.tool_calls);
    for (name, mut lat) in tool_latency {
        lat.sort_unstable();
        if let Some(t) = report.tools.get_mut(name) {
            t.p50_ms = percentile(&lat, 50.0);
            t.p95_ms = percentile(&lat, 95.0);
        }
    }
    for (name, mut lat) in model_latency {
        lat.sort_unstable();
        if let Some(m) = report.models.get_mut(name) {
            m.p50_ms = percentile(&lat, 50.0);
            m.p95_ms = percentile(&lat, 95.0);
        }
    }
    for (name, u) in utilization {
        if let Some(m) = report.models.get_mut(name)
            && !u.is_empty()
        {
            m.context_utilization_mean = Some(u.iter().sum::<f64>() / u.len() as f64);
            m.context_utilization_max = u.iter().copied().reduce(f64::max);
        }
    }
    report
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Prometheus text exposition format (version 0.0.4).
pub fn render_prometheus(r: &MetricsReport) -> String {
    let mut o = String::new();
    header(&mut o, "keel_runs_total", "counter", "Runs by end state.");
    for (state, n) in &r.end_states {
        let _ = writeln!(o, "keel_runs_total{{end_state=\"{}\"}} {n}", label(state));
    }
    header(
        &mut o,
        "keel_turn_survival_ratio",
        "gauge",
        "Share of runs not failed before N tool calls.",
    );
    for p in &r.survival {
        let _ = writeln!(
            o,
            "keel_turn_survival_ratio{{tool_calls=\"{}\"}} {}",
            p.tool_calls, p.rate
        );
    }
    header(
        &mut o,
        "keel_tool_calls_total",
        "counter",
        "Tool calls by tool and outcome.",
    );
    for (tool, t) in &r.tools {
        let _ = writeln!(
            o,
            "keel_tool_calls_total{{tool=\"{}\",outcome=\"ok\"}} {}",
            label(tool),
            t.calls - t.errors
        );
        let _ = writeln!(
            o,
            "keel_tool_calls_total{{tool=\"{}\",outcome=\"error\"}} {}",
            label(tool),
            t.errors
        );
    }
    header(
        &mut o,
        "keel_tool_latency_ms",
        "summary",
        "Tool call latency in milliseconds (nearest-rank quantiles).",
    );
    for (tool, t) in &r.tools {
        let _ = writeln!(
            o,
            "keel_tool_latency_ms{{tool=\"{}\",quantile=\"0.5\"}} {}",
            label(tool),
            t.p50_ms
        );
        let _ = writeln!(
            o,
            "keel_tool_latency_ms{{tool=\"{}\",quantile=\"0.95\"}} {}",
            label(tool),
            t.p95_ms
        );
        let _ = writeln!(
            o,
            "keel_tool_latency_ms_count{{tool=\"{}\"}} {}",
            label(tool),
            t.calls
        );
    }
    header(
        &mut o,
        "keel_tool_errors_total",
        "counter",
        "Tool errors by taxonomy code.",
    );
    for (code, n) in &r.tool_errors {
        let _ = writeln!(o, "keel_tool_errors_total{{code=\"{}\"}} {n}", label(code));
    }
    header(
        &mut o,
        "keel_model_errors_total",
        "counter",
        "Model failures by error kind.",
    );
    for (kind, n) in &r.model_errors {
        let _ = writeln!(o, "keel_model_errors_total{{kind=\"{}\"}} {n}", label(kind));
    }
    header(
        &mut o,
        "keel_step_success_ratio",
        "gauge",
        "Successful tool calls / tool calls.",
    );
    let _ = writeln!(
        o,
        "keel_step_success_ratio {}",
        r.step_success_rate.unwrap_or(0.0)
    );
    header(
        &mut o,
        "keel_repair_success_ratio",
        "gauge",
        "Repairs that worked / repairs attempted.",
    );
    let _ = writeln!(
        o,
        "keel_repair_success_ratio {}",
        r.repair_success_rate.unwrap_or(0.0)
    );
    header(
        &mut o,
        "keel_tool_retries_mean",
        "gauge",
        "Mean retries per tool call.",
    );
    let _ = writeln!(
        o,
        "keel_tool_retries_mean {}",
        r.mean_retries.unwrap_or(0.0)
    );
    header(
        &mut o,
        "keel_retries_total",
        "counter",
        "Retry events by scope.",
    );
    for (scope, n) in &r.retry_events {
        let _ = writeln!(o, "keel_retries_total{{scope=\"{}\"}} {n}", label(scope));
    }
    header(
        &mut o,
        "keel_model_tokens_total",
        "counter",
        "Tokens by model and type.",
    );
    for (model, m) in &r.models {
        let _ = writeln!(
            o,
            "keel_model_tokens_total{{model=\"{}\",type=\"input\"}} {}",
            label(model),
            m.input_tokens
        );
        let _ = writeln!(
            o,
            "keel_model_tokens_total{{model=\"{}\",type=\"output\"}} {}",
            label(model),
            m.output_tokens
        );
    }
    header(
        &mut o,
        "keel_model_cost_usd_total",
        "counter",
        "Known cost in US dollars by model.",
    );
    for (model, m) in &r.models {
        let _ = writeln!(
            o,
            "keel_model_cost_usd_total{{model=\"{}\"}} {}",
            label(model),
            m.cost_usd
        );
    }
    header(
        &mut o,
        "keel_context_window_utilization_ratio",
        "gauge",
        "Input tokens / context window by model.",
    );
    for (model, m) in &r.models {
        if let (Some(mean), Some(max)) = (m.context_utilization_mean, m.context_utilization_max) {
            let _ = writeln!(
                o,
                "keel_context_window_utilization_ratio{{model=\"{}\",stat=\"mean\"}} {mean}",
                label(model)
            );
            let _ = writeln!(
                o,
                "keel_context_window_utilization_ratio{{model=\"{}\",stat=\"max\"}} {max}",
                label(model)
            );
        }
    }
    o
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.1}%", x * 100.0))
        .unwrap_or_else(|| "n/a".into())
}

/// A human summary for `keel stats`.
pub fn render_summary(r: &MetricsReport) -> String {
    let mut o = String::new();
    let states: Vec<String> = r
        .end_states
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(o, "runs: {}  ({})", r.runs, states.join(", "));
    let curve: Vec<String> = r
        .survival
        .iter()
        .map(|p| format!("{}: {:.1}%", p.tool_calls, p.rate * 100.0))
        .collect();
    let _ = writeln!(o, "survival after N tool calls: {}", curve.join("  "));
    let _ = writeln!(
        o,
        "tool calls: {}  step success: {}  repairs: {}/{} ({})  mean retries: {}",
        r.tool_calls,
        pct(r.step_success_rate),
        r.repairs_succeeded,
        r.repair_attempts,
        pct(r.repair_success_rate),
        r.mean_retries
            .map(|m| format!("{m:.3}"))
            .unwrap_or_else(|| "n/a".into())
    );
    if !r.tool_errors.is_empty() {
        let errs: Vec<String> = r
            .tool_errors
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(o, "tool errors: {}", errs.join(", "));
    }
    if !r.model_errors.is_empty() {
        let errs: Vec<String> = r
            .model_errors
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(o, "model errors: {}", errs.join(", "));
    }
    if !r.tools.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<24} {:>7} {:>7} {:>9} {:>9}",
            "tool", "calls", "errors", "p50 ms", "p95 ms"
        );
        for (name, t) in &r.tools {
            let _ = writeln!(
                o,
                "{:<24} {:>7} {:>7} {:>9} {:>9}",
                name, t.calls, t.errors, t.p50_ms, t.p95_ms
            );
        }
    }
    if !r.models.is_empty() {
        let _ = writeln!(
            o,
            "\n{:<32} {:>6} {:>10} {:>10} {:>10} {:>8}",
            "model", "calls", "input", "output", "cost $", "ctx max"
        );
        for (name, m) in &r.models {
            let _ = writeln!(
                o,
                "{:<32} {:>6} {:>10} {:>10} {:>10.4} {:>8}",
                name,
                m.calls,
                m.input_tokens,
                m.output_tokens,
                m.cost_usd,
                pct(m.context_utilization_max)
            );
        }
    }
    o
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use keel_core::event::ModelFailure;
    use keel_core::model::ModelErrorKind;
    use keel_core::run_metrics::ThreadMetrics;
    use keel_core::{
        Budget, EndState, Event, EventKind, ToolErrorCode, ToolOutcome, ToolResult, ToolResultKind,
    };

    use super::*;

    #[derive(Default)]
    struct RunAcc {
        model: String,
        end_state: Option<String>,
        tool_calls: u32,
        // (tool name, ok, code)
        calls: Vec<(String, bool, Option<ToolErrorCode>)>,
        // turn -> (model id, context window)
        requested: HashMap<u32, (String, Option<u64>)>,
    }

    /// `compute_metrics` as it was before the facts: one pass over the events.
    fn reference<'a>(
        events: impl IntoIterator<Item = &'a Event>,
        options: &MetricsOptions,
    ) -> MetricsReport {
        let mut order: Vec<String> = Vec::new();
        let mut runs: HashMap<String, RunAcc> = HashMap::new();
        let mut report = MetricsReport::default();
        let mut tool_latency: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut model_latency: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut utilization: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for e in events {
            if !runs.contains_key(&*e.run_id) {
                order.push(e.run_id.to_string());
            }
            let run = runs.entry(e.run_id.to_string()).or_default();
            match &e.kind {
                EventKind::RunStarted { model, .. } => run.model = model.clone(),
                EventKind::ModelRequested {
                    turn,
                    model,
                    context_window,
                    ..
                } => {
                    run.requested
                        .insert(*turn, (model.clone(), *context_window));
                }
                EventKind::ModelResponded {
                    turn,
                    usage,
                    latency_ms,
                    cost_usd,
                    ..
                } => {
                    let (model, window) = run
                        .requested
                        .get(turn)
                        .cloned()
                        .unwrap_or_else(|| (run.model.clone(), None));
                    let bare = crate::spans::split_model(&model).1.to_string();
                    let window = window
                        .or_else(|| options.context_windows.get(&model).copied())
                        .or_else(|| options.context_windows.get(&bare).copied());
                    let m = report.models.entry(model.clone()).or_default();
                    m.calls += 1;
                    m.input_tokens = m.input_tokens.saturating_add(usage.input_tokens);
                    m.output_tokens = m.output_tokens.saturating_add(usage.output_tokens);
                    m.cost_usd += cost_usd.unwrap_or(0.0);
                    model_latency
                        .entry(model.clone())
                        .or_default()
                        .push(*latency_ms);
                    if let Some(w) = window.filter(|w| *w > 0) {
                        utilization
                            .entry(model)
                            .or_default()
                            .push(usage.input_tokens as f64 / w as f64);
                    }
                }
                EventKind::ModelFailed { turn, error } => {
                    let model = run
                        .requested
                        .get(turn)
                        .map(|r| r.0.clone())
                        .unwrap_or_else(|| run.model.clone());
                    report.models.entry(model).or_default().failures += 1;
                    let kind = serde_json::to_value(error.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    *report.model_errors.entry(kind).or_default() += 1;
                }
                EventKind::ToolCallFinished { result } => {
                    let o = &result.outcome;
                    run.tool_calls = run.tool_calls.saturating_add(1);
                    report.tool_calls += 1;
                    let code = o.error_code();
                    let retries = u64::from(o.attempts.saturating_sub(1));
                    report.tool_retries += retries;
                    let t = report.tools.entry(result.name.clone()).or_default();
                    t.calls += 1;
                    t.retries += retries;
                    match code {
                        None => report.tool_calls_ok += 1,
                        Some(c) => {
                            t.errors += 1;
                            *report
                                .tool_errors
                                .entry(c.as_str().to_string())
                                .or_default() += 1;
                        }
                    }
                    tool_latency
                        .entry(result.name.clone())
                        .or_default()
                        .push(o.latency_ms);
                    run.calls.push((result.name.clone(), code.is_none(), code));
                }
                EventKind::Retry { scope, .. } => {
                    *report.retry_events.entry(scope.clone()).or_default() += 1
                }
                EventKind::RunEnded { end_state, .. } => {
                    run.end_state = Some(end_state.as_str().to_string())
                }
                _ => {}
            }
        }
        report.runs = order.len() as u64;
        for id in &order {
            let Some(run) = runs.get(id) else { continue };
            let state = run.end_state.clone().unwrap_or_else(|| "incomplete".into());
            *report.end_states.entry(state).or_default() += 1;
            for (i, (name, _, code)) in run.calls.iter().enumerate() {
                if matches!(
                    code,
                    Some(ToolErrorCode::InvalidInput | ToolErrorCode::OutputSchemaMismatch)
                ) {
                    let next = run
                        .calls
                        .iter()
                        .skip(i.saturating_add(1))
                        .find(|(n, _, _)| n == name);
                    if let Some((_, ok, _)) = next {
                        report.repair_attempts += 1;
                        if *ok {
                            report.repairs_succeeded += 1;
                        }
                    }
                }
            }
        }
        for &k in &options.survival_points {
            let mut reached = 0;
            let mut alive = 0;
            for id in &order {
                let Some(run) = runs.get(id) else { continue };
                if run.tool_calls >= k {
                    reached += 1;
                }
                let failed = run.end_state.as_deref().is_some_and(|s| s != "done");
                if !(failed && run.tool_calls < k) {
                    alive += 1;
                }
            }
            report.survival.push(SurvivalPoint {
                tool_calls: k,
                reached,
                alive,
                rate: ratio(alive, report.runs).unwrap_or(0.0),
            });
        }
        report.step_success_rate = ratio(report.tool_calls_ok, report.tool_calls);
        report.repair_success_rate = ratio(report.repairs_succeeded, report.repair_attempts);
        report.mean_retries = ratio(report.tool_retries, report.tool_calls);
        for (name, mut lat) in tool_latency {
            lat.sort_unstable();
            if let Some(t) = report.tools.get_mut(&name) {
                t.p50_ms = percentile(&lat, 50.0);
                t.p95_ms = percentile(&lat, 95.0);
            }
        }
        for (name, mut lat) in model_latency {
            lat.sort_unstable();
            if let Some(m) = report.models.get_mut(&name) {
                m.p50_ms = percentile(&lat, 50.0);
                m.p95_ms = percentile(&lat, 95.0);
            }
        }
        for (name, u) in utilization {
            if let Some(m) = report.models.get_mut(&name)
                && !u.is_empty()
            {
                m.context_utilization_mean = Some(u.iter().sum::<f64>() / u.len() as f64);
                m.context_utilization_max = u.iter().copied().reduce(f64::max);
            }
        }
        report
    }

    /// xorshift64*: the same cases every run.
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

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len() as u64) as usize]
        }
    }

    const MODELS: &[&str] = &["openai:gpt-4o", "anthropic:claude", "local:qwen", "gpt-4o"];
    const TOOLS: &[&str] = &["search", "fetch", "write"];

    fn event(thread: &str, run: &str, seq: u64, ms: i64, kind: EventKind) -> Event {
        Event {
            v: keel_core::EVENT_SCHEMA_VERSION,
            seq,
            ts: chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap(),
            thread_id: thread.into(),
            run_id: run.into(),
            trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
            span_id: "b7ad6b7169203331".into(),
            kind,
        }
    }

    fn tool_finished(rng: &mut Rng, run: &str) -> EventKind {
        let name = rng.pick(TOOLS);
        let code = match rng.below(6) {
            0 => Some(ToolErrorCode::InvalidInput),
            1 => Some(ToolErrorCode::OutputSchemaMismatch),
            2 => Some(ToolErrorCode::Timeout),
            _ => None,
        };
        EventKind::ToolCallFinished {
            result: std::sync::Arc::new(ToolResult {
                call_id: format!("call_{}", rng.below(1000)),
                name: name.into(),
                outcome: ToolOutcome {
                    tool: name.into(),
                    call_id: "c".into(),
                    thread_id: "t".into(),
                    run_id: run.into(),
                    attempts: 1 + rng.below(3) as u32,
                    latency_ms: rng.below(5000),
                    repairs: Vec::new(),
                    result: match code {
                        None => ToolResultKind::Ok {
                            data: serde_json::Value::Null,
                            schema_validated: true,
                            truncated: false,
                        },
                        Some(code) => ToolResultKind::Error {
                            code,
                            message: "failed".into(),
                            details: None,
                        },
                    },
                },
                content: String::new(),
            }),
        }
    }

    /// A run's events in one thread: starts with `run_started`; an answer or failure is to
    /// a turn requested before in the same run of the same thread, or to a turn no one
    /// requests (900+).
    fn run_events(rng: &mut Rng, run: &str) -> Vec<EventKind> {
        let mut out = vec![EventKind::RunStarted {
            agent: "a".into(),
            model: rng.pick(MODELS).into(),
            goal: "g".into(),
            constraints: Vec::new(),
            budget: Budget::unlimited(),
            definition: None,
            parent_span_id: None,
        }];
        let mut requested: Vec<u32> = Vec::new();
        for _ in 0..rng.below(14) {
            let kind = match rng.below(9) {
                0 | 1 => {
                    let turn = 1 + rng.below(5) as u32;
                    requested.push(turn);
                    let window =
                        [None, Some(0u64), Some(8192u64), Some(128_000u64)][rng.below(4) as usize];
                    serde_json::from_value(serde_json::json!({
                        "type": "model_requested", "turn": turn, "model": rng.pick(MODELS),
                        "message_count": 2, "tool_count": 1, "estimated_input_tokens": 10,
                        "context_window": window,
                    }))
                    .unwrap()
                }
                2 | 3 => {
                    let turn = if requested.is_empty() || rng.below(4) == 0 {
                        900 + rng.below(3) as u32
                    } else {
                        requested[rng.below(requested.len() as u64) as usize]
                    };
                    // Awkward costs: sums of these round differently in another order.
                    let cost = [None, Some(0.1), Some(1e-7), Some(0.3), Some(12_345.678_9)]
                        [rng.below(5) as usize];
                    serde_json::from_value(serde_json::json!({
                        "type": "model_responded", "turn": turn,
                        "message": keel_core::Message::assistant("x"),
                        "usage": keel_core::Usage { input_tokens: rng.below(100_000), output_tokens: rng.below(900), cache_read_tokens: 0, cache_write_tokens: 0 },
                        "latency_ms": rng.below(9000), "stop_reason": keel_core::model::StopReason::EndTurn,
                        "cost_usd": cost,
                    }))
                    .unwrap()
                }
                4 => EventKind::ModelFailed {
                    turn: if requested.is_empty() {
                        901
                    } else {
                        requested[0]
                    },
                    error: ModelFailure {
                        kind: [ModelErrorKind::RateLimited, ModelErrorKind::Server]
                            [rng.below(2) as usize],
                        message: "m".into(),
                        status: None,
                    },
                },
                5 => EventKind::Retry {
                    scope: rng.pick(&["model", "tool"]).into(),
                    attempt: 1,
                    class: "c".into(),
                    wait_ms: 0,
                    call_id: None,
                },
                6 => EventKind::Notice {
                    code: "n".into(),
                    message: "m".into(),
                    data: None,
                },
                _ => tool_finished(rng, run),
            };
            out.push(kind);
        }
        if rng.below(5) > 0 {
            let state = [
                EndState::Done,
                EndState::Done,
                EndState::Failed,
                EndState::BudgetExceeded,
            ][rng.below(4) as usize];
            out.push(EventKind::RunEnded {
                end_state: state,
                reason: None,
                final_text: None,
            });
        }
        out
    }

    /// Threads of 1–3 runs; run ids are drawn from a small pool, so some runs span
    /// threads (as a fork's copy of its parent's run does).
    fn threads(rng: &mut Rng) -> Vec<Vec<Event>> {
        let mut out = Vec::new();
        for t in 0..1 + rng.below(6) {
            let thread = format!("thr_{t}");
            let mut log = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let run = format!("run_{}", rng.below(8));
                for kind in run_events(rng, &run) {
                    let seq = log.len() as u64;
                    log.push(event(
                        &thread,
                        &run,
                        seq,
                        rng.below(100_000_000) as i64,
                        kind,
                    ));
                }
            }
            out.push(log);
        }
        out
    }

    fn options(rng: &mut Rng) -> MetricsOptions {
        let mut options = MetricsOptions::default();
        if rng.below(2) == 0 {
            options.context_windows = BTreeMap::from([
                ("local:qwen".to_string(), 32_768),
                ("gpt-4o".to_string(), 128_000),
            ]);
        }
        options
    }

    #[test]
    fn the_facts_give_the_report_of_one_pass_over_the_events() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..400 {
            let threads = threads(&mut rng);
            let options = options(&mut rng);
            let all: Vec<Event> = threads.iter().flatten().cloned().collect();
            let expected = reference(&all, &options);
            assert_eq!(compute_metrics(&all, &options), expected, "case {case}");

            // Per thread, folded in two steps with the state stored (JSON) in between, as
            // an index catching up does; then combined in thread order.
            let mut segments = Vec::new();
            for log in &threads {
                let cut = rng.below(log.len() as u64 + 1) as usize;
                let first = ThreadMetrics::from_events(&log[..cut]);
                let stored = serde_json::to_string(&first).unwrap();
                let mut facts: ThreadMetrics = serde_json::from_str(&stored).unwrap();
                assert_eq!(facts, first, "case {case}: the facts round-trip");
                for e in &log[cut..] {
                    facts.fold(e);
                }
                assert_eq!(facts, ThreadMetrics::from_events(log), "case {case}");
                segments.extend(facts.runs);
            }
            assert_eq!(
                metrics_from_facts(&segments, &options),
                expected,
                "case {case}"
            );
        }
    }

    /// A repair pending at the end of one segment of a run completes in the next segment
    /// of that run, even in another thread.
    #[test]
    fn a_repair_spans_segments_of_one_run() {
        let finished = |ok: bool| {
            let mut rng = Rng(1);
            let mut kind = tool_finished(&mut rng, "r");
            if let EventKind::ToolCallFinished { result } = &mut kind {
                let result = std::sync::Arc::make_mut(result);
                result.name = "fetch".into();
                result.outcome.result = if ok {
                    ToolResultKind::Ok {
                        data: serde_json::Value::Null,
                        schema_validated: true,
                        truncated: false,
                    }
                } else {
                    ToolResultKind::Error {
                        code: ToolErrorCode::InvalidInput,
                        message: "bad".into(),
                        details: None,
                    }
                };
            }
            kind
        };
        let a = vec![event("a", "r", 0, 0, finished(false))];
        let b = vec![event("b", "r", 0, 1, finished(true))];
        let all: Vec<Event> = a.iter().chain(&b).cloned().collect();
        let options = MetricsOptions::default();
        let expected = reference(&all, &options);
        assert_eq!(expected.repair_attempts, 1);
        assert_eq!(expected.repairs_succeeded, 1);
        let mut segments = ThreadMetrics::from_events(&a).runs;
        segments.extend(ThreadMetrics::from_events(&b).runs);
        assert_eq!(metrics_from_facts(&segments, &options), expected);
    }
}
