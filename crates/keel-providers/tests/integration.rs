//! Every integration test of `keel-providers` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod common;

mod config;
mod connections;
mod framing_props;
mod limits;
mod providers;
mod request_bodies;
