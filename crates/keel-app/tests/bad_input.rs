//! Bad agent definitions fail before any model is called, naming the file, the key and
//! its line: an unknown key in an agent file, an unknown tool, an unknown model alias or
//! provider — from keel.toml `[agents.<name>]` and from agent files alike.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::sync::Arc;

use keel_app::{AgentRef, AgentRequest, App, AppError};
use keel_config::DiagnosticCode;
use keel_testkit::mock_llm::{MockLlmServer, MockScript};

/// Builds agent `reference` from `toml` (in `dir`) with the OpenAI provider pointed at a
/// mock; returns the error and how many requests the mock received.
fn fails(dir: &Path, toml: &str, reference: &str) -> (AppError, usize) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mock = MockLlmServer::start(
                MockScript::from_json(r#"{"turns": [{"text": "hi"}]}"#).unwrap(),
            )
            .await
            .unwrap();
            let toml = format!(
                "[providers.openai]\nbase_url = \"{}/v1\"\n{toml}",
                mock.base_url()
            );
            let env = Arc::new(|n: &str| (n == "OPENAI_API_KEY").then(|| "sk".to_string()));
            let app = App::from_toml_str(&toml, dir, env).unwrap();
            let agent = match app.config().agents.contains_key(reference) {
                true => AgentRef::Named(reference.into()),
                false => AgentRef::File(dir.join(reference)),
            };
            let Err(error) = app
                .agent(&AgentRequest {
                    agent: Some(agent),
                    ..AgentRequest::default()
                })
                .await
            else {
                panic!("the definition is refused");
            };
            (error, mock.request_count())
        })
}

#[test]
fn an_unknown_key_in_an_agent_file_names_file_line_and_nearest_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        "name = \"x\"\ninstructions = \"Do.\"\nmodle = \"openai:m\"\n",
    )
    .unwrap();
    let (error, requests) = fails(dir.path(), "", "agent.toml");
    assert_eq!(requests, 0);
    let d = &error.diagnostics()[0];
    assert_eq!(d.code, DiagnosticCode::UnknownKey);
    assert_eq!((d.line, d.column), (Some(3), Some(1)));
    assert!(d.file.ends_with("agent.toml"));
    assert!(d.message.contains("did you mean `model`?"), "{}", d.message);
    // Through keel.toml's `file`, the same diagnostic (with the path as keel.toml gives
    // it) already when keel.toml loads.
    let error = App::from_toml_str(
        "[agents.a]\nfile = \"agent.toml\"\n",
        dir.path(),
        Arc::new(|_: &str| None),
    )
    .unwrap_err();
    assert!(
        error.to_string().contains(
            "\nagent.toml:3:1: error: unknown key `modle` in the top level; did you mean `model`?"
        ),
        "{error}"
    );
}

#[test]
fn an_unknown_tool_is_located_in_the_file_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let toml =
        "[agents.helper]\ninstructions = \"Help.\"\ntools = [\"calculator\", \"calculater\"]\n";
    let (error, requests) = fails(dir.path(), toml, "helper");
    assert_eq!(requests, 0, "no model call");
    let d = &error.diagnostics()[0];
    assert_eq!(d.key.as_deref(), Some("agents.helper.tools[1]"));
    assert_eq!(d.file, "keel.toml");
    assert_eq!(d.line, Some(5), "{error}"); // after the two provider lines
    assert!(
        d.message.contains("did you mean `calculator`?"),
        "{}",
        d.message
    );
    // In an agent file: its own name and line.
    std::fs::write(
        dir.path().join("mine.toml"),
        "instructions = \"Help.\"\n\n[[tools]]\nname = \"pingpong\"\n",
    )
    .unwrap();
    let (error, _) = fails(dir.path(), "", "mine.toml");
    let d = &error.diagnostics()[0];
    assert_eq!((d.key.as_deref(), d.line), (Some("tools[0]"), Some(3)));
    assert!(
        d.message.contains("did you mean `ping_pong`?"),
        "{}",
        d.message
    );
}

#[test]
fn an_unknown_model_or_provider_is_located() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.toml"),
        "instructions = \"Do.\"\nmodel = \"opneai:gpt-4o\"\n",
    )
    .unwrap();
    let (error, requests) = fails(dir.path(), "", "agent.toml");
    assert_eq!(requests, 0);
    let d = &error.diagnostics()[0];
    assert_eq!((d.key.as_deref(), d.line), (Some("model"), Some(2)));
    assert!(
        d.message.contains("did you mean `openai`?"),
        "{}",
        d.message
    );
    std::fs::write(
        dir.path().join("alias.toml"),
        "instructions = \"Do.\"\nmodel = \"fastt\"\n",
    )
    .unwrap();
    let (error, _) = fails(
        dir.path(),
        "[models.fast]\nmodel = \"openai:m\"\n",
        "alias.toml",
    );
    let d = &error.diagnostics()[0];
    assert!(d.message.contains("did you mean `fast`?"), "{}", d.message);
    // A keel.toml agent naming an unknown alias is refused when keel.toml loads.
    let refused = App::from_toml_str(
        "[agents.a]\nmodel = \"nonsense\"\n",
        dir.path(),
        Arc::new(|_: &str| None),
    )
    .unwrap_err();
    assert!(refused.to_string().contains("agents.a.model"), "{refused}");
}

#[test]
fn an_unknown_agent_name_suggests_the_nearest() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::from_toml_str(
        "[agents.detective]\ninstructions = \"x\"\n",
        dir.path(),
        Arc::new(|_: &str| None),
    )
    .unwrap();
    let error = app.find_agent("detectiv").unwrap_err();
    assert!(
        error.to_string().contains("did you mean `detective`?"),
        "{error}"
    );
    assert_eq!(
        app.find_agent("detective").unwrap(),
        AgentRef::Named("detective".into())
    );
}
