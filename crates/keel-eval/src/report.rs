//! The evaluation report in seed 004's JSON shape: `summary` (`pass_rate`,
//! `total_scenarios`, `avg_scores` per dimension), `scenarios[]` (`id`, `status`, `scores`,
//! plus pass rate, 95% interval, pass@k, pass^k and every trial's detail) and
//! `regression_analysis` (filled by [`EvalReport::attach`] after a baseline comparison).
//! Beyond the seed's shape, `run` says who ran the suite, when, for how long and at what
//! cost, and each trial carries its end state, duration, tokens and cost
//! ([`TrialFacts`]); both are absent from reports saved before they were recorded.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use keel_core::Event;
use serde::{Deserialize, Serialize};

use crate::compare::{Change, Comparison};
use crate::score::{CheckOutcome, Dimension, TrialScore, TrialStatus};
use crate::stats::{Interval, is_flaky, pass_at_k, pass_pow_k, wilson};
use crate::suite::Suite;

/// How scenario results become statuses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReportOptions {
    /// A scenario passes when its trial pass rate is at least this.
    pub min_pass_rate: f64,
    /// The k of pass@k / pass^k (capped at each scenario's trial count).
    pub k: u32,
}

impl ReportOptions {
    /// The suite's settings.
    pub fn from_suite(suite: &Suite) -> Self {
        Self {
            min_pass_rate: suite.suite.min_pass_rate,
            k: suite.k(),
        }
    }
}

/// One trial's record, as the runner hands it over.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// The trial's thread.
    pub thread_id: String,
    /// Its trace id.
    pub trace_id: String,
    /// Its scores.
    pub score: TrialScore,
    /// How its run went (end state, duration, tokens, cost).
    pub facts: TrialFacts,
}

/// How one trial's run went, read from its thread's events (every field absent when the
/// thread has none, and in reports saved before they were recorded).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialFacts {
    /// Where the run stands: the end state (`done`, `failed`, …), `awaiting_approval`,
    /// `awaiting_user` or `incomplete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_state: Option<String>,
    /// From the thread's first event to its last, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Model calls made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u32>,
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Cost in US dollars, when some model call reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

impl TrialFacts {
    /// The facts of a trial whose thread holds `events` (folded into `trace`).
    pub fn from_events(events: &[Event], trace: &crate::trace::RunTrace) -> Self {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Self::default();
        };
        let duration = (last.ts - first.ts).num_milliseconds().max(0);
        Self {
            end_state: Some(trace.end.as_str().to_string()),
            duration_ms: u64::try_from(duration).ok(),
            model_calls: Some(trace.model_calls),
            tokens: Some(
                trace
                    .usage
                    .input_tokens
                    .saturating_add(trace.usage.output_tokens),
            ),
            cost_usd: trace.cost_usd,
        }
    }
}

/// Who ran a suite, when, for how long and at what cost (the report's `run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// The agent evaluated (its name).
    pub agent: String,
    /// The model it ran with (`provider:model`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Trials per scenario.
    pub trials: u32,
    /// When the first trial started.
    pub started_at: DateTime<Utc>,
    /// Wall time from the first trial's start to the last trial's score, in milliseconds.
    pub duration_ms: u64,
    /// Input plus output tokens over every trial.
    pub tokens: u64,
    /// Cost in US dollars over every trial, when some model call reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The baseline the run was compared with (`keel eval run --baseline`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineRef>,
}

/// The baseline a run was compared with, as it stood then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRef {
    /// Baseline name.
    pub name: String,
    /// The saved eval run it pointed to.
    pub run_id: i64,
    /// The regression threshold used.
    pub threshold: f64,
}

/// A scenario's trials.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioTrials {
    /// Scenario id.
    pub id: String,
    /// Its trials.
    pub trials: Vec<Trial>,
}

