//! Every integration test of `keel-local` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod common;

mod cancellation;
mod local_model;
mod pinned_bindings;
mod prompt_cache;
mod pull;
mod random_catalogs;
mod untrusted_input;
