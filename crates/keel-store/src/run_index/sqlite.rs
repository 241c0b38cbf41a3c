//! [`keel_core::EventStore::list_runs`] on SQLite: catch the index up (detection and
//! folding on a read connection on Tokio's blocking pool, the new rows written by the
//! store's writer in one short job per step), then one query.
//!
//! A running thread's `threads` row lags (migration `0004`): its count and time come from
//! its last event, here as in `list_threads`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_core::AppendDurability;
use keel_core::run_metrics::{FactsPage, FactsQuery, ThreadFacts};
use keel_core::runs::{RunPage, RunQuery, page_of};
use keel_core::store::StoreError;
use rusqlite::functions::FunctionFlags;
use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags, params, params_from_iter};

use super::{
    CATCH_UP_BUDGET, IndexRow, Indexed, MetricsColumns, STEP_EVENTS, STEP_THREADS, Stale,
    StatsColumns, ThreadColumns, after_operator, background, fold, in_background, read_facts,
    sort_expression, summary,
};
use crate::SqliteStore;
use crate::rows::{backend, status_columns, ts_to_ns_saturating};

/// How long a read waits for a lock (WAL readers rarely do).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The `threads` rows with a running thread's count and time read from its last event.
const THREADS: &str = "SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at \
     FROM threads WHERE status <> 'running' \
     UNION ALL \
     SELECT t.thread_id, t.agent, t.status, t.end_state, e.seq + 1, t.created_at, e.ts \
     FROM threads t JOIN events e ON e.rowid = (SELECT m.rowid FROM events m \
     WHERE m.thread_id = t.thread_id ORDER BY m.seq DESC LIMIT 1) \
     WHERE t.status = 'running'";

/// The threads whose index row is missing, of another thread, or behind the log.
const STALE: &str = "SELECT s.thread_id, s.created_at, s.current, r.indexed_count, r.created_at, \
     r.runs, r.turns, r.tool_calls, r.tool_errors, r.tokens, r.cost, r.model, r.models, r.goal, r.trace_id, \
     r.facts, r.fold_state, r.facts_count \
     FROM (SELECT t.thread_id, t.created_at, CASE WHEN t.status = 'running' \
     THEN (SELECT max(e.seq) + 1 FROM events e WHERE e.thread_id = t.thread_id) \
     ELSE t.event_count END AS current FROM threads t) s \
     LEFT JOIN run_index r ON r.thread_id = s.thread_id \
     WHERE r.thread_id IS NULL OR r.created_at <> s.created_at OR r.indexed_count <> s.current \
     OR r.facts_count IS NOT r.indexed_count \
     LIMIT ?1";

/// The listing's columns.
const COLUMNS: &str = "t.thread_id, t.agent, t.status, t.end_state, t.event_count, t.created_at, \
     t.updated_at, r.runs, r.turns, r.tool_calls, r.tool_errors, r.tokens, r.cost, r.model, \
     r.models, r.goal, r.trace_id";

