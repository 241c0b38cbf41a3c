//! In-process fan-out from the embedded workers to the HTTP side: a [`HubObserver`] on
//! every run the server's workers drive announces each appended event (streams then read
//! the store, which already holds it) and forwards text deltas (which are never stored);
//! it also registers the run's cancellation token while the run is driven here, and adds
//! the run's model tokens to its tenant's daily usage.
//!
//! Nothing here is needed for correctness: streams also poll the store, so runs driven by
//! other processes (`keel worker`, other `keel serve`s) stream too, only without deltas
//! and with the poll's latency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use keel_core::{CancellationToken, Event, EventKind, StreamEvent};
use keel_runtime::RunObserver;
use tokio::sync::broadcast;

use crate::limits::Usage;

/// What the hub announces.
#[derive(Debug, Clone)]
pub enum HubMessage {
    /// Event `seq` was appended to this store thread.
    Appended(Arc<str>, u64),
    /// A text delta of a model answer on this store thread.
    Delta {
        /// Store thread id.
        thread: Arc<str>,
        /// Run id.
        run_id: Arc<str>,
        /// The text.
        text: Arc<str>,
    },
}

impl HubMessage {
    /// The store thread it is about.
    pub fn thread(&self) -> &str {
        match self {
            Self::Appended(thread, _) => thread,
            Self::Delta { thread, .. } => thread,
        }
    }
}

/// The fan-out and the registry of runs driven in this process.
#[derive(Debug)]
pub struct Hub {
    sender: broadcast::Sender<HubMessage>,
    running: Mutex<HashMap<String, CancellationToken>>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    /// A hub (a slow subscriber misses messages and re-reads the store).
    pub fn new() -> Self {
        Self {
            sender: broadcast::channel(1024).0,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Receives what is announced from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<HubMessage> {
        self.sender.subscribe()
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, CancellationToken>> {
        match self.running.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Cancels run `run_id` if this process drives it; whether it did.
    pub fn cancel(&self, run_id: &str) -> bool {
        match self.running().get(run_id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// How many runs this process drives now.
    pub fn running_count(&self) -> usize {
        self.running().len()
    }

    fn register(&self, run_id: &str, token: &CancellationToken) {
        self.running().insert(run_id.to_string(), token.clone());
    }

    fn unregister(&self, run_id: &str) {
        self.running().remove(run_id);
    }
}

/// The observer the embedded workers put on every run (see the module docs).
pub struct HubObserver {
    hub: Arc<Hub>,
    usage: Arc<Usage>,
    cancel: CancellationToken,
    /// The run this observer saw start or resume, unregistered when the context drops.
    run_id: Mutex<Option<String>>,
}

impl std::fmt::Debug for HubObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubObserver").finish_non_exhaustive()
    }
}

impl HubObserver {
    /// An observer of a run cancelled by `cancel`; `run_id` when resuming a known run.
    pub fn new(
        hub: Arc<Hub>,
        usage: Arc<Usage>,
        cancel: CancellationToken,
        run_id: Option<&str>,
    ) -> Self {
        if let Some(run_id) = run_id {
            hub.register(run_id, &cancel);
        }
        Self {
            hub,
            usage,
            cancel,
            run_id: Mutex::new(run_id.map(str::to_string)),
        }
    }

    /// The run observed (once started or resumed).
    pub fn run_id(&self) -> Option<String> {
        match self.run_id.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_run(&self, run_id: &str) {
        let mut current = match self.run_id.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if current.as_deref() != Some(run_id) {
            if let Some(previous) = current.take() {
                self.hub.unregister(&previous);
            }
            self.hub.register(run_id, &self.cancel);
            *current = Some(run_id.to_string());
        }
    }
}

impl Drop for HubObserver {
    fn drop(&mut self) {
        let run = match self.run_id.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(run_id) = run {
            self.hub.unregister(&run_id);
        }
    }
}

impl RunObserver for HubObserver {
    fn on_event(&self, event: &Event) {
        match &event.kind {
            EventKind::RunStarted { .. } => self.set_run(&event.run_id),
            EventKind::ModelResponded { usage, .. } => {
                let tenant = event.thread_id.split('.').next().unwrap_or_default();
                self.usage.add(
                    tenant,
                    usage.input_tokens.saturating_add(usage.output_tokens),
                );
            }
            _ => {}
        }
        let _ = self.hub.sender.send(HubMessage::Appended(
            Arc::from(event.thread_id.as_str()),
            event.seq,
        ));
    }

    fn on_stream(&self, thread_id: &str, run_id: &str, event: &StreamEvent) {
        if let StreamEvent::TextDelta(text) = event {
            let _ = self.hub.sender.send(HubMessage::Delta {
                thread: Arc::from(thread_id),
                run_id: Arc::from(run_id),
                text: Arc::from(text.as_str()),
            });
        }
    }
}
