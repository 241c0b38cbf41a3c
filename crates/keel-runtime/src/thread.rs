//! A thread: one conversation, made of the runs on it. Holds the folded state so a run
//! continues where the last one stopped; the log itself lives in the store.

use keel_core::{EventStore, RunState, StoreError, new_id};

/// A conversation the caller owns. Fork or reset it by loading another one from the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    state: RunState,
}

impl Default for Thread {
    fn default() -> Self {
        Self::new()
    }
}

impl Thread {
    /// A new, empty thread with a fresh id.
    pub fn new() -> Self {
        Self::with_id(new_id("thr"))
    }

    /// A new, empty thread with this id.
    pub fn with_id(id: impl Into<String>) -> Self {
        Self {
            state: RunState::new(id),
        }
    }

    /// Loads a thread from its log (empty if it does not exist yet).
    pub async fn load(store: &dyn EventStore, id: &str) -> Result<Self, StoreError> {
        let events = store.load(id).await?;
        Ok(Self {
            state: RunState::from_events(id, &events),
        })
    }

    /// The id.
    pub fn id(&self) -> &str {
        self.state.thread_id()
    }

    /// The folded state.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    pub(crate) fn state_mut(&mut self) -> &mut RunState {
        &mut self.state
    }

    /// Forks the stored thread at `at_seq` into a new thread and loads it.
    pub async fn fork(store: &dyn EventStore, id: &str, at_seq: u64) -> Result<Self, StoreError> {
        let target = new_id("thr");
        store.fork_thread(id, at_seq, &target).await?;
        Self::load(store, &target).await
    }
}
