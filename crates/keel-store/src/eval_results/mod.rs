//! Evaluation results and baselines (`keel eval`), kept in the event store's database.
//!
//! Each `keel eval run` is saved as one **run**: its report, whole and opaque (this crate
//! does not know keel-eval's types: the report is a `serde_json::Value`), plus copies of
//! the columns used to list and pick runs (suite, model, pass rate, scenario count, time)
//! and one **thread link** per trial (scenario, trial, thread id, trace id), so "which
//! eval run did thread X belong to" is one indexed query ([`EvalResultStore::runs_for_thread`]).
//!
//! A **baseline** is a named pointer to a run (`keel eval run --save-baseline NAME`):
//! saving an existing name moves it to the new run. Runs are never modified once saved.
//!
//! Run ids are assigned by the store: positive integers, increasing in save order within
//! one database (SQLite `AUTOINCREMENT`, Postgres `BIGSERIAL`, a counter in memory), never
//! reused. Times are stored as integer nanoseconds since the epoch, by the saving
//! process's clock. Lists are newest first: by `created_at`, then by id.
//!
//! Backends: [`MemoryEvalResultStore`], [`crate::SqliteStore`] (writes through the
//! store's writer thread, reads through its read pool) and [`crate::PostgresStore`]; the
//! tables come from migration `0005_eval_results`.

mod memory;
mod postgres;
mod sqlite;

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use memory::MemoryEvalResultStore;

/// Longest baseline name, in characters.
pub const MAX_BASELINE_NAME_CHARS: usize = 128;

/// A saved evaluation run's id: a positive integer assigned by the store (see the module
/// docs). Displays and parses as the plain number (`42`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EvalRunId(pub i64);

impl fmt::Display for EvalRunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for EvalRunId {
    type Err = EvalStoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<i64>() {
            Ok(id) if id > 0 => Ok(Self(id)),
            _ => Err(invalid(
                "run id",
                format!("{s:?} is not an eval run id: expected a positive integer such as 42"),
            )),
        }
    }
}

/// Why an eval-result operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalStoreError {
    /// No run has this id.
    #[error("eval run {0} is not in the store: check the id against the list of saved runs")]
    NotFound(EvalRunId),
    /// A bad argument: `field` names it, `message` says what is wrong and what is allowed.
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        /// The argument (e.g. `name`, `suite`, `threads[2].thread_id`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The database failed.
    #[error("eval store backend error: {0}")]
    Backend(String),
}

impl EvalStoreError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::Backend(_) => "backend",
        }
    }
}

/// Which thread (and trace) ran one trial of one scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalThreadLink {
    /// Scenario id (non-empty).
    pub scenario: String,
    /// Trial number within the scenario.
    pub trial: u32,
    /// The trial's thread (non-empty).
    pub thread_id: String,
    /// The trial's trace id (may be empty when the trial recorded no event).
    pub trace_id: String,
}

/// A run to save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvalRun {
    /// Suite name (non-empty).
    pub suite: String,
    /// Model evaluated, when known.
    pub model: Option<String>,
    /// Overall pass rate, in `0.0..=1.0`.
    pub pass_rate: f64,
    /// Scenarios in the run.
    pub total_scenarios: u32,
    /// The whole report (stored and returned as is).
    pub report: Value,
    /// One link per trial, in the order to return them.
    pub threads: Vec<EvalThreadLink>,
}

/// A saved run without its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRunInfo {
    /// Its id.
    pub id: EvalRunId,
    /// Suite name.
    pub suite: String,
    /// Model evaluated, when known.
    pub model: Option<String>,
    /// Overall pass rate.
    pub pass_rate: f64,
    /// Scenarios in the run.
    pub total_scenarios: u32,
    /// When it was saved.
    pub created_at: DateTime<Utc>,
    /// Its trials' threads, in the order they were saved.
    pub threads: Vec<EvalThreadLink>,
}

/// A saved run with its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvalRun {
    /// Everything but the report.
    pub info: EvalRunInfo,
    /// The report, as saved.
    pub report: Value,
}

