-- A continuation (the job that resumes a paused run once it is approved, denied, answered
-- or cancelled) is leased before its thread's other queued jobs, which may be waiting for
-- that run to end (issue 45).
ALTER TABLE run_queue ADD COLUMN continuation BOOLEAN NOT NULL DEFAULT FALSE;
