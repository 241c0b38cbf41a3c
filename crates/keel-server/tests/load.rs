//! What the load benchmark (`cargo xtask bench-serve`, docs/server.md "Load") found, kept
//! as tests:
//! - the concurrent-runs check looked every remembered job up in the queue on every chat,
//!   so a burst of N chats cost N² queue reads. Under the limit it now reads no job; at the
//!   limit it still counts queued runs exactly.
//! - a burst of chats (or A2A sends) all counted the same runs and were all admitted past
//!   `concurrent_runs`; a task queued by one tenant could be read by another by its id.
//! - a stream whose task read the store after its run had ended (a stream that fell
//!   behind, or started late, under load) ended with the run and dropped the text deltas
//!   still waiting for it. (The hub's per-thread channels, the other half of the lost
//!   deltas, are tested in `hub.rs`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::response::IntoResponse;
use keel_app::App;
use keel_core::{CancellationToken, Message};
use keel_runtime::Thread;
use keel_server::follow::{Follow, Until, event_stream};
use keel_server::hub::{Hub, HubObserver};
use keel_server::jobs::recipe_for;
use keel_server::limits::{RateLimiter, Usage};
use keel_server::metrics::Metrics;
use keel_server::state::{AppState, Shared};
use keel_server::tenancy::Tenant;
use keel_server::{Server, keys};
use keel_store::{JobId, JobInfo, Lease, OpenedStore, QueueCounts, QueueError, RunQueue};
use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn};
use serde_json::{Value, json};

use crate::common::DEADLINE;

/// A run queue that counts [`RunQueue::job`] lookups, and whose `enqueue` takes as long as
/// a round trip to a database server does (a SQLite write here returns before another
/// request gets a turn, which hid the race between counting runs and queueing one).
struct CountingQueue {
    inner: Arc<dyn RunQueue>,
    lookups: AtomicUsize,
}

/// How long [`CountingQueue::enqueue`] waits before writing.
const ENQUEUE_ROUND_TRIP: Duration = Duration::from_millis(20);

#[async_trait]
impl RunQueue for CountingQueue {
    async fn enqueue(&self, thread_id: &str, payload: &Value) -> Result<JobId, QueueError> {
        tokio::time::sleep(ENQUEUE_ROUND_TRIP).await;
        self.inner.enqueue(thread_id, payload).await
    }
    async fn enqueue_continuation(
        &self,
        thread_id: &str,
        payload: &Value,
    ) -> Result<JobId, QueueError> {
        self.inner.enqueue_continuation(thread_id, payload).await
    }
    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
        self.inner.acquire(worker_id, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError> {
        self.inner.renew(lease, ttl).await
    }
    async fn complete(&self, lease: &Lease) -> Result<(), QueueError> {
        self.inner.complete(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
        self.inner.release(lease).await
    }
    async fn retry_later(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        self.inner.retry_later(lease, delay).await
    }
    async fn fail(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        self.inner.fail(lease, error).await
    }
    async fn snooze(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        self.inner.snooze(lease, delay).await
    }
    async fn dead_letter(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        self.inner.dead_letter(lease, error).await
    }
    async fn cancel_queued(&self, job_id: JobId, reason: &str) -> Result<bool, QueueError> {
        self.inner.cancel_queued(job_id, reason).await
    }
    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.job(job_id).await
    }
    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        self.inner.counts().await
    }
}

/// A server without workers (queued runs stay queued) over SQLite, its queue counted.
async fn server(
    dir: &std::path::Path,
    limit: u64,
) -> (String, String, Arc<CountingQueue>, CancellationToken) {
    let (base, key, _rival, queue, stop) = server_with_rival(dir, limit).await;
    (base, key, queue, stop)
}

