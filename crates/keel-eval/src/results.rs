//! Reports in the event store's database: a finished report saved as an eval run (with one
//! link per trial to its thread and trace, so a thread leads back to its evaluation),
//! baselines by name, and saved reports read back for comparison. The storage itself is
//! keel-store's [`EvalResultStore`]; this module maps [`EvalReport`]s onto it.

use keel_store::{EvalResultStore, EvalRunId, EvalStoreError, EvalThreadLink, NewEvalRun};

use crate::report::EvalReport;

/// Why a report could not be saved or read back.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] EvalStoreError),
    /// A saved report is not a report of this version of keel-eval.
    #[error("saved eval run {run} does not hold a readable report: {message}")]
    Unreadable {
        /// The run.
        run: EvalRunId,
        /// What did not parse.
        message: String,
    },
    /// A report could not be serialized.
    #[error("cannot serialize the report: {0}")]
    Serialize(String),
}

/// The store's record of `report` (evaluated with `model`, when known; else the model
/// the report's `run` names).
pub fn new_run(report: &EvalReport, model: Option<&str>) -> Result<NewEvalRun, ResultsError> {
    let model = model.or_else(|| report.run.as_ref().and_then(|run| run.model.as_deref()));
    let threads = report
        .scenarios
        .iter()
        .flat_map(|scenario| {
            scenario
                .trials
                .iter()
                .enumerate()
                .map(|(index, trial)| EvalThreadLink {
                    scenario: scenario.id.clone(),
                    trial: u32::try_from(index + 1).unwrap_or(u32::MAX),
                    thread_id: trial.thread_id.clone(),
                    trace_id: trial.trace_id.clone(),
                })
        })
        .collect();
    Ok(NewEvalRun {
        suite: report.suite.clone(),
        model: model.map(str::to_string),
        pass_rate: report.summary.pass_rate.clamp(0.0, 1.0),
        total_scenarios: u32::try_from(report.summary.total_scenarios).unwrap_or(u32::MAX),
        report: serde_json::to_value(report).map_err(|e| ResultsError::Serialize(e.to_string()))?,
        threads,
    })
}

/// Saves `report` as a new eval run; returns its id.
pub async fn save_report(
    store: &dyn EvalResultStore,
    report: &EvalReport,
    model: Option<&str>,
) -> Result<EvalRunId, ResultsError> {
    Ok(store.save_run(new_run(report, model)?).await?)
}

/// The report of eval run `id` (`None` when there is no such run).
pub async fn load_run(
    store: &dyn EvalResultStore,
    id: EvalRunId,
) -> Result<Option<EvalReport>, ResultsError> {
    match store.run(&id).await? {
        Some(stored) => decode(id, stored.report).map(Some),
        None => Ok(None),
    }
}

/// The report baseline `name` points to, with its run id (`None` when there is no such
/// baseline).
pub async fn load_baseline(
    store: &dyn EvalResultStore,
    name: &str,
) -> Result<Option<(EvalRunId, EvalReport)>, ResultsError> {
    match store.baseline(name).await? {
        Some(stored) => {
            let id = stored.info.id;
            decode(id, stored.report).map(|report| Some((id, report)))
        }
        None => Ok(None),
    }
}

fn decode(run: EvalRunId, value: serde_json::Value) -> Result<EvalReport, ResultsError> {
    serde_json::from_value(value).map_err(|e| ResultsError::Unreadable {
        run,
        message: e.to_string(),
    })
}
