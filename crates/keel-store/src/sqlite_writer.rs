//! The SQLite group-commit writer: one `rusqlite` connection performs every write of a
//! [`crate::SqliteStore`] (appends, fork, delete, purge, run-queue updates), one group of
//! jobs at a time.
//!
//! Callers hand over closures and await a reply. Whoever finds the writer idle commits:
//!
//! - **inline**: a caller that finds the writer idle and the queue empty runs its own job
//!   at once on its own thread (a commit in WAL mode without fsync is tens of
//!   microseconds). A sequential agent — the common case — then pays no thread handoff
//!   at all: measured, the two wake-ups of a handoff cost as much CPU as the commit.
//! - **background**: while a group commits, newcomers queue up; the committer then hands
//!   the queue to a dedicated thread, which takes up to [`MAX_GROUP`] jobs and runs them
//!   all in ONE `BEGIN IMMEDIATE` transaction, and loops until the queue is empty. Work
//!   that may block — a synchronous commit (fsync), waiting for another process's write
//!   lock, checkpoints — only ever runs there, never on an async runtime's thread: the
//!   inline path gives up at once when the database is locked (the busy handler below)
//!   and re-queues its job for the background thread.
//! - **gathering**: once a commit has ended with other jobs queued behind it, appends are
//!   concurrent, and for the next [`CONCURRENT_FOR`] a caller that finds the writer idle
//!   does not commit alone inline: its job is queued for the background thread, which
//!   holds a group until it has [`MAX_GROUP`] jobs or its oldest job has waited
//!   [`GATHER_WINDOW`]. Many runs in flight then share a few large transactions instead
//!   of each paying a commit of its own on an async runtime thread (`./scripts/bench`,
//!   W2, 500 concurrent runs: wall −16 to −29 %); a sequential caller never has a job
//!   queued behind its commit, so it keeps the inline path and waits for nothing.
//!   [`GATHER_WINDOW`] is the only delay the writer ever adds.
//!
//! In a group each job runs under its own `SAVEPOINT`: a job that fails (a conflict, a bad
//! row) is rolled back to its savepoint alone, so it never fails nor partially writes the
//! other jobs of its group. Appends skip the savepoint ([`Guard::Unwritten`]): they check
//! before they write, so a conflict writes nothing; should one fail after a statement of
//! it completed (disk full, an I/O error), the whole group is rolled back and each of its
//! jobs fails. Two fewer statements per append in a group (W2: CPU −11 %). Jobs run in
//! arrival order, so two appends to one thread in one group behave exactly like
//! sequential appends. Every caller is answered only after its group's `COMMIT` returned
//! (one WAL write, and one fsync when the commit is synchronous), so a reply means
//! "durable at the level asked for". Apart from the gather window of concurrent appends
//! (above), no delay is added.
//!
//! A job may ask for a synchronous commit ([`AppendDurability::Sync`]): its group then
//! commits with `synchronous=FULL` (the pragma cannot change inside a transaction, so it
//! is set before `BEGIN` and restored after `COMMIT`), which fsyncs the WAL and with it
//! every earlier commit.
//!
//! The WAL is checkpointed by the background thread (PASSIVE, every
//! [`CHECKPOINT_EVERY`] commits) instead of SQLite's automatic checkpoint, which would run
//! — with its fsyncs — inside whichever commit crossed the threshold, inline ones too.
//! Before each group's statements run, under its `BEGIN IMMEDIATE`, the WAL file is grown
//! ahead of its content if needed ([`crate::sqlite_wal`]), so commits do not extend it.
//!
//! Hand-written rather than a crate: no maintained crate does group commit for SQLite;
//! the rules (savepoint per job, reply after commit, one committer at a time) are the
//! point.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use keel_core::store::{AppendDurability, StoreError};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::sqlite_wal::WalGrowth;

/// Most jobs in one transaction (bounds the latency of the first job of a big group).
pub(crate) const MAX_GROUP: usize = 512;

/// After a commit that had jobs queued behind it, how long appends count as concurrent.
pub(crate) const CONCURRENT_FOR: Duration = Duration::from_millis(10);