/// [`server`], also returning a key of another tenant (`rival`).
async fn server_with_rival(
    dir: &std::path::Path,
    limit: u64,
) -> (
    String,
    String,
    String,
    Arc<CountingQueue>,
    CancellationToken,
) {
    let url = format!("sqlite://{}", dir.join("keel.db").display());
    let opened = keel_store::open(&url).await.unwrap();
    let queue = Arc::new(CountingQueue {
        inner: opened.queue.clone(),
        lookups: AtomicUsize::new(0),
    });
    let store = OpenedStore {
        queue: queue.clone(),
        ..opened
    };
    let toml = format!(
        r#"
[providers.openai]
base_url = "http://127.0.0.1:9/v1"

[agents.bot]
model = "openai:gpt-4.1-mini"
instructions = "Never runs: no worker."

[server]
workers = 0

[server.limits]
concurrent_runs = {limit}
"#
    );
    let env: keel_app::Env =
        Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    let app = App::from_toml_str(&toml, dir, env).unwrap();
    let config = app.config().server.clone();
    let server = Server::new(Arc::new(app), &store, config).unwrap();
    let key = keys::create(store.serving.as_ref(), "acme", None)
        .await
        .unwrap()
        .key;
    let rival = keys::create(store.serving.as_ref(), "rival", None)
        .await
        .unwrap()
        .key;
    let (base, stop, _task) = crate::common::serve_on_loopback(server).await;
    (base, key, rival, queue, stop)
}

/// JSON-RPC `method` to `/a2a/bot` with `key`.
async fn a2a(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    method: &str,
    params: Value,
) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let response = tokio::time::timeout(
        DEADLINE,
        client
            .post(format!("{base}/a2a/bot"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    response.json().await.unwrap()
}

/// A task queued by one tenant (not started: no worker) is not another tenant's to read,
/// even by its exact id: the map of queued tasks answered any tenant that named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_a2a_task_is_not_found_by_another_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key, rival, _queue, stop) = server_with_rival(dir.path(), 100).await;
    let client = reqwest::Client::new();
    let sent = a2a(
        &client,
        &base,
        &key,
        "message/send",
        json!({
            "message": {"kind": "message", "role": "user", "messageId": "m1",
                        "parts": [{"kind": "text", "text": "the secret plan"}]},
            "configuration": {"blocking": false},
        }),
    )
    .await;
    let task_id = sent["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"))
        .to_string();
    let own = a2a(&client, &base, &key, "tasks/get", json!({"id": task_id})).await;
    assert_eq!(own["result"]["status"]["state"], "submitted", "{own}");
    let other = a2a(&client, &base, &rival, "tasks/get", json!({"id": task_id})).await;
    assert!(other.get("result").is_none(), "{other}");
    assert!(!other.to_string().contains("secret plan"), "{other}");
    stop.cancel();
}

/// Starts a streaming chat and returns its status once the headers arrive (the run is
/// queued by then); the stream itself is dropped.
async fn chat(client: &reqwest::Client, base: &str, key: &str, n: usize) -> (u16, String) {
    let response = tokio::time::timeout(
        DEADLINE,
        client
            .post(format!("{base}/v1/chat"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(
                json!({"agent": "bot", "message": format!("chat {n}"), "stream": true}).to_string(),
            )
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    let status = response.status().as_u16();
    let body = if status == 200 {
        String::new()
    } else {
        response.text().await.unwrap()
    };
    (status, body)
}

#[tokio::test]
async fn chats_under_the_concurrent_runs_limit_look_up_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key, queue, stop) = server(dir.path(), 100).await;
    let client = reqwest::Client::new();
    for n in 0..30 {
        let (status, body) = chat(&client, &base, &key, n).await;
        assert_eq!(status, 200, "chat {n}: {body}");
    }
    // Before: 0 + 1 + … + 29 = 435 lookups.
    assert_eq!(queue.lookups.load(Ordering::SeqCst), 0);
    stop.cancel();
}

#[tokio::test]
async fn at_the_limit_queued_runs_are_counted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key, queue, stop) = server(dir.path(), 5).await;
    let client = reqwest::Client::new();
    for n in 0..5 {
        let (status, body) = chat(&client, &base, &key, n).await;
        assert_eq!(status, 200, "chat {n}: {body}");
    }
    // Five runs queued (no worker starts them): the sixth is refused after the jobs were
    // looked up (still queued, so they count).
    let (status, body) = chat(&client, &base, &key, 5).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("concurrent_runs"), "{body}");
    assert_eq!(queue.lookups.load(Ordering::SeqCst), 5);
    stop.cancel();
}

