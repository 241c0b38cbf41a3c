//! Planner modes and control actions.
//!
//! - `native`: the model's own tool calling, plus two built-in control tools,
//!   [`ASK_USER`] `{question, missing_fields}` and [`REPLAN`] `{subgoals}`.
//! - `structured`: for models without tool calling, the model answers every turn with
//!   exactly one JSON action (seed 000 §15), validated against [`action_schema`]; invalid
//!   output is re-asked a bounded number of times.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tool::ToolDefinition;

/// Name of the control tool that asks the user a question.
pub const ASK_USER: &str = "ask_user";
/// Name of the control tool that replaces the plan.
pub const REPLAN: &str = "replan";

/// How the agent chooses its next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlannerMode {
    /// Native tool calling.
    #[default]
    Native,
    /// One JSON action per turn, parsed from the answer text.
    Structured,
}

/// Arguments of `ask_user`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskUserArgs {
    /// The question for the user.
    pub question: String,
    /// Fields only the user can provide.
    #[serde(default)]
    pub missing_fields: Vec<String>,
}

/// Arguments of `replan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplanArgs {
    /// The new ordered subgoals.
    pub subgoals: Vec<String>,
}

/// Definitions of the control tools offered in native mode.
pub fn control_tool_definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: ASK_USER.into(),
            description: "Ask the user a question when you need information only they have.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string", "minLength": 1, "description": "The question for the user."},
                    "missing_fields": {"type": "array", "items": {"type": "string"}, "description": "Names of the fields you cannot know."}
                },
                "required": ["question"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: REPLAN.into(),
            description: "Replace your plan with a new ordered list of subgoals.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "subgoals": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
                },
                "required": ["subgoals"],
                "additionalProperties": false
            }),
        },
    ]
}

/// Usage guidance of the control tools, appended to the "Tools" prompt section.
pub const CONTROL_TOOLS_GUIDANCE: &str = "\
## ask_user (built in)
Ask the user a question. Use it only for information the user alone has (an account id, a
preference, a missing requirement); never for something a tool can look up. The run stops
until the user answers.

## replan (built in)
Record a new plan as ordered subgoals when the original approach failed or the goal changed.";

/// One structured action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlannerAction {
    /// Call a tool.
    CallTool {
        /// Tool name.
        name: String,
        /// Arguments.
        #[serde(default)]
        args: Value,
    },
    /// Ask the user.
    AskUser {
        /// Question.
        question: String,
        /// Missing fields.
        #[serde(default)]
        missing_fields: Vec<String>,
    },
    /// New subgoals.
    Replan {
        /// Subgoals.
        subgoals: Vec<String>,
    },
    /// Finish with an answer.
    Stop {
        /// The final answer or the reason for stopping.
        reason: String,
    },
}

/// The JSON Schema of one structured action, with `name` restricted to the given tools.
/// Providers with structured output or grammars receive it as the response format.
pub fn action_schema(tool_names: &[&str]) -> Value {
    let name_schema = if tool_names.is_empty() {
        json!({"type": "string"})
    } else {
        json!({"type": "string", "enum": tool_names})
    };
    json!({
        "oneOf": [
            {
                "type": "object",
                "properties": {"action": {"const": "call_tool"}, "name": name_schema, "args": {"type": "object"}},
                "required": ["action", "name", "args"],
                "additionalProperties": false
            },
            {
                "type": "object",
                "properties": {
                    "action": {"const": "ask_user"},
                    "question": {"type": "string", "minLength": 1},
                    "missing_fields": {"type": "array", "items": {"type": "string"}}
                },
                "required": ["action", "question"],
                "additionalProperties": false
            },
            {
                "type": "object",
                "properties": {
                    "action": {"const": "replan"},
                    "subgoals": {"type": "array", "items": {"type": "string"}, "minItems": 1}
                },
                "required": ["action", "subgoals"],
                "additionalProperties": false
            },
            {
                "type": "object",
                "properties": {"action": {"const": "stop"}, "reason": {"type": "string", "minLength": 1}},
                "required": ["action", "reason"],
                "additionalProperties": false
            }
        ]
    })
}

/// The planner prompt of structured mode (seed 000 §15).
pub fn structured_prompt(tool_names: &[&str]) -> String {
    format!(
        "You are the planner. Reply with exactly ONE JSON object and nothing else, one of:\n\
         - {{\"action\": \"call_tool\", \"name\": <one of: {}>, \"args\": {{...}}}}\n\
         - {{\"action\": \"ask_user\", \"question\": \"...\", \"missing_fields\": [\"...\"]}}\n\
         - {{\"action\": \"replan\", \"subgoals\": [\"...\"]}}\n\
         - {{\"action\": \"stop\", \"reason\": \"<your final answer>\"}}\n\
         Tool results come back as messages starting with `Observation:`.\n\
         If a tool fails: retry at most twice for retryable errors; else try another tool; \
         else ask_user for missing information; else stop with a short summary.",
        if tool_names.is_empty() {
            "(no tools)".to_string()
        } else {
            tool_names.join(", ")
        }
    )
}

/// Parses and validates one structured action from a model's text. The text may wrap the
/// JSON in a code fence or surround it with prose; the first complete JSON object is used.
pub fn parse_action(text: &str, tool_names: &[&str]) -> Result<PlannerAction, String> {
    let candidate = extract_json_object(text).ok_or_else(|| {
        "no JSON object found; reply with exactly one JSON action object".to_string()
    })?;
    let value: Value = serde_json::from_str(candidate).map_err(|e| format!("invalid JSON: {e}"))?;
    let schema = action_schema(tool_names);
    let validator =
        jsonschema::validator_for(&schema).map_err(|e| format!("internal schema error: {e}"))?;
    if let Some(error) = validator.iter_errors(&value).next() {
        let unknown_tool = value
            .get("name")
            .and_then(Value::as_str)
            .filter(|name| !tool_names.contains(name))
            .map(|name| {
                format!(
                    " (unknown tool `{name}`; available: {})",
                    tool_names.join(", ")
                )
            })
            .unwrap_or_default();
        return Err(format!(
            "the action does not match the action schema: {error}{unknown_tool}"
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("invalid action: {e}"))
}

/// The first balanced `{...}` in `text`, honouring strings and escapes.
fn extract_json_object(text: &str) -> Option<&str> {
    let start = text.find('{')?;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, c) in text.get(start..)?.char_indices() {
        if in_string {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => in_string = false,
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return text.get(start..=start + offset);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_actions_and_rejects_invalid_ones() {
        let tools = ["calculator"];
        assert_eq!(
            parse_action(
                "```json\n{\"action\":\"call_tool\",\"name\":\"calculator\",\"args\":{\"expression\":\"1+1\"}}\n```",
                &tools
            ),
            Ok(PlannerAction::CallTool {
                name: "calculator".into(),
                args: json!({"expression": "1+1"})
            })
        );
        assert_eq!(
            parse_action("{\"action\":\"stop\",\"reason\":\"2\"}", &tools),
            Ok(PlannerAction::Stop { reason: "2".into() })
        );
        assert!(parse_action("I think the answer is 2", &tools).is_err());
        assert!(
            parse_action(
                "{\"action\":\"call_tool\",\"name\":\"nope\",\"args\":{}}",
                &tools
            )
            .unwrap_err()
            .contains("unknown tool `nope`")
        );
        assert!(parse_action("{\"action\":\"dance\"}", &tools).is_err());
        assert!(
            parse_action(
                "{\"action\": \"stop\", \"reason\": \"a } in a string\"}",
                &tools
            )
            .is_ok()
        );
    }
}
