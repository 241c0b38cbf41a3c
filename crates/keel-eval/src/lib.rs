//! Keel's evaluation core (seed 004 §7): what a suite file says ([`suite`]), what a run did
//! as read from its events ([`trace`]), deterministic scoring of one trial in three
//! dimensions ([`score`]), the statistics of repeated trials ([`stats`]), the JSON report
//! ([`report`]), its self-contained HTML rendering ([`html`]) and the comparison with a
//! baseline report ([`compare`]).
//!
//! The [`runner`] runs each scenario's trials against the suite's agent (built through
//! keel-app, as `keel run` builds it), reads each trial's events back from the store and
//! scores them; the [`judge`] scores rubrics with an LLM, caching verdicts by content hash.
//! Reports are saved in the event store's database, and baselines named there
//! ([`results`]). Golden conversations ([`golden`]) record one run as a cassette and
//! replay it offline, failing when the action trace deviates beyond declared allowances.

pub mod compare;
pub mod golden;
pub mod html;
pub mod judge;
pub mod report;
pub mod results;
pub mod runner;
pub mod score;
pub mod stats;
pub mod suite;
pub mod trace;

pub use compare::{Change, Comparison, MetricDelta, compare};
pub use golden::{
    Allowances, Cassette, CassetteError, ReplayError, ReplayOptions, ReplayReport, replay,
};
pub use html::{HtmlOptions, render_html};
pub use judge::{DEFAULT_JUDGE_CACHE, ModelJudge};
pub use report::{
    BaselineRef, EvalReport, ReportOptions, RunMeta, ScenarioReport, ScenarioStatus,
    ScenarioTrials, Trial, TrialFacts,
};
pub use results::{ResultsError, load_baseline, load_run, save_report};
pub use runner::{
    DEFAULT_TRIAL_TIMEOUT, EvalError, Progress, ProgressFn, RunOptions, TrialSetup, run_suite,
};
pub use score::{
    CheckOutcome, Dimension, DimensionScore, Judge, JudgeError, JudgeVerdict, TrialScore,
    TrialStatus, apply_judge, score_scenario,
};
pub use stats::{Interval, StatsError, pass_at_k, pass_pow_k, wilson};
pub use suite::{Scenario, Suite, SuiteSettings, Thresholds};
pub use trace::{CallOutcome, RunTrace, TraceEnd, TracedCall};
