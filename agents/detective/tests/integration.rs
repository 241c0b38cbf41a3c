//! Every integration test of `keel-detective` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod agent_file;
mod end_to_end;
mod service;
mod tools_against_service;
