//! The Agent2Agent (A2A) protocol for Keel, versions 1.0 and 0.3, over JSON-RPC.
//!
//! - [`types`], [`card`], [`jsonrpc`]: the wire types — agent cards, messages and parts,
//!   tasks, status and artifact updates, JSON-RPC envelopes and the A2A error codes. One
//!   tolerant reader takes either version's shapes; [`ProtocolVersion`] writes each.
//! - [`client`]: [`A2aClient`] fetches an agent's card, speaks the newest version the card
//!   advertises, and sends, streams (SSE), gets and cancels tasks — every await with a
//!   deadline, credentials from environment variables.
//! - [`agent`]: one turn of a conversation with a remote agent ([`agent::turn`]: send, then
//!   follow the task to the end of its turn as a stream of [`agent::TurnEvent`]s — the task
//!   once named, reply text as it streams, the end), for an agent answered by a remote A2A
//!   agent (keel-app's `A2aAgent`, keel.toml `[agents.<name>] a2a = "…"`).
//! - [`tool`]: [`A2aTool`], a remote agent as a Keel tool (keel.toml `[[a2a.agents]]`),
//!   with streaming, `input-required` surfaced to the model, and remote cancellation when
//!   the call is cancelled or times out.
//! - [`server`]: an axum router serving agent cards and the JSON-RPC endpoint (both
//!   versions, negotiated by method name and `A2A-Version`) over an [`A2aBackend`]; keel-
//!   server implements the backend over Keel threads and runs. [`testing::EchoBackend`]
//!   is an in-memory backend for tests and examples; [`peers`] starts the Python SDK's
//!   server for interoperability tests.
//!
//! This crate must not depend on the store, the runtime or the application layer: it only
//! knows keel-core's tool contract (keel-app journals the runs of remote agents). It never
//! reads configuration files; callers pass values (keel-app turns `[[a2a.agents]]` into
//! [`RemoteAgent`]s and `A2aAgent`s).

pub mod agent;
pub mod card;
pub mod client;
pub mod jsonrpc;
pub mod peers;
pub mod server;
pub mod sse;
pub mod testing;
pub mod tool;
pub mod types;
pub mod version;

pub use card::{AgentCard, Endpoint};
pub use client::{A2aClient, Auth, ClientError, ClientOptions, EnvLookup};
pub use jsonrpc::RpcError;
pub use server::{A2aBackend, AgentDescriptor, CallContext, TaskRun, router};
pub use tool::{A2aTool, A2aToolArgs, A2aToolOutput, RemoteAgent};
pub use types::{
    Artifact, Message, Part, PartContent, Role, SendResult, StreamEvent, Task, TaskEvent,
    TaskState, TaskStatus,
};
pub use version::{Method, ProtocolVersion};
