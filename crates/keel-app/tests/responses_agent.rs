//! The Responses agent (`kind = "openai-responses"`) against the loopback mock LLM: only
//! new messages are sent, chained by `previous_response_id` with `store: true`; each
//! response id is in the store when `run` returns; retries honour `Retry-After`; errors
//! end the run `failed`; cancellation ends it `cancelled`; and threads refuse agents that
//! cannot continue them, with nothing appended.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use keel_app::{AgentRef, AgentRequest, App, AppError, Env, ResponsesAgent};
use keel_config::AgentKind;
use keel_core::{
    CancellationToken, EndState, Event, EventKind, EventStore, MemoryStore, Message, StreamEvent,
};
use keel_providers::{ProviderOptions, RecordingSleeper, RetryConfig, StoredResponses};
use keel_runtime::{
    Agent, RunContext, RunError, RunObserver, RunStatus, Thread, ThreadHome, ToolAgent,
};
use keel_testkit::mock_llm::{MockError, MockLlmServer, MockScript, MockTurn};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

fn env_for(server: &MockLlmServer) -> Env {
    let base = server.base_url();
    Arc::new(move |name: &str| match name {
        "OPENAI_API_KEY" => Some("sk-test".to_string()),
        "OPENAI_BASE_URL" => Some(base.clone()),
        "KEEL_TEST_MODE" => Some("1".to_string()),
        _ => None,
    })
}

const TOML: &str = r#"
[agents.assistant]
kind = "openai-responses"
model = "openai-responses:gpt-5"
instructions = "Answer briefly."
"#;

async fn responses_agent(server: &MockLlmServer) -> ResponsesAgent {
    let app = App::from_toml_str(TOML, std::path::Path::new("."), env_for(server)).unwrap();
    let request = AgentRequest {
        agent: Some(AgentRef::Named("assistant".into())),
        ..AgentRequest::default()
    };
    assert_eq!(
        app.agent_kind(request.agent.as_ref().unwrap()).unwrap(),
        AgentKind::OpenAiResponses
    );
    let (agent, resolution) = app.responses_agent(&request).await.unwrap();
    assert_eq!(
        resolution.model_spec.as_deref(),
        Some("openai-responses:gpt-5")
    );
    agent
}

fn bodies(server: &MockLlmServer) -> Vec<Value> {
    server.requests().into_iter().map(|r| r.body).collect()
}

/// The text of each input item of a Responses request.
fn input_texts(body: &Value) -> Vec<(String, String)> {
    body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            (
                item["role"].as_str().unwrap().to_string(),
                item["content"][0]["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn response_ids(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponded { response_id, .. } => response_id.clone(),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn later_turns_send_only_the_new_message_after_the_previous_response() {
    let server = MockLlmServer::start(MockScript::new(vec![
        MockTurn::text("Hello Ada."),
        MockTurn::text("Your name is Ada."),
    ]))
    .await
    .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_chain");

    let first = agent
        .run(vec![Message::user("I am Ada.")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(first.final_text.as_deref(), Some("Hello Ada."));
    let second = agent
        .run(
            vec![Message::user("What is my name?")],
            &mut thread,
            &context,
        )
        .await
        .unwrap();
    assert_eq!(
        second.status,
        RunStatus::Ended {
            end_state: EndState::Done
        }
    );
    assert_eq!(second.final_text.as_deref(), Some("Your name is Ada."));
    assert_eq!(second.turns, 1);

    let sent = bodies(&server);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["store"], json!(true));
    assert_eq!(sent[0].get("previous_response_id"), None);
    assert_eq!(sent[0]["instructions"], json!("Answer briefly."));
    assert_eq!(sent[0]["model"], json!("gpt-5"));
    // The provider keeps the reasoning: no encrypted reasoning is asked for.
    assert_eq!(sent[0].get("include"), None);
    assert_eq!(input_texts(&sent[0]), [("user".into(), "I am Ada.".into())]);
    // The second request continues the stored conversation: the new message only.
    assert_eq!(sent[1]["store"], json!(true));
    assert_eq!(sent[1]["previous_response_id"], json!("resp_mock_1"));
    assert_eq!(sent[1]["instructions"], json!("Answer briefly."));
    assert_eq!(
        input_texts(&sent[1]),
        [("user".into(), "What is my name?".into())]
    );

    assert_eq!(
        thread.home(),
        ThreadHome::Provider {
            provider: "openai-responses".into(),
            conversation: "resp_mock_2".into()
        }
    );
    // The log keeps a copy of the whole conversation.
    let texts: Vec<String> = thread
        .state()
        .messages()
        .iter()
        .map(Message::text)
        .collect();
    assert_eq!(
        texts,
        [
            "I am Ada.",
            "Hello Ada.",
            "What is my name?",
            "Your name is Ada."
        ]
    );
    // A fork taken after the first answer continues from the first response.
    let events = store.load("thr_chain").await.unwrap();
    let first_end = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::RunEnded { .. }))
        .unwrap()
        .seq;
    let fork = Thread::fork(store.as_ref(), "thr_chain", first_end)
        .await
        .unwrap();
    assert_eq!(
        fork.home(),
        ThreadHome::Provider {
            provider: "openai-responses".into(),
            conversation: "resp_mock_1".into()
        }
    );
}

#[tokio::test]
async fn the_response_id_is_in_the_store_when_run_returns() {
    let server = MockLlmServer::start(MockScript::new(vec![MockTurn::text("Stored.")]))
        .await
        .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_durable");
    agent
        .run(vec![Message::user("Remember this.")], &mut thread, &context)
        .await
        .unwrap();

    let events = store.load("thr_durable").await.unwrap();
    assert_eq!(response_ids(&events), ["resp_mock_1"]);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "user_message",
            "model_requested",
            "model_responded",
            "run_ended"
        ]
    );
    match &events[0].kind {
        EventKind::RunStarted { agent, model, .. } => {
            assert_eq!(agent, "assistant");
            assert_eq!(model, "openai-responses:gpt-5");
        }
        other => panic!("not run_started: {other:?}"),
    }
    // A process that loads the thread from the store continues the same conversation.
    let reloaded = Thread::load(store.as_ref(), "thr_durable").await.unwrap();
    assert_eq!(
        reloaded.home(),
        ThreadHome::Provider {
            provider: "openai-responses".into(),
            conversation: "resp_mock_1".into()
        }
    );
}

