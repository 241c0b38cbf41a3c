-- The dashboard's figures from the run index (issue 18, `keel ui`): per thread, the
-- metrics facts of its runs (keel_core::run_metrics::ThreadMetrics, JSON): `facts`, the
-- segments a dashboard combines into `keel stats`' report, and `fold_state`, what the fold
-- needs to go on. They are folded with the rest of the row, from the events a thread
-- gained. `facts_count` is the number of events the facts cover: a row whose
-- `facts_count` is not its `indexed_count` (every row indexed before this migration, or
-- one a build without it moved on) is folded again from the thread's first event.
ALTER TABLE run_index ADD COLUMN facts TEXT;
ALTER TABLE run_index ADD COLUMN fold_state TEXT;
ALTER TABLE run_index ADD COLUMN facts_count INTEGER;