/// While appends are concurrent, how long the background thread may hold the oldest
/// queued job to gather more into its group. 2 ms rather than 0.5: `./scripts/bench` W2
/// on one VM, SQLite's wall over the memory store's 0.98–1.20× (mean 1.13, 12 runs)
/// against 1.09–1.28× (mean 1.18, 16 runs) — fewer, larger groups; the added wait is
/// small beside any model call (docs/performance.md).
pub(crate) const GATHER_WINDOW: Duration = Duration::from_micros(2000);

/// Commits between two PASSIVE checkpoints of the WAL (a few pages each: the WAL stays
/// within some tens of MB).
pub(crate) const CHECKPOINT_EVERY: u64 = 1024;

thread_local! {
    /// How long this thread's SQLite calls may wait for another connection's lock:
    /// `None` (every thread but the background writer) gives up at once.
    static BUSY_WAIT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// The writer connection's busy handler: waits (sleeping 1, 2, … up to 25 ms between
/// tries) only on the background thread, up to its configured timeout.
fn busy_handler(tries: i32) -> bool {
    let Some(limit) = BUSY_WAIT.with(Cell::get) else {
        return false;
    };
    let tries = u64::try_from(tries).unwrap_or(0);
    let waited_ms: u64 = (0..tries).map(|i| (i + 1).min(25)).sum();
    if u128::from(waited_ms) >= limit.as_millis() {
        return false;
    }
    std::thread::sleep(Duration::from_millis((tries + 1).min(25)));
    true
}

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
    /// How the job's writes are undone when it fails in a group.
    fn guard(&self) -> Guard;
    /// Answers the caller once the group's fate is known (`Some`: it did not commit).
    fn finish(self: Box<Self>, group_failure: Option<&WriterFailure>);
}

/// How a job that fails inside a group is kept from committing part of its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The job runs under its own `SAVEPOINT` and a failure rolls back to it: any job.
    Savepoint,
    /// No savepoint: the job promises to fail before its first write (a failed check)
    /// or by an error of SQLite's. A failure after one of its statements completed (seen
    /// in the connection's change count) rolls back the whole group. For appends.
    Unwritten,
}

/// A typed job: the closure, its result once run, and the caller's reply channel.
struct Call<T, E, F> {
    work: Option<F>,
    result: Option<Result<T, E>>,
    sync: bool,
    guard: Guard,
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

    fn guard(&self) -> Guard {
        self.guard
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

/// Handle to the writer, shared by every clone of a store.
pub(crate) struct SqliteWriter {
    shared: Arc<Shared>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
}

/// What the callers and the background thread share.
struct Shared {
    /// The one write connection; `None` once closed. Locked only by the committer.
    conn: Mutex<Option<WriterConnection>>,
    queue: Mutex<Queue>,
    /// Wakes the background thread when work is handed to it.
    wake: Condvar,
    full_sync: bool,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Box<dyn Job>>,
    /// Someone (an inline caller or the background thread) is committing: newcomers
    /// queue and wait for their reply.
    committing: bool,
    /// The queue was handed to the background thread.
    handed_off: bool,
    /// Commits since the last checkpoint.
    commits: u64,
    closing: bool,
    /// Until when appends count as concurrent (set when a commit ends with jobs queued
    /// behind it): meanwhile jobs go to the background thread, which gathers groups.
    concurrent_until: Option<Instant>,
    /// When the oldest job now queued was queued: bounds how long its group gathers.
    oldest: Option<Instant>,
    /// The background thread is gathering: wake it once this many jobs are queued.
    gather_for: Option<usize>,
    timing: Timing,
}

/// How gathering is timed ([`CONCURRENT_FOR`], [`GATHER_WINDOW`]; tests stretch them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub concurrent_for: Duration,
    pub gather_window: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            concurrent_for: CONCURRENT_FOR,
            gather_window: GATHER_WINDOW,
        }
    }
}

impl Queue {
    fn concurrent(&self, now: Instant) -> bool {
        self.concurrent_until.is_some_and(|until| now < until)
    }

