//! A store in a temporary SQLite file seeded with scripted runs (through `keel-app` and the
//! runtime, as `keel run --script` makes them), and the UI served on a loopback port.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_app::App;
use keel_app::recipe::Recipe;
use keel_core::{
    EventKind, EventStore, Message, Tool, ToolContext, ToolError, ToolRegistry, ToolSpec,
};
use keel_runtime::{RunApprovalMode, RunStatus, Thread};
use keel_telemetry::Redactor;
use keel_testkit::{ScriptStep, ScriptedModel};
use keel_ui::{AppResumer, RunSource, Ui};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Semaphore;

/// A tool that blocks until the test adds a permit: a run that is provably in progress.
pub struct Gate(pub Arc<Semaphore>);

#[derive(Debug, Deserialize, JsonSchema)]
pub struct GateArgs {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct GateOutput {
    /// Always true.
    pub opened: bool,
}

impl Tool for Gate {
    type Args = GateArgs;
    type Output = GateOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "gate",
            "Wait until the gate opens.",
            "gate — Usage Guide\n\nPrimary purpose:\n- Wait for the test.\n",
        )
        .with_timeout(Duration::from_secs(600))
    }

    async fn call(&self, _args: GateArgs, _ctx: &ToolContext) -> Result<GateOutput, ToolError> {
        let permit = self
            .0
            .acquire()
            .await
            .map_err(|e| ToolError::invalid_input(e.to_string()))?;
        permit.forget();
        Ok(GateOutput { opened: true })
    }
}

/// The seeded threads.
#[derive(Debug, Clone)]
pub struct Threads {
    pub done: String,
    pub failed: String,
    pub xss: String,
    pub paused: String,
    pub paused_call: String,
    /// Started only when asked for; blocked on the gate.
    pub live: Option<String>,
}

pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub store: Arc<dyn EventStore>,
    /// The store's run queue: the UI takes threads' leases from it, as `keel ui` does.
    pub queue: Arc<dyn keel_store::RunQueue>,
    pub base: String,
    pub threads: Threads,
    pub gate: Arc<Semaphore>,
}

/// What the XSS run's tool returns and its user says.
pub const SCRIPT_PAYLOAD: &str =
    "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">";
/// A secret in the XSS run's message: never shown.
pub const SECRET: &str = "sk-ant-api03-abcdefghijklmnopqrstuvwx";

