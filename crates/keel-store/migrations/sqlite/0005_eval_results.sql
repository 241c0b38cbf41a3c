-- Evaluation results and baselines (issue 16, `keel eval`). Each saved `keel eval run` is
-- one row of `eval_runs`: its report kept whole as JSON text in `report` (the store does
-- not interpret it), the columns used to list and pick runs copied beside it. Every trial
-- of the run is one row of `eval_run_threads`, so finding the eval runs of a thread is one
-- indexed lookup. A baseline is a named pointer to a run; saving a name again moves it.
-- Runs are never updated. Timestamps are nanoseconds since the Unix epoch (UTC).
CREATE TABLE eval_runs (
    run_id          INTEGER PRIMARY KEY AUTOINCREMENT,
    suite           TEXT NOT NULL,
    model           TEXT,
    pass_rate       REAL NOT NULL,
    total_scenarios INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    report          TEXT NOT NULL
);
CREATE INDEX eval_runs_by_created ON eval_runs (created_at, run_id);
CREATE INDEX eval_runs_by_suite ON eval_runs (suite, created_at, run_id);

CREATE TABLE eval_run_threads (
    run_id    INTEGER NOT NULL REFERENCES eval_runs (run_id),
    position  INTEGER NOT NULL,
    scenario  TEXT NOT NULL,
    trial     INTEGER NOT NULL,
    thread_id TEXT NOT NULL,
    trace_id  TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE INDEX eval_run_threads_by_thread ON eval_run_threads (thread_id);

CREATE TABLE eval_baselines (
    name       TEXT PRIMARY KEY NOT NULL,
    run_id     INTEGER NOT NULL REFERENCES eval_runs (run_id),
    updated_at INTEGER NOT NULL
);
