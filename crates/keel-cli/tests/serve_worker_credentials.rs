//! A `keel serve` run driven by a separate `keel worker` process gets its tenant's tool
//! credentials, as the server's embedded workers give them: `keel serve --workers 0`
//! queues a chat of tenant `acme` (which configured `SVC_TOKEN`) and one of tenant `beta`
//! (which did not) on Postgres; a `keel worker` whose own environment holds another
//! `SVC_TOKEN` drives both. The service sees acme's secret once and nothing else: beta's
//! call fails `unauthorized` naming the setting to add, and the worker's own variable is
//! never sent.
//!
//! Needs PostgreSQL: set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test).

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_core::{EventKind, EventStore};
use keel_store::RunQueue;
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve_shutdown::{Proc, log_of, post, schema_store, serve};

const DEADLINE: Duration = Duration::from_secs(120);
const ACME_SECRET: &str = "acme-svc-secret-1111";
const WORKER_OWN: &str = "worker-own-svc-9999";

/// The model looks the customer up once, then answers.
const SCRIPT: &str = r#"{"turn_by": "conversation", "turns": [
  {"text": "Looking.", "tool_calls": [{"name": "lookup", "arguments": {}}]},
  {"text": "Done."}
]}"#;

fn keel_toml(mock: &str, svc: &str) -> String {
    format!(
        r#"
[providers.openai]
base_url = "{mock}/v1"

[[tools.http]]
name = "lookup"
description = "Look the customer up."
usage = "lookup — call it with no arguments."
method = "GET"
url = "{svc}/lookup"
auth = {{ bearer_env = "SVC_TOKEN" }}

[agents.bot]
model = "openai:gpt-4.1-mini"
instructions = "Look the customer up."
tools = ["lookup"]

[server]
workers = 0
request_timeout_ms = 100

[server.limits]
concurrent_runs = 0
requests_per_minute = 0

[server.tenants.acme.credentials]
SVC_TOKEN = {{ env = "ACME_SVC_TOKEN" }}
"#
    )
}

/// A loopback service answering every request with a customer and recording its
/// `Authorization` header (`""` when absent).
async fn service() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorder = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let recorder = recorder.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_string();
                let auth = text
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("authorization")
                            .then(|| value.trim().to_string())
                    })
                    .unwrap_or_default();
                recorder.lock().unwrap().push(auth);
                let body = r#"{"customer": "c-1", "plan": "gold"}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (base, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keel_worker_gives_a_server_run_its_tenants_credentials() {
    let (store, store_url) = schema_store().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let mock = MockLlmServer::start(MockScript::from_json(SCRIPT).unwrap())
        .await
        .unwrap();
    let (svc, seen) = service().await;
    std::fs::write(root.join("keel.toml"), keel_toml(&mock.base_url(), &svc)).unwrap();
    let opened = keel_store::open(&store_url).await.unwrap();
    let mut keys = Vec::new();
    for tenant in ["acme", "beta"] {
        let key = keel_server::keys::create(opened.serving.as_ref(), tenant, None)
            .await
            .unwrap()
            .key;
        keys.push((tenant, key));
    }
    let (_server, url) = serve(&root, &store_url, "serve");

    // Both chats are queued (no embedded worker: the server answers 202 once its short
    // request timeout passes, or 200 if a run ends first — it cannot here).
    let mut threads = Vec::new();
    for (tenant, key) in &keys {
        let body = json!({"agent": "bot", "message": "Who is the customer?"});
        let (status, text) = post(&url, "/v1/chat", key, &body).await;
        assert!(status == 200 || status == 202, "{tenant}: {status} {text}");
        let body: Value = serde_json::from_str(&text).unwrap();
        threads.push((
            *tenant,
            format!("{tenant}.{}", body["thread_id"].as_str().unwrap()),
        ));
    }

    // A separate worker, whose own environment has a different SVC_TOKEN.
    let log = std::fs::File::create(root.join("worker.log")).unwrap();
    let mut worker = Proc(
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args([
                "worker",
                "--store",
                &store_url,
                "--poll-ms",
                "50",
                "--exit-when-idle",
            ])
            .current_dir(&root)
            .env("OPENAI_API_KEY", "sk-test")
            .env("ACME_SVC_TOKEN", ACME_SECRET)
            .env("SVC_TOKEN", WORKER_OWN)
            .env_remove("KEEL_STORE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            assert!(
                status.success(),
                "worker: {status}\n{}",
                log_of(&root, "worker")
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not finish:\n{}",
            log_of(&root, "worker")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = store.counts().await.unwrap();
    assert_eq!(counts.done, 2, "{counts:?}\n{}", log_of(&root, "worker"));

    // The service saw acme's secret, once; never the worker's own variable.
    assert_eq!(
        *seen.lock().unwrap(),
        vec![format!("Bearer {ACME_SECRET}")],
        "worker log:\n{}",
        log_of(&root, "worker")
    );
    for (tenant, thread) in &threads {
        let events = store.load(thread).await.unwrap();
        let text = serde_json::to_string(&events).unwrap();
        assert!(
            !text.contains(ACME_SECRET) && !text.contains(WORKER_OWN),
            "{text}"
        );
        let results: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolCallFinished { result } => Some(result),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 1, "{tenant}: {text}");
        let failed = results[0].is_error();
        match *tenant {
            "acme" => assert!(!failed, "acme: {text}"),
            _ => {
                assert!(failed, "{tenant}: {text}");
                assert!(text.contains("unauthorized"), "{text}");
                assert!(text.contains("[server.tenants.beta.credentials]"), "{text}");
            }
        }
    }
}
