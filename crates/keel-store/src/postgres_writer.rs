//! The Postgres group-commit writer: appends from every concurrent run of this process are
//! gathered into groups, and each group is ONE call of the `keel_append_group` SQL
//! function (migrations `0002_append_group.sql` and `0009_append_group_linear.sql`): one
//! round trip, one transaction, one WAL flush at commit, instead of four round trips and a
//! flush per append.
//!
//! Per-append semantics are those of a lone append: the function handles the appends in
//! order, a conflict (the guarded `UPDATE` of the summary row touches no row) writes
//! nothing of that append, and two appends to one thread in one group behave like
//! sequential appends. The group runs in one subtransaction; if anything raises (e.g. the
//! `(thread_id, seq)` primary key on a corrupt log) it runs again with one subtransaction
//! per append, so such a failure still fails that append alone. Several groups
//! (and several processes) may be in flight at once; row locks serialize appends to one
//! thread across them exactly as before. Each group locks its threads in `thread_id`
//! order (a stable sort keeps one thread's appends in arrival order), so two groups can
//! never deadlock on each other; a deadlock with some other transaction (e.g. a purge) is
//! retried as a whole.
//!
//! Fenced appends ([`keel_core::AppendFence`], a worker's or a command's lease) ride in the
//! same groups: a group holding any runs in a transaction that first reads those leases'
//! run-queue rows `FOR SHARE` (in job order) and checks them by the database's clock, so
//! an append whose lease was taken over, ended or lapsed writes nothing — at the price of
//! three more round trips for that group, shared by every append in it.
//!
//! Sessions run with `synchronous_commit = on` (set on connect), so a reply always means
//! the commit is on the server's stable storage: [`keel_core::AppendDurability::Sync`]
//! needs nothing more.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::store::StoreError;
use sqlx::postgres::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;

use crate::rows::{Batch, FencedRow, backend, conflict, fence_refusal, status_columns};

/// Most appends in one group.
const MAX_GROUP: usize = 512;

/// Appends that may wait before senders wait for room.
const QUEUE_CAPACITY: usize = 4096;

/// Attempts of a group that hit a deadlock or serialization failure.
const GROUP_ATTEMPTS: u32 = 3;

/// One append waiting for its group.
pub(crate) struct PendingAppend {
    pub thread_id: String,
    pub expected: i64,
    pub batch: Batch,
    /// The lease the append is conditional on, if any.
    pub fence: Option<keel_core::AppendFence>,
    pub reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Handle to the writer task, shared by every clone of a store.
pub(crate) struct PgGroupWriter {
    sender: Mutex<Option<mpsc::Sender<PendingAppend>>>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

impl std::fmt::Debug for PgGroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgGroupWriter").finish_non_exhaustive()
    }
}