/// A read connection, with `keel_contains(text, needle)`: whether `needle` occurs in
/// `text`, byte for byte — `instr` without its per-byte loop (memchr's SIMD search), for
/// the text search that reads every `run_text` row.
fn open(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| backend(&format!("sqlite open {}", path.display()), e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .and_then(|()| conn.execute_batch("PRAGMA query_only = ON"))
        .and_then(|()| {
            conn.create_scalar_function(
                "keel_contains",
                2,
                FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
                |ctx| {
                    let text = ctx.get_raw(0).as_bytes().unwrap_or_default();
                    let needle = ctx.get_raw(1).as_bytes().unwrap_or_default();
                    Ok(memchr::memmem::find(text, needle).is_some())
                },
            )
        })
        .map_err(|e| backend("sqlite run index connection", e))?;
    Ok(conn)
}

/// Runs `work` with a read connection on the blocking pool.
async fn on_reader<T: Send + 'static>(
    conn: Connection,
    work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<(Connection, T), StoreError> {
    tokio::task::spawn_blocking(move || {
        let out = work(&conn)?;
        Ok((conn, out))
    })
    .await
    .map_err(|e| backend("sqlite run index task", e))?
}

async fn open_reader(path: PathBuf) -> Result<Connection, StoreError> {
    tokio::task::spawn_blocking(move || open(&path))
        .await
        .map_err(|e| backend("sqlite run index task", e))?
}

/// The listing: catch-up (within [`CATCH_UP_BUDGET`], the rest in the background), then
/// one query.
pub(crate) async fn list_runs(
    store: &SqliteStore,
    query: &RunQuery,
) -> Result<RunPage, StoreError> {
    query.validate()?;
    let (conn, complete) = caught_up(store).await?;
    let query = query.clone();
    let (_conn, page) = on_reader(conn, move |conn| {
        let mut page = page(conn, &query)?;
        if !complete {
            page.unindexed = unindexed(conn, query.thread_prefix.as_deref())?;
        }
        Ok(page)
    })
    .await?;
    Ok(page)
}

/// A read connection after bringing the index up to date within [`CATCH_UP_BUDGET`] (the
/// rest left to a background task); `true` when it is complete.
async fn caught_up(store: &SqliteStore) -> Result<(Connection, bool), StoreError> {
    let conn = open_reader(store.path().to_path_buf()).await?;
    let key = format!("sqlite:{}", store.path().display());
    let (conn, complete) = if in_background(&key) {
        (conn, false)
    } else {
        catch_up(store, conn, Some(Instant::now() + CATCH_UP_BUDGET)).await?
    };
    if !complete {
        let store = store.clone();
        background(key, async move {
            let conn = open_reader(store.path().to_path_buf()).await?;
            catch_up(&store, conn, None).await.map(|_| ())
        });
    }
    Ok((conn, complete))
}

/// [`keel_core::EventStore::run_facts`]: the same catch-up as a listing, then one query
/// over the threads and the facts of their index rows.
pub(crate) async fn run_facts(
    store: &SqliteStore,
    query: &FactsQuery,
) -> Result<FactsPage, StoreError> {
    let (conn, complete) = caught_up(store).await?;
    let query = query.clone();
    let (_conn, page) = on_reader(conn, move |conn| {
        let threads = facts(conn, &query)?;
        let unindexed = if complete {
            0
        } else {
            without_facts(conn, query.thread_prefix.as_deref())?
        };
        Ok(FactsPage { threads, unindexed })
    })
    .await?;
    Ok(page)
}

/// The facts of the threads `query` lets through, in `list_threads`' order.
fn facts(conn: &Connection, query: &FactsQuery) -> Result<Vec<ThreadFacts>, StoreError> {
    let mut sql = format!(
        "SELECT t.thread_id, r.facts FROM ({THREADS}) AS t \
         JOIN run_index r ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
         WHERE r.facts IS NOT NULL"
    );
    let mut args: Vec<Value> = Vec::new();
    if let Some(prefix) = &query.thread_prefix {
        let p = bind(&mut args, Value::Text(prefix.clone()));
        sql.push_str(&format!(" AND substr(t.thread_id, 1, length({p})) = {p}"));
    }
    if let Some(agent) = &query.agent {
        let p = bind(&mut args, Value::Text(agent.clone()));
        sql.push_str(&format!(" AND t.agent = {p}"));
    }
    if let Some(since) = query.active_since {
        let p = bind(&mut args, Value::Integer(ts_to_ns_saturating(since)));
        sql.push_str(&format!(" AND t.updated_at >= {p}"));
    }
    sql.push_str(" ORDER BY t.updated_at DESC, t.thread_id ASC");
    let fail = |e: rusqlite::Error| backend("sqlite read run metrics facts", e);
    let mut stmt = conn.prepare(&sql).map_err(fail)?;
    let mut rows = stmt.query(params_from_iter(args)).map_err(fail)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(fail)? {
        let thread_id: String = row.get(0).map_err(fail)?;
        let facts = row
            .get_ref(1)
            .and_then(|value| value.as_str().map_err(Into::into))
            .map_err(fail)?;
        let runs = read_facts(&thread_id, facts)?;
        out.push(ThreadFacts { thread_id, runs });
    }
    Ok(out)
}

/// Threads (under `prefix`) without metrics facts of their own.
fn without_facts(conn: &Connection, prefix: Option<&str>) -> Result<u64, StoreError> {
    let count: i64 = conn
        .query_row(
            "SELECT count(*) FROM threads t LEFT JOIN run_index r \
             ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
             WHERE (r.thread_id IS NULL OR r.facts IS NULL) \
             AND (?1 IS NULL OR substr(t.thread_id, 1, length(?1)) = ?1)",
            [prefix],
            |row| row.get(0),
        )
        .map_err(|e| backend("sqlite count threads without facts", e))?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Brings the index up to date, step by step, until nothing is stale (`true`) or the
/// deadline passed (`false`). Also stops (`true`) when a step could write none of what it
/// folded: another process is indexing the same threads.
async fn catch_up(
    store: &SqliteStore,
    mut conn: Connection,
    deadline: Option<Instant>,
) -> Result<(Connection, bool), StoreError> {
    loop {
        let (back, (steps, full)) = on_reader(conn, step).await?;
        conn = back;
        if steps.is_empty() {
            return Ok((conn, true));
        }
        let applied = store
            .writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                apply(conn, &steps)
            })
            .await?;
        if !full || applied == 0 {
            return Ok((conn, true));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok((conn, false));
        }
    }
}

