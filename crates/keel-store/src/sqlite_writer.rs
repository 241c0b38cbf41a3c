//! The SQLite group-commit writer: one dedicated OS thread owning one `rusqlite`
//! connection performs every write of a [`crate::SqliteStore`] (appends, fork, delete,
//! purge, run-queue updates).
//!
//! Callers send closures over a bounded channel and await a oneshot reply. The thread
//! takes the first waiting job, drains whatever else is queued (up to [`MAX_GROUP`]) and
//! runs them all in ONE `BEGIN IMMEDIATE` transaction, each under its own `SAVEPOINT`: a
//! job that fails (a conflict, a bad row) is rolled back to its savepoint alone, so it
//! never fails nor partially writes the other jobs of its group. Jobs run in arrival
//! order, so two appends to one thread in one group behave exactly like sequential
//! appends. Every caller is answered only after the group's `COMMIT` returned (one WAL
//! write, and one fsync when the commit is synchronous), so a reply means "durable at the
//! level asked for". No artificial delay is added: under load, jobs pile up while the
//! previous group commits and the next group takes them all; alone, a job commits at once.
//!
//! A job may ask for a synchronous commit ([`AppendDurability::Sync`]): its group then
//! commits with `synchronous=FULL` (the pragma cannot change inside a transaction, so it
//! is set before `BEGIN` and restored after `COMMIT`), which fsyncs the WAL and with it
//! every earlier commit.
//!
//! Hand-written rather than a crate: no maintained crate does group commit for SQLite;
//! the loop is short and its rules (savepoint per job, reply after commit) are the point.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use keel_core::store::{AppendDurability, StoreError};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

/// Most jobs in one transaction (bounds the latency of the first job of a big group).
pub(crate) const MAX_GROUP: usize = 512;

/// Jobs that may wait in the channel before senders wait for room.
const QUEUE_CAPACITY: usize = 4096;

/// The writer failed or is gone; converted into the caller's error type.
#[derive(Debug, Clone)]
pub(crate) struct WriterFailure(pub String);

impl From<WriterFailure> for StoreError {
    fn from(failure: WriterFailure) -> Self {
        StoreError::Backend(failure.0)
    }
}

impl From<WriterFailure> for crate::queue::QueueError {
    fn from(failure: WriterFailure) -> Self {
        crate::queue::QueueError::Backend(failure.0)
    }
}

/// One unit of work run inside a group transaction.
trait Job: Send {
    /// Runs the work under the job's savepoint; returns whether to keep its writes.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Whether the group must commit synchronously for this job.
    fn wants_sync(&self) -> bool;
    /// Answers the caller once the group's fate is known (`Some`: it did not commit).
    fn finish(self: Box<Self>, group_failure: Option<&WriterFailure>);
}

/// A typed job: the closure, its result once run, and the caller's reply channel.
struct Call<T, E, F> {
    work: Option<F>,
    result: Option<Result<T, E>>,
    sync: bool,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<T, E, F> Job for Call<T, E, F>
where
    T: Send,
    E: Send + From<WriterFailure>,
    F: FnOnce(&Connection) -> Result<T, E> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let result = work(conn);
        let keep = result.is_ok();
        self.result = Some(result);
        keep
    }

    fn wants_sync(&self) -> bool {
        self.sync
    }

    fn finish(self: Box<Self>, group_failure: Option<&WriterFailure>) {
        let answer = match (group_failure, self.result) {
            // A job that failed on its own keeps its own error (it wrote nothing anyway).
            (_, Some(Err(own))) => Err(own),
            (Some(failure), _) => Err(E::from(failure.clone())),
            (None, Some(Ok(value))) => Ok(value),
            (None, None) => Err(E::from(WriterFailure(
                "SQLite writer: job was not run".into(),
            ))),
        };
        // The caller may have stopped waiting (its future was dropped): nothing to do.
        let _ = self.reply.send(answer);
    }
}

/// How the writer's connection is set up.
#[derive(Debug, Clone)]
pub(crate) struct WriterConfig {
    /// Database file (already created and migrated).
    pub path: PathBuf,
    /// `synchronous=FULL` for every commit (else NORMAL).
    pub full_sync: bool,
    /// How long `BEGIN IMMEDIATE` waits for another process's write lock.
    pub busy_timeout: Duration,
}

/// Handle to the writer thread, shared by every clone of a store.
pub(crate) struct SqliteWriter {
    sender: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter").finish_non_exhaustive()
    }
}

