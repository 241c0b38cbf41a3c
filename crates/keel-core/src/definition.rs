//! The agent definition a run records when it starts (in its `RunStarted` event), so that
//! the run can be continued by a process that knows nothing else — after a crash, an
//! approval decided elsewhere, or on another worker. Like a durable-execution engine's
//! history, the log alone says which agent the run belongs to.
//!
//! A definition has two parts:
//! - the **recipe**: how the application layer rebuilds the agent (model spec, provider
//!   options, tool selection, agent file path and hash, overrides). It is opaque here —
//!   written and read by the surface that built the agent — and never holds secrets:
//!   keys are resolved from the environment again when the agent is rebuilt.
//! - the **fingerprint**: what the agent built from it looked like (model, a hash of the
//!   system prompt, every tool's name, effect and schema hashes, planner and context
//!   settings). A rebuilt agent is compared with it before the run continues, so a tool
//!   that disappeared or changed its contract is a clear error before any model call
//!   instead of a silent `not_found` in the middle of the run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::observation::ObservationMode;
use crate::planner::PlannerMode;
use crate::tool::{Effect, ToolSpec};

/// Everything a run records about the agent that started it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    /// How the application layer rebuilds the agent (`null` for agents built in code).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub recipe: Value,
    /// What the built agent looked like.
    pub fingerprint: AgentFingerprint,
}

/// The observable shape of a built agent, compared on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentFingerprint {
    /// Model identifier (`provider:model`).
    pub model: String,
    /// SHA-256 of the full system prompt (instructions and tool guidance), followed by
    /// `"\n\n"` and the agent's reminder when it has one.
    pub system_prompt_sha256: String,
    /// The tools offered (control tools excluded), sorted by name.
    pub tools: Vec<ToolFingerprint>,
    /// Native tool calling or structured actions.
    #[serde(default)]
    pub planner: PlannerMode,
    /// What the model sees of tool results.
    #[serde(default)]
    pub observation: ObservationMode,
    /// Whether a critic reviews answers.
    #[serde(default)]
    pub critic: bool,
    /// Context strategy name (`None`: context management off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_strategy: Option<String>,
    /// Context window override, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// Output token limit per model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// SHA-256 of each configuration section that shapes the agent, by its name in
    /// keel.toml (`[agents.NAME]`, `[models]`, `[policies]`, `[approvals]`, `[mcp]`,
    /// `[tools]`…): a resume names every section that changed since the run started.
    /// Empty for agents built in Rust without keel-app, and in runs recorded before it was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

/// One tool of a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFingerprint {
    /// Tool name.
    pub name: String,
    /// Its declared effect.
    pub effect: Effect,
    /// SHA-256 of the input schema (the contract the model's arguments follow).
    pub input_sha256: String,
    /// SHA-256 of the whole spec (description, guidance, schemas, policies).
    pub spec_sha256: String,
}

impl ToolFingerprint {
    /// The fingerprint of a tool spec.
    pub fn of(spec: &ToolSpec) -> Self {
        let whole = serde_json::to_value(spec).unwrap_or(Value::Null);
        Self {
            name: spec.name.clone(),
            effect: spec.effect,
            input_sha256: sha256_json(&spec.input_schema),
            spec_sha256: sha256_json(&whole),
        }
    }
}

/// How a rebuilt agent compares with the one a run recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefinitionComparison {
    /// Differences that make continuing the run unsafe (a tool missing, or a tool whose
    /// input contract changed): the run must not continue with this agent.
    pub incompatible: Vec<String>,
    /// Differences worth telling (another model, changed instructions, a tool added).
    pub changed: Vec<String>,
}

impl DefinitionComparison {
    /// Whether the run may continue with the rebuilt agent.
    pub fn is_compatible(&self) -> bool {
        self.incompatible.is_empty()
    }
}

