//! Agent files (`keel_detective::agent_file`). Input: the file's TOML text. Invariants:
//! - parsing and building never panic;
//! - a parsed file round-trips: serialized back to TOML it parses to the same file;
//! - building reads only the environment variables the file declares in `env = [...]`,
//!   and fails when a tool references an undeclared one;
//! - every tool of a built agent keeps the tool contract.
#![no_main]

use std::cell::RefCell;
use std::sync::Arc;

use futures::stream::BoxStream;
use keel_core::{Model, ModelCapabilities, ModelError, ModelRequest, StreamEvent};
use keel_detective::agent_file::{AgentFile, build_agent_with_env};
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
    let Ok(file) = AgentFile::parse(text, "agent.toml") else {
        return;
    };
    if let Ok(again) = toml::to_string(&file) {
        let reparsed = AgentFile::parse(&again, "agent.toml")
            .unwrap_or_else(|e| panic!("serialized agent file does not parse: {e}\n{again}"));
        let same = reparsed == file || toml::to_string(&reparsed).ok().as_deref() == Some(&again);
        assert!(same, "round trip changed the file:\n{again}");
    }

    let asked = RefCell::new(Vec::<String>::new());
    let env = |name: &str| {
        asked.borrow_mut().push(name.to_string());
        match name {
            "HOST" => Some("127.0.0.1:9".to_string()),
            "TOKEN" => Some("t0k".to_string()),
            _ => None,
        }
    };
    let undeclared = file.undeclared_env_vars();
    let built = build_agent_with_env(&file, Arc::new(Unused), &env);
    for name in asked.borrow().iter() {
        assert!(
            file.env.contains(name),
            "building read undeclared variable `{name}`"
        );
    }
    match built {
        Ok(agent) => {
            assert!(
                undeclared.is_empty(),
                "built despite undeclared variables {undeclared:?}"
            );
            for spec in agent.tools().specs() {
                let problems = spec.contract_violations();
                assert!(problems.is_empty(), "{problems:?}");
            }
        }
        Err(error) => assert!(!error.to_string().trim().is_empty()),
    }
});
