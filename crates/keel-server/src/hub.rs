//! In-process fan-out from the embedded workers to the HTTP side: a [`HubObserver`] on
//! every run the server's workers drive announces each appended event (streams then read
//! the store, which already holds it) and forwards text deltas (which are never stored);
//! it also registers the run's cancellation token while the run is driven here, and adds
//! the run's model tokens to its tenant's daily usage.
//!
//! Announcements go to the subscribers of their thread ([`Hub::subscribe_thread`]: a
//! stream or a waiting request follows one thread) and to the subscribers of every thread
//! ([`Hub::subscribe`]). Per-thread channels keep the fan-out linear: with one shared
//! channel, each of N open streams woke for the messages of all N runs (N² wake-ups), and
//! under load the streams fell behind the channel and lost text deltas.
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

/// How many messages a subscriber of every thread may fall behind before it misses some
/// (and re-reads the store).
const CAPACITY: usize = 1024;

/// The same for a subscriber of one thread: its own run's messages only. Kept small
/// because a channel's buffer is allocated whole when the thread is first followed (~80
/// bytes a slot: 500 followed threads hold 5 MB at 128 slots, 40 MB at 1,024). A stream
/// loses text deltas only when its client falls this many announcements behind on top of
/// the 256 SSE events buffered for it.
const THREAD_CAPACITY: usize = 128;

/// The fan-out and the registry of runs driven in this process.
#[derive(Debug)]
pub struct Hub {
    /// Every thread's messages.
    sender: broadcast::Sender<HubMessage>,
    /// One thread's messages, for the threads someone follows.
    threads: Mutex<HashMap<Arc<str>, broadcast::Sender<HubMessage>>>,
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
            sender: broadcast::channel(CAPACITY).0,
            threads: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Receives what is announced from now on, for every thread.
    pub fn subscribe(&self) -> broadcast::Receiver<HubMessage> {
        self.sender.subscribe()
    }

    /// Receives what is announced from now on for store thread `thread` only.
    pub fn subscribe_thread(self: &Arc<Self>, thread: &str) -> ThreadSubscription {
        let thread: Arc<str> = Arc::from(thread);
        let receiver = lock(&self.threads)
            .entry(thread.clone())
            .or_insert_with(|| broadcast::channel(THREAD_CAPACITY).0)
            .subscribe();
        ThreadSubscription {
            receiver,
            hub: self.clone(),
            thread,
        }
    }

    /// Subscribers of every thread's announcements now ([`Hub::subscribe`]; for tests: a
    /// follower of one thread belongs on its thread's channel, where other threads'
    /// appends do not wake it).
    pub fn all_threads_followers(&self) -> usize {
        self.sender.receiver_count()
    }

    /// Threads with a subscriber now (for tests).
    pub fn followed_threads(&self) -> usize {
        lock(&self.threads).len()
    }

