//! Observation normalization (seed 000 §5): every tool outcome can be reduced to
//! `{summary, key_facts, affordances}` so the model's context stays small and predictable.
//! Agents choose whether the model sees the raw result, the observation, or both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::outcome::{ToolErrorCode, ToolOutcome, ToolResultKind};

/// A normalized observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Observation {
    /// One sentence of what happened.
    pub summary: String,
    /// The most useful scalar facts.
    pub key_facts: BTreeMap<String, String>,
    /// What the model can do next (`next_page`, `retry_with_smaller_query`, ...).
    pub affordances: Vec<String>,
}

/// What the model sees of a tool result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ObservationMode {
    /// The raw data (or error object).
    #[default]
    Raw,
    /// Only the normalized observation.
    Normalized,
    /// Both: `{"observation": ..., "raw": ...}`.
    Both,
}

/// Turns outcomes into observations. Tools with better knowledge of their output provide
/// their own (see `DynTool::normalize`).
pub trait ObservationNormalizer: Send + Sync {
    /// Normalizes one outcome.
    fn normalize(&self, outcome: &ToolOutcome) -> Observation;
}

/// The default normalizer: up to 8 top-level scalar fields become key facts; pagination,
/// truncation and retryable errors become affordances.
#[derive(Debug, Default, Clone, Copy)]
pub struct DefaultNormalizer;

const MAX_FACTS: usize = 8;
const MAX_FACT_CHARS: usize = 200;

impl ObservationNormalizer for DefaultNormalizer {
    fn normalize(&self, outcome: &ToolOutcome) -> Observation {
        let mut observation = Observation::default();
        match &outcome.result {
            ToolResultKind::Ok {
                data, truncated, ..
            } => {
                let (facts, items) = scalar_facts(data);
                observation.key_facts = facts;
                observation.summary = match items {
                    Some(0) => format!("{} returned no results.", outcome.tool),
                    Some(n) => format!(
                        "{} returned {n} item{}.",
                        outcome.tool,
                        if n == 1 { "" } else { "s" }
                    ),
                    None => format!("{} succeeded.", outcome.tool),
                };
                if items == Some(0) {
                    observation.affordances.push("broaden_the_query".into());
                }
                if data.get("next_token").is_some_and(|t| !t.is_null()) {
                    observation.affordances.push("next_page".into());
                }
                if *truncated {
                    observation.affordances.push("next_page".into());
                    observation.affordances.push("narrow_the_query".into());
                }
                if !outcome.repairs.is_empty() {
                    observation
                        .key_facts
                        .insert("repairs".into(), outcome.repairs.join("; "));
                }
            }
            ToolResultKind::Error { code, message, .. } => {
                observation.summary =
                    format!("{} failed with {code}: {}", outcome.tool, truncate(message));
                observation
                    .key_facts
                    .insert("error_code".into(), code.to_string());
                observation
                    .affordances
                    .extend(error_affordances(*code).iter().map(|s| s.to_string()));
            }
        }
        observation
            .key_facts
            .insert("attempts".into(), outcome.attempts.to_string());
        observation.affordances.dedup();
        observation
    }
}

fn error_affordances(code: ToolErrorCode) -> &'static [&'static str] {
    match code {
        ToolErrorCode::InvalidInput => &["fix_arguments", "ask_user"],
        ToolErrorCode::Timeout | ToolErrorCode::RetryableServer | ToolErrorCode::RateLimited => {
            &["retry_later", "use_another_tool"]
        }
        ToolErrorCode::NotFound => &["check_the_name_or_id", "replan"],
        ToolErrorCode::NoResults => &["broaden_the_query"],
        ToolErrorCode::Unauthorized | ToolErrorCode::Forbidden => &["ask_user_to_fix_credentials"],
        ToolErrorCode::OutputSchemaMismatch | ToolErrorCode::ToolBug => &["use_another_tool"],
        ToolErrorCode::Cancelled | ToolErrorCode::Denied => &["ask_user"],
    }
}

fn truncate(text: &str) -> String {
    if text.chars().count() <= MAX_FACT_CHARS {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX_FACT_CHARS).collect();
    format!("{cut}…")
}

/// Scalar top-level facts, and the item count when the data is (or holds) one list.
fn scalar_facts(data: &Value) -> (BTreeMap<String, String>, Option<usize>) {
    let mut facts = BTreeMap::new();
    let mut items = None;
    match data {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    Value::Array(list) if items.is_none() => items = Some(list.len()),
                    Value::String(s) if facts.len() < MAX_FACTS => {
                        facts.insert(key.clone(), truncate(s));
                    }
                    Value::Number(_) | Value::Bool(_) if facts.len() < MAX_FACTS => {
                        facts.insert(key.clone(), value.to_string());
                    }
                    _ => {}
                }
            }
        }
        Value::Array(list) => items = Some(list.len()),
        Value::String(s) => {
            facts.insert("text".into(), truncate(s));
        }
        Value::Number(_) | Value::Bool(_) => {
            facts.insert("value".into(), data.to_string());
        }
        Value::Null => items = Some(0),
    }
    (facts, items)
}

/// The text the model sees for an outcome under a mode.
pub fn render_for_model(
    outcome: &ToolOutcome,
    observation: Option<&Observation>,
    mode: ObservationMode,
) -> String {
    match (mode, observation) {
        (ObservationMode::Raw, _) | (_, None) => outcome.render_for_model(),
        (ObservationMode::Normalized, Some(observation)) => {
            serde_json::to_string(observation).unwrap_or_else(|_| outcome.render_for_model())
        }
        (ObservationMode::Both, Some(observation)) => {
            let raw: Value = serde_json::from_str(&outcome.render_for_model())
                .unwrap_or_else(|_| Value::String(outcome.render_for_model()));
            serde_json::json!({ "observation": observation, "raw": raw }).to_string()
        }
    }
}
