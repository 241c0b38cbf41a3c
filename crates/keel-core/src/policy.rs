//! The policy engine: what happens after a tool call fails, as data.
//!
//! Seed 000's decision table (§6, §18) is the default: for each [`ToolErrorCode`] a
//! [`PolicyRule`] — an ordered list of [`PolicyStep`]s. `Retry` is carried out inside the
//! executor (within the tool's retry policy) before the outcome exists; the engine then
//! takes the first remaining step that applies (a `Fallback` applies only when a fallback
//! tool is configured). Agents override rules globally or per tool, and declare fallbacks
//! (`tool_a` → `tool_b`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::decide::EndState;
use crate::outcome::{ToolErrorCode, ToolOutcome, ToolResultKind};

/// One step of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "step")]
pub enum PolicyStep {
    /// Retry with backoff and jitter (done by the executor).
    Retry,
    /// Call the configured fallback tool with the same arguments.
    Fallback,
    /// Ask the user for the missing fields (only for `invalid_input` about required fields
    /// the model could not fill; see [`PolicyTable::decide`]).
    AskUser,
    /// Feed the error back to the model and let it decide (repair its call, replan).
    ReturnToModel,
    /// End the run.
    Stop {
        /// The end state.
        end_state: EndState,
        /// Tell the user what to do (e.g. fix credentials).
        #[serde(default)]
        action_item: bool,
        /// Raise an alert (a tool bug).
        #[serde(default)]
        alert: bool,
    },
}

/// What to do about one failed call, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    /// The steps.
    pub steps: Vec<PolicyStep>,
}

impl PolicyRule {
    fn of(steps: Vec<PolicyStep>) -> Self {
        Self { steps }
    }
}

/// The engine's decision for one outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum PolicyDecision {
    /// Call this fallback tool with the same arguments.
    Fallback {
        /// The fallback tool.
        tool: String,
    },
    /// Ask the user.
    AskUser {
        /// The question.
        question: String,
        /// The fields the model could not fill.
        missing_fields: Vec<String>,
    },
    /// Let the model see the error and continue.
    ReturnToModel,
    /// End the run.
    Stop {
        /// End state.
        end_state: EndState,
        /// Why, and what to do about it.
        reason: String,
        /// An instruction for the user, when the fix is theirs (credentials, permissions).
        action_item: Option<String>,
        /// Whether this is an alert-worthy bug.
        alert: bool,
    },
}

/// The decision table plus per-tool overrides and fallbacks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyTable {
    /// Rules by error code.
    pub rules: BTreeMap<ToolErrorCode, PolicyRule>,
    /// Per-tool overrides: tool → code → rule.
    pub tools: BTreeMap<String, BTreeMap<ToolErrorCode, PolicyRule>>,
    /// Fallback tools: `tool_a` → `tool_b`.
    pub fallbacks: BTreeMap<String, String>,
    /// Required fields that only the user can provide, per tool. An `invalid_input` about
    /// one of them asks the user at once.
    pub user_fields: BTreeMap<String, Vec<String>>,
    /// How many times the model may miss the same required field of the same tool before
    /// the user is asked for it.
    pub missing_field_attempts: u32,
}

impl Default for PolicyTable {
    fn default() -> Self {
        Self::seed_defaults()
    }
}

/// Seed 000's table (§18), expressed as rules.
fn seed_rule(code: ToolErrorCode) -> PolicyRule {
    use PolicyStep::{AskUser, Fallback, Retry, ReturnToModel};
    let stop = |end_state, action_item, alert| PolicyStep::Stop {
        end_state,
        action_item,
        alert,
    };
    match code {
        // "Ask user / repair": the model repairs its call; the user is asked for fields
        // the model cannot know.
        ToolErrorCode::InvalidInput => PolicyRule::of(vec![AskUser, ReturnToModel]),
        // "Retry then fallback".
        ToolErrorCode::Timeout => PolicyRule::of(vec![Retry, Fallback, ReturnToModel]),
        // "Retry with backoff".
        ToolErrorCode::RetryableServer => PolicyRule::of(vec![Retry, Fallback, ReturnToModel]),
        // "Retry with backoff + jitter".
        ToolErrorCode::RateLimited => PolicyRule::of(vec![Retry, ReturnToModel]),
        // "Stop with action item".
        ToolErrorCode::Unauthorized | ToolErrorCode::Forbidden => {
            PolicyRule::of(vec![stop(EndState::Failed, true, false)])
        }
        // "Ask/replan": the model replans with what it learned.
        ToolErrorCode::NotFound => PolicyRule::of(vec![ReturnToModel]),
        // "Attempt bounded repair else stop" (repair happened in the executor).
        ToolErrorCode::OutputSchemaMismatch => PolicyRule::of(vec![stop(
            EndState::UnrecoverableToolContract,
            false,
            false,
        )]),
        // "Stop & alert".
        ToolErrorCode::ToolBug => PolicyRule::of(vec![stop(EndState::Failed, false, true)]),
        ToolErrorCode::NoResults | ToolErrorCode::Cancelled | ToolErrorCode::Denied => {
            PolicyRule::of(vec![ReturnToModel])
        }
    }
}

