//! Keel's built-in tools.
//!
//! The reference tools of seed 002 — [`PingPong`], [`Calculator`], [`Delay`] and
//! [`FailureInjection`] — each with LLM-facing usage guidance in the seed's recommended
//! format. They double as the executor's test fixtures: `failure_injection` fails on
//! purpose (error, panic or hang) to prove failures are contained.
//!
//! [`http`] turns a declaration ([`HttpToolConfig`]: method, URL template, headers from
//! environment variables, schemas, timeout, retry, effect) into a tool ([`HttpTool`]), so
//! tools for HTTP services are configuration, not code.
//!
//! Tools here must never panic on bad input (except `failure_injection` in `panic` mode,
//! which exists to do exactly that) and must honour `ToolContext::cancel`.

pub mod calculator;
pub mod delay;
pub mod expr;
pub mod failure_injection;
pub mod http;
pub mod ping_pong;

use keel_core::{RegistryError, ToolRegistry};

pub use calculator::Calculator;
pub use delay::Delay;
pub use failure_injection::FailureInjection;
pub use http::{HttpAuth, HttpTool, HttpToolConfig, HttpToolError};
pub use ping_pong::PingPong;

/// Names of the built-in tools.
pub const BUILTIN_TOOLS: [&str; 4] = ["calculator", "delay", "failure_injection", "ping_pong"];

/// A registry with every built-in tool.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use keel_core::ToolContext;
///
/// let tools = keel_tools::builtin_registry()?;
/// assert_eq!(tools.names().collect::<Vec<_>>(), keel_tools::BUILTIN_TOOLS);
///
/// let calculator = tools.get("calculator").expect("built in");
/// let ctx = ToolContext::new("thr_1", "run_1", "call_1", Default::default());
/// let output = calculator.call(serde_json::json!({"expression": "2*(3+4)"}), &ctx).await?;
/// assert_eq!(output["result"], 14.0);
/// # Ok(()) }
/// ```
pub fn builtin_registry() -> Result<ToolRegistry, RegistryError> {
    let mut registry = ToolRegistry::new();
    registry.register_typed(PingPong)?;
    registry.register_typed(Calculator)?;
    registry.register_typed(Delay)?;
    registry.register_typed(FailureInjection::default())?;
    Ok(registry)
}
