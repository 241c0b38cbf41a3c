-- Keel event log (SQLite). One row per event; the full event is kept as JSON in `body`,
-- the indexed columns are copies used for lookups. `threads` is maintained in the same
-- transaction as every append so that listing never scans events.
-- Timestamps are nanoseconds since the Unix epoch (UTC).
CREATE TABLE threads (
    thread_id   TEXT PRIMARY KEY NOT NULL,
    agent       TEXT,
    status      TEXT NOT NULL,
    end_state   TEXT,
    event_count INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX threads_by_updated ON threads (updated_at DESC, thread_id);
CREATE INDEX threads_by_status ON threads (status, updated_at);

CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    type      TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    ts        INTEGER NOT NULL,
    body      TEXT NOT NULL,
    CONSTRAINT events_thread_seq UNIQUE (thread_id, seq)
);
CREATE INDEX events_by_run ON events (run_id);

-- Runs waiting for (or leased by) a worker.
CREATE TABLE run_queue (
    job_id           INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id        TEXT NOT NULL,
    payload          TEXT NOT NULL,
    state            TEXT NOT NULL,
    rerun            INTEGER NOT NULL DEFAULT 0,
    worker_id        TEXT,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0,
    enqueued_at      INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE UNIQUE INDEX run_queue_one_active_per_thread ON run_queue (thread_id)
    WHERE state IN ('queued', 'leased');
CREATE INDEX run_queue_ready ON run_queue (state, job_id);
