//! `[[mcp.servers]]` entries as they appear in keel.toml.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::Duration;

use keel_mcp::{McpServerConfig, McpTransport};
use serde::Deserialize;

#[derive(Deserialize)]
struct KeelToml {
    mcp: Mcp,
}

#[derive(Deserialize)]
struct Mcp {
    servers: Vec<McpServerConfig>,
}

#[test]
fn parses_keel_toml_servers() {
    let text = r#"
        [[mcp.servers]]
        name = "everything"
        command = "npx"
        args = ["-y", "@modelcontextprotocol/server-everything"]
        env = { LOG_LEVEL = "debug" }
        env_passthrough = ["NPM_CONFIG_REGISTRY"]
        startup_timeout_ms = 10000

        [[mcp.servers]]
        name = "remote"
        url = "https://mcp.example.invalid/mcp"
        headers = { Authorization = "Bearer ${REMOTE_TOKEN}" }
        call_timeout_ms = 15000
    "#;
    let parsed: KeelToml = toml::from_str(text).unwrap();
    let [everything, remote] = parsed.mcp.servers.try_into().unwrap();
    assert_eq!(everything.startup_timeout, Duration::from_secs(10));
    match everything.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            env_passthrough,
            cwd,
        } => {
            assert_eq!(command, "npx");
            assert_eq!(args.len(), 2);
            assert_eq!(env["LOG_LEVEL"], "debug");
            assert_eq!(env_passthrough, ["NPM_CONFIG_REGISTRY"]);
            assert!(cwd.is_none());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(remote.call_timeout, Duration::from_secs(15));
    assert!(
        matches!(remote.transport, McpTransport::Http { ref headers, .. } if headers.contains_key("Authorization"))
    );
}

#[test]
fn unknown_keys_are_rejected_with_the_key_named() {
    let text = r#"
        [[mcp.servers]]
        name = "x"
        command = "y"
        timeout = 5
    "#;
    let error = toml::from_str::<KeelToml>(text).err().unwrap().to_string();
    assert!(error.contains("timeout"), "{error}");
}
