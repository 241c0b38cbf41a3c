//! Agent files: Keel's one agent schema (`keel_config::AgentDefinition`, also keel.toml's
//! `[agents.<name>]`), built by keel-app. Input: the file's TOML text. Invariants:
//! - parsing and building never panic, and every parse diagnostic has a position;
//! - a parsed file round-trips: serialized back to TOML it parses to the same definition;
//! - building reads only the environment variables the file declares in `env = [...]`,
//!   and fails when a tool references an undeclared one;
//! - every tool of a built agent keeps the tool contract.
#![no_main]

use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use keel_app::{AgentRef, AgentRequest, App};
use keel_config::{AgentDefinition, AgentFile, Source};
use keel_core::{Model, ModelCapabilities, ModelError, ModelRequest, StreamEvent};
use libfuzzer_sys::fuzz_target;

/// A model that is never called: building an agent only stores it.
struct Unused;

impl Model for Unused {
    fn id(&self) -> String {
        "fuzz:unused".into()
    }

    fn capabilities(&self) -> ModelCapabilities {
        ModelCapabilities::default()
    }

    fn stream<'a>(&'a self, _: ModelRequest<'a>) -> BoxStream<'a, Result<StreamEvent, ModelError>> {
        Box::pin(futures::stream::empty())
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let definition = match AgentDefinition::parse(text, "agent.toml") {
        Ok(definition) => definition,
        Err(diagnostics) => {
            assert!(!diagnostics.is_empty(), "an error without a diagnostic");
            for d in &diagnostics {
                assert!(!d.message.trim().is_empty(), "empty message: {d:?}");
            }
            return;
        }
    };
    if let Ok(again) = toml::to_string(&definition) {
        let reparsed = AgentDefinition::parse(&again, "agent.toml")
            .unwrap_or_else(|e| panic!("serialized agent file does not parse: {e:?}\n{again}"));
        let same =
            reparsed == definition || toml::to_string(&reparsed).ok().as_deref() == Some(&again);
        assert!(same, "round trip changed the file:\n{again}");
    }

    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = asked.clone();
    let env = Arc::new(move |name: &str| {
        if let Ok(mut asked) = record.lock() {
            asked.push(name.to_string());
        }
        match name {
            "HOST" => Some("127.0.0.1:9".to_string()),
            "TOKEN" => Some("t0k".to_string()),
            _ => None,
        }
    });
    let Ok(app) = App::from_toml_str("", Path::new("/nonexistent/keel-fuzz"), env) else {
        return;
    };
    let undeclared = definition.undeclared_env_vars();
    let allowed = definition.env_allowlist().to_vec();
    let request = AgentRequest {
        agent: Some(AgentRef::Parsed(Box::new(AgentFile {
            definition,
            source: Source::new("agent.toml", None, text),
        }))),
        model_override: Some(Arc::new(Unused)),
        ..AgentRequest::default()
    };
    // Building awaits nothing that needs a reactor (no MCP servers, no model call).
    let built = futures::executor::block_on(app.agent(&request));
    let asked = asked.lock().map(|a| a.clone()).unwrap_or_default();
    for name in &asked {
        assert!(
            allowed.contains(name),
            "building read undeclared variable `{name}`"
        );
    }
    match built {
        Ok(built) => {
            assert!(
                undeclared.is_empty(),
                "built despite undeclared variables {undeclared:?}"
            );
            for spec in built.agent.tools().specs() {
                let problems = spec.contract_violations();
                assert!(problems.is_empty(), "{problems:?}");
            }
        }
        Err(error) => assert!(!error.to_string().trim().is_empty()),
    }
});