impl PgGroupWriter {
    /// Starts the writer task on the current Tokio runtime. At most `in_flight` groups
    /// run at once; `call_timeout` bounds one group's round trip.
    pub(crate) fn start(pool: PgPool, in_flight: usize, call_timeout: Duration) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE_CAPACITY);
        let (stopped_tx, stopped_rx) = oneshot::channel();
        tokio::spawn(async move {
            run_loop(pool, receiver, in_flight.max(1), call_timeout).await;
            let _ = stopped_tx.send(());
        });
        Self {
            sender: Mutex::new(Some(sender)),
            stopped: Mutex::new(Some(stopped_rx)),
        }
    }

    /// Queues an append and waits for its group to commit. With a `fence`
    /// ([`keel_core::AppendFence`]) the append is written only while that lease holds: its
    /// group then runs in a transaction that first reads the fenced leases' run-queue rows
    /// `FOR SHARE` — a takeover, renewal or completion of those jobs waits for the group's
    /// commit, and the read sees theirs — and checks each by the database's clock; an
    /// append whose lease is gone is answered [`StoreError::Fenced`] and left out.
    pub(crate) async fn append(
        &self,
        thread_id: String,
        expected: i64,
        batch: Batch,
        fence: Option<keel_core::AppendFence>,
    ) -> Result<(), StoreError> {
        let sender = lock(&self.sender).clone().ok_or_else(|| {
            StoreError::Backend("the Postgres store is closed: connect again to write".into())
        })?;
        let (reply, answer) = oneshot::channel();
        sender
            .send(PendingAppend {
                thread_id,
                expected,
                batch,
                fence,
                reply,
            })
            .await
            .map_err(|_| {
                StoreError::Backend(
                    "the Postgres append writer has stopped (was its Tokio runtime shut down?): connect again".into(),
                )
            })?;
        drop(sender);
        answer.await.map_err(|_| {
            StoreError::Backend("the Postgres append writer stopped before answering".into())
        })?
    }

    /// Stops accepting appends and waits until the queued ones are answered.
    pub(crate) async fn close(&self) {
        drop(lock(&self.sender).take());
        let stopped = lock(&self.stopped).take();
        if let Some(stopped) = stopped {
            let _ = stopped.await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

async fn run_loop(
    pool: PgPool,
    mut receiver: mpsc::Receiver<PendingAppend>,
    in_flight: usize,
    call_timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(in_flight));
    let mut running = JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let Some(first) = receiver.recv().await else {
            break;
        };
        let mut group = Vec::with_capacity(MAX_GROUP.min(64));
        group.push(first);
        while group.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        let pool = pool.clone();
        running.spawn(async move {
            commit_group(&pool, group, call_timeout).await;
            drop(permit);
        });
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// The per-append answers of one `keel_append_group` call.
type GroupRows = Vec<(Option<i64>, Option<String>)>;

async fn commit_group(pool: &PgPool, mut group: Vec<PendingAppend>, call_timeout: Duration) {
    // Lock threads in a fixed order (stable: one thread's appends keep their order).
    group.sort_by(|a, b| a.thread_id.cmp(&b.thread_id));
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        let call = tokio::time::timeout(call_timeout, run_group(pool, &group)).await;
        match call {
            Err(_) => {
                break Err(StoreError::Backend(format!(
                    "postgres append group timed out after {call_timeout:?}; whether it committed is unknown (reload the thread)"
                )));
            }
            Ok(Err(e)) if attempt < GROUP_ATTEMPTS && is_retryable(&e) => continue,
            Ok(Err(e)) => break Err(backend("postgres append group", e)),
            Ok(Ok(answers)) => break answers,
        }
    };
    match outcome {
        Ok(answers) => {
            for (append, answer) in group.into_iter().zip(answers) {
                let _ = append.reply.send(answer);
            }
        }
        Err(error) => {
            for append in group {
                let _ = append.reply.send(Err(error.clone()));
            }
        }
    }
}

/// Runs one group: a lone `keel_append_group` call, or — when appends of it are fenced —
/// that call inside a transaction that first checks their leases (see
/// [`PgGroupWriter::append`]). Answers each append in order; `Err` is the call's own
/// failure (retried when it is a deadlock or serialization failure).
async fn run_group(
    pool: &PgPool,
    group: &[PendingAppend],
) -> Result<Result<Vec<Result<(), StoreError>>, StoreError>, sqlx::Error> {
    let fences: Vec<i64> = group
        .iter()
        .filter_map(|append| append.fence.map(|fence| fence.job_id))
        .collect();
    if fences.is_empty() {
        let appends: Vec<(&str, i64, &Batch)> = group.iter().map(PendingAppend::parts).collect();
        let rows = call_group(pool, &appends).await?;
        return Ok(answers(group.iter(), rows));
    }
    let mut tx = pool.begin().await?;
    // In job order, so two groups lock the same leases in one order.
    let leases: Vec<(i64, String, i64, bool)> = sqlx::query_as(
        "SELECT job_id, state, lease_token, COALESCE(lease_expires_at > now(), false) \
         FROM run_queue WHERE job_id = ANY($1) ORDER BY job_id FOR SHARE",
    )
    .bind(&fences)
    .fetch_all(&mut *tx)
    .await?;
    let refusals: Vec<Option<StoreError>> = group
        .iter()
        .map(|append| {
            let fence = append.fence?;
            let found = leases
                .iter()
                .find(|(job_id, ..)| *job_id == fence.job_id)
                .map(|(_, state, token, live)| FencedRow {
                    state: state.clone(),
                    token: *token,
                    live: *live,
                });
            fence_refusal(&append.thread_id, fence, found)
        })
        .collect();
    let admitted: Vec<&PendingAppend> = group
        .iter()
        .zip(&refusals)
        .filter(|(_, refused)| refused.is_none())
        .map(|(append, _)| append)
        .collect();
    let rows = if admitted.is_empty() {
        Vec::new()
    } else {
        let appends: Vec<(&str, i64, &Batch)> =
            admitted.iter().map(|append| append.parts()).collect();
        call_group(&mut *tx, &appends).await?
    };
    tx.commit().await?;
    let mut written = match answers(admitted.into_iter(), rows) {
        Ok(written) => written.into_iter(),
        Err(failure) => return Ok(Err(failure)),
    };
    Ok(Ok(refusals
        .into_iter()
        .map(|refused| match refused {
            Some(refused) => Err(refused),
            None => written.next().unwrap_or_else(|| {
                Err(StoreError::Backend(
                    "postgres append group answered too few rows".into(),
                ))
            }),
        })
        .collect()))
}

/// Each append's answer from its row of one `keel_append_group` call; a call that
/// answered another number of rows than appends fails as a whole.
fn answers<'a>(
    appends: impl ExactSizeIterator<Item = &'a PendingAppend>,
    rows: GroupRows,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    if rows.len() != appends.len() {
        return Err(StoreError::Backend(format!(
            "postgres append group answered {} rows for {} appends",
            rows.len(),
            appends.len()
        )));
    }
    Ok(appends
        .zip(rows)
        .map(|(append, row)| answer(&append.thread_id, append.expected, row))
        .collect())
}

