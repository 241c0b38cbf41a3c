//! [`keel_core::EventStore::list_runs`] on Postgres: catch the index up (one query finds
//! the stale threads, one reads the events they gained, one transaction writes the new
//! rows — set-based, a step at a time), then one query. Several processes may catch up at
//! once: a row is only replaced by one that folded more events of the same thread.

use std::collections::HashMap;
use std::time::Instant;

use keel_core::Event;
use keel_core::run_metrics::{FactsPage, FactsQuery, ThreadFacts};
use keel_core::runs::{RunPage, RunQuery, SortValue, page_of};
use keel_core::store::StoreError;
use sqlx::{Postgres, QueryBuilder, Row};

use super::{
    CATCH_UP_BUDGET, IndexRow, Indexed, MetricsColumns, STEP_EVENTS, STEP_THREADS, Stale,
    StatsColumns, ThreadColumns, after_operator, background, fold, in_background, no_nul,
    read_facts, sort_expression, summary,
};
use crate::PostgresStore;
use crate::rows::{backend, parse_event, status_columns, ts_to_ns_saturating};

/// The listing: catch-up (within [`CATCH_UP_BUDGET`], the rest in the background), then
/// one query.
pub(crate) async fn list_runs(
    store: &PostgresStore,
    query: &RunQuery,
) -> Result<RunPage, StoreError> {
    query.validate()?;
    let complete = caught_up(store).await?;
    let mut page = page(store, query).await?;
    if !complete {
        page.unindexed = unindexed(store, query.thread_prefix.as_deref()).await?;
    }
    Ok(page)
}

/// Brings the index up to date within [`CATCH_UP_BUDGET`] (the rest left to a background
/// task); `true` when it is complete.
async fn caught_up(store: &PostgresStore) -> Result<bool, StoreError> {
    let options = store.pool.connect_options();
    let key = format!(
        "postgres:{}:{}/{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(""),
        store.schema().unwrap_or("")
    );
    let complete =
        !in_background(&key) && catch_up(store, Some(Instant::now() + CATCH_UP_BUDGET)).await?;
    if !complete {
        let store = store.clone();
        background(key, async move { catch_up(&store, None).await.map(|_| ()) });
    }
    Ok(complete)
}

/// [`keel_core::EventStore::run_facts`]: the same catch-up as a listing, then one query
/// over the threads and the facts of their index rows, in `list_threads`' order.
pub(crate) async fn run_facts(
    store: &PostgresStore,
    query: &FactsQuery,
) -> Result<FactsPage, StoreError> {
    let complete = caught_up(store).await?;
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT t.thread_id, r.facts FROM threads t \
         JOIN run_index r ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
         WHERE r.facts IS NOT NULL",
    );
    if let Some(prefix) = &query.thread_prefix {
        q.push(" AND starts_with(t.thread_id, ")
            .push_bind(prefix.clone())
            .push(")");
    }
    if let Some(agent) = &query.agent {
        q.push(" AND t.agent = ").push_bind(agent.clone());
    }
    if let Some(since) = query.active_since {
        q.push(" AND t.updated_at >= ")
            .push_bind(ts_to_ns_saturating(since));
    }
    q.push(" ORDER BY t.updated_at DESC, t.thread_id ASC");
    let rows: Vec<(String, String)> = q
        .build_query_as()
        .fetch_all(&store.pool)
        .await
        .map_err(|e| backend("postgres read run metrics facts", e))?;
    let mut threads = Vec::with_capacity(rows.len());
    for (thread_id, facts) in rows {
        let runs = read_facts(&thread_id, &facts)?;
        threads.push(ThreadFacts { thread_id, runs });
    }
    let unindexed = if complete {
        0
    } else {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM threads t LEFT JOIN run_index r \
             ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
             WHERE (r.thread_id IS NULL OR r.facts IS NULL) \
             AND ($1::text IS NULL OR starts_with(t.thread_id, $1))",
        )
        .bind(query.thread_prefix.as_deref())
        .fetch_one(&store.pool)
        .await
        .map_err(|e| backend("postgres count threads without facts", e))
        .map(|n| u64::try_from(n).unwrap_or(0))?
    };
    Ok(FactsPage { threads, unindexed })
}

