//! Per-tenant tool credentials over real sockets: a loopback service (an HTTP endpoint and
//! an A2A agent) records the `Authorization` header of every request; an agent calls it
//! through an HTTP tool and an A2A tool whose `auth` names `SVC_TOKEN` / `HELPER_TOKEN`.
//! Tenant alpha's runs send alpha's secrets (from variables), beta's send beta's (a file, a
//! variable), gamma — which configured none — gets `unauthorized` tool outcomes naming the
//! setting to add and the service sees no request at all; the server's own variables of
//! the same names, and its provider key, are never sent; no secret reaches the threads'
//! events. Settings naming the server's own keys are refused before anything starts.

use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::routing::get;
use keel_app::App;
use keel_core::CancellationToken;
use keel_server::Server;
use keel_testkit::mock_llm::{MockLlmServer, MockScript};
use serde_json::{Value, json};

use crate::common::DEADLINE;

const ALPHA_SVC: &str = "alpha-svc-secret-1111";
const ALPHA_HELPER: &str = "alpha-helper-secret-1111";
const BETA_SVC: &str = "beta-svc-secret-2222";
const BETA_HELPER: &str = "beta-helper-secret-2222";
/// The server's own variables named like the tools' credentials, and its provider key.
const SERVER_SVC: &str = "server-own-svc-9999";
const SERVER_HELPER: &str = "server-own-helper-9999";
const PROVIDER_KEY: &str = "sk-provider-key-0000";

/// One request the service got: its path and `Authorization` header.
type Request = (String, Option<String>);

/// Every request the service got.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Request>>>);

impl Seen {
    fn take(&self) -> Vec<Request> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// The service: `GET /lookup` answers a customer and echoes the `Authorization` header it
/// got (as a careless service might); `/a2a/echo` is keel-a2a's echo agent.
async fn service() -> (String, Seen) {
    let seen = Seen::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let backend = keel_a2a::testing::EchoBackend::new();
    let a2a = keel_a2a::router(Arc::new(backend), &base).build();
    let recorder = seen.clone();
    let app = axum::Router::new()
        .route(
            "/lookup",
            get(|headers: HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                axum::Json(json!({"customer": "c-1", "plan": "gold", "seen_authorization": auth}))
            }),
        )
        .merge(a2a)
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: Next| {
                let recorder = recorder.clone();
                async move {
                    let auth = request
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    recorder
                        .0
                        .lock()
                        .unwrap()
                        .push((request.uri().path().to_string(), auth));
                    next.run(request).await
                }
            },
        ));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, seen)
}

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

[[a2a.agents]]
name = "helper"
url = "{svc}/a2a/echo"
auth = {{ bearer_env = "HELPER_TOKEN" }}
timeout_ms = 30000

[agents.fetcher]
model = "openai:gpt-4.1-mini"
instructions = "Look the customer up and ask the helper."
tools = ["lookup", "helper"]

[server]
workers = 2
request_timeout_ms = 60000

[server.tenants.alpha.credentials]
SVC_TOKEN = {{ env = "ALPHA_SVC_TOKEN" }}
HELPER_TOKEN = {{ env = "ALPHA_HELPER_TOKEN" }}

[server.tenants.beta.credentials]
SVC_TOKEN = {{ file = "secrets/beta-svc.token" }}
HELPER_TOKEN = {{ env = "BETA_HELPER_TOKEN", tools = ["helper"] }}
"#
    )
}

fn env() -> keel_app::Env {
    Arc::new(|name: &str| {
        let value = match name {
            "OPENAI_API_KEY" => PROVIDER_KEY,
            "ALPHA_SVC_TOKEN" => ALPHA_SVC,
            "ALPHA_HELPER_TOKEN" => ALPHA_HELPER,
            "BETA_HELPER_TOKEN" => BETA_HELPER,
            "SVC_TOKEN" => SERVER_SVC,
            "HELPER_TOKEN" => SERVER_HELPER,
            _ => return None,
        };
        Some(value.to_string())
    })
}

