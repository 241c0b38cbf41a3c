//! `keel-core` is Keel's vocabulary and its pure run state machine.
//!
//! It defines messages, tool contracts ([`ToolSpec`], the typed [`Tool`] trait and its
//! erased form [`DynTool`]), tool outcomes and the error taxonomy, the durable [`Event`]
//! records of a run, budgets, the [`Model`] trait, and the decision function
//! [`decide`] that reads a folded [`RunState`] and says what to do next.
//!
//! This crate must not do I/O: no async runtime, no HTTP, no database, no clock reads in
//! `decide` (the caller passes `now`). Everything that performs actions lives in
//! `keel-runtime` and the adapter crates, which depend on this one and never the reverse.

pub mod budget;
pub mod call_rules;
pub mod cancel;
pub mod cap;
pub mod context;
pub mod critic;
pub mod decide;
pub mod definition;
pub mod event;
pub mod message;
pub mod model;
pub mod observation;
pub mod outcome;
pub mod paging;
pub mod planner;
pub mod policy;
pub mod registry;
pub mod run_metrics;
pub mod runs;
pub mod state;
pub mod store;
pub mod tool;

pub use budget::Budget;
pub use call_rules::{
    CallRule, GroundedArgument, MAX_CITATIONS, PastCall, ToolProgress, check_call, expected_tools,
    grounded_arguments, withheld_tools,
};
pub use cancel::CancellationToken;
pub use critic::{Critic, CriticInput, ModelCritic, RuleCritic, Subject, Verdict};
pub use decide::{Action, EndState, decide};
pub use definition::{AgentDefinition, AgentFingerprint, DefinitionComparison, ToolFingerprint};
pub use event::{EVENT_SCHEMA_VERSION, Event, EventKind};
pub use message::{Message, Part, Role, ToolCall, ToolResult, Usage};
pub use model::{
    Model, ModelCapabilities, ModelError, ModelErrorKind, ModelRequest, ModelResponse, StopReason,
    StreamEvent, ToolChoice,
};
pub use observation::{DefaultNormalizer, Observation, ObservationMode, ObservationNormalizer};
pub use outcome::{ToolError, ToolErrorCode, ToolOutcome, ToolResultKind};
pub use paging::{Page, PageRequest, paginate};
pub use planner::{PlannerAction, PlannerMode};
pub use policy::{PolicyDecision, PolicyStep, PolicyTable};
pub use registry::{RegistryError, ToolRegistry};
pub use state::RunState;
pub use store::{
    AppendDurability, AppendFence, EventStore, MemoryStore, RunDurability, StoreError,
};
pub use tool::{
    ApprovalMode, CredentialLookup, CredentialSource, DynTool, Effect, RetryPolicy, Tool,
    ToolContext, ToolDefinition, ToolSpec, TypedTool,
};

/// A new unique, time-ordered identifier (UUID v7) with a short prefix such as `thr` or `run`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}
