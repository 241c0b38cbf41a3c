//! Remote A2A agents as agents (`[agents.<name>] a2a = "<[[a2a.agents]] name>"`), over
//! real loopback sockets: against keel-a2a's `EchoBackend` router (streaming and not) and
//! the official Python SDK's server (`a2a_peer.py`, installed by
//! `./scripts/install-a2a-peers`). Built the way `keel run --agent NAME`, `keel reply`,
//! workers and `keel serve` build agents (a recorded `Recipe`), each run is journaled:
//! the reply as the agent's message, input-required as a question the next message
//! answers on the same remote task, cancellation sent to the remote task; the agent also
//! works as a handoff target, an agent offered as a tool and a workflow step.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_a2a::peers::PythonPeer;
use keel_a2a::testing::EchoBackend;
use keel_a2a::{A2aClient, ClientOptions, TaskState};
use keel_app::recipe::Recipe;
use keel_app::workflow::WorkflowRequest;
use keel_app::{AgentRef, AgentRequest, App};
use keel_core::{
    CancellationToken, EndState, Event, EventKind, EventStore, MemoryStore, Message, Part,
    StreamEvent,
};
use keel_runtime::context::UserInputSource;
use keel_runtime::{Agent, RunContext, RunObserver, RunOutcome, Thread};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

/// Generous: a loaded 2-core machine is slow, and nothing here waits on time.
const DEADLINE: Duration = Duration::from_secs(60);

/// keel.toml with the remote agent `echo` at `url` and the agent `researcher` it answers;
/// `extra` adds more.
fn app(url: &str, extra: &str) -> App {
    let toml = format!(
        r#"
[[a2a.agents]]
name = "echo"
url = "{url}"
timeout_ms = 60000

[agents.researcher]
a2a = "echo"
description = "Finds things out."
{extra}"#
    );
    let env = Arc::new(|name: &str| (name == "OPENAI_API_KEY").then(|| "sk-test".to_string()));
    App::from_toml_str(&toml, std::path::Path::new("."), env).unwrap()
}

/// The text deltas a run streamed.
#[derive(Default)]
struct Deltas(Mutex<String>);

impl RunObserver for Deltas {
    fn on_event(&self, _event: &Event) {}

    fn on_stream(&self, _thread_id: &str, _run_id: &str, event: &StreamEvent) {
        if let StreamEvent::TextDelta(text) = event {
            self.0.lock().unwrap().push_str(text);
        }
    }
}

/// Answers every question with `self.0`.
struct Answers(&'static str);

#[async_trait::async_trait]
impl UserInputSource for Answers {
    async fn answer(&self, _thread: &str, _question: &str, _fields: &[String]) -> Option<String> {
        Some(self.0.to_string())
    }
}

/// What `keel run --agent researcher` builds: the agent of a recipe naming it.
async fn built(app: &App) -> keel_app::recipe::BuiltRecipe {
    Recipe {
        agent_name: Some("researcher".into()),
        ..Recipe::default()
    }
    .build_agent(app, None)
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

fn notices<'a>(events: &'a [Event], code: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Notice {
                code: c,
                data: Some(data),
                ..
            } if c == code => Some(data),
            _ => None,
        })
        .collect()
}

async fn run_once(
    agent: &keel_app::ComposedAgent,
    thread: &mut Thread,
    context: &RunContext,
    text: &str,
) -> RunOutcome {
    tokio::time::timeout(
        DEADLINE,
        agent.run(vec![Message::user(text)], thread, context),
    )
    .await
    .expect("the run ended in time")
    .unwrap()
}

