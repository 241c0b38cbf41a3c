-- One queued job per submitted message (issue 14, defect 5). Before, a second `enqueue`
-- for a thread with an active job overwrote that job's payload, so an earlier message was
-- lost. Now every enqueue adds a job, and the jobs of one thread run one at a time in
-- enqueue order: `acquire` only leases a thread's oldest active job, and at most one job
-- of a thread may be leased (unique index below).

DROP INDEX run_queue_one_active_per_thread;

-- A leased job marked `rerun` was enqueued again while it ran; its new payload becomes a
-- job of its own, queued behind it.
INSERT INTO run_queue (thread_id, payload, state)
    SELECT thread_id, payload, 'queued'
    FROM run_queue WHERE rerun AND state = 'leased' ORDER BY job_id;
ALTER TABLE run_queue DROP COLUMN rerun;

-- `retry_later`: a queued job is not ready before this time (NULL = now).
ALTER TABLE run_queue ADD COLUMN ready_at TIMESTAMPTZ;
-- Why a `failed` job was given up.
ALTER TABLE run_queue ADD COLUMN error TEXT;

CREATE UNIQUE INDEX run_queue_one_lease_per_thread ON run_queue (thread_id)
    WHERE state = 'leased';
CREATE INDEX run_queue_active_by_thread ON run_queue (thread_id, job_id)
    WHERE state IN ('queued', 'leased');
