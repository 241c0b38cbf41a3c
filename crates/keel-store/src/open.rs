//! [`open`] / [`open_store`]: pick a store from a URL (the `--store` flag, `keel.toml`).
//!
//! Accepted forms:
//! - `memory:` — in this process only ([`keel_core::MemoryStore`], [`MemoryRunQueue`] and
//!   [`MemoryEvalResultStore`]);
//! - `sqlite://PATH`, `sqlite:PATH` or a plain path — [`SqliteStore`]
//!   (`sqlite:///abs/path` is absolute; add `?synchronous=full` for fsync per commit);
//! - `postgres://...` / `postgresql://...` — [`PostgresStore`].

use std::sync::Arc;

use keel_core::MemoryStore;
use keel_core::store::{EventStore, StoreError};

use crate::eval_results::{EvalResultStore, MemoryEvalResultStore};
use crate::postgres::PostgresStore;
use crate::queue::{MemoryRunQueue, RunQueue};
use crate::serving::{MemoryServingStore, ServingStore};
use crate::sqlite::{Durability, SqliteOptions, SqliteStore};

/// A store opened from a URL: its event log, its run queue, its eval results and the
/// server's keys and cancel requests (sharing one database and pool).
#[derive(Clone)]
pub struct OpenedStore {
    /// The event log.
    pub events: Arc<dyn EventStore>,
    /// The run queue of the same backend.
    pub queue: Arc<dyn RunQueue>,
    /// Eval runs and baselines of the same backend.
    pub eval_results: Arc<dyn EvalResultStore>,
    /// API keys and cancel requests of `keel serve`, same backend.
    pub serving: Arc<dyn ServingStore>,
    /// `memory`, `sqlite` or `postgres`.
    pub backend: &'static str,
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStore")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// Opens the event store named by `url` (see the module docs for the forms).
pub async fn open_store(url: &str) -> Result<Arc<dyn EventStore>, StoreError> {
    Ok(open(url).await?.events)
}

/// Opens the run queue named by `url` (see the module docs for the forms).
pub async fn open_run_queue(url: &str) -> Result<Arc<dyn RunQueue>, StoreError> {
    Ok(open(url).await?.queue)
}

/// Opens the event store, run queue and eval-result store named by `url`.
pub async fn open(url: &str) -> Result<OpenedStore, StoreError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(StoreError::Backend(
            "store URL is empty: use a path (e.g. .keel/keel.db), sqlite://PATH, postgres://... or memory:".into(),
        ));
    }
    if url == "memory:" || url == "memory" {
        return Ok(OpenedStore {
            events: Arc::new(MemoryStore::new()),
            queue: Arc::new(MemoryRunQueue::new()),
            eval_results: Arc::new(MemoryEvalResultStore::new()),
            serving: Arc::new(MemoryServingStore::new()),
            backend: "memory",
        });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PostgresStore::connect(url).await?;
        return Ok(OpenedStore {
            events: Arc::new(store.clone()),
            queue: Arc::new(store.clone()),
            eval_results: Arc::new(store.clone()),
            serving: Arc::new(store),
            backend: "postgres",
        });
    }
    let options = sqlite_options(url)?;
    let store = SqliteStore::open_with(options).await?;
    Ok(OpenedStore {
        events: Arc::new(store.clone()),
        queue: Arc::new(store.clone()),
        eval_results: Arc::new(store.clone()),
        serving: Arc::new(store),
        backend: "sqlite",
    })
}

/// Parses the SQLite forms of a store URL.
pub(crate) fn sqlite_options(url: &str) -> Result<SqliteOptions, StoreError> {
    let rest = if let Some(rest) = url.strip_prefix("sqlite://") {
        rest
    } else if let Some(rest) = url.strip_prefix("sqlite:") {
        rest
    } else if let Some((scheme, _)) = url.split_once("://") {
        return Err(StoreError::Backend(format!(
            "unsupported store URL scheme {scheme:?}: use a path, sqlite://PATH, postgres://... or memory:"
        )));
    } else {
        url
    };
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    if path.is_empty() || path == ":memory:" {
        return Err(StoreError::Backend(format!(
            "store URL {url:?} names no SQLite file: give a path, or use memory: for a store in memory"
        )));
    }
    let mut options = SqliteOptions::new(path);
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("synchronous", "full")) => options.durability = Durability::Full,
            Some(("synchronous", "normal")) => options.durability = Durability::Normal,
            _ => {
                return Err(StoreError::Backend(format!(
                    "unknown SQLite store option {pair:?} in {url:?}: supported is synchronous=normal|full"
                )));
            }
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )]
    use super::*;

    #[test]
    fn parses_sqlite_forms() {
        assert_eq!(
            sqlite_options("sqlite://.keel/keel.db").unwrap().path,
            std::path::Path::new(".keel/keel.db")
        );
        assert_eq!(
            sqlite_options("sqlite:///tmp/x.db").unwrap().path,
            std::path::Path::new("/tmp/x.db")
        );
        assert_eq!(
            sqlite_options("sqlite:a.db").unwrap().path,
            std::path::Path::new("a.db")
        );
        assert_eq!(
            sqlite_options("data/k.db").unwrap().path,
            std::path::Path::new("data/k.db")
        );
        let full = sqlite_options("sqlite://k.db?synchronous=full").unwrap();
        assert_eq!(full.durability, Durability::Full);
        assert!(sqlite_options("mysql://x").is_err());
        assert!(sqlite_options("sqlite://k.db?bogus=1").is_err());
        assert!(sqlite_options("sqlite::memory:").is_err());
    }
}
