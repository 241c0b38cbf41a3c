//! `keel-runtime` drives runs: it performs the actions that `keel_core::decide` chooses —
//! calling the model, executing tools, waiting for approvals or user input — and appends
//! what happened to the thread's event log before acting on it.
//!
//! Entry points: the [`Agent`] trait (anything that processes messages in a thread),
//! [`ToolAgent`], its main implementation (name, instructions, model, tools, budget), and
//! [`Agent::run`], which takes the new messages, the [`Thread`] to continue and a
//! [`RunContext`] (store, observers, approval handler, user-input source, cancellation).
//! The [`ToolExecutor`] is the single place tool calls run: argument validation, timeouts,
//! retries, panic containment, output checks and payload caps.
//!
//! This crate must not know any provider, store backend or surface: those plug in through
//! the `Model` and `EventStore` traits of `keel-core` and the [`RunObserver`] trait here.

pub mod agent;
pub mod agent_tool;
pub mod compaction;
pub mod context;
pub mod custom;
pub mod executor;
pub mod handoff;
pub mod journal;
pub mod outcome;
pub mod repair;
pub mod runner;
pub mod thread;
pub mod tool_agent;
pub mod workflow;

pub use agent::{Agent, AgentUpdate};
pub use agent_tool::AgentTool;
pub use context::{
    ApprovalDecision, ApprovalHandler, ApprovalMode as RunApprovalMode, ChannelObserver,
    RunContext, RunObserver, SpanParent, UserInputSource,
};
pub use custom::RunRecorder;
pub use executor::{CANCEL_GRACE as TOOL_CANCEL_GRACE, ToolExecutor};
pub use handoff::{HandoffGroup, HandoffTarget};
pub use outcome::{Clarification, RunError, RunOutcome, RunStatus, ToolCallSummary};
pub use thread::{Thread, ThreadHome};
pub use tool_agent::{ToolAgent, ToolAgentBuilder};
pub use workflow::Workflow;
