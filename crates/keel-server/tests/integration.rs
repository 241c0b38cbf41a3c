//! keel-server's integration tests, one binary (modules below): a real server on a
//! loopback port over a real store (SQLite in a temp dir; Postgres in a fresh schema from
//! `DATABASE_URL`), its embedded workers driving keel.toml agents whose model is the
//! testkit's mock LLM. Tests wait on events (streams, polled statuses with generous
//! deadlines), never on sleeps.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;
mod contract;

mod a2a;
mod api;
mod chat;
mod credentials;
mod hosts;
mod load;
mod paused;
mod streams;
mod tenancy;
mod ui;
