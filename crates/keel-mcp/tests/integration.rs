//! Every integration test of `keel-mcp` in one test binary: each file of `tests/` is a
//! module of this crate, so a build links one test executable per crate instead of one
//! per file (what keeps a cold `./scripts/test` fast). A new test file needs a `mod`
//! line here.
mod common;

mod agent_run;
mod config_toml;
mod http_server;
mod outbound;
mod real_servers;
mod serve_sessions;
mod stdio_hygiene;