    /// Notes that a commit of `jobs` jobs just ended: if it held several jobs, or jobs
    /// queued behind it, appends are concurrent.
    fn commit_ended(&mut self, jobs: usize) {
        self.commits = self.commits.saturating_add(1);
        if jobs > 1 || !self.jobs.is_empty() {
            self.concurrent_until = Instant::now().checked_add(self.timing.concurrent_for);
        }
    }

    /// Until when the background thread should hold the queued jobs for company, or
    /// `None` to commit them now.
    fn gather_until(&self, now: Instant) -> Option<Instant> {
        if self.closing
            || self.jobs.is_empty()
            || self.jobs.len() >= MAX_GROUP
            || !self.concurrent(now)
        {
            return None;
        }
        self.oldest
            .and_then(|oldest| oldest.checked_add(self.timing.gather_window))
            .filter(|deadline| now < *deadline)
    }
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter").finish_non_exhaustive()
    }
}

impl SqliteWriter {
    /// Opens the writer's connection and starts the background thread.
    pub(crate) async fn start(config: WriterConfig) -> Result<Self, StoreError> {
        Self::start_with(config, Timing::default()).await
    }

    /// [`SqliteWriter::start`] with other gathering times.
    pub(crate) async fn start_with(
        config: WriterConfig,
        timing: Timing,
    ) -> Result<Self, StoreError> {
        let conn = open_connection(&config)?;
        let shared = Arc::new(Shared {
            conn: Mutex::new(Some(conn)),
            queue: Mutex::new(Queue {
                timing,
                ..Queue::default()
            }),
            wake: Condvar::new(),
            full_sync: config.full_sync,
        });
        let (stopped_tx, stopped_rx) = oneshot::channel::<()>();
        let name = format!("keel-sqlite-writer:{}", config.path.display());
        let background = shared.clone();
        let busy_timeout = config.busy_timeout;
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                BUSY_WAIT.with(|wait| wait.set(Some(busy_timeout)));
                background_loop(&background);
                let _ = stopped_tx.send(());
            })
            .map_err(|e| {
                StoreError::Backend(format!("cannot start the SQLite writer thread: {e}"))
            })?;
        Ok(Self {
            shared,
            stopped: Mutex::new(Some(stopped_rx)),
        })
    }

    /// Runs `work` inside the next group transaction and returns its result once that
    /// transaction committed (or the group's failure if it did not). `Err` results roll
    /// back only this job's writes.
    pub(crate) async fn call<T, E, F>(&self, durability: AppendDurability, work: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + From<WriterFailure> + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        self.call_guarded(durability, Guard::Savepoint, work).await
    }

    /// [`SqliteWriter::call`] for a job that keeps [`Guard::Unwritten`]'s promise.
    pub(crate) async fn call_guarded<T, E, F>(
        &self,
        durability: AppendDurability,
        guard: Guard,
        work: F,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + From<WriterFailure> + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let sync = matches!(durability, AppendDurability::Sync);
        let job: Box<dyn Job> = Box::new(Call {
            work: Some(work),
            result: None,
            sync,
            guard,
            reply,
        });
        // Synchronous commits (fsync) never run on the caller's thread.
        let may_run_inline = !sync && !self.shared.full_sync;
        let inline = {
            let mut queue = lock(&self.shared.queue);
            if queue.closing {
                return Err(E::from(WriterFailure(
                    "the SQLite store is closed: open it again to write".into(),
                )));
            }
            let now = Instant::now();
            if queue.jobs.is_empty() {
                queue.oldest = Some(now);
            }
            if queue.committing {
                queue.jobs.push(job);
                if queue.gather_for.is_some_and(|n| queue.jobs.len() >= n) {
                    self.shared.wake.notify_one();
                }
                None
            } else if may_run_inline && queue.jobs.is_empty() && !queue.concurrent(now) {
                queue.committing = true;
                Some(job)
            } else {
                queue.jobs.push(job);
                queue.committing = true;
                hand_off(&self.shared, &mut queue);
                None
            }
        };
        if let Some(job) = inline {
            self.commit_inline(job);
        }
        answer.await.map_err(|_| {
            E::from(WriterFailure(
                "the SQLite writer stopped before answering: reopen the store".into(),
            ))
        })?
    }

    /// Commits one job on the caller's thread; then hands whatever queued meanwhile (or
    /// the job itself, when the database was locked) to the background thread.
    fn commit_inline(&self, job: Box<dyn Job>) {
        let mut group = vec![job];
        let outcome = match lock(&self.shared.conn).as_mut() {
            Some(writer) => run_group(writer, &mut group, false),
            None => Err(GroupFailure::Failed(WriterFailure(
                "the SQLite store is closed: open it again to write".into(),
            ))),
        };
        let retry_in_background = matches!(outcome, Err(GroupFailure::Busy(_)));
        if !retry_in_background {
            finish_group(&mut group, outcome);
        }
        let mut queue = lock(&self.shared.queue);
        if retry_in_background {
            // Nothing of the job ran: it goes first, ahead of later arrivals.
            group.append(&mut queue.jobs);
            queue.jobs = group;
        } else {
            queue.commit_ended(1);
        }
        if queue.jobs.is_empty() && queue.commits < CHECKPOINT_EVERY {
            queue.committing = false;
            if queue.closing {
                // `close` waits for the background thread, which waits for us.
                self.shared.wake.notify_one();
            }
        } else {
            hand_off(&self.shared, &mut queue);
        }
    }

    /// Stops accepting work, lets the writer finish the jobs already queued (their callers
    /// get their results) and waits until its connection is closed.
    pub(crate) async fn close(&self) {
        {
            let mut queue = lock(&self.shared.queue);
            queue.closing = true;
            self.shared.wake.notify_one();
        }
        let stopped = lock(&self.stopped).take();
        if let Some(stopped) = stopped {
            let _ = stopped.await;
        }
    }
}