/// Brings the index up to date, step by step, until nothing is stale (`true`) or the
/// deadline passed (`false`). Also stops (`true`) when a step could write none of what it
/// folded: another process is indexing the same threads.
async fn catch_up(store: &PostgresStore, deadline: Option<Instant>) -> Result<bool, StoreError> {
    loop {
        let (stale, full) = stale(store).await?;
        if stale.is_empty() {
            return Ok(true);
        }
        let mut events = events_of(store, &stale).await?;
        let steps: Vec<Indexed> = stale
            .into_iter()
            .filter_map(|thread| {
                let log = events.remove(&thread.thread_id).unwrap_or_default();
                fold(thread, &log)
            })
            .collect();
        let applied = apply(store, &steps).await?;
        if !full || applied == 0 {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
    }
}

/// Threads (under `prefix`) without an index row of their own.
async fn unindexed(store: &PostgresStore, prefix: Option<&str>) -> Result<u64, StoreError> {
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM threads t LEFT JOIN run_index r \
         ON r.thread_id = t.thread_id AND r.created_at = t.created_at \
         WHERE r.thread_id IS NULL AND ($1::text IS NULL OR starts_with(t.thread_id, $1))",
    )
    .bind(prefix)
    .fetch_one(&store.pool)
    .await
    .map_err(|e| backend("postgres count unindexed threads", e))?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// The threads whose row is missing, of another thread, or behind the log, up to the
/// step's bounds. `true`: a bound was hit, so more may be stale.
async fn stale(store: &PostgresStore) -> Result<(Vec<Stale>, bool), StoreError> {
    let rows = sqlx::query(
        "SELECT t.thread_id, t.created_at, t.event_count, r.indexed_count, r.created_at AS indexed_created, \
         r.runs, r.turns, r.tool_calls, r.tool_errors, r.tokens, r.cost, r.model, r.models, r.goal, r.trace_id, \
         r.facts, r.fold_state, r.facts_count \
         FROM threads t LEFT JOIN run_index r ON r.thread_id = t.thread_id \
         WHERE r.thread_id IS NULL OR r.created_at <> t.created_at OR r.indexed_count <> t.event_count \
         OR r.facts_count IS DISTINCT FROM r.indexed_count \
         LIMIT $1",
    )
    .bind(i64::try_from(STEP_THREADS).unwrap_or(i64::MAX))
    .fetch_all(&store.pool)
    .await
    .map_err(|e| backend("postgres find stale run index rows", e))?;
    let mut full = rows.len() >= STEP_THREADS;
    let mut out = Vec::new();
    let mut events = 0i64;
    let decode = |e: sqlx::Error| backend("postgres decode run index row", e);
    for row in rows {
        if events >= i64::try_from(STEP_EVENTS).unwrap_or(i64::MAX) {
            full = true;
            break;
        }
        let thread_id: String = row.try_get("thread_id").map_err(decode)?;
        let created_at: i64 = row.try_get("created_at").map_err(decode)?;
        let count: i64 = row.try_get("event_count").map_err(decode)?;
        let indexed: Option<i64> = row.try_get("indexed_count").map_err(decode)?;
        let indexed_created: Option<i64> = row.try_get("indexed_created").map_err(decode)?;
        let facts_count: Option<i64> = row.try_get("facts_count").map_err(decode)?;
        let metrics = if facts_count == indexed {
            let facts: Option<&str> = row.try_get("facts").map_err(decode)?;
            let fold_state: Option<&str> = row.try_get("fold_state").map_err(decode)?;
            MetricsColumns::read(facts, fold_state)
        } else {
            None
        };
        let base = match (indexed, indexed_created, metrics) {
            (Some(indexed), Some(created), Some(metrics))
                if created == created_at && indexed <= count =>
            {
                Some(IndexRow {
                    indexed_count: indexed,
                    stats: StatsColumns {
                        runs: row.try_get("runs").map_err(decode)?,
                        turns: row.try_get("turns").map_err(decode)?,
                        tool_calls: row.try_get("tool_calls").map_err(decode)?,
                        tool_errors: row.try_get("tool_errors").map_err(decode)?,
                        tokens: row.try_get("tokens").map_err(decode)?,
                        cost: row.try_get("cost").map_err(decode)?,
                        model: row.try_get("model").map_err(decode)?,
                        models: row.try_get("models").map_err(decode)?,
                        goal: row.try_get("goal").map_err(decode)?,
                        trace_id: row.try_get("trace_id").map_err(decode)?,
                    }
                    .into_stats(),
                    metrics,
                })
            }
            _ => None,
        };
        let stale = Stale {
            thread_id,
            created_at,
            base,
        };
        events = events.saturating_add(count.saturating_sub(stale.first_seq()));
        out.push(stale);
    }
    Ok((out, full))
}

/// The events each stale thread gained (everything from its `from_seq`), by thread.
async fn events_of(
    store: &PostgresStore,
    stale: &[Stale],
) -> Result<HashMap<String, Vec<Event>>, StoreError> {
    let ids: Vec<&str> = stale.iter().map(|s| s.thread_id.as_str()).collect();
    let from: Vec<i64> = stale.iter().map(Stale::first_seq).collect();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT e.thread_id, e.body::text FROM events e \
         JOIN UNNEST($1::text[], $2::bigint[]) AS s(thread_id, from_seq) \
         ON e.thread_id = s.thread_id AND e.seq >= s.from_seq ORDER BY e.thread_id, e.seq",
    )
    .bind(ids)
    .bind(from)
    .fetch_all(&store.pool)
    .await
    .map_err(|e| backend("postgres read events to index", e))?;
    let mut out: HashMap<String, Vec<Event>> = HashMap::new();
    for (thread_id, body) in rows {
        let event = parse_event(&thread_id, &body)?;
        out.entry(thread_id).or_default().push(event);
    }
    Ok(out)
}

