//! [`Error`]: everything that can go wrong on the facade's paths — a bad keel.toml or agent
//! definition, a store that will not open, a run that could not be driven, a run that
//! ended other than `done`, a typed answer that never matched its schema.

use keel_core::EndState;

/// Why a facade call failed. Each message says what happened and where (file and line of
/// a bad definition, the thread to inspect with `keel threads show`).
///
/// `Debug` shows the same message as `Display`, so `fn main() -> Result<(), keel::Error>`
/// prints a readable error; match on the variants for the details.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// keel.toml or an agent definition is invalid, or something it names could not be
    /// built or opened (model, tool, MCP server, store).
    #[error(transparent)]
    Config(#[from] keel_app::AppError),
    /// A model spec could not be turned into a model (unknown provider, missing API key,
    /// a non-loopback URL in test mode…).
    #[error(transparent)]
    Provider(#[from] keel_providers::ProviderConfigError),
    /// The event store failed (opening it, loading a thread).
    #[error("event store: {0}")]
    Store(#[from] keel_core::StoreError),
    /// A tool could not be registered (its contract is broken, or its name is taken).
    #[error(transparent)]
    Tool(#[from] keel_core::RegistryError),
    /// The run could not be driven at all (store failure, a run already in progress…).
    #[error(transparent)]
    Run(#[from] keel_runtime::RunError),
    /// The run ended, but not `done` (failed, budget exceeded, clarification needed,
    /// cancelled…). The thread keeps the whole story.
    #[error(
        "the run ended {state} on thread {thread_id}{}",
        reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default(),
        state = end_state.as_str()
    )]
    RunEnded {
        /// How it ended.
        end_state: EndState,
        /// Why (the model error, the budget reached, the question asked…).
        reason: Option<String>,
        /// The thread of the run (`keel threads show THREAD`).
        thread_id: String,
        /// The run.
        run_id: String,
    },
    /// The run paused, waiting for a human to approve a tool call; continue it with
    /// `keel approve THREAD CALL_ID` (or [`keel_runtime::Thread::approve`] and
    /// [`crate::Agent::resume`]).
    #[error("the run on thread {thread_id} is waiting for approval of `{tool}` call {call_id}")]
    AwaitingApproval {
        /// The thread of the run.
        thread_id: String,
        /// The run.
        run_id: String,
        /// The call waiting for a decision.
        call_id: String,
        /// Its tool.
        tool: String,
    },
    /// A typed answer still did not match the type's JSON Schema after every repair
    /// attempt.
    #[error(
        "the answer on thread {thread_id} does not match the schema of `{type_name}` after {attempts} attempt(s): {}",
        violations.join("; ")
    )]
    InvalidOutput {
        /// The Rust type asked for.
        type_name: String,
        /// The thread of the conversation (every attempt is on it).
        thread_id: String,
        /// Answers received (the first one plus the repairs).
        attempts: u32,
        /// What was wrong with the last answer, one entry per violation.
        violations: Vec<String>,
        /// The last answer, as the model gave it.
        output: String,
    },
    /// The JSON Schema generated for a typed answer could not be compiled (a bug in the
    /// type's `JsonSchema` implementation).
    #[error("the JSON Schema of `{type_name}` is not usable: {message}")]
    Schema {
        /// The Rust type.
        type_name: String,
        /// What the validator said.
        message: String,
    },
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl Error {
    /// The thread the failure happened on, when there was a run.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            Self::RunEnded { thread_id, .. }
            | Self::AwaitingApproval { thread_id, .. }
            | Self::InvalidOutput { thread_id, .. } => Some(thread_id),
            Self::Run(keel_runtime::RunError::RunInProgress { thread_id, .. }) => Some(thread_id),
            _ => None,
        }
    }

    /// How the run ended, for [`Error::RunEnded`].
    pub fn end_state(&self) -> Option<EndState> {
        match self {
            Self::RunEnded { end_state, .. } => Some(*end_state),
            _ => None,
        }
    }
}