/// Context the engine needs beyond the outcome.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyContext<'a> {
    /// Raw arguments of the failed call.
    pub arguments: &'a str,
    /// How many earlier calls of this run to the same tool failed with `invalid_input`
    /// about the same missing field(s).
    pub same_missing_field_failures: u32,
    /// Whether this call already is a fallback (fallbacks do not chain).
    pub is_fallback: bool,
}

impl PolicyTable {
    /// The seed's defaults, with no fallbacks.
    pub fn seed_defaults() -> Self {
        Self {
            rules: ToolErrorCode::ALL
                .into_iter()
                .map(|code| (code, seed_rule(code)))
                .collect(),
            tools: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
            user_fields: BTreeMap::new(),
            missing_field_attempts: 2,
        }
    }

    /// Adds a fallback.
    pub fn with_fallback(mut self, tool: impl Into<String>, fallback: impl Into<String>) -> Self {
        self.fallbacks.insert(tool.into(), fallback.into());
        self
    }

    /// The rule for a tool and code (per-tool override, then global, then seed).
    pub fn rule(&self, tool: &str, code: ToolErrorCode) -> PolicyRule {
        self.tools
            .get(tool)
            .and_then(|rules| rules.get(&code))
            .or_else(|| self.rules.get(&code))
            .cloned()
            .unwrap_or_else(|| seed_rule(code))
    }

    /// Decides what follows a failed outcome. `None` for a success.
    pub fn decide(&self, outcome: &ToolOutcome, ctx: PolicyContext<'_>) -> Option<PolicyDecision> {
        let ToolResultKind::Error {
            code,
            message,
            details,
        } = &outcome.result
        else {
            return None;
        };
        let rule = self.rule(&outcome.tool, *code);
        for step in &rule.steps {
            match step {
                PolicyStep::Retry => {}
                PolicyStep::Fallback => {
                    if ctx.is_fallback {
                        continue;
                    }
                    if let Some(tool) = self.fallbacks.get(&outcome.tool) {
                        return Some(PolicyDecision::Fallback { tool: tool.clone() });
                    }
                }
                PolicyStep::AskUser => {
                    let missing = missing_required_fields(details.as_ref());
                    if missing.is_empty() {
                        continue;
                    }
                    let user_only = self
                        .user_fields
                        .get(&outcome.tool)
                        .is_some_and(|fields| missing.iter().any(|m| fields.contains(m)));
                    if user_only || ctx.same_missing_field_failures >= self.missing_field_attempts {
                        return Some(PolicyDecision::AskUser {
                            question: format!(
                                "To use `{}` I need: {}. Could you provide {}?",
                                outcome.tool,
                                missing.join(", "),
                                if missing.len() == 1 { "it" } else { "them" }
                            ),
                            missing_fields: missing,
                        });
                    }
                }
                PolicyStep::ReturnToModel => return Some(PolicyDecision::ReturnToModel),
                PolicyStep::Stop {
                    end_state,
                    action_item,
                    alert,
                } => {
                    let action_item = action_item.then(|| action_item_for(*code, &outcome.tool));
                    return Some(PolicyDecision::Stop {
                        end_state: *end_state,
                        reason: format!("`{}` failed with {code}: {message}", outcome.tool),
                        action_item,
                        alert: *alert,
                    });
                }
            }
        }
        Some(PolicyDecision::ReturnToModel)
    }
}

fn action_item_for(code: ToolErrorCode, tool: &str) -> String {
    match code {
        ToolErrorCode::Unauthorized => format!(
            "Check the credentials configured for `{tool}`: they are missing, expired or invalid."
        ),
        ToolErrorCode::Forbidden => format!(
            "Grant the credentials used by `{tool}` permission for this operation, or use an account that has it."
        ),
        _ => format!("Investigate why `{tool}` failed with {code}."),
    }
}

