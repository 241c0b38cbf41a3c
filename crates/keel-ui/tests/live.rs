//! The live stream of a run page, as an operator would measure it: while a run waits, each
//! poll reads only the log's tail (before, the whole log was read and redacted every
//! 400 ms, forever for a paused run), and a host's [`keel_ui::LiveGuard`] ends the stream
//! when its session ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use keel_core::store::{StoreError, ThreadFilter, ThreadSummary};
use keel_core::{Event, EventStore};
use keel_telemetry::Redactor;
use keel_ui::{LiveGuard, RunSource, Ui};

use crate::common::Fixture;

const DEADLINE: Duration = Duration::from_secs(60);

/// Counts whole-log reads and tail reads of the store it wraps.
struct Counting {
    inner: Arc<dyn EventStore>,
    whole: AtomicUsize,
    tails: AtomicUsize,
}

#[async_trait]
impl EventStore for Counting {
    async fn append(&self, thread: &str, next: u64, events: &[Event]) -> Result<(), StoreError> {
        self.inner.append(thread, next, events).await
    }
    async fn load(&self, thread_id: &str) -> Result<Vec<Event>, StoreError> {
        self.whole.fetch_add(1, Ordering::SeqCst);
        self.inner.load(thread_id).await
    }
    async fn load_from(&self, thread_id: &str, from: u64) -> Result<Vec<Event>, StoreError> {
        self.tails.fetch_add(1, Ordering::SeqCst);
        self.inner.load_from(thread_id, from).await
    }
    async fn list_threads(&self, filter: &ThreadFilter) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads(filter).await
    }
    async fn delete_thread(&self, thread_id: &str) -> Result<bool, StoreError> {
        self.inner.delete_thread(thread_id).await
    }
}

/// Serves `router` on a loopback port; returns its base URL.
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(keel_ui::serve(listener, router, std::future::pending()));
    base
}

/// Reads the stream until an event named `name`; returns its data.
async fn until_event(response: &mut reqwest::Response, name: &str) -> String {
    let mut buffer = String::new();
    loop {
        if let Some(at) = buffer.find(&format!("event: {name}\n")) {
            let rest = &buffer[at..];
            if let Some(end) = rest.find("\n\n") {
                let block = &rest[..end];
                return block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                    .collect::<Vec<_>>()
                    .join("\n");
            }
        }
        let chunk = tokio::time::timeout(DEADLINE, response.chunk())
            .await
            .expect("the stream stalled")
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before `{name}`: {buffer}"));
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_runs_live_stream_reads_only_the_logs_tail() {
    let f = Fixture::new(false).await;
    let counting = Arc::new(Counting {
        inner: f.store.clone(),
        whole: AtomicUsize::new(0),
        tails: AtomicUsize::new(0),
    });
    let ui = Ui::new(RunSource::new(counting.clone(), Redactor::default()));
    let base = serve(keel_ui::router(ui)).await;
    let shown = f.store.load(&f.threads.paused).await.unwrap().len();
    let mut response = reqwest::get(format!(
        "{base}/runs/{}/live?after={shown}",
        f.threads.paused
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    // Ten polls of a run that waits for a human.
    tokio::time::timeout(DEADLINE, async {
        while counting.tails.load(Ordering::SeqCst) < 10 {
            let _ = tokio::time::timeout(Duration::from_millis(100), response.chunk()).await;
        }
    })
    .await
    .expect("the stream stopped polling");
    // The one whole read checked that the run exists; every poll since read the tail.
    assert_eq!(counting.whole.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_guard_ends_the_stream_when_the_session_ends() {
    let f = Fixture::new(false).await;
    let allowed = Arc::new(AtomicBool::new(true));
    let guard = {
        let allowed = allowed.clone();
        LiveGuard::new(
            move || {
                let allowed = allowed.load(Ordering::SeqCst);
                Box::pin(async move { allowed })
            },
            (),
        )
    };
    let ui = Ui::new(RunSource::new(f.store.clone(), Redactor::default()));
    let base = serve(keel_ui::router(ui).layer(axum::Extension(guard))).await;
    let shown = f.store.load(&f.threads.paused).await.unwrap().len();
    let mut response = reqwest::get(format!(
        "{base}/runs/{}/live?after={shown}",
        f.threads.paused
    ))
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    allowed.store(false, Ordering::SeqCst);
    let why = until_event(&mut response, "done").await;
    assert!(why.contains("signed out"), "{why}");
    drop(response);
}
