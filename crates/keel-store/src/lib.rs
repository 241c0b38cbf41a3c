//! Durable event-log stores for Keel threads: [`SqliteStore`] (the embedded default,
//! `.keel/keel.db`), [`PostgresStore`] (several processes sharing one database) and
//! keel-core's `MemoryStore`, all implementing [`keel_core::EventStore`] and all held to one
//! [`conformance`] suite. The SQL stores are also [`RunQueue`]s: runs leased to scale-out
//! workers with expiry, renewal and fencing tokens, and [`EvalResultStore`]s: `keel eval`
//! runs (reports kept as opaque JSON, linked to their trials' thread and trace ids) and
//! named baselines ([`eval_results`]); and [`ServingStore`]s: what `keel serve` keeps
//! beside the log — hashed API keys and run cancel requests ([`serving`]).
//!
//! This crate stores and loads events; it must not interpret them beyond the thread
//! summary (agent, status, counts, times), drive runs, or know about models and tools.
//!
//! # Durability and cost
//!
//! - Group commit: each store has one writer that commits the appends of all concurrent
//!   runs together, one transaction (and one fsync when synchronous) per group, each
//!   append under its own savepoint (SQLite; Postgres: a conflict writes nothing, and a
//!   group that raises runs again one subtransaction per append) so every caller gets
//!   its own answer
//!   (SQLite: `sqlite_writer`, a `rusqlite` connection on a dedicated thread that also
//!   performs fork, delete, purge and queue updates, and that holds a group up to 2 ms
//!   to gather more while runs append concurrently; Postgres: `postgres_writer`, one
//!   `keel_append_group` call per group). An append returns once its group committed.
//! - The optimistic-concurrency check (`expected_next_seq` = the thread's event count)
//!   and a `UNIQUE (thread_id, seq)` constraint are enforced by the database, so
//!   concurrent appenders — in one process or many — never interleave: exactly one wins
//!   each seq, the others get [`keel_core::StoreError::Conflict`] and nothing of their
//!   batch is written.
//! - SQLite runs in WAL mode with `synchronous=NORMAL` by default ([`Durability::Normal`]):
//!   a committed append survives the process being killed (SIGKILL included); only an OS
//!   crash or power loss can lose the last commits. [`Durability::Full`]
//!   (`sqlite://PATH?synchronous=full`) fsyncs every commit, and
//!   [`AppendDurability::Sync`] fsyncs the group of one append whatever the level.
//!   Other processes' writers wait up to the busy timeout (5 s by default) for the lock.
//! - `load` is one query ordered by the primary key; listing threads reads the `threads`
//!   summary table (maintained in the append transaction). On SQLite a running thread's
//!   row is rewritten only when its status or agent changes (migration `0004`: fewer
//!   B-tree pages per commit), so a listing reads a running thread's count and time from
//!   its last event.
//! - Events are stored whole as JSON (Postgres: `json`, which keeps the exact text and,
//!   unlike `jsonb`, accepts the NUL character), with `thread_id`, `seq`, `type`, `run_id`
//!   and `ts` copied into indexed columns. Times are stored as integer nanoseconds so a
//!   summary's times equal its events' times exactly.
//! - The runs list (`EventStore::list_runs`: filters, sorting, keyset pages) is answered
//!   from an index of each thread's run statistics and searchable text (`run_index`,
//!   migration `0007`), which the store brings up to date before each listing from the
//!   events threads gained since — never on the append path. The same rows hold each
//!   thread's metrics facts (`EventStore::run_facts`, migration `0008`), from which the
//!   web UI's dashboard computes `keel stats`' figures without reading a log.
//! - Schemas are embedded migrations (`migrations/sqlite`, `migrations/postgres`) applied
//!   on open.

mod migrations;
mod open;
mod postgres;
mod postgres_writer;
mod rows;
mod run_index;
mod sqlite;
mod sqlite_reader;
mod sqlite_wal;
mod sqlite_writer;

pub mod conformance;
pub mod eval_results;
pub mod queue;
pub mod serving;

pub use eval_results::{
    BaselineInfo, EvalResultStore, EvalRunId, EvalRunInfo, EvalStoreError, EvalThreadLink,
    MemoryEvalResultStore, NewEvalRun, StoredEvalRun,
};
pub use keel_core::MemoryStore;
pub use keel_core::store::{
    AppendDurability, EventStore, StoreError, ThreadFilter, ThreadStatus, ThreadSummary,
};
pub use open::{OpenedStore, open, open_run_queue, open_store};
pub use postgres::{PostgresOptions, PostgresStore};
pub use queue::{
    CLAIM_KEY, JobId, JobInfo, JobState, Lease, MemoryRunQueue, QueueCounts, QueueError, RunQueue,
    claim_holder, claim_payload,
};
pub use serving::{
    ApiKeyInfo, MemoryServingStore, NewApiKey, ServingStore, ServingStoreError, valid_tenant,
};
pub use sqlite::{DEFAULT_SQLITE_PATH, Durability, SqliteOptions, SqliteStore};
