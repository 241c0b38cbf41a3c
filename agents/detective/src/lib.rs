//! The Detective: Keel's reference agent for release risk assessment (seed 004).
//!
//! This crate holds three things:
//! - the **release service** ([`serve`], [`serve_forever`]): an HTTP server answering
//!   release summaries and test details from fixtures and accepting risk reports, which it
//!   validates and keeps on disk;
//! - the **agent file** format ([`agent_file::AgentFile`]): an agent declared in TOML —
//!   instructions, declarative HTTP tools, built-in tools, budget and critic rules — and
//!   [`agent_file::build_agent`], which turns any such file into a `keel_runtime::Agent`;
//! - the Detective's own agent file, `agents/detective/agent.toml`, whose tools are pure
//!   configuration pointing at the release service through `RELEASE_SERVICE_URL`.
//!
//! It must not contain agent logic in code: the Detective's behaviour lives in its agent
//! file, and the release service is test and demo infrastructure, not part of the runtime.

pub mod agent_file;
pub mod fixtures;
pub mod reports;
pub mod service;

pub use agent_file::{AgentFile, AgentFileError, build_agent};
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
