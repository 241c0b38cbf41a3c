//! Keeps the SQLite write-ahead log's file longer than what is written in it, so that the
//! writer's commits overwrite bytes the file already has instead of extending it.
//!
//! Why: a WAL frame is a 24-byte header plus a page (4,120 bytes for 4 KB pages), so the
//! frames of a growing WAL never line up with the file system's blocks, and every frame
//! written at the end of the file extends it: the kernel allocates a block, zeroes the
//! part of it the write does not cover, and updates the file's size — per frame, twice
//! (SQLite writes the header and the page with separate `pwrite`s). Profiled with
//! `./scripts/bench` (W2, 500 concurrent runs on a fresh store), that zeroing alone was
//! 8 % of the SQLite run's extra CPU over the memory store; growing the file ahead took
//! W2's wall and CPU down 6–7 % (interleaved A/B, docs/performance.md). Once a WAL has
//! grown, SQLite rewrites it from the start after each complete checkpoint and never
//! shrinks it while the database is open (no `journal_size_limit`), so only its first
//! growth pays this — but every process that opens a store starts with a new WAL (SQLite
//! deletes it when the last connection closes), which is every `keel run`.
//!
//! How: a WAL hook ([`note_commit`]) records, after each commit of the writer's connection,
//! how many frames the log holds. Before the next commit — inside its `BEGIN IMMEDIATE`,
//! so no other connection can write the log meanwhile — [`WalGrowth::reserve`] makes sure
//! the file is at least [`HEADROOM_FRAMES`] frames longer than that, appending zeros in
//! steps of [`GROW_BY`] bytes. Zeros are never a valid frame (a frame is valid only when
//! its header carries the log's salts and checksums), so SQLite's recovery stops where the
//! zeros begin, exactly as it stops at the end of the file; and only bytes past the file's
//! current end are written, never a byte SQLite wrote. Growth is best effort: if it fails
//! (disk full, the file missing), commits simply extend the file as they would anyway.
//! At most [`GROW_BY`] plus the headroom is added to the log's size; SQLite deletes the
//! file with its last connection as before.
//!
//! Hand-written: SQLite has no option to grow the WAL in chunks (`SQLITE_FCNTL_CHUNK_SIZE`
//! applies to the database file only).

use std::cell::Cell;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Bytes of the WAL file's header.
const WAL_HEADER: u64 = 32;
/// Bytes of a frame's header (the page follows).
const FRAME_HEADER: u64 = 24;

/// Frames the file must hold beyond the log's content before a commit (most commits write
/// a few frames; a big group's may write more than this, and extends the file past it).
pub(crate) const HEADROOM_FRAMES: u64 = 256;

/// How much more than the headroom the file grows at a time (zeros, in a few large writes:
/// about a millisecond's work every ~500 frames).
pub(crate) const GROW_BY: u64 = 2 << 20;

/// The size of one write of zeros.
const ZEROS: usize = 256 << 10;

