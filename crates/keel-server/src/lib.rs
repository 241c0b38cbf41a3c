//! Keel's HTTP server (`keel serve`): a chat API over keel.toml's agents in which runs are
//! queued, never tied to a request — the server enqueues on the store's run queue and
//! embedded workers (or separate `keel worker` processes on a shared Postgres) drive them
//! — with Server-Sent Events of the journaled events (resumable with `Last-Event-ID`),
//! threads and runs (fork, delete, cancel, approvals, replies), API keys hashed in the
//! store, tenant isolation, per-tenant limits, health, readiness, metrics and an OpenAPI
//! document generated from the handlers.
//!
//! Agents are built by `keel-app` exactly as the CLI builds them ([`jobs`]); events are
//! written only by the runtime's journal. This crate must not build agents any other way,
//! write events itself, or let a request's tenant reach another tenant's threads: every
//! store id goes through [`tenancy`].
//!
//! Map: [`server`] (router, layers, workers, shutdown), [`api`] (handlers), [`auth`]
//! (keys on requests, the rate limit), [`keys`] (creating and checking keys), [`tenancy`]
//! (thread ids per tenant), [`limits`], [`jobs`] (queueing and the workers' agents),
//! [`follow`] (SSE and waits), [`hub`] (in-process fan-out), [`outcome`] (run JSON),
//! [`metrics`], [`error`], [`a2a`] (the A2A agent cards and JSON-RPC over threads and
//! runs), [`ui`] (the web UI under `/ui`: sessions from API keys, a tenant's scope),
//! [`credentials`] (each tenant's tool credentials, never the server's own).

pub mod a2a;
pub mod api;
pub mod auth;
pub mod credentials;
pub mod error;
pub mod follow;
pub mod hub;
pub mod jobs;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod outcome;
pub mod server;
pub mod state;
pub mod streams;
pub mod tenancy;
pub mod ui;

pub use error::ApiError;
pub use server::{ServeReport, Server, ServerError};
