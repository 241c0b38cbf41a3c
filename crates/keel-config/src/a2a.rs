//! `[a2a]`: remote agents reached over the Agent2Agent protocol, offered as tools
//! (`[[a2a.agents]]`). Only values live here; keel-app builds the tools (keel-a2a), and
//! [`A2aConfig::problems`] is what `keel config check` reports about them.
//!
//! ```toml
//! [[a2a.agents]]
//! name = "researcher"                      # the tool's name
//! url = "https://agents.example/a2a/research"   # base URL or agent card URL
//! description = "Ask the research agent."  # optional
//! auth = { bearer_env = "RESEARCHER_TOKEN" }    # or headers = { "X-Api-Key" = "VAR" }
//! timeout_ms = 120000                      # optional
//! interface_origins = ["https://rpc.agents.example"]  # optional: the card may name these
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The default deadline of one call of a remote agent, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// `[a2a]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aConfig {
    /// `[[a2a.agents]]`: remote agents offered as tools.
    pub agents: Vec<A2aAgentConfig>,
}

/// One `[[a2a.agents]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aAgentConfig {
    /// The tool's name (`lowercase_snake_case`, unique).
    pub name: String,
    /// The agent's base URL (its card is at `/.well-known/agent-card.json` under it) or
    /// the URL of its card (`….json`); `http://` or `https://`.
    pub url: String,
    /// When the model should use it (default: a sentence naming the agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Credentials, by the environment variables holding them (never the secrets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<A2aAuthConfig>,
    /// Longest one call may take, in milliseconds (default 120000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Origins (`https://rpc.example`) besides the card's own that the agent's card may
    /// name for its JSON-RPC interface; its credentials are sent there. Default: none —
    /// an interface on another origin is refused before anything is sent to it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interface_origins: Vec<String>,
}

/// `auth = { bearer_env = "VAR" }` and/or `auth = { headers = { "X-Api-Key" = "VAR" } }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct A2aAuthConfig {
    /// Sends `Authorization: Bearer $VAR`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_env: Option<String>,
    /// Sends each header with the value of its variable.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl A2aAgentConfig {
    /// The deadline of one call, in milliseconds.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)
    }
}

fn valid_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

impl A2aConfig {
    /// Every invalid value as (key path under `a2a`, with the entry's index, and a message
    /// naming the fix): names (snake_case, unique), URLs (http/https), environment variable
    /// and header names, timeouts.
    pub fn problems(&self) -> Vec<(Vec<String>, String)> {
        let mut out = Vec::new();
        for (index, agent) in self.agents.iter().enumerate() {
            let at = |key: &str| {
                let mut path = vec!["a2a".to_string(), "agents".into(), index.to_string()];
                if !key.is_empty() {
                    path.extend(key.split('.').map(str::to_string));
                }
                path
            };
            let shown = format!("a2a.agents[{index}]");
            if !keel_core::tool::is_snake_case_name(&agent.name) {
                out.push((
                    at("name"),
                    if agent.name.is_empty() {
                        format!("`{shown}` needs `name` (the tool's name, e.g. \"researcher\")")
                    } else {
                        format!(
                            "`{shown}.name` = {:?} must be lowercase_snake_case (the tool's name), e.g. {:?}",
                            agent.name,
                            keel_core::tool::suggest_snake_case(&agent.name)
                        )
                    },
                ));
            } else if self.agents.iter().take(index).any(|a| a.name == agent.name) {
                out.push((
                    at("name"),
                    format!(
                        "`{shown}.name` = {:?} is used by an earlier entry; names must be unique",
                        agent.name
                    ),
                ));
            }
            let scheme_ok = ["http://", "https://"].iter().any(|scheme| {
                agent.url.strip_prefix(scheme).is_some_and(|rest| {
                    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
                    !host.is_empty() && !rest.contains(char::is_whitespace)
                })
            });
            if !scheme_ok {
                out.push((
                    at("url"),
                    format!(
                        "`{shown}.url` must be an http:// or https:// URL (the agent's base URL or its card's URL){}",
                        if agent.url.is_empty() { ", and is missing" } else { "" }
                    ),
                ));
            }
            if let Some(auth) = &agent.auth {
                if let Some(var) = &auth.bearer_env
                    && !valid_env_name(var)
                {
                    out.push((
                        at("auth.bearer_env"),
                        format!(
                            "`{shown}.auth.bearer_env` = {var:?} is not an environment variable name: name the variable holding the token (e.g. \"RESEARCHER_TOKEN\"), never the token itself"
                        ),
                    ));
                }
                for (header, var) in &auth.headers {
                    if !valid_header_name(header) {
                        out.push((
                            at(&format!("auth.headers.{header}")),
                            format!("`{shown}.auth.headers`: {header:?} is not a header name"),
                        ));
                    } else if !valid_env_name(var) {
                        out.push((
                            at(&format!("auth.headers.{header}")),
                            format!(
                                "`{shown}.auth.headers.{header}` = {var:?} is not an environment variable name: name the variable holding the value, never the value itself"
                            ),
                        ));
                    }
                }
            }
            for (position, origin) in agent.interface_origins.iter().enumerate() {
                let valid = url::Url::parse(origin).is_ok_and(|url| {
                    matches!(url.scheme(), "http" | "https")
                        && url.host().is_some()
                        && matches!(url.path(), "" | "/")
                        && url.query().is_none()
                });
                if !valid {
                    out.push((
                        at(&format!("interface_origins.{position}")),
                        format!(
                            "`{shown}.interface_origins[{position}]` = {origin:?} is not an origin; write it as \"https://host\" or \"https://host:port\" (no path)"
                        ),
                    ));
                }
            }
            if agent.timeout_ms == Some(0) {
                out.push((
                    at("timeout_ms"),
                    format!("`{shown}.timeout_ms` must be at least 1 (milliseconds)"),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_are_checked_by_name_url_auth_and_timeout() {
        let config: A2aConfig = toml::from_str(
            "[[agents]]\nname = \"researcher\"\nurl = \"https://a.example/x\"\n\
             auth = { bearer_env = \"TOKEN\", headers = { \"X-Api-Key\" = \"KEY\" } }\n\
             [[agents]]\nname = \"researcher\"\nurl = \"ftp://a\"\n\
             [[agents]]\nname = \"Bad-Name\"\nurl = \"http://h\"\nauth = { bearer_env = \"sk-123 abc\" }\ntimeout_ms = 0\n",
        )
        .unwrap();
        let keys: Vec<String> = config.problems().iter().map(|(k, _)| k.join(".")).collect();
        assert_eq!(
            keys,
            [
                "a2a.agents.1.name",
                "a2a.agents.1.url",
                "a2a.agents.2.name",
                "a2a.agents.2.auth.bearer_env",
                "a2a.agents.2.timeout_ms"
            ]
        );
        assert_eq!(config.agents[0].timeout_ms(), DEFAULT_TIMEOUT_MS);
    }
}
