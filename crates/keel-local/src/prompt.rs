//! Renders a [`ModelRequest`] into chat turns (role, content) for the model's chat
//! template: the tool catalogue goes into the system turn, earlier tool calls are written
//! back in the same `<tool_call>[...]</tool_call>` form the grammar produces, and tool
//! results become user turns saying what each tool returned (small chat templates have no
//! tool role).

use serde_json::{Value, json};

use keel_core::{Message, ModelRequest, Part, Role, ToolChoice, ToolDefinition};

use crate::grammar::{CALL_CLOSE, CALL_OPEN};

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
    Some(format!(
        "You are an expert in composing functions. You are given a question and a set of \
         possible functions. Based on the question, you will need to make one or more \
         function/tool calls to achieve the purpose. {rule}\n\n\
         You have access to the following tools:\n<tools>{catalogue}</tools>\n\n\
         The output MUST strictly adhere to the following format, and NO other text MUST be \
         included. Please make sure the parameter type is correct.\n\
         {CALL_OPEN}[\n{{\"name\": \"func_name1\", \"arguments\": {{\"argument1\": \"value1\", \
         \"argument2\": \"value2\"}}}},\n... (more tool calls as required)\n]{CALL_CLOSE}"
    ))
}

/// The chat turns of a request.
pub fn render(request: &ModelRequest<'_>) -> Vec<Turn> {
    let mut turns = Vec::with_capacity(request.messages.len().saturating_add(1));
    let mut system = request.system.map(str::to_string).unwrap_or_default();
    if let Some(tools) = tool_instructions(request.tools, request.tool_choice) {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&tools);
    }
    if let Some(schema) = request.response_schema {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str("Answer with JSON that follows this JSON Schema:\n");
        system.push_str(&schema.to_string());
    }
    if !system.is_empty() {
        turns.push(Turn {
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
            last.content.push_str("\n\n");
            last.content.push_str(&content);
            continue;
        }
        turns.push(Turn { role, content });
    }
    turns
}

fn render_message(message: &Message) -> String {
    let mut text = String::new();
    let mut calls: Vec<String> = Vec::new();
    let mut results: Vec<String> = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text: t } | Part::Summary { text: t, .. } => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            Part::ToolCall(call) => {
                let arguments = if call.arguments.trim().is_empty() {
                    "{}"
                } else {
                    &call.arguments
                };
                calls.push(format!(
                    "{{\"name\": {}, \"arguments\": {arguments}}}",
                    Value::String(call.name.clone())
                ));
            }
            Part::ToolResult(result) => {
                results.push(format!(
                    "The {} tool returned: {}",
                    result.name, result.content
                ));
            }
            Part::ProviderItem { .. } => {}
        }
    }
    if !calls.is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(CALL_OPEN);
        text.push('[');
        text.push_str(&calls.join(", "));
        text.push(']');
        text.push_str(CALL_CLOSE);
    }
    if !results.is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&results.join("\n"));
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
