//! The Hermes/ChatML tool-call format of Qwen2.5 (and models whose chat template holds
//! `<tool_call>`): the prompt as Qwen's own chat template renders it, the calls rule of
//! the output grammar, and the parser of what the model produced.
//!
//! ```text
//! <|im_start|>system
//! {system}
//!
//! # Tools
//! ...
//! <tools>
//! {"type": "function", "function": {"name": "calculator", ...}}
//! </tools>
//! ...<|im_end|>
//! <|im_start|>user
//! what is 17*23?<|im_end|>
//! <|im_start|>assistant
//! <tool_call>
//! {"name": "calculator", "arguments": {"expression": "17*23"}}
//! </tool_call><|im_end|>
//! <|im_start|>user
//! <tool_response>
//! 391
//! </tool_response><|im_end|>
//! <|im_start|>assistant
//! ```
//!
//! Keel renders this text itself: llama.cpp's built-in template engine (what the JSON
//! array format uses) recognises ChatML but has no notion of tools. Catalogue JSON uses
//! Python's `json.dumps` separators (`", "`, `": "`) as the template's `tojson` does;
//! earlier calls are written back with their arguments exactly as generated, so a
//! thread's next prompt extends the previous one token for token (what the KV cache
//! reuses).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use keel_core::{Message, ModelRequest, Part, Role, ToolChoice, ToolDefinition};

use crate::grammar::{CALL_CLOSE, CALL_OPEN, ParsedCall, ParsedOutput};
use crate::text::Prompt;

/// Qwen's system prompt when the request has none (its template's default).
pub const DEFAULT_SYSTEM: &str =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/// JSON with `", "` and `": "` separators, like Python's `json.dumps` (and so the
/// `tojson` filter of Hugging Face chat templates).
pub fn python_json(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_json(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// The `# Tools` section Qwen's template appends to the system prompt.
pub fn tools_section(tools: &[&ToolDefinition]) -> String {
    tools_section_prompt(tools).into_text()
}

/// [`tools_section`] with its data marked: the framing is the template's (its
/// `<tool_call>` markers are Qwen's special tokens), each signature is data (names,
/// descriptions and schemas come from tool authors and MCP servers).
fn tools_section_prompt(tools: &[&ToolDefinition]) -> Prompt {
    let mut out = Prompt::new();
    out.markup(
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        let signature = json!({
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            }
        });
        out.markup("\n");
        out.data(&python_json(&signature));
    }
    out.markup(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    out
}

/// One turn: the role header is markup, the content data.
fn push_turn(out: &mut Prompt, role: &str, content: &Prompt) {
    out.markup("<|im_start|>");
    out.markup(role);
    out.markup("\n");
    out.append(content);
    out.markup("<|im_end|>\n");
}

/// The tools listed in the prompt under a tool choice: all of them, also under `None`
/// (the grammar alone forbids calls then), so the system turn — the start of every
/// prompt of a thread — stays the same from one call to the next and the prompt cache
/// serves the whole earlier conversation. Leaving the section out under `None` (the
/// answer after the last tool result, with eager tools) made that call's prompt diverge
/// at the system turn: Qwen2.5-Coder-0.5B's Detective re-evaluated ~1,000 tokens (15 s)
/// for its answer.
fn offered<'t>(tools: &'t [ToolDefinition], choice: &ToolChoice) -> Vec<&'t ToolDefinition> {
    match choice {
        ToolChoice::Tool(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::None | ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    }
}

/// The complete prompt of a request, ending with the assistant's opening.
pub fn render(request: &ModelRequest<'_>) -> String {
    render_prompt(request).into_text()
}

/// [`render`] with its data marked (see [`crate::text`]): message text, tool results,
/// call arguments and tool signatures stay text when tokenized.
pub(crate) fn render_prompt(request: &ModelRequest<'_>) -> Prompt {
    let mut system = Prompt::new();
    system.data(request.system.unwrap_or(DEFAULT_SYSTEM));
    let tools = offered(request.tools, request.tool_choice);
    if !tools.is_empty() {
        system.append(&tools_section_prompt(&tools));
    }
    if let Some(schema) = request.response_schema {
        system.markup("\n\nAnswer with JSON that follows this JSON Schema:\n");
        system.data(&schema.to_string());
    }
    let mut out = Prompt::new();
    push_turn(&mut out, "system", &system);
    let mut in_tool_turn = false;
    for message in request.messages {
        if message.role == Role::Tool {
            if !in_tool_turn {
                out.markup("<|im_start|>user");
                in_tool_turn = true;
            }
            push_results(&mut out, message);
            continue;
        }
        if in_tool_turn {
            out.markup("<|im_end|>\n");
            in_tool_turn = false;
        }
        match message.role {
            Role::System => push_turn(&mut out, "system", &text_of(message)),
            Role::User => push_turn(&mut out, "user", &text_of(message)),
            Role::Assistant => push_assistant(&mut out, message),
            Role::Tool => {}
        }
    }
    if in_tool_turn {
        out.markup("<|im_end|>\n");
    }
    out.markup("<|im_start|>assistant\n");
    out
}

fn text_of(message: &Message) -> Prompt {
    let mut text = Prompt::new();
    for part in &message.parts {
        match part {
            Part::Text { text: t } | Part::Summary { text: t, .. } => {
                if !text.is_empty() {
                    text.markup("\n");
                }
                text.data(t);
            }
            // A result in a user message (unusual): shown the way a tool turn shows it.
            Part::ToolResult(result) => {
                if !text.is_empty() {
                    text.markup("\n");
                }
                text.markup("<tool_response>\n");
                text.data(&result.content);
                text.markup("\n</tool_response>");
            }
            Part::ToolCall(_) | Part::ProviderItem { .. } => {}
        }
    }
    text
}

fn push_assistant(out: &mut Prompt, message: &Message) {
    let text = text_of(message);
    if !message.parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
        push_turn(out, "assistant", &text);
        return;
    }
    out.markup("<|im_start|>assistant");
    if !text.is_empty() {
        out.markup("\n");
        out.append(&text);
    }
    for part in &message.parts {
        if let Part::ToolCall(call) = part {
            let arguments = if call.arguments.trim().is_empty() {
                "{}"
            } else {
                call.arguments.as_str()
            };
            out.markup("\n");
            out.append(&call_block_prompt(&call.name, arguments));
        }
    }
    out.markup("<|im_end|>\n");
}