/// A baseline and the run it points to (for listings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineInfo {
    /// Baseline name.
    pub name: String,
    /// The run it points to.
    pub run_id: EvalRunId,
    /// The run's suite.
    pub suite: String,
    /// The run's model.
    pub model: Option<String>,
    /// The run's pass rate.
    pub pass_rate: f64,
    /// The run's scenario count.
    pub total_scenarios: u32,
    /// When the run was saved.
    pub run_created_at: DateTime<Utc>,
    /// When the baseline was last saved (created or moved).
    pub updated_at: DateTime<Utc>,
}

/// Evaluation runs and baselines. Implemented by [`MemoryEvalResultStore`],
/// [`crate::SqliteStore`] and [`crate::PostgresStore`].
#[async_trait]
pub trait EvalResultStore: Send + Sync {
    /// Saves a run and its thread links (all or nothing); returns its new id.
    async fn save_run(&self, run: NewEvalRun) -> Result<EvalRunId, EvalStoreError>;

    /// A run with its report, or `None` when no run has this id.
    async fn run(&self, id: &EvalRunId) -> Result<Option<StoredEvalRun>, EvalStoreError>;

    /// At most `limit` runs, newest first, of one suite or of all.
    async fn list_runs(
        &self,
        suite: Option<&str>,
        limit: usize,
    ) -> Result<Vec<EvalRunInfo>, EvalStoreError>;

    /// The runs with a trial on `thread_id`, newest first (usually one).
    async fn runs_for_thread(&self, thread_id: &str) -> Result<Vec<EvalRunInfo>, EvalStoreError>;

    /// Points baseline `name` at run `run` (creating it, or moving it and recording the
    /// time). [`EvalStoreError::NotFound`] when the run does not exist; the name is
    /// checked by [`check_baseline_name`].
    async fn save_baseline(&self, name: &str, run: &EvalRunId) -> Result<(), EvalStoreError>;

    /// The run baseline `name` points to, or `None` when there is no such baseline.
    async fn baseline(&self, name: &str) -> Result<Option<StoredEvalRun>, EvalStoreError>;

    /// Every baseline, by name.
    async fn baselines(&self) -> Result<Vec<BaselineInfo>, EvalStoreError>;

    /// Removes baseline `name` (not its run); `false` when there was none.
    async fn delete_baseline(&self, name: &str) -> Result<bool, EvalStoreError>;
}

/// Checks a baseline name: non-empty, at most [`MAX_BASELINE_NAME_CHARS`] characters, no
/// control characters, no leading or trailing whitespace.
pub fn check_baseline_name(name: &str) -> Result<(), EvalStoreError> {
    let fail = |why: &str| Err(invalid("name", format!("baseline name {name:?} {why}")));
    if name.is_empty() {
        return fail("is empty: give a name such as main or release-1.2");
    }
    if name.chars().count() > MAX_BASELINE_NAME_CHARS {
        return fail(&format!(
            "is longer than {MAX_BASELINE_NAME_CHARS} characters: use a shorter name"
        ));
    }
    if name.chars().any(char::is_control) {
        return fail("contains a control character (newline, tab, ...): remove it");
    }
    if name.trim() != name {
        return fail("starts or ends with whitespace: remove it");
    }
    Ok(())
}

/// Checks a run before saving; names the first bad field.
pub(crate) fn check_new_run(run: &NewEvalRun) -> Result<(), EvalStoreError> {
    check_text("suite", &run.suite, true)?;
    if let Some(model) = &run.model {
        check_text("model", model, false)?;
    }
    if !(run.pass_rate.is_finite() && (0.0..=1.0).contains(&run.pass_rate)) {
        return Err(invalid(
            "pass_rate",
            format!("{} is not a rate: expected 0.0 to 1.0", run.pass_rate),
        ));
    }
    for (i, link) in run.threads.iter().enumerate() {
        check_text(&format!("threads[{i}].scenario"), &link.scenario, true)?;
        check_text(&format!("threads[{i}].thread_id"), &link.thread_id, true)?;
        check_text(&format!("threads[{i}].trace_id"), &link.trace_id, false)?;
    }
    Ok(())
}

/// A text column: no control characters (Postgres `TEXT` rejects NUL), non-empty when
/// `required`.
fn check_text(field: &str, value: &str, required: bool) -> Result<(), EvalStoreError> {
    if required && value.is_empty() {
        return Err(invalid(field, "must not be empty".to_string()));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(
            field,
            format!("{value:?} contains a control character: remove it"),
        ));
    }
    Ok(())
}