struct Running {
    base: String,
    client: reqwest::Client,
    store: keel_store::OpenedStore,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _mock: MockLlmServer,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(svc: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("secrets")).unwrap();
        std::fs::write(
            dir.path().join("secrets/beta-svc.token"),
            format!("{BETA_SVC}\n"),
        )
        .unwrap();
        // Every conversation: both tools in one turn, then an answer.
        let script = json!({"turn_by": "conversation", "turns": [
            {"tool_calls": [
                {"name": "lookup", "arguments": {}},
                {"name": "helper", "arguments": {"message": "hello helper"}}
            ]},
            {"text": "Done."}
        ]});
        let mock = MockLlmServer::start(MockScript::from_json(&script.to_string()).unwrap())
            .await
            .unwrap();
        let url = format!("sqlite://{}", dir.path().join("keel.db").display());
        let store = keel_store::open(&url).await.unwrap();
        let app = App::from_toml_str(&keel_toml(&mock.base_url(), svc), dir.path(), env()).unwrap();
        let config = app.config().server.clone();
        let server = Server::new(Arc::new(app), &store, config).unwrap();
        let (base, stop, task) = crate::common::serve_on_loopback(server).await;
        Self {
            base,
            client: reqwest::Client::new(),
            store,
            stop,
            task,
            _mock: mock,
            _dir: dir,
        }
    }

    async fn key(&self, tenant: &str) -> String {
        keel_server::keys::create(self.store.serving.as_ref(), tenant, None)
            .await
            .unwrap()
            .key
    }

    async fn send(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {key}"));
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
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A chat of `tenant` with the agent, to its end: the outcome and the thread's events
    /// (as JSON text).
    async fn chat(&self, tenant: &str) -> (Value, String) {
        let key = self.key(tenant).await;
        let (status, outcome) = self
            .send(
                "POST",
                "/v1/chat",
                &key,
                Some(json!({"agent": "fetcher", "message": "Who is the customer?"})),
            )
            .await;
        assert_eq!(status, 200, "{outcome}");
        assert_eq!(outcome["status"], "ended", "{outcome}");
        let thread = outcome["thread_id"].as_str().unwrap();
        let (status, body) = self
            .send("GET", &format!("/v1/threads/{thread}"), &key, None)
            .await;
        assert_eq!(status, 200, "{body}");
        (outcome, body["events"].to_string())
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// The outcome's call of `tool`.
fn call<'a>(outcome: &'a Value, tool: &str) -> &'a Value {
    outcome["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == tool)
        .unwrap_or_else(|| panic!("no call of {tool}: {outcome}"))
}

fn assert_no_secret(text: &str, what: &str) {
    for secret in [
        ALPHA_SVC,
        ALPHA_HELPER,
        BETA_SVC,
        BETA_HELPER,
        SERVER_SVC,
        SERVER_HELPER,
        PROVIDER_KEY,
    ] {
        assert!(
            !text.contains(secret),
            "{what} holds the secret {secret}: {text}"
        );
    }
}

/// The service got requests only with `bearer` on `/lookup` and `helper_bearer` on the
/// A2A agent, at least one of each.
fn assert_sent(seen: &[Request], svc: &str, helper: &str) {
    let lookups: Vec<_> = seen.iter().filter(|(p, _)| p == "/lookup").collect();
    assert_eq!(lookups.len(), 1, "{seen:?}");
    assert_eq!(
        lookups[0].1.as_deref(),
        Some(format!("Bearer {svc}").as_str())
    );
    let a2a: Vec<_> = seen
        .iter()
        .filter(|(p, _)| p.starts_with("/a2a/"))
        .collect();
    assert!(!a2a.is_empty(), "the A2A agent was called: {seen:?}");
    for (path, auth) in a2a {
        assert_eq!(
            auth.as_deref(),
            Some(format!("Bearer {helper}").as_str()),
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_calls_with_its_own_secret_and_never_the_servers() {
    let (svc, seen) = service().await;
    let server = Running::start(&svc).await;

    // Alpha: both secrets from variables.
    let (outcome, events) = server.chat("alpha").await;
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    assert_eq!(call(&outcome, "lookup")["ok"], true, "{outcome}");
    assert_eq!(call(&outcome, "helper")["ok"], true, "{outcome}");
    assert_sent(&seen.take(), ALPHA_SVC, ALPHA_HELPER);
    assert_no_secret(&events, "alpha's events");
    assert!(
        events.contains(r#""seen_authorization":"[redacted]""#),
        "the echoed credential is scrubbed from the tool's result: {events}"
    );

    // Beta: the service secret from a file, the helper's from a variable.
    let (outcome, events) = server.chat("beta").await;
    assert_eq!(outcome["end_state"], "done", "{outcome}");
    assert_sent(&seen.take(), BETA_SVC, BETA_HELPER);
    assert_no_secret(&events, "beta's events");

    // Gamma configured nothing: both calls refused before anything is sent, naming the
    // tenant's setting; the server's own SVC_TOKEN / HELPER_TOKEN are not used.
    let (outcome, events) = server.chat("gamma").await;
    for (tool, credential) in [("lookup", "SVC_TOKEN"), ("helper", "HELPER_TOKEN")] {
        let call = call(&outcome, tool);
        assert_eq!(call["ok"], false, "{outcome}");
        assert_eq!(call["error_code"], "unauthorized", "{outcome}");
        let message = call["error_message"].as_str().unwrap();
        assert!(
            message.contains("[server.tenants.gamma.credentials]")
                && message.contains(&format!(
                    "{credential} = {{ env = \"GAMMA_{credential}\" }}"
                )),
            "{message}"
        );
    }
    let sent = seen.take();
    assert!(sent.is_empty(), "gamma's run sent requests: {sent:?}");
    assert_no_secret(&events, "gamma's events");
    assert_no_secret(&outcome.to_string(), "gamma's outcome");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_naming_the_servers_own_secrets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let load = |tenant_section: &str| {
        let text = format!(
            "[providers.corp]\nkind = \"openai\"\napi_key_env = \"CORP_LLM_KEY\"\n\
             [server.tenants.alpha.credentials]\n{tenant_section}\n"
        );
        App::from_toml_str(&text, dir.path(), env())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let provider = load("SVC_TOKEN = { env = \"OPENAI_API_KEY\" }");
    assert!(
        provider.contains("server.tenants.alpha.credentials.SVC_TOKEN.env")
            && provider.contains("the API key of model provider `openai`"),
        "{provider}"
    );
    let custom = load("SVC_TOKEN = { env = \"CORP_LLM_KEY\" }");
    assert!(custom.contains("model provider `corp`"), "{custom}");
    // A pasted secret is refused without being shown.
    let pasted = load("SVC_TOKEN = \"tok-pasted-5555\"");
    assert!(pasted.contains("secrets never go in keel.toml"), "{pasted}");
    assert!(!pasted.contains("tok-pasted-5555"), "{pasted}");
    let pasted_env = load("SVC_TOKEN = { env = \"tok pasted 5555\" }");
    assert!(pasted_env.contains("never the"), "{pasted_env}");
    assert!(!pasted_env.contains("tok pasted"), "{pasted_env}");

    // A tool whose fixed header carries the provider key (`${OPENAI_API_KEY}` expanded
    // when keel.toml was loaded) would send it on every tenant's calls: the server refuses.
    let leaky = App::from_toml_str(
        "[[tools.http]]\nname = \"leaky\"\ndescription = \"Leaks.\"\nusage = \"leaky — no arguments.\"\n\
         method = \"GET\"\nurl = \"http://127.0.0.1:9/x\"\n\
         headers = { Authorization = \"Bearer ${OPENAI_API_KEY}\" }\n",
        dir.path(),
        env(),
    )
    .unwrap();
    let config = leaky.config().server.clone();
    let store = keel_store::open("memory:").await.unwrap();
    let refused = Server::new(Arc::new(leaky), &store, config)
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("tool `leaky` sends the value of `OPENAI_API_KEY`")
            && refused.contains("headers.Authorization"),
        "{refused}"
    );
    assert!(!refused.contains(PROVIDER_KEY), "{refused}");

    // The same tool in an agent file that keel.toml names: the file keeps the reference
    // as written (expanded when the agent is built), and the server refuses it too
    // (before, agent files were not looked at: the server started and sent the key).
    std::fs::create_dir_all(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("agents/leaky.toml"),
        "instructions = \"Help.\"\n\
         [[tools]]\nname = \"leaky_file\"\ndescription = \"Leaks.\"\n\
         usage = \"leaky_file — no arguments.\"\nmethod = \"GET\"\n\
         url = \"http://127.0.0.1:9/x\"\n\
         headers = { Authorization = \"Bearer ${OPENAI_API_KEY}\" }\n",
    )
    .unwrap();
    let from_file = App::from_toml_str(
        "[agents.leaky]\nfile = \"agents/leaky.toml\"\n",
        dir.path(),
        env(),
    )
    .unwrap();
    let config = from_file.config().server.clone();
    let refused = Server::new(Arc::new(from_file), &store, config)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("tool `leaky_file` sends the value of `OPENAI_API_KEY`")
            && refused.contains("headers.Authorization"),
        "{refused}"
    );
    assert!(!refused.contains(PROVIDER_KEY), "{refused}");

    // A server configured in code gets the same refusal.
    let app = App::from_toml_str("", dir.path(), env()).unwrap();
    let mut config = app.config().server.clone();
    config.tenants.insert(
        "alpha".into(),
        keel_config::TenantConfig {
            credentials: [(
                "SVC_TOKEN".to_string(),
                keel_config::CredentialRef {
                    env: Some("ANTHROPIC_API_KEY".into()),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        },
    );
    let refused = Server::new(Arc::new(app), &store, config).err().unwrap();
    assert!(
        refused
            .to_string()
            .contains("the API key of model provider `anthropic`"),
        "{refused}"
    );
}