impl Drop for SqliteWriter {
    /// A store dropped without `close`: the background thread still drains the queue,
    /// closes the connection and exits.
    fn drop(&mut self) {
        let mut queue = lock(&self.shared.queue);
        queue.closing = true;
        self.shared.wake.notify_one();
    }
}

/// Gives the queue to the background thread (the caller holds the queue's lock and has
/// set `committing`).
fn hand_off(shared: &Shared, queue: &mut Queue) {
    queue.handed_off = true;
    shared.wake.notify_one();
}

/// The background thread: commits what is handed to it until the queue is empty, runs
/// the periodic checkpoint, and on close drains the queue and closes the connection.
fn background_loop(shared: &Shared) {
    loop {
        let (mut group, checkpoint) = {
            let mut queue = lock(&shared.queue);
            // Sleep until work is handed over, or the store closes while nobody commits.
            let idle_close = |q: &Queue| q.closing && !q.committing;
            while !queue.handed_off && !idle_close(&queue) {
                queue = match shared.wake.wait(queue) {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
            }
            if !queue.handed_off {
                // Closing and idle: nobody commits any more.
                break;
            }
            let now = Instant::now();
            if let Some(deadline) = queue.gather_until(now) {
                // Concurrent appends: wait for company (a full group, the deadline or
                // closing wakes this thread), then decide again.
                queue.gather_for = Some(MAX_GROUP);
                let (mut queue, _) = match shared
                    .wake
                    .wait_timeout(queue, deadline.saturating_duration_since(now))
                {
                    Ok(woken) => woken,
                    Err(poisoned) => poisoned.into_inner(),
                };
                queue.gather_for = None;
                continue;
            }
            let take = queue.jobs.len().min(MAX_GROUP);
            let group: Vec<Box<dyn Job>> = queue.jobs.drain(..take).collect();
            let checkpoint = group.is_empty() && queue.commits >= CHECKPOINT_EVERY;
            if group.is_empty() && !checkpoint {
                queue.handed_off = false;
                queue.committing = false;
                continue;
            }
            if checkpoint {
                queue.commits = 0;
            }
            (group, checkpoint)
        };
        let mut guard = lock(&shared.conn);
        if let Some(writer) = guard.as_mut() {
            if checkpoint {
                // PASSIVE: copies what no reader still needs, never waits for readers.
                let _ = writer.conn.execute_batch("PRAGMA wal_checkpoint(PASSIVE)");
            } else {
                let raise_sync = !shared.full_sync && group.iter().any(|job| job.wants_sync());
                let outcome = run_group(writer, &mut group, raise_sync);
                if raise_sync {
                    // Back to the store's level; if this fails later commits are merely safer.
                    let _ = writer.conn.execute_batch("PRAGMA synchronous = NORMAL");
                }
                let jobs = group.len();
                finish_group(&mut group, outcome);
                lock(&shared.queue).commit_ended(jobs);
            }
        } else {
            finish_group(
                &mut group,
                Err(GroupFailure::Failed(WriterFailure(
                    "the SQLite store is closed: open it again to write".into(),
                ))),
            );
        }
    }
    // Closing: a final checkpoint happens when the connection closes.
    drop(lock(&shared.conn).take());
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn open_connection(config: &WriterConfig) -> Result<WriterConnection, StoreError> {
    let fail = |what: &str, e: rusqlite::Error| {
        StoreError::Backend(format!(
            "SQLite writer {what} on {}: {e}",
            config.path.display()
        ))
    };
    let conn = Connection::open(&config.path).map_err(|e| fail("open", e))?;
    conn.busy_handler(Some(busy_handler))
        .map_err(|e| fail("busy_handler", e))?;
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
    // file, journaling every page a job touches cost more CPU than the job itself.
    // A 2 MB page cache (SQLite's default; it was 32 MB) that spills a transaction's dirty
    // pages only past 32 MB (cache_spill, in pages): the hot pages of appends — the
    // events' last leaves, the key's leaves of the threads in flight — fit many times
    // over, a big group still never spills, and every commit after a split in the middle
    // of a B-tree (W2's concurrent threads) costs less: such a split renumbers pages
    // through the never-used lock page (page 262,145), after which SQLite's end of
    // transaction scans the whole page-cache hash table, whose size follows the cached
    // page count (W2: 10 % of the writer thread's time with 32 MB; wall −5 %, CPU −7 %
    // with 2 MB, docs/performance.md).
    // wal_autocheckpoint=0: the background thread checkpoints (see the module's docs).
    conn.execute_batch(if config.full_sync {
        "PRAGMA synchronous = FULL;"
    } else {
        "PRAGMA synchronous = NORMAL;"
    })
    .and_then(|()| {
        conn.execute_batch(
            "PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -2000; \
             PRAGMA cache_spill = 8192; \
             PRAGMA wal_autocheckpoint = 0;",
        )
    })
    .map_err(|e| fail("pragmas", e))?;
    conn.set_prepared_statement_cache_capacity(64);
    // After `wal_autocheckpoint`, which replaces the connection's WAL hook.
    conn.wal_hook(Some(crate::sqlite_wal::note_commit));
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .map_err(|e| fail("page_size", e))?;
    let wal = WalGrowth::new(&config.path, u64::try_from(page_size).unwrap_or(4096));
    Ok(WriterConnection { conn, wal })
}

/// The writer's connection and what it tracks of its write-ahead log.
struct WriterConnection {
    conn: Connection,
    wal: WalGrowth,
}

/// Why a group did not commit.
enum GroupFailure {
    /// The database was locked by another connection before anything ran: the jobs may
    /// be run again (on the background thread, which waits for the lock).
    Busy(WriterFailure),
    /// Anything else: every job of the group gets this failure (unless it failed alone).
    Failed(WriterFailure),
}

/// Answers every job of a group with its own result or the group's failure.
fn finish_group(group: &mut Vec<Box<dyn Job>>, outcome: Result<(), GroupFailure>) {
    let failure = match outcome {
        Ok(()) => None,
        Err(GroupFailure::Busy(failure) | GroupFailure::Failed(failure)) => Some(failure),
    };
    for job in group.drain(..) {
        job.finish(failure.as_ref());
    }
}

fn run_group(
    writer: &mut WriterConnection,
    group: &mut [Box<dyn Job>],
    raise_sync: bool,
) -> Result<(), GroupFailure> {
    let conn = &writer.conn;
    let fail = |what: &str, e: rusqlite::Error| {
        GroupFailure::Failed(WriterFailure(format!("SQLite {what}: {e}")))
    };
    if raise_sync {
        conn.execute_batch("PRAGMA synchronous = FULL")
            .map_err(|e| fail("raising synchronous to FULL", e))?;
    }
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        let busy = matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        );
        let failure = WriterFailure(format!("SQLite begin: {e}"));
        return Err(if busy {
            GroupFailure::Busy(failure)
        } else {
            GroupFailure::Failed(failure)
        });
    }
    // The write lock is held: no other connection writes the log until COMMIT.
    writer.wal.reserve();
    let single = group.len() == 1;
    for job in group.iter_mut() {
        if single {
            // One job: the transaction itself is its savepoint.
            if !job.run(conn) {
                return rollback(conn).map_err(|e| fail("rollback", e));
            }
            continue;
        }
        if job.guard() == Guard::Unwritten {
            let before = conn.total_changes();
            // SQLite itself may have rolled the transaction back (disk full, I/O error):
            // later jobs must not run outside it.
            if !job.run(conn) && (conn.total_changes() != before || conn.is_autocommit()) {
                let _ = rollback(conn);
                return Err(GroupFailure::Failed(WriterFailure(
                    "SQLite: an append of the same commit failed after writing, so the whole \
                     commit was rolled back; nothing of this call was written: retry it"
                        .into(),
                )));
            }
            continue;
        }
        if let Err(e) = run_cached(conn, "SAVEPOINT job") {
            let failure = fail("savepoint", e);
            let _ = rollback(conn);
            return Err(failure);
        }
        let keep = job.run(conn);
        let end = if keep {
            run_cached(conn, "RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        if let Err(e) = end {
            let failure = fail("ending savepoint", e);
            let _ = rollback(conn);
            return Err(failure);
        }
    }
    if let Err(e) = run_cached(conn, "COMMIT") {
        let failure = fail("commit", e);
        let _ = rollback(conn);
        return Err(failure);
    }
    writer.wal.committed();
    Ok(())
}

/// Runs a statement without parameters from the connection's statement cache: the
/// transaction and savepoint statements run several times per group, and `execute_batch`
/// would parse them every time.
fn run_cached(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
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

    /// The values in table `t`, in order.
    async fn rows_of_t(w: &SqliteWriter) -> Vec<i64> {
        w.call(AppendDurability::Default, |c: &Connection| {
            let mut stmt = c
                .prepare("SELECT x FROM t ORDER BY x")
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            stmt.query_map([], |r| r.get(0))
                .and_then(|rows| rows.collect())
                .map_err(|e| StoreError::Backend(e.to_string()))
        })
        .await
        .unwrap()
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
        let rows = rows_of_t(&w).await;
        assert_eq!(rows, (0..30).filter(|x| x % 3 != 0).collect::<Vec<_>>());
        w.close().await;
    }

    fn insert_one(conn: &Connection) -> Result<(), StoreError> {
        conn.execute_batch("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            .and_then(|()| conn.execute_batch("INSERT INTO t VALUES (1)"))
            .map_err(|e| StoreError::Backend(e.to_string()))
    }

    /// Another process holds the write lock: the inline attempt gives up at once (it must
    /// not block an async thread) and the background thread waits for the lock, so the
    /// caller still gets its commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_locked_database_moves_the_job_to_the_background_thread() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&dir, false).await;
        let other = Connection::open(dir.path().join("w.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            release_rx.recv().unwrap();
            other.execute_batch("COMMIT").unwrap();
        });
        let call = tokio::spawn({
            let w = std::sync::Arc::new(w);
            let w2 = w.clone();
            async move { (w2.call(AppendDurability::Default, insert_one).await, w) }
        });
        // Let the call try (and fail) inline before the lock is released; if it has not
        // tried yet, it simply finds the database free: both orders must succeed.
        tokio::task::yield_now().await;
        release_tx.send(()).unwrap();
        let (result, w) = call.await.unwrap();
        result.unwrap();
        holder.join().unwrap();
        w.close().await;
    }

    /// A lock that is never released: the call fails after the busy timeout with SQLite's
    /// error instead of hanging.
    #[tokio::test]
    async fn a_lock_held_past_the_busy_timeout_fails_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let w = SqliteWriter::start(WriterConfig {
            path: dir.path().join("w.db"),
            full_sync: false,
            busy_timeout: Duration::from_millis(50),
        })
        .await
        .unwrap();
        let other = Connection::open(dir.path().join("w.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let result = w.call(AppendDurability::Default, insert_one).await;
        assert!(
            matches!(&result, Err(StoreError::Backend(m)) if m.contains("locked")),
            "{result:?}"
        );
        other.execute_batch("COMMIT").unwrap();
        w.call(AppendDurability::Default, insert_one).await.unwrap();
        w.close().await;
    }

    /// Many concurrent callers: every one is answered, in a few groups, and the rows are
    /// all there (the inline and background paths hand over without losing a job).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_are_all_answered() {
        let dir = tempfile::tempdir().unwrap();
        let w = std::sync::Arc::new(writer(&dir, false).await);
        let tasks: Vec<_> = (0..2000)
            .map(|i| {
                let w = w.clone();
                tokio::spawn(async move {
                    let durability = if i % 97 == 0 {
                        AppendDurability::Sync
                    } else {
                        AppendDurability::Default
                    };
                    w.call(durability, insert_one).await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let count: i64 = w
            .call(AppendDurability::Default, |c: &Connection| {
                c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                    .map_err(|e| StoreError::Backend(e.to_string()))
            })
            .await
            .unwrap();
        assert_eq!(count, 2000);
        w.close().await;
    }

    /// The name of the thread a job ran on.
    fn thread_name(_: &Connection) -> Result<String, StoreError> {
        Ok(std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string())
    }

    /// Waits (yielding, no sleeps) until `n` jobs are queued.
    async fn until_queued(w: &SqliteWriter, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while lock(&w.shared.queue).jobs.len() < n {
            assert!(Instant::now() < deadline, "{n} jobs never queued");
            tokio::task::yield_now().await;
        }
    }

    /// Starts a job that keeps the writer committing until the returned sender is used
    /// (its handle answers once it committed), and returns once that job is running: calls
    /// made after it queue behind it.
    async fn hold_writer(
        w: &std::sync::Arc<SqliteWriter>,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ) {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (running_tx, running_rx) = tokio::sync::oneshot::channel::<()>();
        // The job may commit inline, on the thread that calls, and blocks that thread until
        // released: a thread of its own, never a runtime worker (a blocked worker froze the
        // tasks queued on it: "1 jobs never queued" once in a fresh-clone ./scripts/test
        // under load). And the caller waits for the job itself to run, not for any commit
        // (`committing` could still be set by the previous group, and then the blocker
        // queued behind the calls it was meant to hold back).
        let runtime = tokio::runtime::Handle::current();
        let blocker = tokio::task::spawn_blocking({
            let w = w.clone();
            move || {
                runtime.block_on(w.call(AppendDurability::Default, move |_: &Connection| {
                    let _ = running_tx.send(());
                    release_rx
                        .recv()
                        .map_err(|e| StoreError::Backend(e.to_string()))
                }))
            }
        });
        running_rx.await.unwrap();
        (release_tx, blocker)
    }

    /// A sequential caller commits on its own thread; once a commit ended with jobs queued
    /// behind it, the next caller that finds the writer idle is gathered on the writer
    /// thread instead, and every caller is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_are_gathered_on_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let timing = Timing {
            concurrent_for: Duration::from_secs(3600),
            gather_window: Duration::from_millis(20),
        };
        let config = WriterConfig {
            path: dir.path().join("w.db"),
            full_sync: false,
            busy_timeout: Duration::from_secs(5),
        };
        let w = std::sync::Arc::new(SqliteWriter::start_with(config, timing).await.unwrap());
        let writer_thread = |name: &str| name.starts_with("keel-sqlite-writer:");
        // Alone: inline, on the caller's thread.
        let name = w
            .call(AppendDurability::Default, thread_name)
            .await
            .unwrap();
        assert!(!writer_thread(&name), "a lone call ran on {name}");
        // A commit that others queue behind.
        let (release_tx, blocker) = hold_writer(&w).await;
        let followers: Vec<_> = (0..3)
            .map(|_| {
                let w = w.clone();
                tokio::spawn(async move { w.call(AppendDurability::Default, thread_name).await })
            })
            .collect();
        until_queued(&w, 3).await;
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        for follower in followers {
            let name = follower.await.unwrap().unwrap();
            assert!(writer_thread(&name), "a queued call ran on {name}");
        }
        // Appends are now concurrent: a caller finding the writer idle is gathered.
        let name = w
            .call(AppendDurability::Default, thread_name)
            .await
            .unwrap();
        assert!(
            writer_thread(&name),
            "a call after concurrency ran on {name}"
        );
        w.close().await;
    }

    /// A job for [`one_group`].
    type TestJob<T> = Box<dyn FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static>;

    /// Runs `jobs` as one group: a blocking job, committing alone, holds the writer while
    /// they queue (`w` must not gather: see [`Timing`]).
    async fn one_group<T: Send + 'static>(
        w: &std::sync::Arc<SqliteWriter>,
        jobs: Vec<TestJob<T>>,
    ) -> Vec<Result<T, StoreError>> {
        let (release_tx, blocker) = hold_writer(w).await;
        let n = jobs.len();
        let mut calls = Vec::new();
        for (i, job) in jobs.into_iter().enumerate() {
            let writer = w.clone();
            calls.push(tokio::spawn(async move {
                writer
                    .call_guarded(AppendDurability::Default, Guard::Unwritten, job)
                    .await
            }));
            until_queued(w.as_ref(), i + 1).await;
        }
        assert_eq!(lock(&w.shared.queue).jobs.len(), n);
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let mut results = Vec::new();
        for call in calls {
            results.push(call.await.unwrap());
        }
        results
    }

    fn insert(x: i64, then_fail: bool) -> TestJob<()> {
        Box::new(move |c: &Connection| {
            if then_fail && x < 0 {
                // Fails before writing.
                return Err(StoreError::InvalidBatch("checked first".into()));
            }
            c.execute("INSERT INTO t VALUES (?1)", [x])
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            if then_fail {
                return Err(StoreError::InvalidBatch("failed after writing".into()));
            }
            Ok(())
        })
    }

    /// Jobs without savepoints: one that fails before writing fails alone; one that fails
    /// after writing takes its whole group down, and nothing of the group is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unwritten_jobs_fail_alone_unless_they_wrote() {
        let dir = tempfile::tempdir().unwrap();
        // Never gathering: the blocking job of `one_group` commits alone, inline.
        let timing = Timing {
            concurrent_for: Duration::ZERO,
            gather_window: Duration::ZERO,
        };
        let config = WriterConfig {
            path: dir.path().join("w.db"),
            full_sync: false,
            busy_timeout: Duration::from_secs(5),
        };
        let w = std::sync::Arc::new(SqliteWriter::start_with(config, timing).await.unwrap());
        w.call(AppendDurability::Default, |c: &Connection| {
            c.execute_batch("CREATE TABLE t (x INTEGER)")
                .map_err(|e| StoreError::Backend(e.to_string()))
        })
        .await
        .unwrap();
        let results = one_group(
            &w,
            vec![insert(1, false), insert(-1, true), insert(2, false)],
        )
        .await;
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(&results[1], Err(StoreError::InvalidBatch(m)) if m == "checked first"),
            "{results:?}"
        );
        let results = one_group(
            &w,
            vec![insert(3, false), insert(4, true), insert(5, false)],
        )
        .await;
        assert!(
            matches!(&results[1], Err(StoreError::InvalidBatch(m)) if m == "failed after writing"),
            "{results:?}"
        );
        for other in [&results[0], &results[2]] {
            assert!(
                matches!(other, Err(StoreError::Backend(m)) if m.contains("rolled back")),
                "{results:?}"
            );
        }
        let rows = rows_of_t(&w).await;
        assert_eq!(rows, vec![1, 2]);
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