impl SqliteWriter {
    /// Opens the writer's connection on a new thread and starts the loop.
    pub(crate) async fn start(config: WriterConfig) -> Result<Self, StoreError> {
        let (sender, receiver) = mpsc::channel::<Box<dyn Job>>(QUEUE_CAPACITY);
        let (opened_tx, opened_rx) = oneshot::channel::<Result<(), StoreError>>();
        let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
        let name = format!("keel-sqlite-writer:{}", config.path.display());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let conn = match open_connection(&config) {
                    Ok(conn) => {
                        let _ = opened_tx.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                run_loop(&conn, receiver, config.full_sync);
                drop(conn);
                let _ = stopped_tx.send(());
            })
            .map_err(|e| {
                StoreError::Backend(format!("cannot start the SQLite writer thread: {e}"))
            })?;
        opened_rx.await.map_err(|_| {
            StoreError::Backend("the SQLite writer thread stopped while opening".into())
        })??;
        Ok(Self {
            sender: Mutex::new(Some(sender)),
            stopped: Mutex::new(Some(stopped_rx)),
        })
    }

    /// Runs `work` on the writer thread inside the next group transaction and returns its
    /// result once that transaction committed (or the group's failure if it did not).
    /// `Err` results roll back only this job's writes.
    pub(crate) async fn call<T, E, F>(&self, durability: AppendDurability, work: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + From<WriterFailure> + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let sender = lock(&self.sender).clone().ok_or_else(|| {
            E::from(WriterFailure(
                "the SQLite store is closed: open it again to write".into(),
            ))
        })?;
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Call {
            work: Some(work),
            result: None,
            sync: matches!(durability, AppendDurability::Sync),
            reply,
        });
        sender.send(job).await.map_err(|_| {
            E::from(WriterFailure(
                "the SQLite writer thread has stopped: reopen the store".into(),
            ))
        })?;
        drop(sender);
        answer.await.map_err(|_| {
            E::from(WriterFailure(
                "the SQLite writer thread stopped before answering: reopen the store".into(),
            ))
        })?
    }

    /// Stops accepting work, lets the writer finish the jobs already queued (their callers
    /// get their results) and waits until its connection is closed.
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

fn open_connection(config: &WriterConfig) -> Result<Connection, StoreError> {
    let fail = |what: &str, e: rusqlite::Error| {
        StoreError::Backend(format!(
            "SQLite writer {what} on {}: {e}",
            config.path.display()
        ))
    };
    let conn = Connection::open(&config.path).map_err(|e| fail("open", e))?;
    conn.busy_timeout(config.busy_timeout)
        .map_err(|e| fail("busy_timeout", e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| fail("journal_mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "SQLite store {} could not switch to WAL (journal_mode is {mode})",
            config.path.display()
        )));
    }
    // temp_store=MEMORY keeps the savepoints' sub-journals in memory: on a temporary
    // file, journaling every page a job touches cost more CPU than the job itself. A 32 MB
    // page cache (default 2 MB) keeps a big group's dirty pages and the hot index pages in
    // memory instead of spilling and re-reading them (measured: see docs/durability.md).
    conn.execute_batch(if config.full_sync {
        "PRAGMA synchronous = FULL;"
    } else {
        "PRAGMA synchronous = NORMAL;"
    })
    .and_then(|()| {
        conn.execute_batch(
            "PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -32000;",
        )
    })
    .map_err(|e| fail("pragmas", e))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Takes groups off the channel until every sender is gone.
fn run_loop(conn: &Connection, mut receiver: mpsc::Receiver<Box<dyn Job>>, full_sync: bool) {
    let mut group: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = receiver.blocking_recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(conn, &mut group, full_sync);
    }
}

/// Runs one group in one transaction and answers every job in it.
fn commit_group(conn: &Connection, group: &mut Vec<Box<dyn Job>>, full_sync: bool) {
    let raise_sync = !full_sync && group.iter().any(|job| job.wants_sync());
    let failure = run_group(conn, group, raise_sync).err();
    if raise_sync {
        // Back to the store's level; if this fails the next commits are merely safer.
        let _ = conn.execute_batch("PRAGMA synchronous = NORMAL");
    }
    for job in group.drain(..) {
        job.finish(failure.as_ref());
    }
}

