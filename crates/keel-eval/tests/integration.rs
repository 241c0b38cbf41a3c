//! Every integration test of `keel-eval` in one test binary: each file of `tests/` is a
//! module of this crate. A new test file needs a `mod` line here.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
mod compare_reports;
mod golden_library;
mod html_report;
mod judge_model;
mod report_json;
mod scoring;
mod stats_values;
mod suite_parse;
