//! Every integration test of `keel-a2a` in one test binary: each file of `tests/` is a
//! module of this crate. A new test file needs a `mod` line here.
mod common;
mod keel_router;
mod outbound;
mod outbound_policy;
mod python_client;
mod python_peer;
mod turn;
