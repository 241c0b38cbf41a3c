//! Keel's evaluation core (seed 004 §7): what a suite file says ([`suite`]), what a run did
//! as read from its events ([`trace`]), deterministic scoring of one trial in three
//! dimensions ([`score`]), the statistics of repeated trials ([`stats`]), the JSON report
//! ([`report`]) and the comparison with a baseline report ([`compare`]).
//!
//! This crate performs no I/O and runs no agent: a runner (not built yet) runs each
//! scenario's trials, reads each trial's events and hands them here.

pub mod compare;
pub mod report;
pub mod score;
pub mod stats;
pub mod suite;
pub mod trace;

pub use compare::{Change, Comparison, MetricDelta, compare};
pub use report::{
    EvalReport, ReportOptions, ScenarioReport, ScenarioStatus, ScenarioTrials, Trial,
};
pub use score::{
    CheckOutcome, Dimension, DimensionScore, Judge, JudgeError, JudgeVerdict, TrialScore,
    TrialStatus, apply_judge, score_scenario,
};
pub use stats::{Interval, StatsError, pass_at_k, pass_pow_k, wilson};
pub use suite::{Scenario, Suite, SuiteSettings, Thresholds};
pub use trace::{CallOutcome, RunTrace, TraceEnd, TracedCall};