/// `keel run --agent researcher "hello"`: done, the reply journaled as the agent's
/// message with the remote task's marker, the recipe recorded, the text streamed.
async fn a_run_is_journaled(url: &str, streams: bool) {
    let app = app(url, "");
    let built = built(&app).await;
    assert_eq!(built.agent.model_id(), "a2a:echo");
    assert!(built.agent.entry().is_none());
    let store = Arc::new(MemoryStore::new());
    let deltas = Arc::new(Deltas::default());
    let context = app
        .run_context(store.clone(), None, built.approve)
        .with_observer(deltas.clone());
    let mut thread = Thread::new();
    let outcome = run_once(&built.agent, &mut thread, &context, "hello").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(outcome.final_text.as_deref(), Some("echo: hello"));
    assert_eq!(
        *deltas.0.lock().unwrap(),
        "echo: hello",
        "streams: {streams}"
    );

    let events = store.load(thread.id()).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "user_message",
            "notice",
            "agent_message",
            "run_ended"
        ]
    );
    let EventKind::RunStarted {
        agent, model, goal, ..
    } = &events[0].kind
    else {
        panic!()
    };
    assert_eq!((agent.as_str(), model.as_str()), ("researcher", "a2a:echo"));
    assert_eq!(goal, "hello");
    let recipe = Recipe::recorded(
        &events
            .iter()
            .cloned()
            .map(std::sync::Arc::new)
            .collect::<Vec<_>>(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(recipe.agent_name.as_deref(), Some("researcher"));
    let task_id = notices(&events, "a2a_task")[0]["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let EventKind::AgentMessage { agent, message } = &events[3].kind else {
        panic!()
    };
    assert_eq!(agent, "researcher");
    assert_eq!(message.text(), "echo: hello");
    let marker = message
        .parts
        .iter()
        .find_map(|p| match p {
            Part::ProviderItem { provider, item } if provider == "a2a" => Some(item.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(marker["task_id"], task_id.as_str());
    assert_eq!(marker["state"], "completed");

    // The next message continues the remote conversation (same context), in a new task.
    let outcome = run_once(&built.agent, &mut thread, &context, "again").await;
    assert_eq!(outcome.final_text.as_deref(), Some("echo: again"));
    let events = store.load(thread.id()).await.unwrap();
    let tasks = notices(&events, "a2a_task");
    assert_eq!(tasks.len(), 2);
    assert_ne!(tasks[0]["task_id"], tasks[1]["task_id"]);
    assert_eq!(tasks[0]["context_id"], tasks[1]["context_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_streams_and_is_journaled_against_the_keel_router() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    a_run_is_journaled(&url, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_polls_an_agent_that_does_not_stream() {
    let url = keel_a2a::testing::serve(EchoBackend::without_streaming())
        .await
        .unwrap();
    a_run_is_journaled(&url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_journaled_against_the_python_sdk() {
    let peer = PythonPeer::start(&[], &[], DEADLINE).await.unwrap();
    a_run_is_journaled(&peer.url, true).await;
    let polled = PythonPeer::start(&["--no-streaming"], &[], DEADLINE)
        .await
        .unwrap();
    a_run_is_journaled(&polled.url, false).await;
}

/// input-required: the run ends `clarify_needed` with the remote agent's question; the
/// next message on the thread (`keel reply`) answers the same remote task.
async fn input_required_then_reply(url: &str) {
    let app = app(url, "");
    let store = Arc::new(MemoryStore::new());
    let mut thread = Thread::new();
    let first = built(&app).await;
    let context = app.run_context(store.clone(), None, first.approve);
    let outcome = run_once(&first.agent, &mut thread, &context, "ask me").await;
    assert_eq!(
        outcome.end_state(),
        Some(EndState::ClarifyNeeded),
        "{outcome:?}"
    );
    assert_eq!(
        outcome.clarification.as_ref().unwrap().question,
        "What is your name?"
    );
    let events = store.load(thread.id()).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "user_message",
            "notice",
            "agent_message",
            "user_asked",
            "run_ended"
        ]
    );
    let asked = notices(&events, "a2a_task")[0]["task_id"].clone();

    // `keel reply`: a new process rebuilds the agent from the recorded recipe and starts a
    // run with the answer.
    let recipe = Recipe::recorded(thread.run_events()).unwrap().unwrap();
    let again = recipe.build_agent(&app, None).await.unwrap();
    let mut thread = Thread::load(store.as_ref(), thread.id()).await.unwrap();
    let outcome = run_once(&again.agent, &mut thread, &context, "Ada").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("Nice to meet you, Ada.")
    );
    let events = store.load(thread.id()).await.unwrap();
    let tasks = notices(&events, "a2a_task");
    assert_eq!(tasks.len(), 2);
    assert_eq!(
        tasks[1]["task_id"], asked,
        "the answer went to the same task"
    );

    // An interactive surface answers at once: one run, the same task.
    let interactive = context.clone().with_user_input(Arc::new(Answers("Grace")));
    let mut thread = Thread::new();
    let outcome = run_once(&again.agent, &mut thread, &interactive, "ask again").await;
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("Nice to meet you, Grace.")
    );
    let events = store.load(thread.id()).await.unwrap();
    assert!(kinds(&events).contains(&"user_answered"));
    let tasks = notices(&events, "a2a_task");
    assert_eq!(tasks[0]["task_id"], tasks[1]["task_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_then_reply_continues_the_task_on_the_keel_router() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    input_required_then_reply(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_then_reply_continues_the_task_on_the_python_sdk() {
    let peer = PythonPeer::start(&[], &[], DEADLINE).await.unwrap();
    input_required_then_reply(&peer.url).await;
}

/// Starts `slow …` on a new thread in the background; answers the run's handle.
fn start_slow(
    agent: Arc<keel_app::ComposedAgent>,
    context: RunContext,
) -> (String, tokio::task::JoinHandle<RunOutcome>) {
    let mut thread = Thread::new();
    let id = thread.id().to_string();
    let handle = tokio::spawn(async move {
        agent
            .run(vec![Message::user("slow work")], &mut thread, &context)
            .await
            .unwrap()
    });
    (id, handle)
}

async fn until_task_state(client: &A2aClient, task_id: &str, state: TaskState) {
    tokio::time::timeout(DEADLINE, async {
        loop {
            if client
                .get_task(task_id, Some(0))
                .await
                .unwrap()
                .status
                .state
                == state
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("task {task_id} never became {state}"));
}

fn client(url: &str) -> A2aClient {
    A2aClient::new(
        url,
        ClientOptions {
            timeout: DEADLINE,
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

/// Cancelling the run sends `tasks/cancel` for the remote task and ends it `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_cancels_the_remote_task_on_the_keel_router() {
    let (url, backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let app = app(&url, "");
    let built = built(&app).await;
    let store = Arc::new(MemoryStore::new());
    let cancel = CancellationToken::new();
    let context = app
        .run_context(store.clone(), None, None)
        .with_cancel(cancel.clone());
    let (thread_id, run) = start_slow(Arc::new(built.agent), context);
    let task_id = tokio::time::timeout(
        DEADLINE,
        backend.wait_for_status_message("working until cancelled"),
    )
    .await
    .unwrap();
    cancel.cancel();
    let outcome = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert_eq!(
        outcome.end_state(),
        Some(EndState::Cancelled),
        "{outcome:?}"
    );
    tokio::time::timeout(
        DEADLINE,
        backend.wait_for_state(&task_id, TaskState::Canceled),
    )
    .await
    .expect("the remote task was cancelled");
    let events = store.load(&thread_id).await.unwrap();
    assert_eq!(
        notices(&events, "a2a_cancel")[0]["task_id"],
        task_id.as_str()
    );
    assert_eq!(kinds(&events).last(), Some(&"run_ended"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_cancels_the_remote_task_on_the_python_sdk() {
    let mut peer = PythonPeer::start(&[], &[], DEADLINE).await.unwrap();
    let app = app(&peer.url, "");
    let built = built(&app).await;
    let store = Arc::new(MemoryStore::new());
    let cancel = CancellationToken::new();
    let context = app
        .run_context(store.clone(), None, None)
        .with_cancel(cancel.clone());
    let (thread_id, run) = start_slow(Arc::new(built.agent), context);
    let task_id = peer.line("SLOW ").await.unwrap();
    cancel.cancel();
    let outcome = tokio::time::timeout(DEADLINE, run).await.unwrap().unwrap();
    assert_eq!(
        outcome.end_state(),
        Some(EndState::Cancelled),
        "{outcome:?}"
    );
    until_task_state(&client(&peer.url), &task_id, TaskState::Canceled).await;
    let events = store.load(&thread_id).await.unwrap();
    assert_eq!(
        notices(&events, "a2a_cancel")[0]["task_id"],
        task_id.as_str()
    );
}

/// A run interrupted while its remote task works (its process died) is continued from
/// the log: the rebuilt agent follows the same remote task instead of sending again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_follows_its_remote_task_on_resume() {
    let (url, backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let app = app(&url, "");
    let built = built(&app).await;
    let store = Arc::new(MemoryStore::new());
    let context = app.run_context(store.clone(), None, None);
    let (thread_id, run) = start_slow(Arc::new(built.agent), context);
    let task_id = tokio::time::timeout(
        DEADLINE,
        backend.wait_for_status_message("working until cancelled"),
    )
    .await
    .unwrap();
    // Wait for the task to be journaled, then "crash".
    tokio::time::timeout(DEADLINE, async {
        while notices(&store.load(&thread_id).await.unwrap(), "a2a_task").is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    run.abort();
    let _ = run.await;
    assert_eq!(
        backend.state(&task_id),
        Some(TaskState::Working),
        "not cancelled"
    );
    // Someone cancels the task at the remote agent meanwhile.
    client(&url).cancel_task(&task_id).await.unwrap();
    let resumed = tokio::time::timeout(
        DEADLINE,
        keel_app::resume::resume_thread(
            &app,
            store.clone(),
            &thread_id,
            &Recipe::default(),
            None,
            |c| c,
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let outcome = resumed.outcome;
    assert_eq!(
        outcome.end_state(),
        Some(EndState::Cancelled),
        "{outcome:?}"
    );
    assert!(
        outcome.reason.as_deref().unwrap().contains(&task_id),
        "{outcome:?}"
    );
    let events = store.load(&thread_id).await.unwrap();
    let tasks = notices(&events, "a2a_task");
    assert!(
        tasks.iter().all(|t| t["task_id"] == task_id.as_str()),
        "{tasks:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
            .count(),
        1,
        "the same run continued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_remote_task_fails_the_run_with_its_reason() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    let app = app(&url, "");
    let built = built(&app).await;
    let context = app.run_context(Arc::new(MemoryStore::new()), None, None);
    let outcome = run_once(&built.agent, &mut Thread::new(), &context, "fail now").await;
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    let reason = outcome.reason.unwrap();
    assert!(reason.contains("failed the task"), "{reason}");
    assert!(reason.contains("failure requested"), "{reason}");
}

fn scripted(steps: Vec<ScriptStep>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(steps))
}

/// In compositions: a handoff target, an agent offered as a tool, a workflow step.
async fn compositions(url: &str) {
    let app = app(
        url,
        r#"
[agents.triage]
model = "openai:gpt-4.1"
instructions = "Route."
handoffs = ["researcher"]

[agents.boss]
model = "openai:gpt-4.1"
instructions = "Delegate."
agents_as_tools = ["researcher"]

[agents.writer]
model = "openai:gpt-4.1"
instructions = "Write."

[workflows.pipeline]
kind = "sequential"
steps = ["researcher", "writer"]
"#,
    );
    let store = Arc::new(MemoryStore::new());
    let context = app.run_context(store.clone(), None, None);

    // Handoff: triage transfers, the remote agent answers on the same thread; a follow-up
    // message goes straight to it.
    let request = AgentRequest {
        agent: Some(AgentRef::Named("triage".into())),
        model_override: Some(scripted(vec![ScriptStep::tool_call(
            "transfer_to_researcher",
            json!({"reason": "research"}),
        )])),
        ..AgentRequest::default()
    };
    let (triage, _) = app.composed_agent(&request).await.unwrap();
    assert!(triage.member("researcher").is_some());
    let mut thread = Thread::new();
    let outcome = run_once(&triage, &mut thread, &context, "look it up").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(outcome.final_text.as_deref(), Some("echo: look it up"));
    let outcome = run_once(&triage, &mut thread, &context, "and more").await;
    assert_eq!(outcome.final_text.as_deref(), Some("echo: and more"));
    let events = store.load(thread.id()).await.unwrap();
    assert!(kinds(&events).contains(&"handoff"));

    // Agent as a tool: the remote agent's reply is the tool's result.
    let request = AgentRequest {
        agent: Some(AgentRef::Named("boss".into())),
        model_override: Some(scripted(vec![
            ScriptStep::tool_call("researcher", json!({"task": "find it"})),
            ScriptStep::text("The researcher said it."),
        ])),
        ..AgentRequest::default()
    };
    let (boss, _) = app.composed_agent(&request).await.unwrap();
    let mut thread = Thread::new();
    let outcome = run_once(&boss, &mut thread, &context, "go").await;
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert!(outcome.tool_calls[0].ok, "{outcome:?}");
    let result = store
        .load(thread.id())
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::ToolCallFinished { result } => Some(result.content.clone()),
            _ => None,
        })
        .unwrap();
    assert!(result.contains("echo: find it"), "{result}");

    // Workflow step: the remote agent's reply is the next step's input.
    let writer = scripted(vec![ScriptStep::text("Summary written.")]);
    let request = WorkflowRequest {
        model_override: Some(writer.clone()),
        ..WorkflowRequest::new("pipeline")
    };
    let workflow = app.workflow(&request).await.unwrap();
    let mut thread = Thread::new();
    let outcome = tokio::time::timeout(
        DEADLINE,
        workflow.run(vec![Message::user("topic")], &mut thread, &context),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
    assert_eq!(outcome.final_text.as_deref(), Some("Summary written."));
    let asked = writer.requests();
    assert!(
        serde_json::to_string(&asked)
            .unwrap()
            .contains("echo: topic"),
        "the writer got the remote agent's reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_works_in_compositions_on_the_keel_router() {
    let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
    compositions(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_works_in_compositions_on_the_python_sdk() {
    let peer = PythonPeer::start(&[], &[], DEADLINE).await.unwrap();
    compositions(&peer.url).await;
}

/// Definitions a remote agent cannot honour are refused with located errors: keel.toml's
/// when it is loaded (and by `keel config check`), an agent file's when the agent is built.
#[tokio::test]
async fn bad_definitions_are_located_errors() {
    let toml = r#"
[[a2a.agents]]
name = "echo"
url = "http://127.0.0.1:9"

[agents.typo]
a2a = "ecko"

[agents.extra]
a2a = "echo"
model = "openai:gpt-4.1"
tools = ["calculator"]

[agents.kindless]
kind = "a2a"

[agents.mixed]
kind = "tool"
a2a = "echo"
"#;
    let env: keel_app::Env = Arc::new(|_: &str| None);
    let diagnostics = keel_config::check_str(toml, "keel.toml", std::path::Path::new("."), &*env);
    let keys: Vec<&str> = diagnostics
        .iter()
        .filter_map(|d| d.key.as_deref())
        .collect();
    for key in [
        "agents.typo.a2a",
        "agents.extra.model",
        "agents.extra.tools",
        "agents.kindless.kind",
        "agents.mixed.a2a",
    ] {
        assert!(keys.contains(&key), "{key} not reported: {diagnostics:#?}");
    }
    let message = |key: &str| {
        diagnostics
            .iter()
            .find(|d| d.key.as_deref() == Some(key))
            .unwrap()
            .clone()
    };
    let typo = message("agents.typo.a2a");
    assert_eq!(
        typo.line,
        Some(toml.lines().position(|l| l.contains("ecko")).unwrap() + 1)
    );
    assert!(typo.message.contains("did you mean `echo`?"), "{typo:?}");
    assert!(
        message("agents.extra.model")
            .message
            .contains("not supported by a remote A2A agent")
    );
    assert!(
        message("agents.kindless.kind")
            .message
            .contains("needs `a2a = \"<name>\"`")
    );
    // Loading refuses the same problems.
    let refused = App::from_toml_str(toml, std::path::Path::new("."), env.clone()).unwrap_err();
    assert!(refused.to_string().contains("agents.typo.a2a"), "{refused}");

    // An agent file is checked when the agent is built, located in the file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("remote.toml");
    std::fs::write(&file, "a2a = \"ecko\"\ninstructions = \"Be nice.\"\n").unwrap();
    let ok = "[[a2a.agents]]\nname = \"echo\"\nurl = \"http://127.0.0.1:9\"\n[agents.ok]\na2a = \"echo\"\n";
    let app = App::from_toml_str(ok, dir.path(), env).unwrap();
    let recipe = Recipe {
        agent: Some(file.clone()),
        ..Recipe::default()
    };
    let error = recipe
        .build_agent(&app, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("remote.toml:1:"), "{error}");
    assert!(error.contains("did you mean `echo`?"), "{error}");
    assert!(error.contains("remote.toml:2:"), "{error}");
    assert!(error.contains("`instructions` is not supported"), "{error}");
    // Built as a tool-calling agent: refused at its key, naming the way to run it.
    let refused = app
        .agent(&AgentRequest {
            agent: Some(AgentRef::Named("ok".into())),
            ..AgentRequest::default()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("agents.ok.a2a"), "{refused}");
    assert!(refused.contains("keel run --agent ok"), "{refused}");
}

/// A server's tenant credentials: the token for `REMOTE_TOKEN`, or a fix to configure it.
struct TenantSecrets(Option<&'static str>);

impl keel_core::tool::CredentialSource for TenantSecrets {
    fn credential(&self, _tool: &str, _key: &str) -> Option<String> {
        self.0.map(str::to_string)
    }

    fn lookup(&self, tool: &str, key: &str) -> keel_core::tool::CredentialLookup {
        match (self.0, tool, key) {
            (Some(secret), "echo", "REMOTE_TOKEN") => {
                keel_core::tool::CredentialLookup::Found(secret.to_string())
            }
            _ => keel_core::tool::CredentialLookup::Missing {
                fix: format!("add `{key}` to the tenant's credentials"),
            },
        }
    }
}

/// Credentials come from the run's credential source when it has one (a server's tenant),
/// never from the process's environment; a missing one fails the run naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_the_runs_source() {
    let peer = PythonPeer::start(
        &["--bearer-env", "PEER_TOKEN"],
        &[("PEER_TOKEN", "s3cret")],
        DEADLINE,
    )
    .await
    .unwrap();
    let toml = format!(
        "[[a2a.agents]]\nname = \"echo\"\nurl = \"{}\"\nauth = {{ bearer_env = \"REMOTE_TOKEN\" }}\n\
         [agents.researcher]\na2a = \"echo\"\n",
        peer.url
    );
    // The process's environment holds another token: never used for a tenant's run.
    let env: keel_app::Env =
        Arc::new(|name: &str| (name == "REMOTE_TOKEN").then(|| "server-token".to_string()));
    let app = App::from_toml_str(&toml, std::path::Path::new("."), env).unwrap();
    let agent = built(&app).await.agent;
    let store = Arc::new(MemoryStore::new());
    let tenant = app
        .run_context(store.clone(), None, None)
        .with_credentials(Arc::new(TenantSecrets(Some("s3cret"))));
    let outcome = run_once(&agent, &mut Thread::new(), &tenant, "hello").await;
    assert_eq!(
        outcome.final_text.as_deref(),
        Some("echo: hello"),
        "{outcome:?}"
    );

    let unconfigured = app
        .run_context(store.clone(), None, None)
        .with_credentials(Arc::new(TenantSecrets(None)));
    let outcome = run_once(&agent, &mut Thread::new(), &unconfigured, "hello").await;
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    let reason = outcome.reason.unwrap();
    assert!(
        reason.contains("add `REMOTE_TOKEN` to the tenant's credentials"),
        "{reason}"
    );
    assert!(!reason.contains("server-token"), "{reason}");

    // Without a credential source (the CLI), the environment's token is sent: the peer
    // refuses it, and the run fails with the HTTP status.
    let local = app.run_context(store, None, None);
    let outcome = run_once(&agent, &mut Thread::new(), &local, "hello").await;
    assert_eq!(outcome.end_state(), Some(EndState::Failed));
    assert!(outcome.reason.unwrap().contains("401"));
}