    /// Announces `message` to its thread's subscribers and to those of every thread.
    fn publish(&self, message: HubMessage) {
        let thread = lock(&self.threads).get(message.thread()).cloned();
        if let Some(sender) = thread {
            let _ = sender.send(message.clone());
        }
        let _ = self.sender.send(message);
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, CancellationToken>> {
        lock(&self.running)
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A subscription to one thread's announcements ([`Hub::subscribe_thread`]); the thread's
/// channel is dropped with its last subscription.
pub struct ThreadSubscription {
    receiver: broadcast::Receiver<HubMessage>,
    hub: Arc<Hub>,
    thread: Arc<str>,
}

impl std::fmt::Debug for ThreadSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadSubscription")
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl ThreadSubscription {
    /// The next announcement about the thread (`Lagged` when some were missed).
    pub async fn recv(&mut self) -> Result<HubMessage, broadcast::error::RecvError> {
        self.receiver.recv().await
    }

    /// The underlying receiver.
    pub fn receiver(&mut self) -> &mut broadcast::Receiver<HubMessage> {
        &mut self.receiver
    }
}

impl Drop for ThreadSubscription {
    fn drop(&mut self) {
        let mut threads = lock(&self.hub.threads);
        // This subscription's receiver is still alive here: it is the last one at 1.
        if threads
            .get(&self.thread)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            threads.remove(&self.thread);
        }
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
        self.hub.publish(HubMessage::Appended(
            Arc::from(event.thread_id.as_ref()),
            event.seq,
        ));
    }

    fn on_stream(&self, thread_id: &str, run_id: &str, event: &StreamEvent) {
        if let StreamEvent::TextDelta(text) = event {
            self.hub.publish(HubMessage::Delta {
                thread: Arc::from(thread_id),
                run_id: Arc::from(run_id),
                text: Arc::from(text.as_str()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn delta(thread: &str, text: &str) -> HubMessage {
        HubMessage::Delta {
            thread: Arc::from(thread),
            run_id: Arc::from("run"),
            text: Arc::from(text),
        }
    }

    /// The regression of the load benchmark (docs/server.md, "Load"): with one channel
    /// shared by every stream, 300 streams whose runs announce 3,000 messages in all
    /// overflowed every subscriber's buffer and lost text deltas. Each subscriber now holds
    /// only its thread's messages.
    #[tokio::test]
    async fn each_thread_gets_its_own_messages_whatever_the_others_announce() {
        let hub = Arc::new(Hub::new());
        let threads: Vec<String> = (0..300).map(|i| format!("t.{i}")).collect();
        let mut subscriptions: Vec<ThreadSubscription> =
            threads.iter().map(|t| hub.subscribe_thread(t)).collect();
        for round in 0..10 {
            for thread in &threads {
                hub.publish(delta(thread, &round.to_string()));
                hub.publish(HubMessage::Appended(Arc::from(thread.as_str()), round));
            }
        }
        assert!(
            20 * threads.len() > CAPACITY,
            "more than one channel could hold"
        );
        for (thread, subscription) in threads.iter().zip(&mut subscriptions) {
            for round in 0..10u64 {
                match subscription.recv().await.unwrap() {
                    HubMessage::Delta {
                        thread: t, text, ..
                    } => {
                        assert_eq!((&*t, &*text), (thread.as_str(), &*round.to_string()));
                    }
                    other => panic!("expected a delta of {thread}, got {other:?}"),
                }
                match subscription.recv().await.unwrap() {
                    HubMessage::Appended(t, seq) => {
                        assert_eq!((&*t, seq), (thread.as_str(), round));
                    }
                    other => panic!("expected an append of {thread}, got {other:?}"),
                }
            }
            assert!(subscription.receiver().is_empty());
        }
    }

    #[tokio::test]
    async fn a_thread_channel_lives_as_long_as_its_subscribers() {
        let hub = Arc::new(Hub::new());
        let first = hub.subscribe_thread("a.1");
        let mut second = hub.subscribe_thread("a.1");
        let _other = hub.subscribe_thread("a.2");
        assert_eq!(hub.followed_threads(), 2);
        drop(first);
        assert_eq!(hub.followed_threads(), 2);
        hub.publish(delta("a.1", "still here"));
        assert!(matches!(
            second.recv().await.unwrap(),
            HubMessage::Delta { .. }
        ));
        drop(second);
        assert_eq!(hub.followed_threads(), 1);
        // Announcing a thread nobody follows creates nothing.
        hub.publish(delta("a.3", "nobody"));
        assert_eq!(hub.followed_threads(), 1);
    }

    #[tokio::test]
    async fn subscribers_of_every_thread_still_hear_every_thread() {
        let hub = Arc::new(Hub::new());
        let mut all = hub.subscribe();
        let mut one = hub.subscribe_thread("a.1");
        hub.publish(delta("a.2", "x"));
        hub.publish(delta("a.1", "y"));
        assert_eq!(all.recv().await.unwrap().thread(), "a.2");
        assert_eq!(all.recv().await.unwrap().thread(), "a.1");
        assert_eq!(one.recv().await.unwrap().thread(), "a.1");
        assert!(one.receiver().is_empty());
    }
}
