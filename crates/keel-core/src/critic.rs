//! Critics: after each observation and on the final answer, a critic says whether the goal
//! is met, what is missing, and what to do next (seed 000 §3.3).
//!
//! [`RuleCritic`] checks deterministic predicates; [`ModelCritic`] asks a model with a
//! structured-output schema. Every verdict is journaled as a `critique` event; an
//! unsatisfied final answer goes back to the model with the gaps, a bounded number of times.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::event::CriticNext;
use crate::message::{Message, Part, Role, ToolResult};
use crate::model::{Model, ModelRequest, complete};

/// What is being assessed.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A tool result just added to the conversation.
    Observation(&'a ToolResult),
    /// The model's final answer.
    FinalAnswer(&'a str),
}

/// What a critic sees.
#[derive(Debug, Clone, Copy)]
pub struct CriticInput<'a> {
    /// The run's goal (the user's request).
    pub goal: &'a str,
    /// The conversation so far.
    pub messages: &'a [Message],
    /// The thing to assess.
    pub subject: Subject<'a>,
}

/// A critic's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Whether the goal (or subgoal) is met.
    pub satisfied: bool,
    /// What is still missing.
    #[serde(default)]
    pub known_gaps: Vec<String>,
    /// Recommended next step.
    pub next: CriticNext,
    /// A tool the next model call must use to close the first gap, when one does.
    #[serde(default)]
    pub next_tool: Option<String>,
}

impl Verdict {
    /// A satisfied verdict.
    pub fn satisfied() -> Self {
        Self {
            satisfied: true,
            known_gaps: Vec::new(),
            next: CriticNext::Continue,
            next_tool: None,
        }
    }
}

/// Assesses observations and final answers.
#[async_trait]
pub trait Critic: Send + Sync {
    /// Assesses one subject.
    async fn assess(&self, input: CriticInput<'_>) -> Verdict;
}

type Rule = Box<dyn Fn(&CriticInput<'_>) -> Option<String> + Send + Sync>;

/// A critic made of deterministic predicates on the final answer. Each rule returns a gap
/// when it is not met. Observations are always accepted.
#[derive(Default)]
pub struct RuleCritic {
    /// Each rule with the tool that closes its gap, if one does.
    rules: Vec<(Rule, Option<String>)>,
}

impl std::fmt::Debug for RuleCritic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleCritic")
            .field("rules", &self.rules.len())
            .finish()
    }
}

impl RuleCritic {
    /// A critic with no rules (always satisfied).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule on the final answer.
    pub fn rule(
        mut self,
        rule: impl Fn(&CriticInput<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.rules.push((Box::new(rule), None));
        self
    }

    /// Adds a rule whose gap is closed by calling `tool`: when it fails, the next model
    /// call is required to use that tool.
    pub fn rule_for_tool(
        mut self,
        tool: &str,
        rule: impl Fn(&CriticInput<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.rules.push((Box::new(rule), Some(tool.to_string())));
        self
    }

    /// Requires a successful call of `tool` in the conversation whose arguments have every
    /// field of `required_args` present and non-empty.
    pub fn require_successful_call(self, tool: &str, required_args: &[&str]) -> Self {
        let tool = tool.to_string();
        let required: Vec<String> = required_args.iter().map(|s| s.to_string()).collect();
        let forced = tool.clone();
        self.rule_for_tool(&forced, move |input| {
            let ok = successful_calls(input.messages, &tool).any(|args| {
                required.iter().all(|field| match args.get(field) {
                    None | Some(Value::Null) => false,
                    Some(Value::String(s)) => !s.trim().is_empty(),
                    Some(Value::Array(a)) => !a.is_empty(),
                    Some(_) => true,
                })
            });
            (!ok).then(|| {
                if required.is_empty() {
                    format!("`{tool}` was never called successfully")
                } else {
                    format!(
                        "`{tool}` was never called successfully with non-empty {}",
                        required.join(", ")
                    )
                }
            })
        })
    }

    /// Requires the final answer to mention `needle` (case-insensitive).
    pub fn require_in_answer(self, needle: &str, gap: &str) -> Self {
        let needle = needle.to_lowercase();
        let gap = gap.to_string();
        self.rule(move |input| match input.subject {
            Subject::FinalAnswer(text) if !text.to_lowercase().contains(&needle) => {
                Some(gap.clone())
            }
            _ => None,
        })
    }
}

/// Arguments of every successful call of `tool` in the conversation.
fn successful_calls<'m>(
    messages: &'m [Message],
    tool: &'m str,
) -> impl Iterator<Item = Value> + 'm {
    let ok_ids: Vec<&str> = messages
        .iter()
        .flat_map(Message::tool_results)
        .filter(|r| r.name == tool && r.outcome.is_ok())
        .map(|r| r.call_id.as_str())
        .collect();
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(Message::tool_calls)
        .filter(move |call| call.name == tool && ok_ids.contains(&call.id.as_str()))
        .filter_map(|call| call.parse_arguments().ok())
}