/// One call as the model writes it.
pub fn call_block(name: &str, arguments: &str) -> String {
    call_block_prompt(name, arguments).into_text()
}

/// [`call_block`] with the name and arguments as data and the markers as markup (the
/// model produced them as its special tokens).
fn call_block_prompt(name: &str, arguments: &str) -> Prompt {
    let mut out = Prompt::new();
    out.markup(CALL_OPEN);
    out.markup("\n{\"name\": ");
    out.data(&Value::String(name.to_string()).to_string());
    out.markup(", \"arguments\": ");
    out.data(arguments);
    out.markup("}\n");
    out.markup(CALL_CLOSE);
    out
}

fn push_results(out: &mut Prompt, message: &Message) {
    for part in &message.parts {
        let content = match part {
            Part::ToolResult(result) => result.content.as_str(),
            Part::Text { text } => text.as_str(),
            _ => continue,
        };
        out.markup("\n<tool_response>\n");
        out.data(content);
        out.markup("\n</tool_response>");
    }
}

/// The Lark rule `calls` for `more + 1` calls at most, one block each, separated by a
/// newline. `call` is defined by the caller (one `%json` per tool).
pub fn calls_rule(more: u32) -> String {
    let block = format!("block: \"{CALL_OPEN}\\n\" call \"\\n{CALL_CLOSE}\"\n");
    if more == 0 {
        format!("calls: block\n{block}")
    } else {
        format!("calls: block (\"\\n\" block){{0,{more}}}\n{block}")
    }
}

#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