/// One admission attempt: the status and the `Retry-After` header (seconds).
async fn admitted(request: reqwest::RequestBuilder) -> (u16, Option<u64>, String) {
    let response = tokio::time::timeout(DEADLINE, request.send())
        .await
        .unwrap()
        .unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = if status == 200
        && response
            .headers()
            .get("content-type")
            .is_some_and(|c| c.to_str().unwrap_or("").starts_with("text/event-stream"))
    {
        String::new()
    } else {
        tokio::time::timeout(DEADLINE, response.text())
            .await
            .unwrap()
            .unwrap_or_default()
    };
    (status, retry, body)
}

/// Fifty chats at once against `concurrent_runs = 1` (no worker, so the first run stays
/// queued): exactly one is admitted, the other 49 get `429 concurrent_runs` with
/// `Retry-After`. Before, each chat counted the runs and then queued its own, so a burst
/// all counted zero and all were admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_chats_against_a_limit_of_one_admit_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key, _queue, stop) = server(dir.path(), 1).await;
    let client = reqwest::Client::new();
    let attempts = (0..50).map(|n| {
        admitted(
            client
                .post(format!("{base}/v1/chat"))
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(
                    json!({"agent": "bot", "message": format!("chat {n}"), "stream": true})
                        .to_string(),
                ),
        )
    });
    let results = futures::future::join_all(attempts).await;
    let accepted = results.iter().filter(|(s, _, _)| *s == 200).count();
    let limited: Vec<_> = results.iter().filter(|(s, _, _)| *s == 429).collect();
    assert_eq!(accepted, 1, "{results:?}");
    assert_eq!(limited.len(), 49, "{results:?}");
    for (_, retry, body) in limited {
        assert!(retry.is_some_and(|r| r >= 1), "{body}");
        assert!(body.contains("concurrent_runs"), "{body}");
    }
    stop.cancel();
}

/// The same burst over A2A (`message/send`, not blocking): one task submitted, 49
/// refused with a JSON-RPC error that says which limit and when to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_parallel_a2a_sends_against_a_limit_of_one_admit_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key, _queue, stop) = server(dir.path(), 1).await;
    let client = reqwest::Client::new();
    let attempts = (0..50).map(|n| {
        let body = json!({"jsonrpc": "2.0", "id": n, "method": "message/send", "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": format!("m{n}"),
                "parts": [{"kind": "text", "text": format!("task {n}")}],
            },
            "configuration": {"blocking": false},
        }});
        admitted(
            client
                .post(format!("{base}/a2a/bot"))
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
    });
    let results = futures::future::join_all(attempts).await;
    let bodies: Vec<Value> = results
        .iter()
        .map(|(_, _, body)| serde_json::from_str(body).unwrap())
        .collect();
    let submitted = bodies.iter().filter(|b| b.get("result").is_some()).count();
    let refused: Vec<&Value> = bodies.iter().filter(|b| b.get("error").is_some()).collect();
    assert_eq!(submitted, 1, "{bodies:?}");
    assert_eq!(refused.len(), 49, "{bodies:?}");
    for error in refused {
        let text = error.to_string();
        assert!(text.contains("concurrent_runs"), "{text}");
        assert_eq!(error["error"]["code"], -32029, "{text}");
        let detail = &error["error"]["data"][0];
        assert_eq!(detail["reason"], "RESOURCE_EXHAUSTED", "{text}");
        assert_eq!(detail["metadata"]["limit"], "concurrent_runs", "{text}");
        let retry: u64 = detail["metadata"]["retryAfterSeconds"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry >= 1, "{text}");
    }
    stop.cancel();
}

