//! The eval pages: the runs `keel eval run` saved in the store's database
//! (`keel_store::EvalResultStore`, through `keel_eval`'s report type) — the list of eval
//! runs ([`list`]), one run's scenarios × trials grid with every check's reason and links
//! to the trials' run pages ([`grid`]), and its comparison with a baseline computed by the
//! same `keel_eval::compare` as `keel eval compare` ([`compare`]).
//!
//! Nothing here is stored anywhere else: the pages read saved reports (every string in
//! them redacted first) and check which trial threads are still in the event store. Under
//! a [`crate::Scope`], an eval run is visible only when every one of its trial threads is
//! inside the scope, and a baseline only when the run it points to is.

mod compare;
mod grid;
mod list;

use std::sync::Arc;

use keel_eval::EvalReport;
use keel_store::{BaselineInfo, EvalResultStore, EvalRunId, EvalRunInfo, EvalStoreError};
use serde_json::Value;

use crate::Ui;
use crate::error::UiError;

pub(crate) use compare::compare;
pub(crate) use grid::run;
pub(crate) use list::list;

/// The eval results, or the 404 of a UI that shows none.
fn results(ui: &Ui) -> Result<&Arc<dyn EvalResultStore>, UiError> {
    ui.evals.as_ref().ok_or_else(|| {
        UiError::not_found(
            "this UI shows no eval results (keel ui shows the runs `keel eval run` saved in \
             its store; keel serve does not: they belong to no tenant)",
        )
    })
}

fn store_error(ui: &Ui, error: EvalStoreError) -> UiError {
    ui.source.store_error(error)
}

/// Whether `info` may be shown: every trial thread inside the scope (an eval run without
/// trials only when nothing is scoped).
fn visible(ui: &Ui, info: &EvalRunInfo) -> bool {
    match ui.source.scope() {
        crate::Scope::All => true,
        scope => {
            !info.threads.is_empty() && info.threads.iter().all(|t| scope.allows(&t.thread_id))
        }
    }
}

/// Every string of a saved report passed through the redactor (a check's reason may quote
/// an answer, a trial's error a URL).
fn redact_value(ui: &Ui, value: &mut Value) {
    match value {
        Value::String(text) => {
            let redacted = ui.source.redact(text);
            if redacted != *text {
                *text = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_value(ui, v)),
        Value::Object(map) => map.values_mut().for_each(|v| redact_value(ui, v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A saved run's report as shown (redacted), or why it cannot be read.
fn decode(ui: &Ui, id: EvalRunId, mut report: Value) -> Result<EvalReport, String> {
    redact_value(ui, &mut report);
    serde_json::from_value(report).map_err(|e| {
        format!("saved eval run {id} does not hold a report this version can read: {e}")
    })
}

/// The eval run an URL names (`/evals/{id}`): its info and report; 404 when there is no
/// such run or it is outside the scope.
async fn load(ui: &Ui, id_text: &str) -> Result<(EvalRunInfo, EvalReport), UiError> {
    let missing = || UiError::not_found(format!("there is no eval run {id_text}"));
    let id: EvalRunId = id_text.parse().map_err(|_| missing())?;
    let stored = results(ui)?
        .run(&id)
        .await
        .map_err(|e| store_error(ui, e))?
        .ok_or_else(missing)?;
    if !visible(ui, &stored.info) {
        return Err(missing());
    }
    let report = decode(ui, id, stored.report).map_err(UiError::store)?;
    Ok((stored.info, report))
}

/// The baselines pointing at visible runs (with the runs' infos, to check visibility).
async fn visible_baselines(ui: &Ui) -> Result<Vec<BaselineInfo>, UiError> {
    let results = results(ui)?;
    let all = results.baselines().await.map_err(|e| store_error(ui, e))?;
    if *ui.source.scope() == crate::Scope::All {
        return Ok(all);
    }
    let mut shown = Vec::new();
    for baseline in all {
        let info = results
            .run(&baseline.run_id)
            .await
            .map_err(|e| store_error(ui, e))?;
        if info.is_some_and(|run| visible(ui, &run.info)) {
            shown.push(baseline);
        }
    }
    Ok(shown)
}

/// The query's pairs, refusing parameters not in `known`.
fn query_pairs(query: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, UiError> {
    let mut pairs = Vec::new();
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if !known.contains(&key.as_ref()) {
            return Err(UiError::bad_input(
                &key,
                format!("unknown parameter: use {}", known.join(", ")),
            ));
        }
        pairs.push((key.into_owned(), value.trim().to_string()));
    }
    Ok(pairs)
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// `0.667` as `66.7%`.
fn pct(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

/// A score with two decimals.
fn score(value: f64) -> String {
    format!("{value:.2}")
}

/// A signed change, in points of a 0–1 scale: `+0.50`, `−0.25`.
fn signed(delta: f64) -> String {
    if delta < 0.0 {
        format!("−{:.2}", -delta)
    } else {
        format!("+{delta:.2}")
    }
}

/// `tool_usage` as a heading.
fn metric_name(metric: &str) -> String {
    metric.replace('_', " ")
}

/// A milliseconds count from a report as a duration.
fn ms(value: u64) -> String {
    crate::row::duration(i64::try_from(value).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(pct(2.0 / 3.0), "66.7%");
        assert_eq!(score(0.8), "0.80");
        assert_eq!(signed(-0.25), "−0.25");
        assert_eq!(signed(0.5), "+0.50");
        assert_eq!(metric_name("decision_quality"), "decision quality");
        assert_eq!(ms(1500), "1.5 s");
    }
}