pub fn app(dir: &Path, gate: Arc<Semaphore>) -> App {
    let env = Arc::new(|n: &str| (n == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    let mut tools = ToolRegistry::new();
    tools.register_typed(Gate(gate)).unwrap();
    App::from_toml_str("", dir, env).unwrap().with_tools(&tools)
}

fn recipe(tools: &[&str]) -> Recipe {
    Recipe {
        tools: tools.iter().map(|t| t.to_string()).collect(),
        ..Recipe::default()
    }
}

/// Runs `steps` on a new thread with `recipe`; returns the thread id and the status.
async fn run(
    app: &App,
    store: &Arc<dyn EventStore>,
    recipe: &Recipe,
    steps: Vec<ScriptStep>,
    message: &str,
) -> (String, Option<RunStatus>) {
    let model = Arc::new(ScriptedModel::new(steps));
    let built = recipe.build_agent(app, Some(model)).await.unwrap();
    let context = app.run_context(store.clone(), recipe.approve, built.approve);
    let mut thread = Thread::new();
    let outcome = built
        .agent
        .run(vec![Message::user(message)], &mut thread, &context)
        .await;
    (thread.id().to_string(), outcome.ok().map(|o| o.status))
}

impl Fixture {
    /// Seeds the store; with `live`, also starts a run blocked on the gate (and waits
    /// until its tool call has started).
    pub async fn new(live: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("keel.db").display());
        let opened = keel_app::store::open_store(&url).await.unwrap();
        let (store, queue) = (opened.events, opened.queue);
        let gate = Arc::new(Semaphore::new(0));
        let app = Arc::new(app(dir.path(), gate.clone()));

        let (done, _) = run(
            &app,
            &store,
            &recipe(&["calculator"]),
            vec![
                ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
                ScriptStep::text("The answer is 42."),
            ],
            "what is 6*7?",
        )
        .await;
        let failing: ScriptStep = serde_json::from_value(json!({
            "error": {"kind": "invalid_request", "message": "the request is malformed", "status": 400}
        }))
        .unwrap();
        let (failed, _) = run(&app, &store, &recipe(&[]), vec![failing], "this one fails").await;
        let (xss, _) = run(
            &app,
            &store,
            &recipe(&["ping_pong"]),
            vec![
                ScriptStep::tool_call("ping_pong", json!({"message": SCRIPT_PAYLOAD})),
                ScriptStep::text(format!("echoed {SCRIPT_PAYLOAD}")),
            ],
            &format!("echo this {SCRIPT_PAYLOAD} with key {SECRET}"),
        )
        .await;
        let ask = Recipe {
            approve: Some(RunApprovalMode::Ask),
            ..recipe(&["calculator"])
        };
        let (paused, status) = run(
            &app,
            &store,
            &ask,
            vec![ScriptStep::tool_call(
                "calculator",
                json!({"expression": "2*21"}),
            )],
            "what is 2*21? (needs approval)",
        )
        .await;
        let Some(RunStatus::AwaitingApproval { call_id, .. }) = status else {
            panic!("not paused: {status:?}");
        };

        let live_thread = if live {
            let thread = Thread::new();
            let id = thread.id().to_string();
            let app = app.clone();
            let run_store = store.clone();
            tokio::spawn(async move {
                let store = run_store;
                let recipe = recipe(&["gate"]);
                let model = Arc::new(ScriptedModel::new(vec![
                    ScriptStep::tool_call("gate", json!({})),
                    ScriptStep::text("the gate opened"),
                ]));
                let built = recipe.build_agent(&app, Some(model)).await.unwrap();
                let context = app.run_context(store.clone(), None, built.approve);
                let mut thread = thread;
                let _ = built
                    .agent
                    .run(
                        vec![Message::user("wait for the gate")],
                        &mut thread,
                        &context,
                    )
                    .await;
            });
            wait_until(Duration::from_secs(30), || {
                let store = store.clone();
                let id = id.clone();
                async move {
                    store.load(&id).await.unwrap().iter().any(|e| {
                        matches!(&e.kind, EventKind::ToolCallStarted { name, .. } if name == "gate")
                    })
                }
            })
            .await;
            Some(id)
        } else {
            None
        };

        let resume_app = app.clone();
        let resumer = AppResumer::new(resume_app).with_models(Arc::new(|_recipe, _steps| {
            Ok(Some(
                Arc::new(ScriptedModel::new(vec![ScriptStep::text("2*21 is 42.")]))
                    as Arc<dyn keel_core::Model>,
            ))
        }));
        let ui = Ui::new(RunSource::new(store.clone(), Redactor::default()))
            .with_resumer(Arc::new(resumer))
            .with_claims(queue.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let local = listener.local_addr().unwrap();
        let base = format!("http://{local}");
        // As `keel ui` serves it: only its own Host values are answered (DNS rebinding).
        let hosts =
            keel_ui::AllowedHosts::for_server(&keel_config::ServerConfig::default(), &[local]);
        tokio::spawn(keel_ui::serve(
            listener,
            keel_ui::guard_hosts(keel_ui::router(ui), hosts),
            std::future::pending(),
        ));
        Fixture {
            _dir: dir,
            store,
            queue,
            base,
            threads: Threads {
                done,
                failed,
                xss,
                paused,
                paused_call: call_id,
                live: live_thread,
            },
            gate,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Every event of the store, thread by thread (what `keel stats` computes over).
    pub async fn all_events(&self) -> Vec<keel_core::Event> {
        let threads = self.store.list_threads(&Default::default()).await.unwrap();
        let mut events = Vec::new();
        for t in threads {
            events.extend(self.store.load(&t.thread_id).await.unwrap());
        }
        events
    }
}

/// Polls `check` until it holds, failing after `limit` (a deadline, not a timing
/// assumption: the poll returns as soon as the condition holds).
pub async fn wait_until<F, Fut>(limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET `url`: status and body.
pub async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// The anti-forgery token the forms of `page` carry (`name="csrf"`).
pub fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in the page: {page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}
