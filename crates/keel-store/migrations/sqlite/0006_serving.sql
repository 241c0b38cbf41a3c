-- What `keel serve` keeps beside the event log (issue 17). `api_keys`: one row per API
-- key, holding only the SHA-256 of the key (hex), never the key itself; `key_id` is the
-- public, non-secret part shown by `keel keys list` and used to revoke. A revoked key keeps
-- its row (`revoked_at` set) so listings show it. `run_cancellations`: a cancel request for
-- a run, read by the server's workers in any process. Times are nanoseconds since the Unix
-- epoch (UTC).
CREATE TABLE api_keys (
    key_id     TEXT PRIMARY KEY NOT NULL,
    tenant     TEXT NOT NULL,
    name       TEXT,
    key_sha256 TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant, created_at);

CREATE TABLE run_cancellations (
    run_id       TEXT PRIMARY KEY NOT NULL,
    thread_id    TEXT NOT NULL,
    requested_at INTEGER NOT NULL
);
