-- Evaluation results and baselines (issue 16, `keel eval`). Each saved `keel eval run` is
-- one row of `eval_runs`: its report kept whole in `report` as `json` (not `jsonb`: exact
-- text, and the NUL character is accepted), the columns used to list and pick runs copied
-- beside it. Every trial of the run is one row of `eval_run_threads`, so finding the eval
-- runs of a thread is one indexed lookup. A baseline is a named pointer to a run; saving a
-- name again moves it. Runs are never updated. Timestamps are nanoseconds since the Unix
-- epoch (UTC), by the saving process's clock.
CREATE TABLE eval_runs (
    run_id          BIGSERIAL PRIMARY KEY,
    suite           TEXT NOT NULL,
    model           TEXT,
    pass_rate       DOUBLE PRECISION NOT NULL,
    total_scenarios BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    report          JSON NOT NULL
);
CREATE INDEX eval_runs_by_created ON eval_runs (created_at, run_id);
CREATE INDEX eval_runs_by_suite ON eval_runs (suite, created_at, run_id);

CREATE TABLE eval_run_threads (
    run_id    BIGINT NOT NULL REFERENCES eval_runs (run_id),
    position  BIGINT NOT NULL,
    scenario  TEXT NOT NULL,
    trial     BIGINT NOT NULL,
    thread_id TEXT NOT NULL,
    trace_id  TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE INDEX eval_run_threads_by_thread ON eval_run_threads (thread_id);

CREATE TABLE eval_baselines (
    name       TEXT PRIMARY KEY,
    run_id     BIGINT NOT NULL REFERENCES eval_runs (run_id),
    updated_at BIGINT NOT NULL
);
