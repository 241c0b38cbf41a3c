//! SIGTERM with runs in flight, on Postgres, across two `keel serve` processes: 50 chats
//! are queued, server A is sent SIGTERM while it drives some of them, and its runs still
//! going after the (short) grace period are released to the queue at once — the lease TTL
//! is far longer than the test, so only a release lets server B continue them in time.
//! Every run ends exactly once, the logs have no gap, and no mutating call ran twice.
//!
//! Needs PostgreSQL: set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test). The
//! test works in a throw-away schema.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_core::{EndState, EventKind, EventStore};
use keel_store::{PostgresOptions, PostgresStore, RunQueue};
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RUNS: usize = 50;
const DEADLINE: Duration = Duration::from_secs(90);

/// A model answer, the mutating call (slow on both sides of its effect), a final answer.
const SCRIPT: &str = r#"{"turn_by": "conversation", "turns": [
  {"text": "Writing.", "delay_ms": 100, "tool_calls": [
     {"name": "test_append", "arguments": {"text": "once", "delay_before_ms": 300, "delay_after_ms": 300}}]},
  {"text": "Done.", "delay_ms": 100}
]}"#;

fn keel_toml(mock: &str) -> String {
    format!(
        r#"
[providers.openai]
base_url = "{mock}/v1"

[agents.bot]
model = "openai:gpt-4.1-mini"
instructions = "You are a test agent."
tools = ["test_append"]

[server]
workers = 6
request_timeout_ms = 100
shutdown_grace_ms = 200
lease_ttl_ms = 120000

[server.limits]
concurrent_runs = 0
requests_per_minute = 0
"#
    )
}

/// A child process killed when dropped (a failing test leaves no server behind).
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `keel serve` on a free port; its base URL from the banner.
pub(crate) fn serve(dir: &Path, store: &str, name: &str) -> (Proc, String) {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--bind", "127.0.0.1:0", "--store", store])
        .current_dir(dir)
        .env("KEEL_TEST_TOOLS", "1")
        .env("KEEL_TEST_APPEND_FILE", dir.join("appends.log"))
        .env("OPENAI_API_KEY", "sk-test")
        .env("RUST_LOG", "keel=info")
        .env_remove("KEEL_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| {
            panic!(
                "{name}: no banner ({line:?}):\n{}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            )
        })
        .to_string();
    (Proc(child), url)
}

