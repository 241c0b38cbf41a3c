//! Every integration test of `keel-app` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod a2a_agent;
mod bad_input;
mod config_keys;
mod fencing;
#[cfg(feature = "local")]
mod local_loading;
mod responses_agent;
mod resume;
mod workflow;
