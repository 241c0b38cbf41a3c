//! `[outbound]`: which non-public destinations outbound calls — HTTP tools, MCP servers
//! over HTTP, A2A agents — may reach (keel-outbound's policy).
//!
//! Outbound calls reach public addresses, and the hosts keel.toml names as destinations
//! (a `[[tools.http]]` / agent-file tool's `url`, an `[[mcp.servers]]` `url`, an
//! `[[a2a.agents]]` `url` or `interface_origins`). Everything else that is loopback,
//! private, link-local, cloud metadata or otherwise not public — a redirect target, an
//! A2A card's interface on another host, a name that resolves to such an address, a URL
//! host filled from a model's arguments — is refused (`outbound_refused`) unless listed
//! here:
//!
//! ```toml
//! [outbound]
//! allow_private = ["db.internal", "search.internal:8080", "10.20.0.0/16"]
//! ```

use keel_outbound::{InvalidAllow, OutboundPolicy};
use serde::{Deserialize, Serialize};

/// `[outbound]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    /// Non-public destinations allowed besides the configured ones: host names (any
    /// port: `db.internal`), `host:port`, IP addresses (`10.1.2.3`, `[fd00::1]:8080`) and
    /// networks (`10.0.0.0/8`, `fd00::/8`). A name listed here may resolve to any address;
    /// a network allows the addresses in it, whatever name resolved to them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_private: Vec<String>,
}

impl OutboundConfig {
    /// The policy of `allow_private` (the configured destinations are added by whoever
    /// builds each client).
    pub fn policy(&self) -> Result<OutboundPolicy, InvalidAllow> {
        OutboundPolicy::new(&self.allow_private)
    }

    /// Every entry of `allow_private` that does not parse, as (key path, message naming
    /// the entry and how to write it).
    pub fn problems(&self) -> Vec<(Vec<String>, String)> {
        self.allow_private
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                keel_outbound::Allow::parse(entry).err().map(|message| {
                    (
                        vec![
                            "outbound".to_string(),
                            "allow_private".into(),
                            index.to_string(),
                        ],
                        format!("`outbound.allow_private[{index}]` {message}"),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_are_checked_naming_the_index() {
        let config: OutboundConfig = toml::from_str(
            "allow_private = [\"db.internal\", \"http://x.internal\", \"10.0.0.0/8\", \"*.corp\"]",
        )
        .unwrap();
        let problems = config.problems();
        let keys: Vec<String> = problems.iter().map(|(k, _)| k.join(".")).collect();
        assert_eq!(
            keys,
            ["outbound.allow_private.1", "outbound.allow_private.3"]
        );
        assert!(
            problems[0].1.contains("write only its host"),
            "{}",
            problems[0].1
        );
        assert!(
            OutboundConfig::default()
                .policy()
                .unwrap()
                .allowed()
                .is_empty()
        );
    }
}
