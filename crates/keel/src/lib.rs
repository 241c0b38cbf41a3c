//! Keel, the LLM-agent framework, in one crate: the public API of every Keel crate
//! re-exported in modules, and at the root a handle that makes the simple path simple.
//!
//! ```no_run
//! #[tokio::main]
//! async fn main() -> Result<(), keel::Error> {
//!     let agent = keel::Agent::from_config("keel.toml", "detective")?;
//!     let text = agent.prompt("Assess release v2.1.0").await?;
//!     println!("{text}");
//!     Ok(())
//! }
//! ```
//!
//! [`Agent::from_config`] builds the agent keel.toml declares (`[agents.detective]`, or
//! an agent file) exactly as `keel run --agent detective` does — model, tools, budget,
//! critic, store and approval modes — and [`Agent::prompt`] runs it on a new thread and
//! returns the final answer. Every run is an append-only event log in the store, so
//! `keel threads show`, `keel trace show` and `keel resume` work on runs started here.
//!
//! # Building an agent in code
//!
//! [`Agent::builder`] takes a model (any [`core::Model`]: a provider from
//! [`providers::model_from_spec`], the embedded local model, or the scripted model of
//! `keel-testkit` in tests) and tools (typed [`core::Tool`]s):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel::Error> {
//! use std::sync::Arc;
//! use keel_testkit::{ScriptStep, ScriptedModel};
//!
//! // In production: keel::providers::model_from_spec("anthropic:claude-sonnet-4-5", &Default::default())
//! let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("Paris.")]));
//! let agent = keel::Agent::builder("geographer", model)
//!     .instructions("Answer in one word.")
//!     .tools(keel::tools::builtin_registry()?)
//!     .build()?;
//! assert_eq!(agent.prompt("Capital of France?").await?, "Paris.");
//! # Ok(()) }
//! ```
//!
//! # Typed answers
//!
//! [`Agent::prompt_typed`] asks for JSON matching a type's JSON Schema (derived with
//! `schemars`), validates the answer and sends violations back to the model, a bounded
//! number of times ([`Agent::with_max_repairs`], default [`DEFAULT_MAX_REPAIRS`]):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel::Error> {
//! # use std::sync::Arc;
//! # use keel_testkit::{ScriptStep, ScriptedModel};
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Capital {
//!     city: String,
//!     population_millions: f64,
//! }
//! # let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text(
//! #     r#"{"city": "Paris", "population_millions": 2.1}"#,
//! # )]));
//! # let agent = keel::Agent::builder("geographer", model).build()?;
//! let capital: Capital = agent.prompt_typed("Capital of France?").await?;
//! assert_eq!(capital.city, "Paris");
//! # Ok(()) }
//! ```
//!
//! # Two things called `Agent`
//!
//! [`keel::Agent`](Agent) (this crate) is a *handle*: an agent plus the run context its
//! runs use, with `prompt`, `prompt_typed`, `run`, `run_stream` and `resume`.
//! [`keel::runtime::Agent`](runtime::Agent) is the *trait* every agent implements
//! ("anything that processes messages in a thread"): the tool-calling
//! [`runtime::ToolAgent`], compositions, and your own agents. The prelude exports the
//! trait as [`prelude::AgentTrait`] so both can be in scope. A custom agent implements the
//! trait and writes its run with [`runtime::RunRecorder`], which gives it the same
//! durability and observability as any other run; [`Agent::new`] wraps it:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), keel::Error> {
//! use keel::prelude::*;
//!
//! /// Answers every message in capitals, without a model.
//! struct Shout;
//!
//! #[keel::async_trait]
//! impl AgentTrait for Shout {
//!     fn name(&self) -> &str {
//!         "shout"
//!     }
//!
//!     async fn run(
//!         &self,
//!         new_messages: Vec<Message>,
//!         thread: &mut Thread,
//!         context: &RunContext,
//!     ) -> Result<RunOutcome, RunError> {
//!         let answer = new_messages.iter().map(Message::text).collect::<String>().to_uppercase();
//!         let mut run = RunRecorder::start("shout", "custom:shout", new_messages, thread, context).await?;
//!         run.reply("shout", Message::assistant(answer.clone())).await?;
//!         run.finish(EndState::Done, None, Some(answer)).await
//!     }
//! }
//!
//! let agent = keel::Agent::new(Shout);
//! assert_eq!(agent.prompt("hello").await?, "HELLO");
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! | module | crate | what |
//! | --- | --- | --- |
//! | [`core`] | `keel-core` | messages, tools (`Tool`, `ToolSpec`, `ToolRegistry`), events, budgets, the `Model` and `EventStore` traits |
//! | [`runtime`] | `keel-runtime` | the `Agent` trait, `ToolAgent`, `Thread`, `RunContext`, `RunRecorder`, outcomes |
//! | [`tools`] | `keel-tools` | the built-in tools and declarative HTTP tools |
//! | [`providers`] | `keel-providers` | model adapters: Anthropic, OpenAI Chat and Responses, OpenRouter, Ollama |
//! | [`store`] | `keel-store` | SQLite and Postgres event stores, the run queue |
//! | [`config`] | `keel-config` | keel.toml and agent files: schema, loading, diagnostics |
//! | [`app`] | `keel-app` | configuration turned into agents, stores and run contexts |
//! | `testkit` (feature `testkit`) | `keel-testkit` | the scripted model and the mock LLM server |
//!
//! Features: `local` (the embedded llama.cpp model, `local:NAME` model specs; needs
//! cmake and clang) and `testkit`. See `docs/library.md` in the repository for more.

#![warn(missing_docs)]

mod agent;
mod builder;
mod error;
mod typed;

pub use agent::{Agent, DEFAULT_MAX_REPAIRS};
pub use builder::AgentBuilder;
pub use error::Error;

/// The attribute for implementing [`runtime::Agent`] (an `async` trait).
pub use async_trait::async_trait;
/// JSON Schema derivation for typed tools and typed answers (`#[derive(JsonSchema)]`).
pub use schemars;

/// `keel-core`: Keel's vocabulary — messages, tool contracts, events, budgets, the
/// `Model` and `EventStore` traits — and the pure run state machine.
pub use keel_core as core;

/// `keel-runtime`: the [`Agent`](runtime::Agent) trait, the tool-calling
/// [`ToolAgent`](runtime::ToolAgent), threads, run contexts, custom runs
/// ([`RunRecorder`](runtime::RunRecorder)) and outcomes.
pub use keel_runtime as runtime;

/// `keel-tools`: the built-in tools and declarative HTTP tools.
pub use keel_tools as tools;

/// `keel-providers`: model adapters over the providers' wire protocols.
pub use keel_providers as providers;

/// `keel-store`: durable event stores (SQLite, Postgres) and the run queue.
pub use keel_store as store;

/// `keel-config`: keel.toml and agent files — schema, loading, diagnostics.
pub use keel_config as config;

/// `keel-app`: configuration turned into agents, models, tools, stores and run contexts.
pub use keel_app as app;

/// `keel-testkit`: the scripted model and the wire-protocol mock LLM server.
#[cfg(feature = "testkit")]
pub use keel_testkit as testkit;

/// What most programs need, in one import: `use keel::prelude::*;`.
///
/// The runtime's agent trait is exported as [`AgentTrait`](prelude::AgentTrait) so that it
/// does not clash with the [`Agent`] handle.
pub mod prelude {
    pub use crate::{Agent, AgentBuilder, Error, async_trait};
    pub use keel_core::{
        Budget, EndState, Message, Tool, ToolContext, ToolError, ToolRegistry, ToolSpec,
    };
    pub use keel_runtime::Agent as AgentTrait;
    pub use keel_runtime::{AgentUpdate, RunContext, RunError, RunOutcome, RunRecorder, Thread};
    pub use schemars::JsonSchema;
}

// The README's code blocks are doc tests: its first block is the hello world above.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
