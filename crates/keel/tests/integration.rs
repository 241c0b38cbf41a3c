//! Every integration test of `keel` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
#[macro_use]
mod common;

// Every example this binary runs, compiled in once (`common::run_example` starts this
// binary again with `--exact example_child`).
keel_examples! {
    hello => "hello.rs",
    typed_tool => "typed_tool.rs",
    custom_agent => "custom_agent.rs",
    typed_output => "typed_output.rs",
    agent_as_tool => "agent_as_tool.rs",
    handoff => "handoff.rs",
    workflow => "workflow.rs",
}

mod compose_examples;
mod examples;
mod facade;
mod workflow_example;
