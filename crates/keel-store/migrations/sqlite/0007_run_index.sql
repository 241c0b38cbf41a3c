-- The runs list's index (issue 18, `keel ui`): per thread, the statistics of its runs
-- (keel_core::runs::RunStats: runs, model calls, tool calls, tokens, cost, models, goal)
-- and the text a search looks in, so listing, filtering, sorting and paging the runs never
-- reads every thread's events. Nothing on the append path writes here (appends cost what
-- they cost before, see docs/durability.md): the store brings the index up to date before
-- each runs listing, folding only the events a thread gained since (`indexed_count`).
-- Existing logs are indexed by the first listing after this migration.
--
-- run_index: one row per indexed thread. `created_at` is the thread's (its first event's
-- time): a row whose `created_at` differs from the thread's belongs to an earlier thread of
-- that id and is rebuilt. `models` is every model used, each followed by a line break and
-- the list preceded by one. Times are nanoseconds since the Unix epoch (UTC).
CREATE TABLE run_index (
    thread_id     TEXT PRIMARY KEY NOT NULL,
    indexed_count INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    runs          INTEGER NOT NULL,
    turns         INTEGER NOT NULL,
    tool_calls    INTEGER NOT NULL,
    tool_errors   INTEGER NOT NULL,
    tokens        INTEGER NOT NULL,
    cost          REAL,
    model         TEXT,
    models        TEXT NOT NULL,
    goal          TEXT,
    trace_id      TEXT
);

-- run_text: the searchable text of events from_seq.. of a thread (keel_core::runs::
-- push_search_text: lowercased, one line per text), rows of whole lines of at most
-- ~1.5 KB each (small rows keep a search's scan cheap), per indexing step.
CREATE TABLE run_text (
    thread_id TEXT NOT NULL,
    from_seq  INTEGER NOT NULL,
    part      INTEGER NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, from_seq, part)
);

-- Deleting a thread (delete, purge) deletes its index rows, whoever deletes it.
CREATE TRIGGER run_index_forget_thread AFTER DELETE ON threads
BEGIN
    DELETE FROM run_index WHERE thread_id = OLD.thread_id;
    DELETE FROM run_text WHERE thread_id = OLD.thread_id;
END;