#[tokio::test]
async fn a_rate_limit_with_retry_after_is_waited_out_then_the_answer_recorded() {
    let mut limited = MockTurn::http_error(429);
    limited.error = Some(MockError {
        status: Some(429),
        retry_after: Some(2),
        ..MockError::default()
    });
    let server = MockLlmServer::start(MockScript::new(vec![limited, MockTurn::text("Done.")]))
        .await
        .unwrap();
    let sleeper = Arc::new(RecordingSleeper::new());
    let options = ProviderOptions {
        base_url: Some(server.base_url()),
        api_key: Some("sk-test".into()),
        loopback_only: true,
        retry: RetryConfig::default(),
        sleeper: Some(sleeper.clone()),
        ..ProviderOptions::default()
    };
    let client = StoredResponses::with_env("gpt-5", &options, &|_| None).unwrap();
    let agent = ResponsesAgent::new("assistant", client);
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_retry");
    let outcome = agent
        .run(vec![Message::user("Hi")], &mut thread, &context)
        .await
        .unwrap();

    assert_eq!(outcome.final_text.as_deref(), Some("Done."));
    assert_eq!(sleeper.waits(), [Duration::from_secs(2)]);
    assert_eq!(server.requests().len(), 2);
    let events = store.load("thr_retry").await.unwrap();
    let retry = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Retry {
                scope,
                attempt,
                wait_ms,
                ..
            } => Some((scope.clone(), *attempt, *wait_ms)),
            _ => None,
        })
        .expect("a retry event");
    assert_eq!(retry, ("model".to_string(), 1, 2000));
    assert_eq!(response_ids(&events), ["resp_mock_2"]);
}

#[tokio::test]
async fn a_failed_call_ends_the_run_failed_and_the_next_run_sends_its_message_again() {
    let server = MockLlmServer::start(MockScript::new(vec![
        MockTurn::text("First."),
        MockTurn::http_error(400),
        MockTurn::text("Second."),
    ]))
    .await
    .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_failed");
    agent
        .run(vec![Message::user("one")], &mut thread, &context)
        .await
        .unwrap();
    let failed = agent
        .run(vec![Message::user("two")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(failed.end_state(), Some(EndState::Failed));
    let reason = failed.reason.clone().unwrap();
    assert!(
        reason.starts_with("model error (invalid_request)"),
        "{reason}"
    );
    assert!(!failed.resumable);
    // The provider never stored "two": it goes again, with the new message.
    let outcome = agent
        .run(vec![Message::user("three")], &mut thread, &context)
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_deref(), Some("Second."));
    let sent = bodies(&server);
    assert_eq!(sent[2]["previous_response_id"], json!("resp_mock_1"));
    assert_eq!(
        input_texts(&sent[2]),
        [
            ("user".into(), "two".into()),
            ("user".into(), "three".into())
        ]
    );
}

/// Cancels the run as soon as its model request is recorded.
struct CancelOnRequest(CancellationToken);

impl RunObserver for CancelOnRequest {
    fn on_event(&self, event: &Event) {
        if matches!(event.kind, EventKind::ModelRequested { .. }) {
            self.0.cancel();
        }
    }

    fn on_stream(&self, _thread_id: &str, _run_id: &str, _event: &StreamEvent) {}
}

#[tokio::test]
async fn cancellation_ends_the_run_cancelled_without_waiting_for_the_provider() {
    let mut slow = MockTurn::text("too late");
    slow.delay_ms = Some(60_000);
    let server = MockLlmServer::start(MockScript::new(vec![slow]))
        .await
        .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let cancel = CancellationToken::new();
    let context = RunContext::new(store.clone())
        .with_cancel(cancel.clone())
        .with_observer(Arc::new(CancelOnRequest(cancel)));
    let mut thread = Thread::with_id("thr_cancel");
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        agent.run(vec![Message::user("Hi")], &mut thread, &context),
    )
    .await
    .expect("the run returns once cancelled")
    .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Cancelled));
    assert_eq!(thread.home(), ThreadHome::Local);
}