/// Writes the folded rows in one transaction: each only while its thread exists as
/// folded and over a row that folded fewer of its events; then their text. Returns how
/// many rows were written.
async fn apply(store: &PostgresStore, steps: &[Indexed]) -> Result<usize, StoreError> {
    if steps.is_empty() {
        return Ok(0);
    }
    let columns: Vec<StatsColumns> = steps.iter().map(|s| StatsColumns::of(&s.stats)).collect();
    let metrics: Vec<MetricsColumns> = steps
        .iter()
        .map(|s| MetricsColumns::of(&s.metrics))
        .collect::<Result<_, _>>()?;
    let fail = |what: &str| {
        let what = what.to_string();
        move |e: sqlx::Error| backend(&format!("postgres {what}"), e)
    };
    let mut tx = store.pool.begin().await.map_err(fail("begin"))?;
    let written: Vec<String> = sqlx::query_scalar(
        "INSERT INTO run_index (thread_id, indexed_count, created_at, runs, turns, tool_calls, \
         tool_errors, tokens, cost, model, models, goal, trace_id, facts, fold_state, facts_count) \
         SELECT u.thread_id, u.indexed_count, u.created_at, u.runs, u.turns, u.tool_calls, \
         u.tool_errors, u.tokens, u.cost, u.model, u.models, u.goal, u.trace_id, u.facts, \
         u.fold_state, u.indexed_count \
         FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], \
         $7::bigint[], $8::bigint[], $9::float8[], $10::text[], $11::text[], $12::text[], $13::text[], \
         $14::text[], $15::text[]) \
         AS u(thread_id, indexed_count, created_at, runs, turns, tool_calls, tool_errors, tokens, \
         cost, model, models, goal, trace_id, facts, fold_state) \
         JOIN threads t ON t.thread_id = u.thread_id AND t.created_at = u.created_at \
         ON CONFLICT (thread_id) DO UPDATE SET indexed_count = EXCLUDED.indexed_count, \
         created_at = EXCLUDED.created_at, runs = EXCLUDED.runs, turns = EXCLUDED.turns, \
         tool_calls = EXCLUDED.tool_calls, tool_errors = EXCLUDED.tool_errors, \
         tokens = EXCLUDED.tokens, cost = EXCLUDED.cost, model = EXCLUDED.model, \
         models = EXCLUDED.models, goal = EXCLUDED.goal, trace_id = EXCLUDED.trace_id, \
         facts = EXCLUDED.facts, fold_state = EXCLUDED.fold_state, \
         facts_count = EXCLUDED.facts_count \
         WHERE run_index.created_at <> EXCLUDED.created_at \
         OR run_index.indexed_count < EXCLUDED.indexed_count \
         OR run_index.facts_count IS DISTINCT FROM run_index.indexed_count \
         RETURNING run_index.thread_id",
    )
    .bind(steps.iter().map(|s| s.thread_id.as_str()).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.indexed_count).collect::<Vec<_>>())
    .bind(steps.iter().map(|s| s.created_at).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.runs).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.turns).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.tool_calls).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.tool_errors).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.tokens).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.cost).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.model.clone()).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.models.clone()).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.goal.clone()).collect::<Vec<_>>())
    .bind(columns.iter().map(|c| c.trace_id.clone()).collect::<Vec<_>>())
    .bind(metrics.iter().map(|m| m.facts.as_str()).collect::<Vec<_>>())
    .bind(metrics.iter().map(|m| m.fold_state.as_str()).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await
    .map_err(fail("write run index"))?;
    let written: std::collections::HashSet<String> = written.into_iter().collect();
    let restarted: Vec<&str> = steps
        .iter()
        .filter(|s| s.restart && written.contains(&s.thread_id))
        .map(|s| s.thread_id.as_str())
        .collect();
    if !restarted.is_empty() {
        sqlx::query("DELETE FROM run_text WHERE thread_id = ANY($1)")
            .bind(restarted)
            .execute(&mut *tx)
            .await
            .map_err(fail("drop run text"))?;
    }
    let mut ids = Vec::new();
    let mut from = Vec::new();
    let mut parts = Vec::new();
    let mut bodies = Vec::new();
    for step in steps.iter().filter(|s| written.contains(&s.thread_id)) {
        for (part, body) in step.text.iter().enumerate() {
            ids.push(step.thread_id.as_str());
            from.push(step.from_seq);
            parts.push(i64::try_from(part).unwrap_or(i64::MAX));
            bodies.push(body.as_str());
        }
    }
    if !ids.is_empty() {
        sqlx::query(
            "INSERT INTO run_text (thread_id, from_seq, part, body) \
             SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::text[]) \
             ON CONFLICT (thread_id, from_seq, part) DO UPDATE SET body = EXCLUDED.body",
        )
        .bind(ids)
        .bind(from)
        .bind(parts)
        .bind(bodies)
        .execute(&mut *tx)
        .await
        .map_err(fail("write run text"))?;
    }
    tx.commit().await.map_err(fail("commit run index"))?;
    Ok(written.len())
}

