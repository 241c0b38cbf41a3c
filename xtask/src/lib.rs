//! Keel's reliability harness (issue 14), run as `cargo xtask chaos` and `cargo xtask
//! soak` (see `docs/reliability.md`). Everything runs in one process: real agents
//! ([`keel_runtime::ToolAgent`]) on real providers ([`keel_providers`], `openai:` and
//! `anthropic:`) talking HTTP to the loopback mock LLM of `keel-testkit`, with real tools
//! and a memory or SQLite store.
//!
//! - [`chaos`]: many concurrent conversations under seeded provider and tool faults; checks
//!   that every run ends, nothing panics, no request carries an orphan tool result, almost
//!   every run ends `done`, and no mutating call takes effect twice.
//! - [`soak`]: many long conversations with compaction; checks that memory, tokio tasks and
//!   file descriptors do not grow with the work done.
//! - [`serve_bench`] (`cargo xtask bench-serve`, issue 17): the load benchmark of `keel
//!   serve` — separate release `keel` processes (server and mock LLM) driven by many
//!   concurrent streaming chats; it reports figures for docs/server.md and fails only on
//!   errors.
//!
//! The logic lives here so the short versions in `xtask/tests/` (run by `./scripts/test`)
//! exercise the same code as the full commands. Verdicts depend on seeded faults and
//! counts, never on timings.

pub mod chaos;
pub mod panics;
pub mod process;
pub mod serve_bench;
pub mod soak;
pub mod stats;
pub mod store;
pub mod tools;
pub mod wire;
