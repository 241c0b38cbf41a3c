//! Agent cards: what an agent publishes at `/.well-known/agent-card.json`, and how a
//! client picks the interface (URL and protocol version) to talk to.
//!
//! [`AgentCard`] reads both versions' cards: 1.0's `supportedInterfaces` (URL, binding,
//! version per entry) and 0.3's `url` + `preferredTransport` + `protocolVersion` +
//! `additionalInterfaces`. Cards served by Keel carry both, like the Python SDK's.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::version::ProtocolVersion;

/// The JSON-RPC binding's name in cards.
pub const JSONRPC_BINDING: &str = "JSONRPC";

/// The path of the well-known agent card.
pub const WELL_KNOWN_PATH: &str = "/.well-known/agent-card.json";

/// One way to reach an agent (1.0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// Where.
    pub url: String,
    /// `JSONRPC`, `GRPC`, `HTTP+JSON` or a custom binding's URI.
    #[serde(default)]
    pub protocol_binding: String,
    /// `1.0`, `0.3`.
    #[serde(default)]
    pub protocol_version: String,
    /// The tenant to send in requests, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// One way to reach an agent (0.3 `additionalInterfaces`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LegacyInterface {
    /// Where.
    pub url: String,
    /// `JSONRPC`, `GRPC`, `HTTP+JSON`.
    #[serde(default)]
    pub transport: String,
}

/// What the agent supports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `SendStreamingMessage` / `message/stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,
    /// Push notifications (webhooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_notifications: Option<bool>,
    /// An extended card for authenticated clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_agent_card: Option<bool>,
}

/// Who runs the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentProvider {
    /// The organization.
    #[serde(default)]
    pub organization: String,
    /// Its website.
    #[serde(default)]
    pub url: String,
}

/// Something the agent can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// Unique id.
    pub id: String,
    /// Human-readable name.
    #[serde(default)]
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// Keywords.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    /// Accepted media types, when not the card's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    /// Produced media types, when not the card's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
}

/// An agent's self-description (either version; unknown fields are ignored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// The agent's name.
    #[serde(default)]
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// The agent's version.
    #[serde(default)]
    pub version: String,
    /// 1.0: every interface, in preference order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_interfaces: Vec<AgentInterface>,
    /// 0.3: the preferred endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// 0.3: the preferred endpoint's transport (default `JSONRPC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_transport: Option<String>,
    /// 0.3: the protocol version (`0.3.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// 0.3: other endpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_interfaces: Vec<LegacyInterface>,
    /// Who runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<AgentProvider>,
    /// Documentation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation_url: Option<String>,
    /// What it supports.
    #[serde(default)]
    pub capabilities: AgentCapabilities,
    /// Accepted media types.
    #[serde(default)]
    pub default_input_modes: Vec<String>,
    /// Produced media types.
    #[serde(default)]
    pub default_output_modes: Vec<String>,
    /// What it can do.
    #[serde(default)]
    pub skills: Vec<AgentSkill>,
    /// Authentication schemes, as published (not interpreted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_schemes: Option<Value>,
    /// 1.0: which schemes a request must satisfy (`[{"schemes": {"bearer": {"list": []}}}]`:
    /// any one entry), as published (not interpreted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_requirements: Option<Value>,
    /// 0.3: the same requirements in 0.3's shape (`[{"bearer": []}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Value>,
}

/// The endpoint a client talks to: URL and protocol version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The JSON-RPC URL.
    pub url: String,
    /// The protocol version spoken there.
    pub version: ProtocolVersion,
    /// The tenant to send, when the interface names one.
    pub tenant: Option<String>,
}

impl AgentCard {
    /// The JSON-RPC endpoint to use: the newest supported version among
    /// `supportedInterfaces` (earlier entries first among equals), else 0.3's `url` /
    /// `additionalInterfaces`. Relative URLs are resolved against `card_url`. `None` when
    /// the card offers no JSON-RPC interface of a version this crate speaks.
    pub fn select_endpoint(&self, card_url: &str) -> Option<Endpoint> {
        let resolve = |url: &str| -> String {
            match url::Url::parse(card_url).and_then(|base| base.join(url)) {
                Ok(joined) => joined.to_string(),
                Err(_) => url.to_string(),
            }
        };
        let mut best: Option<Endpoint> = None;
        for interface in &self.supported_interfaces {
            if !interface
                .protocol_binding
                .eq_ignore_ascii_case(JSONRPC_BINDING)
            {
                continue;
            }
            let version = if interface.protocol_version.is_empty() {
                Some(ProtocolVersion::V1_0)
            } else {
                ProtocolVersion::parse(&interface.protocol_version)
            };
            let Some(version) = version else { continue };
            if best.as_ref().is_none_or(|b| version > b.version) {
                best = Some(Endpoint {
                    url: resolve(&interface.url),
                    version,
                    tenant: interface.tenant.clone().filter(|t| !t.is_empty()),
                });
            }
        }
        if best.is_some() {
            return best;
        }
        let legacy_version = self
            .protocol_version
            .as_deref()
            .map_or(Some(ProtocolVersion::V0_3), ProtocolVersion::parse)?;
        if let Some(url) = &self.url
            && self
                .preferred_transport
                .as_deref()
                .is_none_or(|t| t.eq_ignore_ascii_case(JSONRPC_BINDING))
        {
            return Some(Endpoint {
                url: resolve(url),
                version: legacy_version,
                tenant: None,
            });
        }
        self.additional_interfaces
            .iter()
            .find(|i| i.transport.eq_ignore_ascii_case(JSONRPC_BINDING))
            .map(|i| Endpoint {
                url: resolve(&i.url),
                version: legacy_version,
                tenant: None,
            })
    }

    /// Whether the agent streams.
    pub fn streams(&self) -> bool {
        self.capabilities.streaming == Some(true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn picks_the_newest_jsonrpc_interface_then_the_legacy_url() {
        let card: AgentCard = serde_json::from_value(serde_json::json!({
            "name": "a", "url": "http://h/legacy", "protocolVersion": "0.3.0",
            "supportedInterfaces": [
                {"url": "h:50051", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://h/rpc03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ]
        }))
        .unwrap();
        let endpoint = card
            .select_endpoint("http://h:9/.well-known/agent-card.json")
            .unwrap();
        assert_eq!(endpoint.url, "http://h:9/rpc");
        assert_eq!(endpoint.version, ProtocolVersion::V1_0);

        let legacy: AgentCard = serde_json::from_value(serde_json::json!({
            "name": "b", "url": "http://h/legacy", "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC"
        }))
        .unwrap();
        let endpoint = legacy.select_endpoint("http://h/card").unwrap();
        assert_eq!(
            (endpoint.url.as_str(), endpoint.version),
            ("http://h/legacy", ProtocolVersion::V0_3)
        );
        let unknown: AgentCard = serde_json::from_value(serde_json::json!({
            "name": "c", "url": "http://h/x", "protocolVersion": "0.2.5"
        }))
        .unwrap();
        assert!(unknown.select_endpoint("http://h/card").is_none());
    }
}
