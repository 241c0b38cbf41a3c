//! Every integration test of `keel-telemetry` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod common;

mod config;
mod metrics;
mod otlp_export;
mod otlp_tls;
mod phoenix;
mod redaction;
mod spans;
mod trace_file;
