//! Eval runs and baselines on SQLite: writes are jobs of the store's writer thread (each
//! in its own savepoint of a group transaction, like appends: a run and its thread links
//! are written together or not at all); reads use the read pool. Runs are never modified
//! after they are saved, so a run read in two statements (columns, then links) is
//! consistent.

use async_trait::async_trait;
use keel_core::store::AppendDurability;
use rusqlite::{Connection, params};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{
    BaselineInfo, EvalResultStore, EvalRunId, EvalRunInfo, EvalStoreError, EvalThreadLink,
    NewEvalRun, RunColumns, StoredEvalRun, backend, check_baseline_name, check_new_run, group_runs,
    now_ns, parse_report, report_text, sql_int, sql_limit, stored_u32,
};
use crate::SqliteStore;
use crate::sqlite_writer::WriterFailure;

impl From<WriterFailure> for EvalStoreError {
    fn from(failure: WriterFailure) -> Self {
        EvalStoreError::Backend(failure.0)
    }
}

/// The runs ⟕ links join over the newest `?1` runs of every suite.
const LIST_ALL: &str = "SELECT r.run_id, r.suite, r.model, r.pass_rate, r.total_scenarios, r.created_at, \
     t.scenario, t.trial, t.thread_id, t.trace_id \
     FROM (SELECT run_id, suite, model, pass_rate, total_scenarios, created_at FROM eval_runs \
     ORDER BY created_at DESC, run_id DESC LIMIT ?1) r \
     LEFT JOIN eval_run_threads t ON t.run_id = r.run_id \
     ORDER BY r.created_at DESC, r.run_id DESC, t.position";

/// The runs ⟕ links join over the newest `?2` runs of suite `?1`.
const LIST_SUITE: &str = "SELECT r.run_id, r.suite, r.model, r.pass_rate, r.total_scenarios, r.created_at, \
     t.scenario, t.trial, t.thread_id, t.trace_id \
     FROM (SELECT run_id, suite, model, pass_rate, total_scenarios, created_at FROM eval_runs \
     WHERE suite = ?1 ORDER BY created_at DESC, run_id DESC LIMIT ?2) r \
     LEFT JOIN eval_run_threads t ON t.run_id = r.run_id \
     ORDER BY r.created_at DESC, r.run_id DESC, t.position";

fn decode_err(e: sqlx::Error) -> EvalStoreError {
    backend("sqlite decode eval run", e)
}

fn run_columns(row: &SqliteRow) -> Result<RunColumns, EvalStoreError> {
    Ok(RunColumns {
        id: row.try_get("run_id").map_err(decode_err)?,
        suite: row.try_get("suite").map_err(decode_err)?,
        model: row.try_get("model").map_err(decode_err)?,
        pass_rate: row.try_get("pass_rate").map_err(decode_err)?,
        total_scenarios: row.try_get("total_scenarios").map_err(decode_err)?,
        created_at: row.try_get("created_at").map_err(decode_err)?,
    })
}

/// The link columns of a row (`None` for a run without links in a left join).
fn link(row: &SqliteRow) -> Result<Option<EvalThreadLink>, EvalStoreError> {
    let trial: Option<i64> = row.try_get("trial").map_err(decode_err)?;
    let Some(trial) = trial else { return Ok(None) };
    Ok(Some(EvalThreadLink {
        scenario: row.try_get("scenario").map_err(decode_err)?,
        trial: stored_u32("trial", trial)?,
        thread_id: row.try_get("thread_id").map_err(decode_err)?,
        trace_id: row.try_get("trace_id").map_err(decode_err)?,
    }))
}

fn grouped(rows: &[SqliteRow]) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
    let rows = rows
        .iter()
        .map(|row| Ok((run_columns(row)?, link(row)?)))
        .collect::<Result<Vec<_>, EvalStoreError>>()?;
    group_runs(rows)
}

/// Inserts a checked run and its links on the writer's connection.
fn insert_run(
    conn: &Connection,
    run: &NewEvalRun,
    report: &str,
    now: i64,
) -> Result<EvalRunId, EvalStoreError> {
    let id: i64 = conn
        .prepare_cached(
            "INSERT INTO eval_runs (suite, model, pass_rate, total_scenarios, created_at, report) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING run_id",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![
                    run.suite,
                    run.model,
                    run.pass_rate,
                    i64::from(run.total_scenarios),
                    now,
                    report
                ],
                |row| row.get(0),
            )
        })
        .map_err(|e| backend("sqlite insert eval run", e))?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO eval_run_threads (run_id, position, scenario, trial, thread_id, trace_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(|e| backend("sqlite insert eval run threads", e))?;
    for (position, link) in run.threads.iter().enumerate() {
        stmt.execute(params![
            id,
            sql_int(position),
            link.scenario,
            i64::from(link.trial),
            link.thread_id,
            link.trace_id
        ])
        .map_err(|e| backend("sqlite insert eval run threads", e))?;
    }
    Ok(EvalRunId(id))
}

