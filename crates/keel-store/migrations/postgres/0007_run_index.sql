-- The runs list's index (issue 18, `keel ui`): per thread, the statistics of its runs
-- (keel_core::runs::RunStats: runs, model calls, tool calls, tokens, cost, models, goal)
-- and the text a search looks in, so listing, filtering, sorting and paging the runs never
-- reads every thread's events. Nothing on the append path writes here (keel_append_group
-- is unchanged): the store brings the index up to date before each runs listing, folding
-- only the events a thread gained since (`indexed_count`). Existing logs are indexed by the
-- first listing after this migration.
--
-- run_index: one row per indexed thread. `created_at` is the thread's (its first event's
-- time): a row whose `created_at` differs from the thread's belongs to an earlier thread of
-- that id and is rebuilt. `models` is every model used, each followed by a line break and
-- the list preceded by one. Times are nanoseconds since the Unix epoch (UTC).
CREATE TABLE run_index (
    thread_id     TEXT PRIMARY KEY,
    indexed_count BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    runs          BIGINT NOT NULL,
    turns         BIGINT NOT NULL,
    tool_calls    BIGINT NOT NULL,
    tool_errors   BIGINT NOT NULL,
    tokens        BIGINT NOT NULL,
    cost          DOUBLE PRECISION,
    model         TEXT,
    models        TEXT NOT NULL,
    goal          TEXT,
    trace_id      TEXT
);

-- run_text: the searchable text of events from_seq.. of a thread (keel_core::runs::
-- push_search_text: lowercased, one line per text, NUL replaced), rows of whole lines of
-- at most ~1.5 KB each (small rows keep a search's scan cheap), per indexing step.
CREATE TABLE run_text (
    thread_id TEXT NOT NULL,
    from_seq  BIGINT NOT NULL,
    part      BIGINT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, from_seq, part)
);

-- A search is `body LIKE '%text%'`: with the pg_trgm extension (shipped with Postgres,
-- "trusted" since 13, so a database owner may create it) a trigram index answers it
-- without reading every row. Where the extension cannot be created (no privilege, a
-- server without contrib), the search reads the table instead: slower, same answers. The
-- extension goes to `public` (created once per database, so stores in several schemas of
-- one database share it and dropping one schema cannot drop it).
DO $$
DECLARE
    trgm_schema TEXT;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm WITH SCHEMA public;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'pg_trgm is not available (%): run text search reads run_text', SQLERRM;
    END;
    SELECT n.nspname INTO trgm_schema
    FROM pg_opclass c
    JOIN pg_namespace n ON n.oid = c.opcnamespace
    JOIN pg_am a ON a.oid = c.opcmethod
    WHERE c.opcname = 'gin_trgm_ops' AND a.amname = 'gin'
    LIMIT 1;
    IF trgm_schema IS NOT NULL THEN
        EXECUTE format('CREATE INDEX run_text_trigrams ON run_text USING gin (body %I.gin_trgm_ops)', trgm_schema);
    END IF;
END
$$;

-- Deleting a thread (delete, purge) deletes its index rows, whoever deletes it.
CREATE FUNCTION keel_run_index_forget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_index WHERE thread_id = OLD.thread_id;
    DELETE FROM run_text WHERE thread_id = OLD.thread_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER run_index_forget_thread AFTER DELETE ON threads
    FOR EACH ROW EXECUTE FUNCTION keel_run_index_forget();
