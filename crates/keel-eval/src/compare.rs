//! Comparing a report with a baseline report: the delta of every metric (per scenario its
//! pass rate and each dimension's score; for the summary its pass rate and average
//! scores), and which changes are regressions or improvements. A change beyond the
//! threshold whose new value still lies inside the baseline's 95% interval is listed as
//! not significant and does not fail the CI gate ([`Comparison::is_regression`]).

use serde::{Deserialize, Serialize};

use crate::report::{EvalReport, ScenarioReport};
use crate::stats::Interval;

/// One metric's change in one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Scenario id.
    pub scenario: String,
    /// `pass_rate`, `tool_usage`, `decision_quality` or `robustness`.
    pub metric: String,
    /// Baseline value.
    pub before: f64,
    /// Current value.
    pub after: f64,
    /// `after - before`.
    pub delta: f64,
    /// False when the new value lies inside the baseline's 95% interval (the change may
    /// be noise); only significant drops are regressions.
    pub significant: bool,
}

/// A summary metric's change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricDelta {
    /// `pass_rate` or a dimension name.
    pub metric: String,
    /// Baseline value.
    pub before: f64,
    /// Current value.
    pub after: f64,
    /// `after - before`.
    pub delta: f64,
}

/// The comparison of a report with its baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The threshold used (absolute change, 0..1).
    pub threshold: f64,
    /// Summary-level deltas (every metric present in both reports).
    pub summary: Vec<MetricDelta>,
    /// Drops larger than the threshold.
    pub regressions: Vec<Change>,
    /// Rises larger than the threshold.
    pub improvements: Vec<Change>,
    /// Scenarios only in the current report.
    pub added: Vec<String>,
    /// Scenarios only in the baseline.
    pub removed: Vec<String>,
}

impl Comparison {
    /// Whether some drop is significant: the CI gate fails.
    pub fn is_regression(&self) -> bool {
        self.regressions.iter().any(|c| c.significant)
    }
}

/// The metrics of a scenario: name, value and 95% interval.
fn metrics(s: &ScenarioReport) -> Vec<(String, f64, Interval)> {
    let mut out = vec![("pass_rate".to_string(), s.pass_rate, s.ci95)];
    for (dimension, report) in &s.dimensions {
        out.push((dimension.as_str().to_string(), report.score, report.ci95));
    }
    out
}

/// Compares `current` with `baseline`: every change larger than `threshold` (e.g. 0.05)
/// is listed; a drop is a significant regression unless the current value lies inside the
/// baseline's interval.
pub fn compare(current: &EvalReport, baseline: &EvalReport, threshold: f64) -> Comparison {
    let mut summary = vec![MetricDelta {
        metric: "pass_rate".into(),
        before: baseline.summary.pass_rate,
        after: current.summary.pass_rate,
        delta: current.summary.pass_rate - baseline.summary.pass_rate,
    }];
    for (dimension, after) in &current.summary.avg_scores {
        if let Some(before) = baseline.summary.avg_scores.get(dimension) {
            summary.push(MetricDelta {
                metric: dimension.as_str().into(),
                before: *before,
                after: *after,
                delta: after - before,
            });
        }
    }
    let mut regressions = Vec::new();
    let mut improvements = Vec::new();
    let mut added = Vec::new();
    for scenario in &current.scenarios {
        let Some(base) = baseline.scenario(&scenario.id) else {
            added.push(scenario.id.clone());
            continue;
        };
        let base_metrics = metrics(base);
        for (metric, after, _) in metrics(scenario) {
            let Some((_, before, interval)) = base_metrics.iter().find(|(m, _, _)| *m == metric)
            else {
                continue;
            };
            let delta = after - before;
            if delta.abs() <= threshold + 1e-12 {
                continue;
            }
            let change = Change {
                scenario: scenario.id.clone(),
                metric,
                before: *before,
                after,
                delta,
                significant: !interval.contains(after),
            };
            if delta < 0.0 {
                regressions.push(change);
            } else {
                improvements.push(change);
            }
        }
    }
    let removed = baseline
        .scenarios
        .iter()
        .filter(|s| current.scenario(&s.id).is_none())
        .map(|s| s.id.clone())
        .collect();
    Comparison {
        threshold,
        summary,
        regressions,
        improvements,
        added,
        removed,
    }
}
