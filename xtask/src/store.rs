//! The event store a harness runs on: Keel's in-memory store, or SQLite (the default
//! durable store) on a file in a temporary directory removed at the end.

use std::sync::Arc;

use anyhow::Context;
use keel_core::{EventStore, MemoryStore};
use keel_store::SqliteStore;

/// Which store backs the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StoreKind {
    /// `keel_core::MemoryStore`.
    #[default]
    Memory,
    /// `keel_store::SqliteStore` on a temporary file.
    Sqlite,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
        })
    }
}

/// An opened store; [`OpenStore::close`] removes what it created.
pub struct OpenStore {
    /// The store.
    pub store: Arc<dyn EventStore>,
    sqlite: Option<(SqliteStore, tempfile::TempDir)>,
}

impl OpenStore {
    /// Opens a store of `kind`.
    pub async fn open(kind: StoreKind) -> anyhow::Result<Self> {
        match kind {
            StoreKind::Memory => Ok(Self {
                store: Arc::new(MemoryStore::new()),
                sqlite: None,
            }),
            StoreKind::Sqlite => {
                let dir = tempfile::tempdir().context("creating a temp dir for SQLite")?;
                let store = SqliteStore::open(dir.path().join("keel.db"))
                    .await
                    .context("opening the SQLite store")?;
                Ok(Self {
                    store: Arc::new(store.clone()),
                    sqlite: Some((store, dir)),
                })
            }
        }
    }

    /// Closes the store and removes its temporary files.
    pub async fn close(self) -> anyhow::Result<()> {
        if let Some((store, dir)) = self.sqlite {
            store.close().await;
            drop(self.store);
            dir.close().context("removing the SQLite temp dir")?;
        }
        Ok(())
    }
}
