//! Every integration test of `keel-cli` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

mod chat_tmux;
mod compose_trace;
mod context_cli;
mod detective_cli;
mod detective_suite;
mod durable_approval;
mod durable_crash;
mod durable_workers;
mod eval_cli;
mod exactly_once;
mod golden_replay;
mod local_subset;
mod policy_cli;
mod providers_e2e;
mod resume_failed;
mod resume_recorded;
mod run_cli;
mod second_driver;
mod serve_flood;
mod serve_shutdown;
mod serve_worker_credentials;
mod serving_guards;
mod surfaces_cli;
mod worker_queue;
mod workflow_crash;