/// One HTTP/1.1 POST of JSON; the status and the body.
pub(crate) async fn post(base: &str, path: &str, key: &str, body: &Value) -> (u16, String) {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A store in a throw-away schema, and the `--store` URL that reaches it.
pub(crate) async fn schema_store() -> (PostgresStore, String) {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!("DATABASE_URL is not set: this test needs PostgreSQL (e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/test; scripts/test sets it when the local server runs)")
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let schema = format!(
        "keel_serve_stop_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000
    );
    let store = PostgresStore::connect_with(PostgresOptions::new(&url).schema(&schema))
        .await
        .unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    (
        store,
        format!("{url}{separator}options[search_path]={schema}"),
    )
}

pub(crate) fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_runs_in_flight_loses_and_repeats_nothing() {
    let (store, store_url) = schema_store().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let mock = MockLlmServer::start(MockScript::from_json(SCRIPT).unwrap())
        .await
        .unwrap();
    std::fs::write(root.join("keel.toml"), keel_toml(&mock.base_url())).unwrap();
    let opened = keel_store::open(&store_url).await.unwrap();
    let key = keel_server::keys::create(opened.serving.as_ref(), "acme", None)
        .await
        .unwrap()
        .key;
    let (mut a, url_a) = serve(&root, &store_url, "serve_a");
    let (b, url_b) = serve(&root, &store_url, "serve_b");

    // 50 chats, half to each server, all queued before the signal.
    let started = Instant::now();
    let mut chats = Vec::new();
    for i in 0..RUNS {
        let base = if i % 2 == 0 { &url_a } else { &url_b }.clone();
        let key = key.clone();
        chats.push(tokio::spawn(async move {
            let body = json!({"agent": "bot", "message": format!("job {i}")});
            // 50 requests at once on a loaded machine can outwait the 100 ms request
            // timeout in the key lookup: that 503 comes before anything is queued, so the
            // client retries it, as its message says.
            let give_up = Instant::now() + DEADLINE;
            loop {
                let (status, text) = post(&base, "/v1/chat", &key, &body).await;
                if status == 503 && text.contains("key store") && Instant::now() < give_up {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                break (status, text);
            }
        }));
    }
    let mut threads = Vec::new();
    for chat in chats {
        let (status, body) = chat.await.unwrap();
        assert!(status == 200 || status == 202, "chat: {status} {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        threads.push(format!("acme.{}", body["thread_id"].as_str().unwrap()));
    }

    // SIGTERM A once some runs are done and A is driving others.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let counts = store.counts().await.unwrap();
        if counts.done >= 8 && counts.leased >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress: {counts:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let term = Command::new("kill")
        .args(["-TERM", &a.0.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let signalled = Instant::now();
    let at_signal = store.counts().await.unwrap();
    // A stops long before any lease could expire (120 s).
    loop {
        if let Some(status) = a.0.try_wait().unwrap() {
            assert!(status.success(), "serve_a exited with {status}");
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(30),
            "serve_a did not stop:\n{}",
            log_of(&root, "serve_a")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log_a = log_of(&root, "serve_a");
    eprintln!(
        "SIGTERM at {at_signal:?}; serve_a stopped in {:?}",
        signalled.elapsed()
    );
    assert!(
        log_a.contains("released to the queue"),
        "serve_a released no run:\n{log_a}"
    );

    // B finishes everything, released runs included (their leases have not expired).
    loop {
        let counts = store.counts().await.unwrap();
        if counts.done == RUNS as u64 {
            assert_eq!((counts.queued, counts.leased, counts.failed), (0, 0, 0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not finish: {counts:?}\n{}",
            log_of(&root, "serve_b")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log_b = log_of(&root, "serve_b");
    assert!(
        log_b.contains("(resumed an interrupted run)"),
        "serve_b continued none of serve_a's runs:\n{log_b}"
    );

    // Every run: started once, ended once (done), seqs contiguous, no call ran twice.
    let appends = std::fs::read_to_string(root.join("appends.log")).unwrap();
    let mut ran: HashMap<&str, usize> = HashMap::new();
    for line in appends.lines() {
        *ran.entry(line.split('\t').next().unwrap()).or_insert(0) += 1;
    }
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "mutating calls executed twice: {twice:?}");
    let mut interrupted = 0;
    for thread in &threads {
        let events = store.load(thread).await.unwrap();
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event.seq, i as u64, "{thread}: seq gap");
        }
        let starts = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
            .count();
        let ends: Vec<EndState> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::RunEnded { end_state, .. } => Some(*end_state),
                _ => None,
            })
            .collect();
        assert_eq!(starts, 1, "{thread}: run started {starts} times");
        assert_eq!(ends, vec![EndState::Done], "{thread}");
        for event in &events {
            let EventKind::ToolCallFinished { result } = &event.kind else {
                continue;
            };
            let key = format!("{thread}:{}", result.call_id);
            let n = ran.get(key.as_str()).copied().unwrap_or(0);
            if result.outcome.is_ok() {
                assert_eq!(n, 1, "{key}: ok but ran {n} times");
            } else {
                interrupted += 1;
                assert!(
                    n <= 1 && result.content.contains(&key),
                    "{key}: {}",
                    result.content
                );
            }
        }
    }
    eprintln!(
        "{RUNS} runs ended in {:?}; {interrupted} mutating calls settled as interrupted",
        started.elapsed()
    );
    drop(b);
    store.drop_schema().await.unwrap();
}