/// A scenario's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioStatus {
    /// The pass rate met `min_pass_rate`.
    Passed,
    /// No trial passed.
    Failed,
    /// Some but not enough trials passed.
    Flaky,
    /// A judge failed in some trial (the scenario does not count as passed).
    JudgeError,
}

/// The report's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Passed scenarios / scenarios (0 when there are none).
    pub pass_rate: f64,
    /// Scenarios.
    pub total_scenarios: usize,
    /// Passed scenarios.
    pub passed: usize,
    /// Failed scenarios.
    pub failed: usize,
    /// Flaky scenarios.
    pub flaky: usize,
    /// Scenarios with a judge error.
    pub judge_errors: usize,
    /// Per dimension: the mean of the scenarios' scores (scenarios without the dimension
    /// are left out).
    pub avg_scores: BTreeMap<Dimension, f64>,
}

/// A dimension within one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DimensionReport {
    /// Mean score over the trials that have it.
    pub score: f64,
    /// The 95% Wilson interval of the score, read as a proportion over those trials.
    pub ci95: Interval,
    /// Trials that have it.
    pub trials: u32,
}

/// One trial in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialReport {
    /// Its thread.
    pub thread_id: String,
    /// Its trace id.
    pub trace_id: String,
    /// Its status.
    pub status: TrialStatus,
    /// Per-dimension scores.
    pub scores: BTreeMap<Dimension, f64>,
    /// Every check with its reason.
    pub checks: Vec<CheckOutcome>,
    /// The judge's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_error: Option<String>,
    /// Why the run failed (setup, timeout, store error), when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How its run went.
    #[serde(flatten)]
    pub facts: TrialFacts,
}

/// One scenario in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioReport {
    /// Scenario id.
    pub id: String,
    /// Passed, failed, flaky or judge error.
    pub status: ScenarioStatus,
    /// Per-dimension mean scores.
    pub scores: BTreeMap<Dimension, f64>,
    /// Per-dimension detail (score, interval).
    pub dimensions: BTreeMap<Dimension, DimensionReport>,
    /// Passed trials / trials.
    pub pass_rate: f64,
    /// The 95% Wilson interval of `pass_rate`.
    pub ci95: Interval,
    /// Trials run.
    pub trials_run: u32,
    /// Trials passed.
    pub trials_passed: u32,
    /// Some but not all trials passed.
    pub flaky: bool,
    /// The k used below (the suite's k, capped at the trials run).
    pub k: u32,
    /// Probability that at least one of k trials passes (absent without trials).
    pub pass_at_k: Option<f64>,
    /// Probability that all k trials pass (absent without trials).
    pub pass_pow_k: Option<f64>,
    /// Every trial.
    pub trials: Vec<TrialReport>,
}

/// `regression_analysis`: the significant changes against a baseline (empty without one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegressionAnalysis {
    /// Drops beyond the threshold (see [`Change::significant`]).
    pub regressions: Vec<Change>,
    /// Rises beyond the threshold.
    pub improvements: Vec<Change>,
}