#[async_trait]
impl EvalResultStore for SqliteStore {
    async fn save_run(&self, run: NewEvalRun) -> Result<EvalRunId, EvalStoreError> {
        check_new_run(&run)?;
        // Serializing happens here, on the caller's task, not on the writer thread.
        let report = report_text(&run.report)?;
        let now = now_ns();
        self.writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                insert_run(conn, &run, &report, now)
            })
            .await
    }

    async fn run(&self, id: &EvalRunId) -> Result<Option<StoredEvalRun>, EvalStoreError> {
        let row = sqlx::query(
            "SELECT run_id, suite, model, pass_rate, total_scenarios, created_at, report \
             FROM eval_runs WHERE run_id = ?1",
        )
        .bind(id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("sqlite read eval run", e))?;
        let Some(row) = row else { return Ok(None) };
        let columns = run_columns(&row)?;
        let report: String = row.try_get("report").map_err(decode_err)?;
        let links = sqlx::query(
            "SELECT scenario, trial, thread_id, trace_id FROM eval_run_threads \
             WHERE run_id = ?1 ORDER BY position",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| backend("sqlite read eval run threads", e))?;
        let threads = links
            .iter()
            .filter_map(|row| link(row).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(StoredEvalRun {
            report: parse_report(*id, &report)?,
            info: columns.into_info(threads)?,
        }))
    }

    async fn list_runs(
        &self,
        suite: Option<&str>,
        limit: usize,
    ) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
        let query = match suite {
            Some(suite) => sqlx::query(LIST_SUITE).bind(suite.to_string()),
            None => sqlx::query(LIST_ALL),
        };
        let rows = query
            .bind(sql_limit(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| backend("sqlite list eval runs", e))?;
        grouped(&rows)
    }

    async fn runs_for_thread(&self, thread_id: &str) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
        let rows = sqlx::query(
            "SELECT r.run_id, r.suite, r.model, r.pass_rate, r.total_scenarios, r.created_at, \
             t.scenario, t.trial, t.thread_id, t.trace_id \
             FROM eval_runs r JOIN eval_run_threads t ON t.run_id = r.run_id \
             WHERE r.run_id IN (SELECT run_id FROM eval_run_threads WHERE thread_id = ?1) \
             ORDER BY r.created_at DESC, r.run_id DESC, t.position",
        )
        .bind(thread_id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| backend("sqlite eval runs for thread", e))?;
        grouped(&rows)
    }

    async fn save_baseline(&self, name: &str, run: &EvalRunId) -> Result<(), EvalStoreError> {
        check_baseline_name(name)?;
        let (name, id, now) = (name.to_string(), run.0, now_ns());
        let saved = self
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                // The WHERE makes the SELECT unambiguous before ON CONFLICT, and writes
                // nothing when the run does not exist.
                conn.prepare_cached(
                    "INSERT INTO eval_baselines (name, run_id, updated_at) \
                     SELECT ?1, run_id, ?3 FROM eval_runs WHERE run_id = ?2 \
                     ON CONFLICT (name) DO UPDATE SET run_id = excluded.run_id, \
                     updated_at = excluded.updated_at",
                )
                .and_then(|mut stmt| stmt.execute(params![name, id, now]))
                .map_err(|e| backend("sqlite save eval baseline", e))
            })
            .await?;
        if saved == 0 {
            return Err(EvalStoreError::NotFound(*run));
        }
        Ok(())
    }

    async fn baseline(&self, name: &str) -> Result<Option<StoredEvalRun>, EvalStoreError> {
        check_baseline_name(name)?;
        let id: Option<i64> =
            sqlx::query_scalar("SELECT run_id FROM eval_baselines WHERE name = ?1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("sqlite read eval baseline", e))?;
        match id {
            Some(id) => self.run(&EvalRunId(id)).await,
            None => Ok(None),
        }
    }

    async fn baselines(&self) -> Result<Vec<BaselineInfo>, EvalStoreError> {
        let rows = sqlx::query(
            "SELECT b.name, b.updated_at, r.run_id, r.suite, r.model, r.pass_rate, \
             r.total_scenarios, r.created_at \
             FROM eval_baselines b JOIN eval_runs r ON r.run_id = b.run_id ORDER BY b.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| backend("sqlite list eval baselines", e))?;
        rows.iter()
            .map(|row| {
                let run = run_columns(row)?.into_info(Vec::new())?;
                let updated_at: i64 = row.try_get("updated_at").map_err(decode_err)?;
                Ok(BaselineInfo {
                    name: row.try_get("name").map_err(decode_err)?,
                    run_id: run.id,
                    suite: run.suite,
                    model: run.model,
                    pass_rate: run.pass_rate,
                    total_scenarios: run.total_scenarios,
                    run_created_at: run.created_at,
                    updated_at: crate::rows::ns_to_ts(updated_at),
                })
            })
            .collect()
    }

    async fn delete_baseline(&self, name: &str) -> Result<bool, EvalStoreError> {
        check_baseline_name(name)?;
        let name = name.to_string();
        let deleted = self
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                conn.prepare_cached("DELETE FROM eval_baselines WHERE name = ?1")
                    .and_then(|mut stmt| stmt.execute([&name]))
                    .map_err(|e| backend("sqlite delete eval baseline", e))
            })
            .await?;
        Ok(deleted > 0)
    }
}