/// The page: one query over the threads and their index rows. Thread ids compare
/// byte-wise (`COLLATE "C"`) whatever the database's collation, like the other stores.
async fn page(store: &PostgresStore, query: &RunQuery) -> Result<RunPage, StoreError> {
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT t.thread_id, t.agent, t.status, t.end_state, t.event_count, t.created_at, \
         t.updated_at, r.runs, r.turns, r.tool_calls, r.tool_errors, r.tokens, r.cost, r.model, \
         r.models, r.goal, r.trace_id FROM threads t \
         JOIN run_index r ON r.thread_id = t.thread_id AND r.created_at = t.created_at WHERE TRUE",
    );
    if let Some(prefix) = &query.thread_prefix {
        q.push(" AND starts_with(t.thread_id, ")
            .push_bind(prefix.clone())
            .push(")");
    }
    if let Some(status) = query.status {
        let (s, e) = status_columns(status);
        q.push(" AND t.status = ").push_bind(s);
        if let Some(e) = e {
            q.push(" AND t.end_state = ").push_bind(e);
        }
    }
    if let Some(agent) = &query.agent {
        q.push(" AND t.agent = ").push_bind(agent.clone());
    }
    if let Some(model) = query.model_needle() {
        q.push(" AND strpos(lower(r.models), ")
            .push_bind(model)
            .push(") > 0");
    }
    if let Some(since) = query.active_since {
        q.push(" AND t.updated_at >= ")
            .push_bind(ts_to_ns_saturating(since));
    }
    if let Some(before) = query.started_before {
        q.push(" AND t.created_at <= ")
            .push_bind(ts_to_ns_saturating(before));
    }
    if let Some(needle) = query.text_needle() {
        // LIKE, so the trigram index (migration 0007) can answer it; `\\` escapes.
        q.push(" AND t.thread_id IN (SELECT thread_id FROM run_text WHERE body LIKE ")
            .push_bind(like_pattern(&no_nul(&needle)))
            .push(")");
    }
    let key = sort_expression(query.sort);
    if let Some(after) = &query.after {
        let op = after_operator(query);
        q.push(format!(" AND ({key} {op} "));
        push_value(&mut q, after.value);
        q.push(format!(" OR ({key} = "));
        push_value(&mut q, after.value);
        q.push(" AND t.thread_id COLLATE \"C\" > ")
            .push_bind(after.thread_id.clone())
            .push("))");
    }
    let direction = if query.ascending { "ASC" } else { "DESC" };
    q.push(format!(
        " ORDER BY {key} {direction}, t.thread_id COLLATE \"C\" ASC LIMIT "
    ))
    .push_bind(
        i64::try_from(query.page_size())
            .unwrap_or(i64::MAX)
            .saturating_add(1),
    );
    let rows = q
        .build()
        .fetch_all(&store.pool)
        .await
        .map_err(|e| backend("postgres list runs", e))?;
    let decode = |e: sqlx::Error| backend("postgres decode runs row", e);
    let mut runs = Vec::with_capacity(rows.len());
    for row in rows {
        let thread = ThreadColumns {
            thread_id: row.try_get("thread_id").map_err(decode)?,
            agent: row.try_get("agent").map_err(decode)?,
            status: row.try_get("status").map_err(decode)?,
            end_state: row.try_get("end_state").map_err(decode)?,
            event_count: row.try_get("event_count").map_err(decode)?,
            created_at: row.try_get("created_at").map_err(decode)?,
            updated_at: row.try_get("updated_at").map_err(decode)?,
        };
        let stats = StatsColumns {
            runs: row.try_get("runs").map_err(decode)?,
            turns: row.try_get("turns").map_err(decode)?,
            tool_calls: row.try_get("tool_calls").map_err(decode)?,
            tool_errors: row.try_get("tool_errors").map_err(decode)?,
            tokens: row.try_get("tokens").map_err(decode)?,
            cost: row.try_get("cost").map_err(decode)?,
            model: row.try_get("model").map_err(decode)?,
            models: row.try_get("models").map_err(decode)?,
            goal: row.try_get("goal").map_err(decode)?,
            trace_id: row.try_get("trace_id").map_err(decode)?,
        };
        runs.push(summary(thread, stats)?);
    }
    Ok(page_of(runs, query))
}

/// `%text%` with `\\`, `%` and `_` escaped (LIKE's default escape character).
fn like_pattern(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('%');
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

fn push_value(q: &mut QueryBuilder<Postgres>, value: SortValue) {
    match value {
        SortValue::Int(v) => q.push_bind(v),
        SortValue::Float(v) => q.push_bind(v),
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn like_patterns_match_the_text_literally() {
        assert_eq!(super::like_pattern("50%_off\\x"), "%50\\%\\_off\\\\x%");
        assert_eq!(super::like_pattern(""), "%%");
    }
}
