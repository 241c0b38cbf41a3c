//! The Keel side: an agent on the `openai:` provider pointed at the mock, with the
//! `calculator` tool, over one of the three stores (memory, SQLite on a temp file,
//! Postgres in a fresh schema).

use std::sync::Arc;

use anyhow::{Context, bail};
use keel_core::{EndState, EventStore, MemoryStore, Message, ToolRegistry};
use keel_providers::{ProviderOptions, model_from_spec};
use keel_runtime::{RunContext, Thread, ToolAgent};
use keel_store::{PostgresOptions, PostgresStore, SqliteStore};
use serde_json::json;

use crate::bare::RequestTemplate;

/// Which store backs the agent's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// `keel_core::MemoryStore`.
    Memory,
    /// `keel_store::SqliteStore` on a temp file (the default durable store).
    Sqlite,
    /// `keel_store::PostgresStore` on `$DATABASE_URL` in a fresh schema.
    Postgres,
}

/// The default Postgres URL when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The agent every Keel configuration runs.
pub fn agent(model: &str, base_url: &str) -> anyhow::Result<ToolAgent> {
    let options = ProviderOptions {
        base_url: Some(base_url.to_owned()),
        api_key: Some("bench".into()),
        loopback_only: true,
        ..ProviderOptions::default()
    };
    let model = model_from_spec(&format!("openai:{model}"), &options)
        .with_context(|| format!("building the model openai:{model}"))?;
    let mut tools = ToolRegistry::new();
    tools
        .register_typed(keel_tools::Calculator)
        .context("registering the calculator tool")?;
    Ok(ToolAgent::builder("bench", model)
        .instructions("Answer arithmetic questions; use the calculator.")
        .tools(tools)
        .build())
}

/// What the baseline must send to match the agent's requests.
pub fn request_template(model: &str, base_url: &str) -> anyhow::Result<RequestTemplate> {
    let agent = agent(model, base_url)?;
    Ok(RequestTemplate {
        model: model.to_owned(),
        system: agent.system_prompt().to_owned(),
        tools: agent
            .tool_definitions()
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema}})
            })
            .collect(),
        max_completion_tokens: agent.model().capabilities().max_output_tokens,
    })
}

/// An opened store and what must happen to it at the end.
pub struct OpenStore {
    /// The store.
    pub store: Arc<dyn EventStore>,
    cleanup: Cleanup,
}

enum Cleanup {
    None,
    Sqlite(SqliteStore, tempfile::TempDir),
    Postgres(PostgresStore),
}

/// Why a store could not be opened: unreachable Postgres is a skip, anything else an error.
pub enum OpenError {
    /// Postgres did not answer; the configuration is skipped.
    Unreachable(String),
    /// Anything else.
    Failed(anyhow::Error),
}

impl OpenStore {
    /// Opens a store of `kind`: a new temp file for SQLite, a fresh schema for Postgres.
    pub async fn open(kind: StoreKind) -> Result<Self, OpenError> {
        match kind {
            StoreKind::Memory => Ok(Self {
                store: Arc::new(MemoryStore::new()),
                cleanup: Cleanup::None,
            }),
            StoreKind::Sqlite => {
                let dir = tempfile::tempdir()
                    .map_err(|e| OpenError::Failed(anyhow::anyhow!("temp dir: {e}")))?;
                let store = SqliteStore::open(dir.path().join("keel.db"))
                    .await
                    .map_err(|e| OpenError::Failed(e.into()))?;
                Ok(Self {
                    store: Arc::new(store.clone()),
                    cleanup: Cleanup::Sqlite(store, dir),
                })
            }
            StoreKind::Postgres => {
                let url = std::env::var("DATABASE_URL")
                    .ok()
                    .filter(|u| !u.trim().is_empty())
                    .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let schema = format!("keel_bench_{}_{nanos}", std::process::id());
                let mut options = PostgresOptions::new(url.clone()).schema(schema);
                options.acquire_timeout = std::time::Duration::from_secs(5);
                match PostgresStore::connect_with(options).await {
                    Ok(store) => Ok(Self {
                        store: Arc::new(store.clone()),
                        cleanup: Cleanup::Postgres(store),
                    }),
                    Err(e) => Err(OpenError::Unreachable(format!("{url}: {e}"))),
                }
            }
        }
    }

    /// Closes the store and removes what the run created (temp file, schema).
    pub async fn close(self) -> anyhow::Result<()> {
        match self.cleanup {
            Cleanup::None => Ok(()),
            Cleanup::Sqlite(store, dir) => {
                store.close().await;
                dir.close().context("removing the SQLite temp dir")
            }
            Cleanup::Postgres(store) => store
                .drop_schema()
                .await
                .context("dropping the benchmark schema"),
        }
    }
}

/// One conversation: a new thread, one user message, run to the end. Returns the number
/// of model requests made.
pub async fn conversation(
    agent: &ToolAgent,
    ctx: &RunContext,
    prompt: &str,
) -> anyhow::Result<u32> {
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user(prompt)], &mut thread, ctx)
        .await
        .context("ToolAgent::run")?;
    if outcome.end_state() != Some(EndState::Done) {
        bail!(
            "the run ended as {:?} ({})",
            outcome.status,
            outcome.reason.unwrap_or_default()
        );
    }
    Ok(outcome.turns)
}
