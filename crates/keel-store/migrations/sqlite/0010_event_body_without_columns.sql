-- Smaller event rows (issue 13, ./scripts/bench W1): from this migration on, an event's
-- `body` no longer repeats what its row's columns hold — `seq`, `ts`, `thread_id`,
-- `run_id` — (keel-store rows.rs, `BodyFormat::WithoutColumns`): ~140 bytes less per
-- event, ~30 % of a one-tool conversation's log, so fewer 4 KB pages written per commit
-- and less JSON to serialize. Rows written earlier keep their whole event and are read as
-- before; the reader takes those four fields from the columns either way. Nothing to
-- change in the schema: this migration only marks the database, so that a build older
-- than this format refuses to open it (sqlx: "migration 10 was previously applied but is
-- missing") instead of failing on the first body it cannot parse.
SELECT 1;