/// Parses a finished output: text, or one or more `<tool_call>` blocks.
pub fn parse_output(output: &str) -> Result<ParsedOutput, String> {
    let mut rest = output.trim();
    if !rest.starts_with(CALL_OPEN) {
        return Ok(ParsedOutput::Text(output.to_string()));
    }
    let mut calls = Vec::new();
    while let Some(after) = rest.strip_prefix(CALL_OPEN) {
        let Some(end) = after.find(CALL_CLOSE) else {
            return Err(format!("a tool-call block is not closed with {CALL_CLOSE}"));
        };
        let body = after.get(..end).unwrap_or_default().trim();
        let raw: RawCall<'_> = serde_json::from_str(body)
            .map_err(|e| format!("a tool-call block is not a JSON call object: {e}"))?;
        calls.push(ParsedCall {
            name: raw.name,
            arguments: raw.arguments.get().to_string(),
        });
        rest = after
            .get(end.saturating_add(CALL_CLOSE.len())..)
            .unwrap_or_default()
            .trim_start();
    }
    if !rest.is_empty() {
        return Err(format!("text after the tool calls: {rest:?}"));
    }
    Ok(ParsedOutput::Calls(calls))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::{ToolCall, ToolOutcome, ToolResult, ToolResultKind};

    fn result(content: &str) -> ToolResult {
        ToolResult {
            call_id: "c1".into(),
            name: "calculator".into(),
            outcome: ToolOutcome {
                tool: "calculator".into(),
                call_id: "c1".into(),
                thread_id: "thr".into(),
                run_id: "run".into(),
                attempts: 1,
                latency_ms: 1,
                repairs: Vec::new(),
                result: ToolResultKind::Ok {
                    data: json!(391),
                    schema_validated: true,
                    truncated: false,
                },
            },
            content: content.into(),
        }
    }

    fn calculator() -> ToolDefinition {
        ToolDefinition {
            name: "calculator".into(),
            description: "Evaluates arithmetic.".into(),
            input_schema: json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
        }
    }

    #[test]
    fn renders_like_qwens_template() {
        let tools = vec![calculator()];
        let messages = vec![
            Message::user("what is 17*23?"),
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "calculator".into(),
                    arguments: r#"{"expression": "17*23"}"#.into(),
                })],
            },
            Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult(result("391").into())],
            },
        ];
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        let prompt = render(&request);
        let expected = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"calculator\", \"description\": \"Evaluates arithmetic.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expression\": {\"type\": \"string\"}}, \"required\": [\"expression\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nwhat is 17*23?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*23\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(prompt, expected);

        // Calls forbidden: the same tools section (the grammar forbids the calls), so
        // the prompt keeps the earlier calls' prefix for the cache.
        request.tool_choice = &ToolChoice::None;
        let answer_prompt = render(&request);
        assert_eq!(answer_prompt, expected);

        // No tools: no tools section; a system prompt replaces the default.
        request.tools = &[];
        request.system = Some("Be brief.");
        let prompt = render(&request);
        assert!(prompt.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"));
        assert!(!prompt.contains("# Tools"));
    }

    #[test]
    fn parses_blocks_and_text() {
        let out = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"p\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            parse_output(out).unwrap(),
            ParsedOutput::Calls(vec![
                ParsedCall {
                    name: "calculator".into(),
                    arguments: r#"{"expression": "1+1"}"#.into()
                },
                ParsedCall {
                    name: "p".into(),
                    arguments: "{}".into()
                },
            ])
        );
        assert_eq!(
            parse_output("The answer is 2.").unwrap(),
            ParsedOutput::Text("The answer is 2.".into())
        );
        assert!(parse_output("<tool_call>\n{\"name\": \"p\"").is_err());
        // What is written back parses to the same call.
        let block = call_block("calculator", r#"{"expression": "1+1"}"#);
        assert!(matches!(parse_output(&block), Ok(ParsedOutput::Calls(c)) if c.len() == 1));
    }

    #[test]
    fn python_separators() {
        assert_eq!(
            python_json(&json!({"a": [1, "x"], "b": {}})),
            r#"{"a": [1, "x"], "b": {}}"#
        );
    }
}
