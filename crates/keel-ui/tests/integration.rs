//! keel-ui's integration tests: one binary (see ARCHITECTURE.md, "A new integration test
//! file"). `pages` checks the pages over HTTP; `evals` the eval pages, time to first token
//! and answering a question; `browser` drives them in headless Chromium.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod browser;
mod common;
mod evals;
mod live;
mod pages;
