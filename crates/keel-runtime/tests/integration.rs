//! Every integration test of `keel-runtime` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod adversarial;
mod agent_run;
mod call_rules;
mod compose;
mod context_window;
mod exactly_once;
mod executor;
mod journal_batches;
mod planner_critic;
mod resume_failed;
mod resume_interrupted;