/// Required fields reported missing in an `invalid_input` error's details (the executor
/// reports schema errors as `{"errors": [{"path", "message"}]}`; jsonschema words a
/// missing property as `"x" is a required property`).
pub fn missing_required_fields(details: Option<&serde_json::Value>) -> Vec<String> {
    let Some(errors) = details
        .and_then(|d| d.get("errors"))
        .and_then(|e| e.as_array())
    else {
        return Vec::new();
    };
    let mut fields = Vec::new();
    for error in errors {
        let Some(message) = error.get("message").and_then(|m| m.as_str()) else {
            continue;
        };
        if let Some(rest) = message.strip_suffix(" is a required property") {
            let field = rest.trim_matches('"').to_string();
            if !fields.contains(&field) {
                fields.push(field);
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(tool: &str, code: ToolErrorCode, details: Option<serde_json::Value>) -> ToolOutcome {
        ToolOutcome {
            tool: tool.into(),
            call_id: "c".into(),
            thread_id: "t".into(),
            run_id: "r".into(),
            attempts: 1,
            latency_ms: 0,
            repairs: Vec::new(),
            result: ToolResultKind::Error {
                code,
                message: "boom".into(),
                details,
            },
        }
    }

    /// Seed 000 §18, row by row: error → policy.
    #[test]
    fn default_table_matches_the_seed() {
        let table = PolicyTable::default();
        let ctx = PolicyContext::default();
        let decide = |code| table.decide(&failed("t", code, None), ctx).unwrap();
        let is_stop = |d: &PolicyDecision, want: EndState, item: bool, alert_wanted: bool| {
            matches!(d, PolicyDecision::Stop { end_state, action_item, alert, .. }
                if *end_state == want && action_item.is_some() == item && *alert == alert_wanted)
        };
        use PolicyStep::*;
        // InvalidInput: ask user / repair.
        assert_eq!(
            table.rule("t", ToolErrorCode::InvalidInput).steps,
            vec![AskUser, ReturnToModel]
        );
        assert_eq!(
            decide(ToolErrorCode::InvalidInput),
            PolicyDecision::ReturnToModel
        );
        // Timeout: retry then fallback.
        assert_eq!(
            table.rule("t", ToolErrorCode::Timeout).steps,
            vec![Retry, Fallback, ReturnToModel]
        );
        // RetryableServer: retry with backoff.
        assert_eq!(
            table.rule("t", ToolErrorCode::RetryableServer).steps[0],
            Retry
        );
        // RateLimited: retry with backoff + jitter.
        assert_eq!(table.rule("t", ToolErrorCode::RateLimited).steps[0], Retry);
        for code in [
            ToolErrorCode::Timeout,
            ToolErrorCode::RetryableServer,
            ToolErrorCode::RateLimited,
        ] {
            assert_eq!(
                decide(code),
                PolicyDecision::ReturnToModel,
                "{code} after retries, no fallback"
            );
        }
        // Unauthorized / Forbidden: stop with action item.
        assert!(is_stop(
            &decide(ToolErrorCode::Unauthorized),
            EndState::Failed,
            true,
            false
        ));
        assert!(is_stop(
            &decide(ToolErrorCode::Forbidden),
            EndState::Failed,
            true,
            false
        ));
        // NotFound: ask / replan (the model replans).
        assert_eq!(
            decide(ToolErrorCode::NotFound),
            PolicyDecision::ReturnToModel
        );
        // OutputSchemaMismatch: bounded repair (executor) else stop.
        assert!(is_stop(
            &decide(ToolErrorCode::OutputSchemaMismatch),
            EndState::UnrecoverableToolContract,
            false,
            false
        ));
        // ToolBug: stop & alert.
        assert!(is_stop(
            &decide(ToolErrorCode::ToolBug),
            EndState::Failed,
            false,
            true
        ));
        // Not in the seed's table: the model decides.
        for code in [
            ToolErrorCode::NoResults,
            ToolErrorCode::Cancelled,
            ToolErrorCode::Denied,
        ] {
            assert_eq!(decide(code), PolicyDecision::ReturnToModel);
        }
        // Every code has a rule.
        assert_eq!(table.rules.len(), ToolErrorCode::ALL.len());
    }

    #[test]
    fn fallbacks_apply_once_and_per_tool_overrides_win() {
        let mut table = PolicyTable::default().with_fallback("search", "search_cache");
        let timeout = failed("search", ToolErrorCode::Timeout, None);
        assert_eq!(
            table.decide(&timeout, PolicyContext::default()),
            Some(PolicyDecision::Fallback {
                tool: "search_cache".into()
            })
        );
        let ctx = PolicyContext {
            is_fallback: true,
            ..PolicyContext::default()
        };
        assert_eq!(
            table.decide(&timeout, ctx),
            Some(PolicyDecision::ReturnToModel)
        );
        table.tools.insert(
            "search".into(),
            [(
                ToolErrorCode::Timeout,
                PolicyRule::of(vec![PolicyStep::ReturnToModel]),
            )]
            .into(),
        );
        assert_eq!(
            table.decide(&timeout, PolicyContext::default()),
            Some(PolicyDecision::ReturnToModel)
        );
    }

    #[test]
    fn missing_required_fields_ask_the_user_when_the_model_cannot_fill_them() {
        let details = serde_json::json!({"errors": [{"path": "/", "message": "\"account_id\" is a required property"}]});
        let outcome = failed("billing", ToolErrorCode::InvalidInput, Some(details));
        let mut table = PolicyTable::default();
        assert_eq!(
            table.decide(&outcome, PolicyContext::default()),
            Some(PolicyDecision::ReturnToModel)
        );
        let repeated = PolicyContext {
            same_missing_field_failures: 2,
            ..PolicyContext::default()
        };
        assert!(
            matches!(table.decide(&outcome, repeated), Some(PolicyDecision::AskUser { missing_fields, .. }) if missing_fields == ["account_id"])
        );
        table
            .user_fields
            .insert("billing".into(), vec!["account_id".into()]);
        assert!(matches!(
            table.decide(&outcome, PolicyContext::default()),
            Some(PolicyDecision::AskUser { .. })
        ));
    }
}