pub(crate) fn invalid(field: &str, message: String) -> EvalStoreError {
    EvalStoreError::InvalidArgument {
        field: field.to_string(),
        message,
    }
}

pub(crate) fn backend(operation: &str, error: impl fmt::Display) -> EvalStoreError {
    EvalStoreError::Backend(format!("{operation}: {error}"))
}

/// The report as stored (JSON text).
pub(crate) fn report_text(report: &Value) -> Result<String, EvalStoreError> {
    serde_json::to_string(report).map_err(|e| invalid("report", format!("cannot serialize: {e}")))
}

/// A stored report parsed back.
pub(crate) fn parse_report(id: EvalRunId, text: &str) -> Result<Value, EvalStoreError> {
    serde_json::from_str(text)
        .map_err(|e| backend(&format!("stored report of eval run {id} does not parse"), e))
}

/// A database integer as a `u32` (out of range is corrupt data).
pub(crate) fn stored_u32(field: &str, value: i64) -> Result<u32, EvalStoreError> {
    u32::try_from(value)
        .map_err(|_| EvalStoreError::Backend(format!("stored {field} {value} is out of range")))
}

/// The current time in nanoseconds since the epoch.
pub(crate) fn now_ns() -> i64 {
    crate::rows::ts_to_ns_saturating(Utc::now())
}

/// A run's columns as read from `eval_runs` (the report aside).
pub(crate) struct RunColumns {
    pub(crate) id: i64,
    pub(crate) suite: String,
    pub(crate) model: Option<String>,
    pub(crate) pass_rate: f64,
    pub(crate) total_scenarios: i64,
    pub(crate) created_at: i64,
}

impl RunColumns {
    pub(crate) fn into_info(
        self,
        threads: Vec<EvalThreadLink>,
    ) -> Result<EvalRunInfo, EvalStoreError> {
        Ok(EvalRunInfo {
            id: EvalRunId(self.id),
            suite: self.suite,
            model: self.model,
            pass_rate: self.pass_rate,
            total_scenarios: stored_u32("total_scenarios", self.total_scenarios)?,
            created_at: crate::rows::ns_to_ts(self.created_at),
            threads,
        })
    }
}

/// Folds the rows of a runs ⟕ threads join (ordered by run, then link position) into one
/// [`EvalRunInfo`] per run, keeping the rows' order.
pub(crate) fn group_runs(
    rows: Vec<(RunColumns, Option<EvalThreadLink>)>,
) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
    let mut runs: Vec<EvalRunInfo> = Vec::new();
    for (columns, link) in rows {
        let same_run = runs.last().is_some_and(|last| last.id.0 == columns.id);
        if !same_run {
            runs.push(columns.into_info(Vec::new())?);
        }
        if let (Some(link), Some(last)) = (link, runs.last_mut()) {
            last.threads.push(link);
        }
    }
    Ok(runs)
}

/// `limit` as a SQL `LIMIT`.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// A link's position or trial as a database integer.
pub(crate) fn sql_int(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn run_ids_parse_and_display_as_numbers() {
        assert_eq!("42".parse::<EvalRunId>().unwrap(), EvalRunId(42));
        assert_eq!(EvalRunId(7).to_string(), "7");
        for bad in ["", "0", "-3", "abc", "1.5"] {
            let err = bad.parse::<EvalRunId>().unwrap_err();
            assert_eq!(err.code(), "invalid_argument", "{bad:?}");
        }
    }

    #[test]
    fn baseline_names_are_checked() {
        check_baseline_name("main").unwrap();
        check_baseline_name(&"é".repeat(MAX_BASELINE_NAME_CHARS)).unwrap();
        for bad in [
            String::new(),
            "x".repeat(MAX_BASELINE_NAME_CHARS + 1),
            "a\nb".into(),
            "a\u{7f}".into(),
            " main".into(),
        ] {
            let err = check_baseline_name(&bad).unwrap_err();
            assert!(
                matches!(&err, EvalStoreError::InvalidArgument { field, .. } if field == "name"),
                "{bad:?}: {err:?}"
            );
        }
    }
}