/// The report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// The suite's name.
    pub suite: String,
    /// Totals.
    pub summary: Summary,
    /// Per scenario, in suite order.
    pub scenarios: Vec<ScenarioReport>,
    /// Changes against a baseline.
    pub regression_analysis: RegressionAnalysis,
    /// Who ran it, when, for how long, at what cost (set by the runner; absent in
    /// reports built otherwise or saved before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunMeta>,
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn scenario_report(s: &ScenarioTrials, options: &ReportOptions) -> ScenarioReport {
    let n = s.trials.len() as u64;
    let c = s
        .trials
        .iter()
        .filter(|t| t.score.status == TrialStatus::Passed)
        .count() as u64;
    let pass_rate = if n == 0 { 0.0 } else { c as f64 / n as f64 };
    let judge_error = s
        .trials
        .iter()
        .any(|t| t.score.status == TrialStatus::JudgeError);
    let status = if judge_error {
        ScenarioStatus::JudgeError
    } else if n > 0 && pass_rate + 1e-9 >= options.min_pass_rate {
        ScenarioStatus::Passed
    } else if is_flaky(n, c) {
        ScenarioStatus::Flaky
    } else {
        ScenarioStatus::Failed
    };
    let mut dimensions = BTreeMap::new();
    for dimension in Dimension::ALL {
        let values: Vec<f64> = s
            .trials
            .iter()
            .filter_map(|t| t.score.score(dimension))
            .collect();
        if let Some(score) = mean(&values) {
            let trials = values.len() as u64;
            let successes = (score * trials as f64).round() as u64;
            dimensions.insert(
                dimension,
                DimensionReport {
                    score,
                    ci95: wilson(successes, trials),
                    trials: u32::try_from(trials).unwrap_or(u32::MAX),
                },
            );
        }
    }
    let k = u64::from(options.k.max(1)).min(n.max(1));
    ScenarioReport {
        id: s.id.clone(),
        status,
        scores: dimensions.iter().map(|(d, r)| (*d, r.score)).collect(),
        dimensions,
        pass_rate,
        ci95: wilson(c, n),
        trials_run: u32::try_from(n).unwrap_or(u32::MAX),
        trials_passed: u32::try_from(c).unwrap_or(u32::MAX),
        flaky: is_flaky(n, c),
        k: u32::try_from(k).unwrap_or(u32::MAX),
        pass_at_k: pass_at_k(n, c, k).ok(),
        pass_pow_k: pass_pow_k(n, c, k).ok(),
        trials: s
            .trials
            .iter()
            .map(|t| TrialReport {
                thread_id: t.thread_id.clone(),
                trace_id: t.trace_id.clone(),
                status: t.score.status,
                scores: t
                    .score
                    .dimensions
                    .iter()
                    .map(|(d, v)| (*d, v.score))
                    .collect(),
                checks: t.score.checks.clone(),
                judge_error: t.score.judge_error.clone(),
                error: t.score.error.clone(),
                facts: t.facts.clone(),
            })
            .collect(),
    }
}

impl EvalReport {
    /// Builds the report of suite `name` from each scenario's trials (in suite order).
    pub fn build(name: &str, options: &ReportOptions, scenarios: &[ScenarioTrials]) -> Self {
        let scenarios: Vec<ScenarioReport> = scenarios
            .iter()
            .map(|s| scenario_report(s, options))
            .collect();
        let count =
            |status: ScenarioStatus| scenarios.iter().filter(|s| s.status == status).count();
        let total = scenarios.len();
        let passed = count(ScenarioStatus::Passed);
        let avg_scores = Dimension::ALL
            .into_iter()
            .filter_map(|d| {
                let values: Vec<f64> = scenarios
                    .iter()
                    .filter_map(|s| s.scores.get(&d).copied())
                    .collect();
                mean(&values).map(|m| (d, m))
            })
            .collect();
        EvalReport {
            suite: name.to_string(),
            summary: Summary {
                pass_rate: if total == 0 {
                    0.0
                } else {
                    passed as f64 / total as f64
                },
                total_scenarios: total,
                passed,
                failed: count(ScenarioStatus::Failed),
                flaky: count(ScenarioStatus::Flaky),
                judge_errors: count(ScenarioStatus::JudgeError),
                avg_scores,
            },
            scenarios,
            regression_analysis: RegressionAnalysis::default(),
            run: None,
        }
    }

    /// Records a comparison's regressions and improvements in `regression_analysis`.
    pub fn attach(&mut self, comparison: &Comparison) {
        self.regression_analysis = RegressionAnalysis {
            regressions: comparison.regressions.clone(),
            improvements: comparison.improvements.clone(),
        };
    }

    /// The scenario `id`.
    pub fn scenario(&self, id: &str) -> Option<&ScenarioReport> {
        self.scenarios.iter().find(|s| s.id == id)
    }
}