/// Under load a chat's run can end before its stream's task first reads the store; the
/// stream must still send every text delta (they are never stored), before the events
/// that follow them.
#[tokio::test]
async fn a_stream_that_reads_its_ended_run_still_sends_every_delta_first() {
    let answer = "one two three four five six seven eight";
    let mock = MockLlmServer::start(MockScript::new(vec![MockTurn::text(answer)]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("keel.db").display());
    let store = keel_store::open(&url).await.unwrap();
    let toml = format!(
        "[providers.openai]\nbase_url = \"{}/v1\"\n\n[agents.bot]\nmodel = \"openai:gpt-4.1-mini\"\ninstructions = \"Answer.\"\n",
        mock.base_url()
    );
    let env: keel_app::Env =
        Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    let app = Arc::new(App::from_toml_str(&toml, dir.path(), env).unwrap());
    let hub = Arc::new(Hub::new());
    let usage = Arc::new(Usage::default());
    let state: AppState = Arc::new(Shared {
        app: app.clone(),
        events: store.events.clone(),
        queue: store.queue.clone(),
        serving: store.serving.clone(),
        hub: hub.clone(),
        rate: RateLimiter::default(),
        usage: usage.clone(),
        metrics: Metrics::default(),
        config: app.config().server.clone(),
        shutdown: CancellationToken::new(),
        poll: Duration::from_secs(3600),
        pending: Mutex::new(Vec::new()),
        openapi: OnceLock::new(),
        admissions: keel_server::state::Admissions::default(),
        streams: std::sync::Arc::default(),
    });
    let store_id = "acme.thr_late";
    // Subscribed before the run, as a chat does; the run is then driven to its end with
    // the embedded workers' observer before the stream reads anything.
    let subscription = hub.subscribe_thread(store_id);
    let built = recipe_for("bot").build_agent(&app, None).await.unwrap();
    let observer = Arc::new(HubObserver::new(hub, usage, CancellationToken::new(), None));
    let context = app
        .run_context(store.events.clone(), None, built.approve)
        .with_observer(observer);
    let mut thread = Thread::with_id(store_id);
    built
        .agent
        .run(vec![Message::user("hello")], &mut thread, &context)
        .await
        .unwrap();

    let tenant = Tenant {
        name: "acme".into(),
        key_id: "key_test".into(),
        key_sha256: String::new(),
    };
    let permit = keel_server::follow::open_stream(&state, &tenant).unwrap();
    let sse = event_stream(
        state,
        Follow {
            tenant,
            store_id: store_id.into(),
            client_id: "thr_late".into(),
            from_seq: 0,
            until: Until::Idle,
        },
        Some(subscription),
        permit,
    );
    let body = tokio::time::timeout(
        DEADLINE,
        axum::body::to_bytes(sse.into_response().into_body(), usize::MAX),
    )
    .await
    .unwrap()
    .unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let mut names = Vec::new();
    let mut streamed = String::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_default()
                .to_string()
        };
        let event = field("event:");
        if event == "text_delta" {
            let data: Value = serde_json::from_str(&field("data:")).unwrap();
            streamed.push_str(data["text"].as_str().unwrap());
        }
        names.push(event);
    }
    assert_eq!(streamed, answer, "events: {names:?}");
    let last_delta = names.iter().rposition(|n| n == "text_delta").unwrap();
    let responded = names.iter().position(|n| n == "model_responded").unwrap();
    assert!(last_delta < responded, "{names:?}");
    assert_eq!(
        names.last().map(String::as_str),
        Some("outcome"),
        "{names:?}"
    );
}
