-- Fewer pages per commit (issue 13, ./scripts/bench W1). `threads` was a rowid table with
-- its TEXT primary key in a second B-tree, plus an index on `status`: creating a thread
-- wrote three pages (row, key, status entry) and ending a run two (row, status entry),
-- 4 KB WAL frames each, out of ~16 frames per one-tool conversation. Now the key is the
-- table (WITHOUT ROWID: the row is stored in its key's B-tree) and the status index is
-- gone: nothing reads through it any more — listing threads reads every summary row to
-- sort them (migration 0004), purge and the run index scan the rows too.
CREATE TABLE threads_by_key (
    thread_id   TEXT PRIMARY KEY NOT NULL,
    agent       TEXT,
    status      TEXT NOT NULL,
    end_state   TEXT,
    event_count INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO threads_by_key (thread_id, agent, status, end_state, event_count, created_at, updated_at)
    SELECT thread_id, agent, status, end_state, event_count, created_at, updated_at FROM threads;
DROP TABLE threads;
ALTER TABLE threads_by_key RENAME TO threads;

-- The trigger of migration 0007 went with the old table: deleting a thread (delete, purge)
-- still deletes its run index rows, whoever deletes it.
CREATE TRIGGER run_index_forget_thread AFTER DELETE ON threads
BEGIN
    DELETE FROM run_index WHERE thread_id = OLD.thread_id;
    DELETE FROM run_text WHERE thread_id = OLD.thread_id;
END;