impl PendingAppend {
    /// What `keel_append_group` needs of it: thread, expected next seq, batch.
    fn parts(&self) -> (&str, i64, &Batch) {
        (self.thread_id.as_str(), self.expected, &self.batch)
    }
}

/// One append's answer from its row of `keel_append_group`: a failure, a conflict (the
/// log's actual length), or written.
fn answer(
    thread_id: &str,
    expected: i64,
    (actual, failure): (Option<i64>, Option<String>),
) -> Result<(), StoreError> {
    match (actual, failure) {
        (_, Some(message)) => Err(StoreError::Backend(format!(
            "postgres append to thread {thread_id}: {message}"
        ))),
        (Some(actual), None) => Err(conflict(
            thread_id,
            u64::try_from(expected).unwrap_or(0),
            actual,
        )),
        (None, None) => Ok(()),
    }
}

/// Deadlocks and serialization failures abort the whole call and may simply be retried.
fn is_retryable(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40P01" | "40001")))
}

/// One `keel_append_group` call for `group`'s appends: (thread, expected next seq, batch).
async fn call_group<'c, X: sqlx::PgExecutor<'c>>(
    executor: X,
    group: &[(&str, i64, &Batch)],
) -> Result<GroupRows, sqlx::Error> {
    let n = group.len();
    let total: usize = group.iter().map(|(_, _, batch)| batch.rows.len()).sum();
    let mut threads = Vec::with_capacity(n);
    let mut expected = Vec::with_capacity(n);
    let mut statuses: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut end_states: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut agents: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut first_ts = Vec::with_capacity(n);
    let mut last_ts = Vec::with_capacity(n);
    let mut init_status = Vec::with_capacity(n);
    let mut init_end: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut ev_from: Vec<i32> = Vec::with_capacity(n);
    let mut ev_to: Vec<i32> = Vec::with_capacity(n);
    let mut seqs = Vec::with_capacity(total);
    let mut kinds = Vec::with_capacity(total);
    let mut runs = Vec::with_capacity(total);
    let mut ts = Vec::with_capacity(total);
    let mut bodies = Vec::with_capacity(total);
    for &(thread_id, expected_seq, batch) in group {
        threads.push(thread_id);
        expected.push(expected_seq);
        let (status, end_state) = match batch.status.map(status_columns) {
            Some((s, e)) => (Some(s), e),
            None => (None, None),
        };
        statuses.push(status);
        end_states.push(end_state);
        agents.push(batch.agent.as_deref());
        first_ts.push(batch.first_ts);
        last_ts.push(batch.last_ts);
        let (s, e) = status_columns(batch.initial_status());
        init_status.push(s);
        init_end.push(e);
        ev_from.push(i32::try_from(seqs.len() + 1).unwrap_or(i32::MAX));
        for row in &batch.rows {
            seqs.push(row.seq);
            kinds.push(row.kind);
            runs.push(&*row.run_id);
            ts.push(row.ts);
            bodies.push(batch.body(row));
        }
        ev_to.push(i32::try_from(seqs.len()).unwrap_or(i32::MAX));
    }
    sqlx::query_as(
        "SELECT actual, failure FROM keel_append_group($1::text[], $2::bigint[], $3::text[], \
         $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::int[], \
         $11::int[], $12::bigint[], $13::text[], $14::text[], $15::bigint[], $16::text[])",
    )
    .bind(threads)
    .bind(expected)
    .bind(statuses)
    .bind(end_states)
    .bind(agents)
    .bind(first_ts)
    .bind(last_ts)
    .bind(init_status)
    .bind(init_end)
    .bind(ev_from)
    .bind(ev_to)
    .bind(seqs)
    .bind(kinds)
    .bind(runs)
    .bind(ts)
    .bind(bodies)
    .fetch_all(executor)
    .await
}