impl AgentFingerprint {
    /// Compares this (rebuilt) agent with the `recorded` one.
    pub fn compare_with(&self, recorded: &AgentFingerprint) -> DefinitionComparison {
        let mut result = DefinitionComparison::default();
        let current: BTreeMap<&str, &ToolFingerprint> =
            self.tools.iter().map(|t| (t.name.as_str(), t)).collect();
        let before: BTreeMap<&str, &ToolFingerprint> = recorded
            .tools
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        for (name, old) in &before {
            match current.get(name) {
                None => result.incompatible.push(format!(
                    "tool `{name}` of the run is not available any more (its MCP server, HTTP declaration or agent file entry is gone)"
                )),
                Some(new) if new.input_sha256 != old.input_sha256 => result.incompatible.push(
                    format!("tool `{name}` changed its input schema since the run started"),
                ),
                Some(new) => {
                    if new.effect != old.effect {
                        result.changed.push(format!(
                            "tool `{name}` is now {:?} (was {:?})",
                            new.effect, old.effect
                        ));
                    } else if new.spec_sha256 != old.spec_sha256 {
                        result
                            .changed
                            .push(format!("tool `{name}` changed its description or policies"));
                    }
                }
            }
        }
        for name in current.keys().filter(|name| !before.contains_key(*name)) {
            result.changed.push(format!(
                "tool `{name}` was not offered when the run started"
            ));
        }
        if self.model != recorded.model {
            result.changed.push(format!(
                "model {} (the run started on {})",
                self.model, recorded.model
            ));
        }
        if self.system_prompt_sha256 != recorded.system_prompt_sha256 {
            result
                .changed
                .push("the system prompt differs from the one the run started with".into());
        }
        if self.observation != recorded.observation {
            result.changed.push(format!(
                "observation mode {:?} (the run started with {:?})",
                self.observation, recorded.observation
            ));
        }
        if self.critic != recorded.critic {
            result.changed.push(if self.critic {
                "a critic now reviews answers (the run started without one)".into()
            } else {
                "no critic reviews answers any more (the run started with one)".into()
            });
        }
        if self.context_strategy != recorded.context_strategy
            || self.context_window != recorded.context_window
        {
            result.changed.push(format!(
                "context settings {} (the run started with {})",
                context_label(self),
                context_label(recorded)
            ));
        }
        if self.max_output_tokens != recorded.max_output_tokens {
            result.changed.push(format!(
                "output limit {} (the run started with {})",
                tokens_label(self.max_output_tokens),
                tokens_label(recorded.max_output_tokens)
            ));
        }
        let sections: std::collections::BTreeSet<&String> = self
            .settings
            .keys()
            .chain(recorded.settings.keys())
            .collect();
        for section in sections {
            match (self.settings.get(section), recorded.settings.get(section)) {
                (Some(now), Some(then)) if now == then => {}
                (Some(_), Some(_)) => result
                    .changed
                    .push(format!("keel.toml {section} changed since the run started")),
                (Some(_), None) if !recorded.settings.is_empty() => result.changed.push(format!(
                    "keel.toml {section} was added since the run started"
                )),
                (None, Some(_)) => result.changed.push(format!(
                    "keel.toml {section} was removed since the run started"
                )),
                _ => {}
            }
        }
        if self.planner != recorded.planner {
            result.incompatible.push(format!(
                "planner mode {:?} differs from the run's {:?}",
                self.planner, recorded.planner
            ));
        }
        result
    }
}

/// A fingerprint's context settings, for a notice.
fn context_label(fingerprint: &AgentFingerprint) -> String {
    let strategy = fingerprint.context_strategy.as_deref().unwrap_or("off");
    match fingerprint.context_window {
        Some(window) => format!("`{strategy}` with a {window}-token window"),
        None => format!("`{strategy}`"),
    }
}

/// An output token limit, for a notice.
fn tokens_label(limit: Option<u32>) -> String {
    limit.map_or_else(|| "none".into(), |tokens| format!("{tokens} tokens"))
}

