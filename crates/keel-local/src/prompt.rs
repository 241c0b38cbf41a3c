//! Renders a [`ModelRequest`] into chat turns (role, content) for the model's chat
//! template: the tool catalogue goes into the system turn, earlier tool calls are written
//! back in the same `<tool_call>[...]</tool_call>` form the grammar produces, and tool
//! results become user turns saying what each tool returned (small chat templates have no
//! tool role).

use serde_json::{Value, json};

use keel_core::{Message, ModelRequest, Part, Role, ToolChoice, ToolDefinition};

use crate::grammar::{CALL_CLOSE, CALL_OPEN};
use crate::text::Prompt;

/// One chat turn before templating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// The text.
    pub content: String,
}

/// The tool section of the system prompt.
pub fn tool_instructions(tools: &[ToolDefinition], choice: &ToolChoice) -> Option<String> {
    tool_instructions_prompt(tools, choice).map(Prompt::into_text)
}

/// [`tool_instructions`] with the catalogue (from tool authors and MCP servers) as data.
fn tool_instructions_prompt(tools: &[ToolDefinition], choice: &ToolChoice) -> Option<Prompt> {
    let offered: Vec<&ToolDefinition> = match choice {
        ToolChoice::None => return None,
        ToolChoice::Tool(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    if offered.is_empty() {
        return None;
    }
    let catalogue: Vec<Value> = offered
        .iter()
        .map(
            |t| json!({"name": t.name, "description": t.description, "parameters": t.input_schema}),
        )
        .collect();
    let catalogue = serde_json::to_string(&catalogue).unwrap_or_default();
    let rule = match choice {
        ToolChoice::Auto => {
            "If none of the functions can be used, answer the question in plain text instead."
        }
        _ => "You must call a function.",
    };
    let mut out = Prompt::new();
    out.markup(&format!(
        "You are an expert in composing functions. You are given a question and a set of \
         possible functions. Based on the question, you will need to make one or more \
         function/tool calls to achieve the purpose. {rule}\n\n\
         You have access to the following tools:\n<tools>"
    ));
    out.data(&catalogue);
    out.markup(&format!(
        "</tools>\n\n\
         The output MUST strictly adhere to the following format, and NO other text MUST be \
         included. Please make sure the parameter type is correct.\n\
         {CALL_OPEN}[\n{{\"name\": \"func_name1\", \"arguments\": {{\"argument1\": \"value1\", \
         \"argument2\": \"value2\"}}}},\n... (more tool calls as required)\n]{CALL_CLOSE}"
    ));
    Some(out)
}

/// The chat turns of a request.
pub fn render(request: &ModelRequest<'_>) -> Vec<Turn> {
    render_turns(request)
        .into_iter()
        .map(|turn| Turn {
            role: turn.role,
            content: turn.content.into_text(),
        })
        .collect()
}

/// One chat turn with its data marked (see [`crate::text`]).
#[derive(Debug, Clone)]
pub(crate) struct MarkedTurn {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// The content.
    pub content: Prompt,
}

/// [`render`] with the data of each turn marked: message text, tool results, call
/// arguments and the tool catalogue stay text when tokenized.
pub(crate) fn render_turns(request: &ModelRequest<'_>) -> Vec<MarkedTurn> {
    let mut turns = Vec::with_capacity(request.messages.len().saturating_add(1));
    let mut system = Prompt::new();
    if let Some(text) = request.system {
        system.data(text);
    }
    if let Some(tools) = tool_instructions_prompt(request.tools, request.tool_choice) {
        if !system.is_empty() {
            system.markup("\n\n");
        }
        system.append(&tools);
    }
    if let Some(schema) = request.response_schema {
        if !system.is_empty() {
            system.markup("\n\n");
        }
        system.markup("Answer with JSON that follows this JSON Schema:\n");
        system.data(&schema.to_string());
    }
    if !system.is_empty() {
        turns.push(MarkedTurn {
            role: "system",
            content: system,
        });
    }
    for message in request.messages {
        let content = render_message(message);
        let role = match message.role {
            Role::System => "system",
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        // Merge into the previous turn when the roles repeat (tool results after a user
        // turn, several system messages): some templates insist on alternation.
        if let Some(last) = turns.last_mut()
            && last.role == role
            && role != "assistant"
        {
            last.content.markup("\n\n");
            last.content.append(&content);
            continue;
        }
        turns.push(MarkedTurn { role, content });
    }
    turns
}

fn render_message(message: &Message) -> Prompt {
    let mut text = Prompt::new();
    let mut calls: Vec<Prompt> = Vec::new();
    let mut results: Vec<Prompt> = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text: t } | Part::Summary { text: t, .. } => {
                if !text.is_empty() {
                    text.markup("\n");
                }
                text.data(t);
            }
            Part::ToolCall(call) => {
                let arguments = if call.arguments.trim().is_empty() {
                    "{}"
                } else {
                    &call.arguments
                };
                let mut rendered = Prompt::new();
                rendered.markup("{\"name\": ");
                rendered.data(&Value::String(call.name.clone()).to_string());
                rendered.markup(", \"arguments\": ");
                rendered.data(arguments);
                rendered.markup("}");
                calls.push(rendered);
            }
            Part::ToolResult(result) => {
                let mut rendered = Prompt::new();
                rendered.markup("The ");
                rendered.data(&result.name);
                rendered.markup(" tool returned: ");
                rendered.data(&result.content);
                results.push(rendered);
            }
            Part::ProviderItem { .. } => {}
        }
    }
    if !calls.is_empty() {
        if !text.is_empty() {
            text.markup("\n");
        }
        text.markup(CALL_OPEN);
        text.markup("[");
        for (i, call) in calls.iter().enumerate() {
            if i > 0 {
                text.markup(", ");
            }
            text.append(call);
        }
        text.markup("]");
        text.markup(CALL_CLOSE);
    }
    if !results.is_empty() {
        if !text.is_empty() {
            text.markup("\n");
        }
        for (i, result) in results.iter().enumerate() {
            if i > 0 {
                text.markup("\n");
            }
            text.append(result);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::ToolCall;

    #[test]
    fn renders_calls_and_results() {
        let messages = vec![
            Message::user("what is 2+2?"),
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "calculator".into(),
                    arguments: r#"{"expression": "2+2"}"#.into(),
                })],
            },
        ];
        let tools = vec![ToolDefinition {
            name: "calculator".into(),
            description: "Evaluates arithmetic.".into(),
            input_schema: json!({"type": "object"}),
        }];
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.system = Some("Be brief.");
        let turns = render(&request);
        assert_eq!(turns.len(), 3);
        assert!(turns[0].content.starts_with("Be brief.\n\n"));
        assert!(
            turns[0]
                .content
                .contains("You have access to the following tools")
        );
        assert!(turns[0].content.contains("\"name\":\"calculator\""));
        assert_eq!(
            turns[2].content,
            r#"<tool_call>[{"name": "calculator", "arguments": {"expression": "2+2"}}]</tool_call>"#
        );
    }
}
