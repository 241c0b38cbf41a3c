//! The harness: [`Harness::start`] runs a server (and a mock LLM answering its agents)
//! over a fresh SQLite or Postgres store; helpers speak HTTP and read SSE.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_app::App;
use keel_core::CancellationToken;
use keel_server::Server;
use keel_server::keys;
use keel_store::{OpenedStore, PostgresOptions, PostgresStore};
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use serde_json::{Value, json};

/// Generous: a loaded 2-core machine is slow, and nothing here waits on time.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Serves `server` on a free loopback port: its base URL, the token that stops it, and
/// the serving task.
pub async fn serve_on_loopback(
    server: Server,
) -> (String, CancellationToken, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let signal = stop.clone();
    let task = tokio::spawn(async move {
        server
            .serve(listener, async move { signal.cancelled().await })
            .await
            .unwrap();
    });
    (base, stop, task)
}

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A running server.
pub struct Harness {
    pub base: String,
    pub client: reqwest::Client,
    pub store: OpenedStore,
    pub openapi: Value,
    pub hub: Arc<keel_server::hub::Hub>,
    _mock: MockLlmServer,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    postgres: Option<PostgresStore>,
    _dir: tempfile::TempDir,
}

/// An agent `bot` with the calculator (each call needs approval) and `delay`, answered by
/// the mock; `extra` adds keel.toml text (e.g. `[server.tenants.x]`).
fn keel_toml(mock: &str, extra: &str, workers: usize) -> String {
    // `extra` may set the timeout itself (its first lines are still in `[server]`).
    let timeout = if extra.contains("request_timeout_ms") {
        ""
    } else {
        "request_timeout_ms = 60000"
    };
    format!(
        r#"
[providers.openai]
base_url = "{mock}/v1"

[agents.bot]
model = "openai:gpt-4.1-mini"
instructions = "You are a test agent."
tools = ["calculator", "delay"]

[approvals.tools]
calculator = "ask"

[server]
workers = {workers}
{timeout}
operators = ["ops"]
{extra}
"#
    )
}

async fn open_store(backend: Backend, dir: &Path) -> (OpenedStore, Option<PostgresStore>) {
    match backend {
        Backend::Sqlite => {
            let url = format!("sqlite://{}", dir.join("keel.db").display());
            (keel_store::open(&url).await.unwrap(), None)
        }
        Backend::Postgres => {
            let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
                panic!(
                    "DATABASE_URL is not set: the Postgres server tests need a server. Run them \
                     through ./scripts/test (which sets DATABASE_URL=postgres://postgres@127.0.0.1:5432/test), \
                     or export DATABASE_URL yourself."
                )
            });
            let schema = format!("keel_server_{}", uuid::Uuid::new_v4().simple());
            let store = PostgresStore::connect_with(PostgresOptions::new(&url).schema(&schema))
                .await
                .expect("connect to Postgres at DATABASE_URL");
            let separator = if url.contains('?') { '&' } else { '?' };
            let opened =
                keel_store::open(&format!("{url}{separator}options[search_path]={schema}"))
                    .await
                    .unwrap();
            (opened, Some(store))
        }
    }
}

impl Harness {
    /// A server over `backend` whose agents the mock answers with `script` (turns by
    /// conversation, so every thread follows the script from its start).
    pub async fn start(backend: Backend, script: Value, extra_toml: &str) -> Self {
        Self::start_with_workers(backend, script, extra_toml, 2).await
    }

    /// [`Harness::start`] with `workers` embedded workers (0: queued jobs stay queued).
    pub async fn start_with_workers(
        backend: Backend,
        script: Value,
        extra_toml: &str,
        workers: usize,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut script = script;
        script["turn_by"] = json!("conversation");
        let mock = MockLlmServer::start(MockScript::from_json(&script.to_string()).unwrap())
            .await
            .unwrap();
        let (store, postgres) = open_store(backend, dir.path()).await;
        let env: keel_app::Env =
            Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
        let app = App::from_toml_str(
            &keel_toml(&mock.base_url(), extra_toml, workers),
            dir.path(),
            env,
        )
        .unwrap();
        let config = app.config().server.clone();
        let server = Server::new(Arc::new(app), &store, config).unwrap();
        let openapi: Value = serde_json::from_str(&server.openapi_json()).unwrap();
        let hub = server.hub();
        let (base, stop, task) = serve_on_loopback(server).await;
        Self {
            base,
            client: reqwest::Client::new(),
            store,
            openapi,
            hub,
            _mock: mock,
            stop,
            task: Some(task),
            postgres,
            _dir: dir,
        }
    }

    /// A new key of `tenant`.
    pub async fn key(&self, tenant: &str) -> String {
        keys::create(self.store.serving.as_ref(), tenant, None)
            .await
            .unwrap()
            .key
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the key.
    pub fn request(&self, method: &str, path: &str, key: &str) -> reqwest::RequestBuilder {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        self.client
            .request(method, self.url(path))
            .header("authorization", format!("Bearer {key}"))
    }

    /// Sends, returns status, headers and the JSON body (Null when not JSON).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = self.request(method, path, key);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = tokio::time::timeout(DEADLINE, request.send())
            .await
            .unwrap()
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    /// Polls a run until it ended.
    pub async fn wait_run(&self, key: &str, thread: &str, run: &str) -> Value {
        let start = Instant::now();
        loop {
            let (status, _, body) = self
                .send(
                    "GET",
                    &format!("/v1/threads/{thread}/runs/{run}"),
                    key,
                    None,
                )
                .await;
            assert_eq!(status, 200, "{body}");
            if body["status"] == "ended" {
                return body;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "run {run} did not settle: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `done` jobs of the queue completed (and none is waiting or leased).
    pub async fn wait_jobs_done(&self, done: u64) {
        let start = Instant::now();
        loop {
            let counts = self.store.queue.counts().await.unwrap();
            if counts.done == done && counts.queued == 0 && counts.leased == 0 {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "jobs: {counts:?}, expected {done} done"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every stored event of a thread (as the API shows them).
    pub async fn events(&self, key: &str, thread: &str) -> Vec<Value> {
        let (status, _, body) = self
            .send("GET", &format!("/v1/threads/{thread}"), key, None)
            .await;
        assert_eq!(status, 200, "{body}");
        body["events"].as_array().unwrap().clone()
    }

    /// Stops the server (and drops a Postgres schema).
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
        }
        if let Some(store) = self.postgres.take() {
            store.drop_schema().await.unwrap();
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub id: Option<u64>,
    pub event: String,
    pub data: Value,
}

/// Reads server-sent events from a streaming response.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (comments skipped); `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut sse = Sse {
                    id: None,
                    event: "message".into(),
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        sse.id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        sse.event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if data.is_empty() && sse.id.is_none() {
                    continue; // a keep-alive comment
                }
                sse.data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some(sse);
            }
            let chunk = tokio::time::timeout(DEADLINE, self.response.chunk())
                .await
                .expect("the stream stalled")
                .unwrap();
            match chunk {
                Some(bytes) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                None => return None,
            }
        }
    }

    /// Events until one named `name` (included).
    pub async fn until(&mut self, name: &str) -> Vec<Sse> {
        let mut seen = Vec::new();
        while let Some(event) = self.next().await {
            let done = event.event == name;
            seen.push(event);
            if done {
                return seen;
            }
        }
        panic!(
            "the stream ended before `{name}`: {:?}",
            seen.iter().map(|e| e.event.clone()).collect::<Vec<_>>()
        );
    }
}

/// Runs `$body` (an async fn taking a `Backend`) on SQLite and on Postgres.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await;
                }
            )*
        }
    };
}