/// Threads (under `prefix`) without an index row of their own.
fn unindexed(conn: &Connection, prefix: Option<&str>) -> Result<u64, StoreError> {
    let count: i64 = conn
        .query_row(
            "SELECT count(*) FROM threads t LEFT JOIN run_index r \
             ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
             WHERE r.thread_id IS NULL AND (?1 IS NULL OR substr(t.thread_id, 1, length(?1)) = ?1)",
            [prefix],
            |row| row.get(0),
        )
        .map_err(|e| backend("sqlite count unindexed threads", e))?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// One step: the stale threads (up to the step's bounds) folded. `full`: the step hit a
/// bound, so more may be stale.
fn step(conn: &Connection) -> Result<(Vec<Indexed>, bool), StoreError> {
    let limit = i64::try_from(STEP_THREADS).unwrap_or(i64::MAX);
    let stale = stale(conn, limit)?;
    let mut full = stale.len() >= STEP_THREADS;
    let mut out = Vec::new();
    let mut events_read = 0usize;
    for thread in stale {
        if events_read >= STEP_EVENTS {
            full = true;
            break;
        }
        let events = events_from(conn, &thread.thread_id, thread.first_seq())?;
        events_read = events_read.saturating_add(events.len());
        if let Some(indexed) = fold(thread, &events) {
            out.push(indexed);
        }
    }
    Ok((out, full))
}

fn stale(conn: &Connection, limit: i64) -> Result<Vec<Stale>, StoreError> {
    let fail = |e: rusqlite::Error| backend("sqlite find stale run index rows", e);
    let mut stmt = conn.prepare_cached(STALE).map_err(fail)?;
    let rows = stmt
        .query_map([limit], |row| {
            let thread_id: String = row.get(0)?;
            let created_at: i64 = row.get(1)?;
            let current: Option<i64> = row.get(2)?;
            let indexed: Option<i64> = row.get(3)?;
            let indexed_created: Option<i64> = row.get(4)?;
            let facts_count: Option<i64> = row.get(17)?;
            let metrics = if facts_count == indexed {
                MetricsColumns::read(
                    row.get_ref(15)?.as_str_or_null()?,
                    row.get_ref(16)?.as_str_or_null()?,
                )
            } else {
                None
            };
            let base = match (indexed, indexed_created, metrics) {
                (Some(count), Some(created), Some(metrics))
                    if created == created_at && count <= current.unwrap_or(0) =>
                {
                    Some(IndexRow {
                        indexed_count: count,
                        stats: StatsColumns {
                            runs: row.get(5)?,
                            turns: row.get(6)?,
                            tool_calls: row.get(7)?,
                            tool_errors: row.get(8)?,
                            tokens: row.get(9)?,
                            cost: row.get(10)?,
                            model: row.get(11)?,
                            models: row.get(12)?,
                            goal: row.get(13)?,
                            trace_id: row.get(14)?,
                        }
                        .into_stats(),
                        metrics,
                    })
                }
                _ => None,
            };
            Ok(Stale {
                thread_id,
                created_at,
                base,
            })
        })
        .map_err(fail)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(fail)
}

fn events_from(
    conn: &Connection,
    thread_id: &str,
    from_seq: i64,
) -> Result<Vec<keel_core::Event>, StoreError> {
    crate::sqlite_reader::read_events(
        conn,
        "SELECT seq, ts, run_id, body FROM events WHERE thread_id = ?1 AND seq >= ?2 ORDER BY seq",
        params![thread_id, from_seq],
        thread_id,
    )
}

/// Writes the folded rows (on the writer's connection, inside its transaction): each only
/// while its thread still exists as folded, and only over a row that folded fewer events
/// of it. Returns how many were written.
fn apply(conn: &Connection, steps: &[Indexed]) -> Result<usize, StoreError> {
    let fail = |e: rusqlite::Error| backend("sqlite write run index", e);
    let mut applied = 0usize;
    for row in steps {
        let c = StatsColumns::of(&row.stats);
        let m = MetricsColumns::of(&row.metrics)?;
        let changed = conn
            .prepare_cached(
                "INSERT INTO run_index (thread_id, indexed_count, created_at, runs, turns, tool_calls, \
                 tool_errors, tokens, cost, model, models, goal, trace_id, facts, fold_state, facts_count) \
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?2 \
                 WHERE EXISTS (SELECT 1 FROM threads WHERE thread_id = ?1 AND created_at = ?3) \
                 ON CONFLICT (thread_id) DO UPDATE SET indexed_count = excluded.indexed_count, \
                 created_at = excluded.created_at, runs = excluded.runs, turns = excluded.turns, \
                 tool_calls = excluded.tool_calls, tool_errors = excluded.tool_errors, \
                 tokens = excluded.tokens, cost = excluded.cost, model = excluded.model, \
                 models = excluded.models, goal = excluded.goal, trace_id = excluded.trace_id, \
                 facts = excluded.facts, fold_state = excluded.fold_state, \
                 facts_count = excluded.facts_count \
                 WHERE run_index.created_at <> excluded.created_at \
                 OR run_index.indexed_count < excluded.indexed_count \
                 OR run_index.facts_count IS NOT run_index.indexed_count",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    row.thread_id,
                    row.indexed_count,
                    row.created_at,
                    c.runs,
                    c.turns,
                    c.tool_calls,
                    c.tool_errors,
                    c.tokens,
                    c.cost,
                    c.model,
                    c.models,
                    c.goal,
                    c.trace_id,
                    m.facts,
                    m.fold_state
                ])
            })
            .map_err(fail)?;
        if changed == 0 {
            continue;
        }
        applied += 1;
        if row.restart {
            conn.prepare_cached("DELETE FROM run_text WHERE thread_id = ?1")
                .and_then(|mut stmt| stmt.execute([&row.thread_id]))
                .map_err(fail)?;
        }
        for (part, body) in row.text.iter().enumerate() {
            conn.prepare_cached(
                "INSERT INTO run_text (thread_id, from_seq, part, body) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (thread_id, from_seq, part) DO UPDATE SET body = excluded.body",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    row.thread_id,
                    row.from_seq,
                    i64::try_from(part).unwrap_or(i64::MAX),
                    body
                ])
            })
            .map_err(fail)?;
        }
    }
    Ok(applied)
}

