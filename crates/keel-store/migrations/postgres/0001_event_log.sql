-- Keel event log (Postgres). One row per event; the full event is kept in `body` as `json`
-- (not `jsonb`: jsonb rejects the NUL character, which tool output may contain, and json
-- keeps the exact text). The indexed columns are copies used for lookups. `threads` is
-- maintained in the same transaction as every append so that listing never scans events.
-- Event timestamps are nanoseconds since the Unix epoch (UTC).
CREATE TABLE threads (
    thread_id   TEXT PRIMARY KEY,
    agent       TEXT,
    status      TEXT NOT NULL,
    end_state   TEXT,
    event_count BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX threads_by_updated ON threads (updated_at DESC, thread_id);
CREATE INDEX threads_by_status ON threads (status, updated_at);

CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    type      TEXT NOT NULL,
    run_id    TEXT NOT NULL,
    ts        BIGINT NOT NULL,
    body      JSON NOT NULL,
    CONSTRAINT events_thread_seq PRIMARY KEY (thread_id, seq)
);
CREATE INDEX events_by_run ON events (run_id);

-- Runs waiting for (or leased by) a worker. Lease times use the database clock.
CREATE TABLE run_queue (
    job_id           BIGSERIAL PRIMARY KEY,
    thread_id        TEXT NOT NULL,
    payload          JSON NOT NULL,
    state            TEXT NOT NULL,
    rerun            BOOLEAN NOT NULL DEFAULT FALSE,
    worker_id        TEXT,
    lease_token      BIGINT NOT NULL DEFAULT 0,
    lease_expires_at TIMESTAMPTZ,
    attempts         INTEGER NOT NULL DEFAULT 0,
    enqueued_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX run_queue_one_active_per_thread ON run_queue (thread_id)
    WHERE state IN ('queued', 'leased');
CREATE INDEX run_queue_ready ON run_queue (job_id) WHERE state IN ('queued', 'leased');
