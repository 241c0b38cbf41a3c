-- No query reads events by run id (a run's events are read through its thread, whose
-- primary-key range is the index), yet every appended event paid an insert into this
-- index: one more B-tree page written per commit. Measured with ./scripts/bench (W1).
DROP INDEX IF EXISTS events_by_run;

-- The status index no longer carries updated_at: every append moves updated_at, and with
-- it an entry of this index; now an entry moves only when the status changes. Listing by
-- status sorts the (few) matching rows instead.
DROP INDEX IF EXISTS threads_by_status;
CREATE INDEX threads_by_status ON threads (status);
