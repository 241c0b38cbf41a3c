//! The Detective: Keel's reference agent for release risk assessment (seed 004).
//!
//! This crate holds two things:
//! - the **release service** ([`serve`], [`serve_forever`]): an HTTP server answering
//!   release summaries and test details from fixtures and accepting risk reports, which it
//!   validates and keeps on disk; [`faults`] make chosen requests fail, stall or answer
//!   malformed JSON for evaluations (`agents/detective/eval/suite.toml`);
//! - the Detective's agent file, `agents/detective/agent.toml` ([`DETECTIVE_AGENT_TOML`]),
//!   whose tools are pure configuration pointing at the release service through
//!   `RELEASE_SERVICE_URL`. It uses Keel's one agent schema (`keel_config::AgentDefinition`,
//!   the same as keel.toml's `[agents.<name>]`); keel-app builds it like any other agent.
//!
//! It must not contain agent logic in code: the Detective's behaviour lives in its agent
//! file, and the release service is test and demo infrastructure, not part of the runtime.

pub mod faults;
pub mod fixtures;
pub mod reports;
pub mod service;

pub use faults::{Endpoint, FaultRule, FaultSetup};
pub use reports::RiskReport;
pub use service::{DEFAULT_PORT, RunningService, ServiceConfig, serve, serve_forever};

/// The Detective's agent file, embedded (same content as `agents/detective/agent.toml`).
pub const DETECTIVE_AGENT_TOML: &str = include_str!("../agent.toml");

/// Errors of the release service.
#[derive(Debug, thiserror::Error)]
pub enum DetectiveError {
    /// The port could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another release service running? pass --port 0 for a free port)"
    )]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A fixture file is unreadable or malformed.
    #[error("release fixture {path}: {message}")]
    Fixture {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A file or directory could not be used.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}
