-- Group commit: one call appends the batches of many concurrent runs in one round trip
-- and one transaction. Appends are processed in array order, each in its own
-- subtransaction (the BEGIN ... EXCEPTION block), so one append's conflict rolls back that
-- append alone and two appends to one thread behave exactly like sequential appends.
--
-- Arguments (1-based arrays): per append i, its thread, the expected next seq (= event
-- count), the summary changes (status/end_state/agent: NULL = unchanged), its first and
-- last event times, the status a new thread starts in, and the slice ev_from[i]..ev_to[i]
-- of the event arrays holding its rows.
-- Returns one row per append, in order: (actual, failure) = (NULL, NULL) when written,
-- (the thread's event count, NULL) on a conflict, (NULL, message) on any other failure.
CREATE FUNCTION keel_append_group(
    a_thread      TEXT[],
    a_expected    BIGINT[],
    a_status      TEXT[],
    a_end_state   TEXT[],
    a_agent       TEXT[],
    a_first_ts    BIGINT[],
    a_last_ts     BIGINT[],
    a_init_status TEXT[],
    a_init_end    TEXT[],
    a_ev_from     INT[],
    a_ev_to       INT[],
    e_seq         BIGINT[],
    e_kind        TEXT[],
    e_run         TEXT[],
    e_ts          BIGINT[],
    e_body        TEXT[]
) RETURNS TABLE (actual BIGINT, failure TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    i        INT;
    n        BIGINT;
    touched  BIGINT;
BEGIN
    FOR i IN 1 .. COALESCE(array_length(a_thread, 1), 0) LOOP
        n := a_ev_to[i] - a_ev_from[i] + 1;
        BEGIN
            UPDATE threads SET event_count = event_count + n,
                status = COALESCE(a_status[i], status),
                end_state = CASE WHEN a_status[i] IS NULL THEN end_state ELSE a_end_state[i] END,
                agent = COALESCE(a_agent[i], agent),
                updated_at = a_last_ts[i]
            WHERE thread_id = a_thread[i] AND event_count = a_expected[i];
            GET DIAGNOSTICS touched = ROW_COUNT;
            IF touched = 0 THEN
                IF a_expected[i] <> 0 THEN
                    RAISE EXCEPTION USING ERRCODE = 'KE001', MESSAGE = 'keel append conflict';
                END IF;
                INSERT INTO threads (thread_id, agent, status, end_state, event_count, created_at, updated_at)
                VALUES (a_thread[i], a_agent[i], a_init_status[i], a_init_end[i], n, a_first_ts[i], a_last_ts[i])
                ON CONFLICT (thread_id) DO NOTHING;
                GET DIAGNOSTICS touched = ROW_COUNT;
                IF touched = 0 THEN
                    RAISE EXCEPTION USING ERRCODE = 'KE001', MESSAGE = 'keel append conflict';
                END IF;
            END IF;
            INSERT INTO events (thread_id, seq, type, run_id, ts, body)
            SELECT a_thread[i], u.seq, u.kind, u.run_id, u.ts, u.body::json
            FROM UNNEST(
                e_seq[a_ev_from[i]:a_ev_to[i]], e_kind[a_ev_from[i]:a_ev_to[i]],
                e_run[a_ev_from[i]:a_ev_to[i]], e_ts[a_ev_from[i]:a_ev_to[i]],
                e_body[a_ev_from[i]:a_ev_to[i]]
            ) AS u(seq, kind, run_id, ts, body);
            actual := NULL;
            failure := NULL;
        EXCEPTION
            WHEN SQLSTATE 'KE001' OR unique_violation THEN
                SELECT t.event_count INTO actual FROM threads t WHERE t.thread_id = a_thread[i];
                actual := COALESCE(actual, 0);
                failure := NULL;
            WHEN deadlock_detected OR serialization_failure OR query_canceled THEN
                -- The whole group must be retried (or fail): let it abort.
                RAISE;
            WHEN OTHERS THEN
                actual := NULL;
                failure := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;