/// Adds a parameter; returns its placeholder.
fn bind(args: &mut Vec<Value>, value: Value) -> String {
    args.push(value);
    format!("?{}", args.len())
}

/// The page: one query over the threads and their index rows.
fn page(conn: &Connection, query: &RunQuery) -> Result<RunPage, StoreError> {
    let mut sql = format!(
        "SELECT {COLUMNS} FROM ({THREADS}) AS t \
         JOIN run_index r ON r.thread_id = t.thread_id AND r.created_at = t.created_at WHERE 1 = 1"
    );
    let mut args: Vec<Value> = Vec::new();
    if let Some(prefix) = &query.thread_prefix {
        let p = bind(&mut args, Value::Text(prefix.clone()));
        sql.push_str(&format!(" AND substr(t.thread_id, 1, length({p})) = {p}"));
    }
    if let Some(status) = query.status {
        let (s, e) = status_columns(status);
        let p = bind(&mut args, Value::Text(s.to_string()));
        sql.push_str(&format!(" AND t.status = {p}"));
        if let Some(e) = e {
            let p = bind(&mut args, Value::Text(e.to_string()));
            sql.push_str(&format!(" AND t.end_state = {p}"));
        }
    }
    if let Some(agent) = &query.agent {
        let p = bind(&mut args, Value::Text(agent.clone()));
        sql.push_str(&format!(" AND t.agent = {p}"));
    }
    if let Some(model) = query.model_needle() {
        let p = bind(&mut args, Value::Text(model));
        sql.push_str(&format!(" AND instr(lower(r.models), {p}) > 0"));
    }
    if let Some(since) = query.active_since {
        let p = bind(&mut args, Value::Integer(ts_to_ns_saturating(since)));
        sql.push_str(&format!(" AND t.updated_at >= {p}"));
    }
    if let Some(before) = query.started_before {
        let p = bind(&mut args, Value::Integer(ts_to_ns_saturating(before)));
        sql.push_str(&format!(" AND t.created_at <= {p}"));
    }
    if let Some(needle) = query.text_needle() {
        let p = bind(&mut args, Value::Text(needle));
        sql.push_str(&format!(
            " AND t.thread_id IN (SELECT thread_id FROM run_text WHERE keel_contains(body, {p}))"
        ));
    }
    let key = sort_expression(query.sort);
    if let Some(after) = &query.after {
        let value = match after.value {
            keel_core::runs::SortValue::Int(v) => Value::Integer(v),
            keel_core::runs::SortValue::Float(v) => Value::Real(v),
        };
        let v = bind(&mut args, value);
        let id = bind(&mut args, Value::Text(after.thread_id.clone()));
        let op = after_operator(query);
        sql.push_str(&format!(
            " AND ({key} {op} {v} OR ({key} = {v} AND t.thread_id > {id}))"
        ));
    }
    let direction = if query.ascending { "ASC" } else { "DESC" };
    let limit = bind(
        &mut args,
        Value::Integer(
            i64::try_from(query.page_size())
                .unwrap_or(i64::MAX)
                .saturating_add(1),
        ),
    );
    sql.push_str(&format!(
        " ORDER BY {key} {direction}, t.thread_id ASC LIMIT {limit}"
    ));
    let fail = |e: rusqlite::Error| backend("sqlite list runs", e);
    let mut stmt = conn.prepare(&sql).map_err(fail)?;
    let rows = stmt
        .query_map(params_from_iter(args), |row| {
            Ok((
                ThreadColumns {
                    thread_id: row.get(0)?,
                    agent: row.get(1)?,
                    status: row.get(2)?,
                    end_state: row.get(3)?,
                    event_count: row.get(4)?,
                    created_at: row.get(5)?,
                    updated_at: row.get(6)?,
                },
                StatsColumns {
                    runs: row.get(7)?,
                    turns: row.get(8)?,
                    tool_calls: row.get(9)?,
                    tool_errors: row.get(10)?,
                    tokens: row.get(11)?,
                    cost: row.get(12)?,
                    model: row.get(13)?,
                    models: row.get(14)?,
                    goal: row.get(15)?,
                    trace_id: row.get(16)?,
                },
            ))
        })
        .map_err(fail)?;
    let mut runs = Vec::new();
    for row in rows {
        let (thread, stats) = row.map_err(fail)?;
        runs.push(summary(thread, stats)?);
    }
    Ok(page_of(runs, query))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;

    use keel_core::runs::RunQuery;
    use keel_core::store::EventStore;

    use super::*;
    use crate::conformance::fixtures::{event, run_started};

    async fn seeded(threads: usize) -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("keel.db")).await.unwrap();
        for i in 0..threads {
            let id = format!("thr_{i:04}");
            let log = vec![event(&id, 0, i as i64, run_started("agent"))];
            store.append(&id, 0, &log).await.unwrap();
        }
        (dir, store)
    }

    /// A catch-up past its deadline stops after a step and says so; the count of threads
    /// not yet indexed is exact; a catch-up without a deadline finishes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catch_up_stops_at_its_deadline_and_resumes() {
        let (_dir, store) = seeded(STEP_THREADS * 2 + 10).await;
        let conn = open_reader(store.path().to_path_buf()).await.unwrap();
        let (conn, complete) = catch_up(&store, conn, Some(Instant::now())).await.unwrap();
        assert!(!complete);
        let (conn, left) = on_reader(conn, |c| unindexed(c, None)).await.unwrap();
        assert_eq!(left, (STEP_THREADS + 10) as u64);
        let (conn, scoped) = on_reader(conn, |c| unindexed(c, Some("thr_00")))
            .await
            .unwrap();
        assert!(scoped <= 100, "{scoped}");
        let (conn, complete) = catch_up(&store, conn, None).await.unwrap();
        assert!(complete);
        let (_conn, left) = on_reader(conn, |c| unindexed(c, None)).await.unwrap();
        assert_eq!(left, 0);
        store.close().await;
    }

    /// Rows indexed before migration `0008` (no facts) and rows a build without it moved
    /// on (facts behind `indexed_count`) are folded again from the first event.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_without_current_facts_are_folded_again() {
        use keel_core::run_metrics::{FactsQuery, run_facts_by_folding};
        let (dir, store) = seeded(20).await;
        store.list_runs(&RunQuery::default()).await.unwrap();
        let conn = Connection::open(dir.path().join("keel.db")).unwrap();
        conn.busy_timeout(BUSY_TIMEOUT).unwrap();
        conn.execute(
            "UPDATE run_index SET facts = NULL, fold_state = NULL, facts_count = NULL \
             WHERE thread_id < 'thr_0010'",
            [],
        )
        .unwrap();
        conn.execute(
            "UPDATE run_index SET facts = '[]', facts_count = indexed_count - 1 \
             WHERE thread_id >= 'thr_0010'",
            [],
        )
        .unwrap();
        drop(conn);
        let query = FactsQuery::default();
        let page = store.run_facts(&query).await.unwrap();
        assert_eq!(page.threads.len(), 20);
        assert_eq!(page, run_facts_by_folding(&store, &query).await.unwrap());
        assert!(page.threads.iter().all(|t| t.runs.len() == 1));
        store.close().await;
    }

    /// A listing that could not index everything in time answers with what it has, says
    /// how many threads are missing, and a background task finishes the index: every
    /// thread is listed soon after, without further listings doing the work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_big_first_listing_finishes_in_the_background() {
        let threads = STEP_THREADS * 8;
        let (_dir, store) = seeded(threads).await;
        let store = Arc::new(store);
        let query = RunQuery {
            limit: 200,
            ..RunQuery::default()
        };
        let first = store.list_runs(&query).await.unwrap();
        assert!(first.unindexed as usize <= threads);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let conn = open_reader(store.path().to_path_buf()).await.unwrap();
            let (_conn, left) = on_reader(conn, |c| unindexed(c, None)).await.unwrap();
            if left == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{left} threads still unindexed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let page = store.list_runs(&query).await.unwrap();
        assert_eq!(page.unindexed, 0);
        assert_eq!(page.runs.len(), 200);
        store.close().await;
    }
}