#[async_trait]
impl Critic for RuleCritic {
    async fn assess(&self, input: CriticInput<'_>) -> Verdict {
        if matches!(input.subject, Subject::Observation(_)) {
            return Verdict::satisfied();
        }
        let mut gaps = Vec::new();
        let mut next_tool = None;
        for (rule, tool) in &self.rules {
            if let Some(gap) = rule(&input) {
                if next_tool.is_none() {
                    next_tool.clone_from(tool);
                }
                gaps.push(gap);
            }
        }
        if gaps.is_empty() {
            Verdict::satisfied()
        } else {
            Verdict {
                satisfied: false,
                known_gaps: gaps,
                next: CriticNext::Continue,
                next_tool,
            }
        }
    }
}

/// Asks a model for a verdict with structured output. A model failure or an unparseable
/// answer counts as satisfied (the critic must not be the reason a run dies), with the
/// problem recorded as a gap-free verdict.
pub struct ModelCritic {
    model: std::sync::Arc<dyn Model>,
    instructions: String,
}

impl std::fmt::Debug for ModelCritic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCritic")
            .field("model", &self.model.id())
            .finish()
    }
}

/// The JSON Schema of a verdict.
pub fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "satisfied": {"type": "boolean"},
            "known_gaps": {"type": "array", "items": {"type": "string"}},
            "next": {"enum": ["continue", "replan", "clarify", "stop"]}
        },
        "required": ["satisfied", "known_gaps", "next"],
        "additionalProperties": false
    })
}

impl ModelCritic {
    /// A critic asking `model`, with extra instructions (criteria).
    pub fn new(model: std::sync::Arc<dyn Model>, instructions: impl Into<String>) -> Self {
        Self {
            model,
            instructions: instructions.into(),
        }
    }
}

#[async_trait]
impl Critic for ModelCritic {
    async fn assess(&self, input: CriticInput<'_>) -> Verdict {
        let subject = match input.subject {
            Subject::Observation(result) => {
                format!("Tool `{}` returned: {}", result.name, result.content)
            }
            Subject::FinalAnswer(text) => format!("The agent's final answer: {text}"),
        };
        let prompt = Message {
            role: Role::User,
            parts: vec![Part::Text {
                text: format!(
                    "Goal: {}\n\n{subject}\n\nIs the goal met? Reply with JSON: {{\"satisfied\": bool, \"known_gaps\": [..], \"next\": \"continue|replan|clarify|stop\"}}",
                    input.goal
                ),
            }],
        };
        let schema = verdict_schema();
        let messages = [prompt];
        let system = format!(
            "You are a strict critic of an agent's work. {}",
            self.instructions
        );
        let request = ModelRequest {
            system: Some(&system),
            response_schema: Some(&schema),
            ..ModelRequest::new(&messages)
        };
        match complete(self.model.as_ref(), request).await {
            Ok(response) => {
                let text = response.message.text();
                let start = text.find('{').unwrap_or(0);
                let end = text.rfind('}').map(|i| i + 1).unwrap_or(text.len());
                serde_json::from_str(text.get(start..end).unwrap_or_default())
                    .unwrap_or_else(|_| Verdict::satisfied())
            }
            Err(_) => Verdict::satisfied(),
        }
    }
}
