//! Read connections for [`crate::SqliteStore::load`]: `rusqlite` connections kept in a
//! small free list and used on Tokio's blocking pool, so loading a long thread is one
//! statement stepped in a loop and parsed on the same thread (no per-row hand-off between
//! threads, which dominated `load` on sqlx). WAL lets these read while the writer writes;
//! a read starts after the caller's last append returned, so it sees that append.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::event::Event;
use keel_core::store::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::rows::{EventRows, RowColumns, backend};

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 4;

/// A free list of read-only connections to one database file.
#[derive(Debug)]
pub(crate) struct SqliteReader {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Arc<Mutex<Vec<Connection>>>,
}

impl SqliteReader {
    pub(crate) fn new(path: PathBuf, busy_timeout: Duration) -> Self {
        Self {
            path,
            busy_timeout,
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// All events of `thread_id` in order.
    pub(crate) async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.load_from(thread_id, 0).await
    }

    /// The thread's events from `from_seq` on.
    pub(crate) async fn load_from(
        &self,
        thread_id: &str,
        from_seq: u64,
    ) -> Result<Vec<Event>, StoreError> {
        // Sequence numbers are stored as INTEGER (i64): one past i64::MAX matches nothing.
        let Ok(from_seq) = i64::try_from(from_seq) else {
            return Ok(Vec::new());
        };
        let thread = thread_id.to_string();
        let path = self.path.clone();
        let busy_timeout = self.busy_timeout;
        let idle = self.idle.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match lock(&idle).pop() {
                Some(conn) => conn,
                None => open(&path, busy_timeout)?,
            };
            let events = load_on(&conn, &thread, from_seq);
            let mut idle = lock(&idle);
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
            events
        })
        .await
        .map_err(|e| backend("sqlite load task", e))?
    }

    /// Drops the idle connections.
    pub(crate) fn close(&self) {
        lock(&self.idle).clear();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn open(path: &PathBuf, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        // Read-write (a read-only handle cannot always open a WAL database's shared
        // memory) but `query_only`, so it can never write.
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| backend(&format!("sqlite open reader {}", path.display()), e))?;
    conn.busy_timeout(busy_timeout)
        .map_err(|e| backend("sqlite reader busy_timeout", e))?;
    conn.execute_batch("PRAGMA query_only = ON")
        .map_err(|e| backend("sqlite reader query_only", e))?;
    Ok(conn)
}

fn load_on(conn: &Connection, thread_id: &str, from_seq: i64) -> Result<Vec<Event>, StoreError> {
    read_events(
        conn,
        "SELECT seq, ts, run_id, body FROM events WHERE thread_id = ?1 AND seq >= ?2 ORDER BY seq",
        rusqlite::params![thread_id, from_seq],
        thread_id,
    )
}

/// Runs `sql` — a query whose columns are `seq, ts, run_id, body` of one thread's event
/// rows, in order — and rebuilds the events as `thread_id`'s ([`EventRows`]).
pub(crate) fn read_events(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    thread_id: &str,
) -> Result<Vec<Event>, StoreError> {
    let fail = |e: rusqlite::Error| backend("sqlite read events", e);
    let mut stmt = conn.prepare_cached(sql).map_err(fail)?;
    let mut rows = stmt.query(params).map_err(fail)?;
    let mut events = Vec::new();
    let mut rebuild = EventRows::new(thread_id);
    while let Some(row) = rows.next().map_err(fail)? {
        let text = |i: usize| {
            row.get_ref(i)
                .and_then(|value| value.as_str().map_err(Into::into))
        };
        let columns = RowColumns {
            seq: row.get(0).map_err(fail)?,
            ts: row.get(1).map_err(fail)?,
            run_id: text(2).map_err(fail)?,
            body: text(3).map_err(fail)?,
        };
        events.push(rebuild.event(&columns)?);
    }
    Ok(events)
}