/// SHA-256 (hex) of a string.
pub fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (hex) of a JSON value in canonical form (object keys sorted at every level),
/// so the hash does not depend on the order keys were inserted in.
pub fn sha256_json(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(value, &mut text);
    sha256_hex(&text)
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            out.push('{');
            for (index, (key, item)) in sorted.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::json;

    fn tool(name: &str, schema: Value) -> ToolFingerprint {
        let mut spec = ToolSpec::new(name, "does things", "use it well");
        spec.input_schema = schema;
        ToolFingerprint::of(&spec)
    }

    fn fingerprint(tools: Vec<ToolFingerprint>) -> AgentFingerprint {
        AgentFingerprint {
            model: "openai:gpt-4.1".into(),
            system_prompt_sha256: sha256_hex("prompt"),
            tools,
            planner: PlannerMode::Native,
            observation: ObservationMode::Raw,
            critic: false,
            context_strategy: Some("truncate".into()),
            context_window: None,
            max_output_tokens: None,
            settings: BTreeMap::new(),
        }
    }

    #[test]
    fn canonical_hash_ignores_key_order() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":2,"p":3}],"x":null}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"p":3,"q":2}]},"b":1}"#).unwrap();
        assert_eq!(sha256_json(&a), sha256_json(&b));
        assert_ne!(sha256_json(&a), sha256_json(&json!({"b": 2})));
    }

    #[test]
    fn missing_or_reshaped_tools_are_incompatible() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "string"}}});
        let recorded = fingerprint(vec![tool("alpha", schema.clone()), tool("beta", schema)]);
        let same = recorded.clone();
        assert_eq!(
            same.compare_with(&recorded),
            DefinitionComparison::default()
        );

        let missing = fingerprint(vec![tool("alpha", json!({"type": "object"}))]);
        let comparison = missing.compare_with(&recorded);
        assert_eq!(comparison.incompatible.len(), 2, "{comparison:?}");
        assert!(comparison.incompatible[0].contains("alpha"));
        assert!(comparison.incompatible[1].contains("`beta`"));

        let mut other_model = recorded.clone();
        other_model.model = "anthropic:claude".into();
        let comparison = other_model.compare_with(&recorded);
        assert!(comparison.is_compatible());
        assert_eq!(comparison.changed.len(), 1);
    }

    #[test]
    fn observation_critic_context_and_settings_changes_are_notices() {
        let mut recorded = fingerprint(Vec::new());
        recorded.settings = BTreeMap::from([
            ("[approvals]".to_string(), sha256_hex("ask")),
            ("[policies]".to_string(), sha256_hex("retry 3")),
        ]);
        let mut rebuilt = recorded.clone();
        assert_eq!(
            rebuilt.compare_with(&recorded),
            DefinitionComparison::default()
        );
        rebuilt.observation = ObservationMode::Normalized;
        rebuilt.critic = true;
        rebuilt.context_window = Some(4096);
        rebuilt.max_output_tokens = Some(256);
        rebuilt
            .settings
            .insert("[approvals]".into(), sha256_hex("auto"));
        rebuilt.settings.remove("[policies]");
        rebuilt
            .settings
            .insert("[agents.helper]".into(), sha256_hex("new"));
        let comparison = rebuilt.compare_with(&recorded);
        assert!(comparison.is_compatible(), "{comparison:?}");
        let said = comparison.changed.join("\n");
        for expected in [
            "observation mode",
            "a critic now reviews answers",
            "4096-token window",
            "output limit 256 tokens",
            "keel.toml [approvals] changed",
            "keel.toml [policies] was removed",
            "keel.toml [agents.helper] was added",
        ] {
            assert!(said.contains(expected), "{expected:?} missing from {said}");
        }
        assert_eq!(comparison.changed.len(), 7, "{said}");
        // A run recorded before settings were: nothing to compare them with.
        let mut older = recorded.clone();
        older.settings.clear();
        let mut now = older.clone();
        now.settings.insert("[approvals]".into(), sha256_hex("ask"));
        assert_eq!(now.compare_with(&older), DefinitionComparison::default());
    }

    #[test]
    fn definition_round_trips_and_omits_null_recipe() {
        let definition = AgentDefinition {
            recipe: Value::Null,
            fingerprint: fingerprint(Vec::new()),
        };
        let text = serde_json::to_string(&definition).unwrap();
        assert!(!text.contains("recipe"));
        let back: AgentDefinition = serde_json::from_str(&text).unwrap();
        assert_eq!(back, definition);
    }
}