thread_local! {
    /// Frames in the log after this thread's latest commit on the writer's connection,
    /// set by the WAL hook (which SQLite calls on the committing thread).
    static FRAMES_AFTER_COMMIT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The writer connection's WAL hook: notes how many frames the log holds after a commit.
pub(crate) fn note_commit(
    _: &rusqlite::hooks::Wal,
    frames: std::ffi::c_int,
) -> rusqlite::Result<()> {
    let frames = u64::try_from(frames).unwrap_or(0);
    FRAMES_AFTER_COMMIT.with(|cell| cell.set(Some(frames)));
    Ok(())
}

/// What the writer knows of its WAL file.
#[derive(Debug)]
pub(crate) struct WalGrowth {
    /// `<database>-wal`.
    path: PathBuf,
    /// Bytes per frame (header and page).
    frame_bytes: u64,
    /// Frames in the log after the writer's latest commit.
    frames: u64,
    /// The file's length as of the last check or growth (a lower bound: SQLite only ever
    /// makes it longer while the database is open).
    known_length: u64,
}

impl WalGrowth {
    /// For the database at `database` with pages of `page_size` bytes.
    pub(crate) fn new(database: &std::path::Path, page_size: u64) -> Self {
        let mut path = database.as_os_str().to_owned();
        path.push("-wal");
        Self {
            path: PathBuf::from(path),
            frame_bytes: page_size.saturating_add(FRAME_HEADER),
            frames: 0,
            known_length: 0,
        }
    }

    /// Records the frame count the WAL hook noted during the commit that just returned on
    /// this thread.
    pub(crate) fn committed(&mut self) {
        if let Some(frames) = FRAMES_AFTER_COMMIT.with(Cell::take) {
            self.frames = frames;
        }
    }

    /// Makes the file at least [`HEADROOM_FRAMES`] frames longer than the log's content.
    /// Call only while holding the database's write lock (inside `BEGIN IMMEDIATE`).
    pub(crate) fn reserve(&mut self) {
        let needed = self
            .frames
            .saturating_add(HEADROOM_FRAMES)
            .saturating_mul(self.frame_bytes)
            .saturating_add(WAL_HEADER);
        if needed <= self.known_length {
            return;
        }
        // Best effort (see the module's documentation): any failure leaves the file as is.
        let _ = self.grow(needed);
    }

    fn grow(&mut self, needed: u64) -> std::io::Result<()> {
        // Not `create`: the log exists once the connection has read in WAL mode; if it
        // does not, SQLite creates it.
        let file = OpenOptions::new().write(true).open(&self.path)?;
        let length = file.metadata()?.len();
        if length >= needed {
            self.known_length = length;
            return Ok(());
        }
        let target = needed.saturating_add(GROW_BY);
        let zeros = vec![0_u8; ZEROS];
        let mut at = length;
        while at < target {
            let n = usize::try_from(target.saturating_sub(at))
                .unwrap_or(ZEROS)
                .min(ZEROS);
            file.write_all_at(zeros.get(..n).unwrap_or_default(), at)?;
            at = at.saturating_add(n as u64);
            self.known_length = at;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use rusqlite::Connection;

    fn open(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
        conn.wal_hook(Some(note_commit));
        conn
    }

    /// Commits with the log grown ahead: the file is longer than its frames, every commit
    /// is readable by another connection, and a connection opened after a simulated crash
    /// (the log kept, zeros and all) recovers exactly the committed rows.
    #[test]
    fn a_grown_log_recovers_exactly_the_committed_frames() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("g.db");
        let conn = open(&db);
        conn.execute_batch("CREATE TABLE t (x INTEGER, pad TEXT)")
            .unwrap();
        let mut growth = WalGrowth::new(&db, 4096);
        for x in 0..300_i64 {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            growth.reserve();
            conn.execute("INSERT INTO t VALUES (?1, ?2)", (x, "p".repeat(3000)))
                .unwrap();
            conn.execute_batch("COMMIT").unwrap();
            growth.committed();
        }
        let wal_len = std::fs::metadata(dir.path().join("g.db-wal"))
            .unwrap()
            .len();
        let content = WAL_HEADER + growth.frames * (4096 + FRAME_HEADER);
        assert!(growth.frames > 300, "{} frames", growth.frames);
        assert!(
            wal_len >= content + HEADROOM_FRAMES * (4096 + FRAME_HEADER),
            "the log ({wal_len} B) is not ahead of its content ({content} B)"
        );
        let other = Connection::open(&db).unwrap();
        let rows: i64 = other
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 300);
        drop(other);
        // A crash: copy the database and its log as they are (the -shm index is rebuilt
        // from the log by the next opener).
        let crashed = dir.path().join("c.db");
        std::fs::copy(&db, &crashed).unwrap();
        std::fs::copy(dir.path().join("g.db-wal"), dir.path().join("c.db-wal")).unwrap();
        let recovered = Connection::open(&crashed).unwrap();
        let (rows, sum): (i64, i64) = recovered
            .query_row("SELECT count(*), sum(x) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((rows, sum), (300, (0..300).sum::<i64>()));
        let integrity: String = recovered
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
    }
}