fn run_group(
    conn: &Connection,
    group: &mut [Box<dyn Job>],
    raise_sync: bool,
) -> Result<(), WriterFailure> {
    let fail = |what: &str, e: rusqlite::Error| WriterFailure(format!("SQLite {what}: {e}"));
    if raise_sync {
        conn.execute_batch("PRAGMA synchronous = FULL")
            .map_err(|e| fail("raising synchronous to FULL", e))?;
    }
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| fail("begin", e))?;
    let single = group.len() == 1;
    for job in group.iter_mut() {
        if single {
            // One job: the transaction itself is its savepoint.
            if !job.run(conn) {
                return rollback(conn).map_err(|e| fail("rollback", e));
            }
            continue;
        }
        if let Err(e) = conn.execute_batch("SAVEPOINT job") {
            let failure = fail("savepoint", e);
            let _ = rollback(conn);
            return Err(failure);
        }
        let keep = job.run(conn);
        let end = if keep {
            conn.execute_batch("RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        if let Err(e) = end {
            let failure = fail("ending savepoint", e);
            let _ = rollback(conn);
            return Err(failure);
        }
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let failure = fail("commit", e);
        let _ = rollback(conn);
        return Err(failure);
    }
    Ok(())
}

fn rollback(conn: &Connection) -> Result<(), rusqlite::Error> {
    if conn.is_autocommit() {
        return Ok(());
    }
    conn.execute_batch("ROLLBACK")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    async fn writer(dir: &tempfile::TempDir, full_sync: bool) -> SqliteWriter {
        SqliteWriter::start(WriterConfig {
            path: dir.path().join("w.db"),
            full_sync,
            busy_timeout: Duration::from_secs(5),
        })
        .await
        .unwrap()
    }

    fn synchronous(conn: &Connection) -> Result<i64, StoreError> {
        conn.query_row("PRAGMA synchronous", [], |row| row.get(0))
            .map_err(|e| StoreError::Backend(e.to_string()))
    }

    /// A Sync job's group commits with synchronous=FULL (2); the level goes back to NORMAL
    /// (1) for the next default group.
    #[tokio::test]
    async fn sync_request_raises_the_commit_level_for_its_group_only() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&dir, false).await;
        let level = |d| w.call(d, synchronous);
        assert_eq!(level(AppendDurability::Default).await.unwrap(), 1);
        assert_eq!(level(AppendDurability::Sync).await.unwrap(), 2);
        assert_eq!(level(AppendDurability::Default).await.unwrap(), 1);
        w.close().await;
        let full = writer(&dir, true).await;
        assert_eq!(
            full.call(AppendDurability::Default, synchronous)
                .await
                .unwrap(),
            2
        );
        full.close().await;
    }

    /// A failing job is rolled back alone; the jobs around it in its group commit.
    #[tokio::test]
    async fn failing_job_rolls_back_alone() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&dir, false).await;
        w.call(AppendDurability::Default, |c: &Connection| {
            c.execute_batch("CREATE TABLE t (x INTEGER UNIQUE)")
                .map_err(|e| StoreError::Backend(e.to_string()))
        })
        .await
        .unwrap();
        let insert = |x: i64, then_fail: bool| {
            w.call(AppendDurability::Default, move |c: &Connection| {
                c.execute("INSERT INTO t VALUES (?1)", [x])
                    .map_err(|e| StoreError::Backend(e.to_string()))?;
                if then_fail {
                    return Err(StoreError::Conflict {
                        thread_id: "t".into(),
                        expected: 0,
                        actual: 0,
                    });
                }
                Ok(())
            })
        };
        let results = futures::future::join_all((0..30).map(|x| insert(x, x % 3 == 0))).await;
        for (x, result) in results.iter().enumerate() {
            assert_eq!(result.is_ok(), x % 3 != 0, "job {x}: {result:?}");
        }
        let rows: Vec<i64> = w
            .call(AppendDurability::Default, |c: &Connection| {
                let mut stmt = c
                    .prepare("SELECT x FROM t ORDER BY x")
                    .map_err(|e| StoreError::Backend(e.to_string()))?;
                stmt.query_map([], |r| r.get(0))
                    .and_then(|rows| rows.collect())
                    .map_err(|e| StoreError::Backend(e.to_string()))
            })
            .await
            .unwrap();
        assert_eq!(rows, (0..30).filter(|x| x % 3 != 0).collect::<Vec<_>>());
        w.close().await;
    }

    /// After close, calls fail at once with an error saying so.
    #[tokio::test]
    async fn closed_writer_refuses_work() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&dir, false).await;
        w.close().await;
        let err = w.call(AppendDurability::Default, synchronous).await;
        assert!(
            matches!(&err, Err(StoreError::Backend(m)) if m.contains("closed")),
            "{err:?}"
        );
        w.close().await;
    }
}