#[tokio::test]
async fn a_tool_agent_refuses_a_thread_that_lives_on_the_provider() {
    let server = MockLlmServer::start(MockScript::new(vec![MockTurn::text("Hello.")]))
        .await
        .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_remote");
    agent
        .run(vec![Message::user("Hi")], &mut thread, &context)
        .await
        .unwrap();
    let before = store.load("thr_remote").await.unwrap().len();

    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("local answer")]));
    let local = ToolAgent::builder("local", model).build();
    let error = local
        .run(vec![Message::user("Continue")], &mut thread, &context)
        .await
        .unwrap_err();
    assert!(
        matches!(error, RunError::IncompatibleThread { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "thread thr_remote lives on openai-responses (response resp_mock_1), where agent \
         `local` cannot continue it: continue it with an agent backed by openai-responses \
         (such as `assistant`, which ran it last), or start a new thread"
    );
    let error = local.resume(&mut thread, &context).await.unwrap_err();
    assert!(
        matches!(error, RunError::IncompatibleThread { .. }),
        "{error:?}"
    );
    // Nothing was appended, and the thread is still the provider's.
    assert_eq!(store.load("thr_remote").await.unwrap().len(), before);
    assert!(matches!(thread.home(), ThreadHome::Provider { .. }));
}

#[tokio::test]
async fn a_responses_agent_refuses_a_thread_with_local_history() {
    let server = MockLlmServer::start(MockScript::new(vec![MockTurn::text("unused")]))
        .await
        .unwrap();
    let agent = responses_agent(&server).await;
    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let context = RunContext::new(store.clone());
    let mut thread = Thread::with_id("thr_local");
    let model = Arc::new(ScriptedModel::new(vec![ScriptStep::text("local answer")]));
    ToolAgent::builder("local", model)
        .build()
        .run(vec![Message::user("Hi")], &mut thread, &context)
        .await
        .unwrap();
    let before = store.load("thr_local").await.unwrap().len();

    let error = agent
        .run(vec![Message::user("Continue")], &mut thread, &context)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "thread thr_local lives in its local log, where agent `assistant` cannot continue \
         it: its history was written by a local agent, and this agent keeps its \
         conversations on openai-responses (it does not replay local history); continue it \
         with a local agent, or start a new thread"
    );
    assert_eq!(store.load("thr_local").await.unwrap().len(), before);
    assert!(
        server.requests().is_empty(),
        "no request reached the provider"
    );
}

#[tokio::test]
async fn the_tool_agent_builder_refuses_a_responses_definition_at_its_kind() {
    let server = MockLlmServer::start(MockScript::new(vec![])).await.unwrap();
    let app = App::from_toml_str(TOML, std::path::Path::new("."), env_for(&server)).unwrap();
    let request = AgentRequest {
        agent: Some(AgentRef::Named("assistant".into())),
        ..AgentRequest::default()
    };
    let error = app.agent(&request).await.unwrap_err().to_string();
    assert!(error.starts_with("keel.toml:3:1: error:"), "{error}");
    assert!(error.contains("has kind = \"openai-responses\""), "{error}");
    assert!(error.contains("keel run --agent assistant"), "{error}");
}

#[tokio::test]
async fn keys_a_responses_agent_cannot_honour_are_errors_at_their_line() {
    let server = MockLlmServer::start(MockScript::new(vec![])).await.unwrap();
    let toml = r#"
[agents.assistant]
kind = "openai-responses"
model = "openai-responses:gpt-5"
tools = ["calculator"]
"#;
    let app = App::from_toml_str(toml, std::path::Path::new("."), env_for(&server)).unwrap();
    let request = AgentRequest {
        agent: Some(AgentRef::Named("assistant".into())),
        ..AgentRequest::default()
    };
    let error = app.responses_agent(&request).await.unwrap_err();
    assert!(matches!(error, AppError::Located(_)), "{error:?}");
    let text = error.to_string();
    assert!(text.contains(":5:"), "{text}");
    assert!(text.contains("`tools` is not supported"), "{text}");

    let toml = r#"
[agents.assistant]
kind = "openai-responses"
model = "anthropic:claude-sonnet-4-5"
"#;
    let app = App::from_toml_str(toml, std::path::Path::new("."), env_for(&server)).unwrap();
    let text = app.responses_agent(&request).await.unwrap_err().to_string();
    assert!(text.contains("needs an openai-responses model"), "{text}");
}
