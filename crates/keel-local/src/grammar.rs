//! The output grammar of a local generation and the parser of what it produced.
//!
//! An answer is EITHER plain text (or, with a response schema, one JSON value) OR tool
//! calls in the model family's format ([`ToolFormat`]): one block holding a JSON array,
//! as SmolLM2 was trained on,
//!
//! ```text
//! <tool_call>[{"name": "calculator", "arguments": {"expression": "17*23"}}]</tool_call>
//! ```
//!
//! or, for Qwen2.5 (Hermes style, see `hermes`), one block per call:
//!
//! ```text
//! <tool_call>
//! {"name": "calculator", "arguments": {"expression": "17*23"}}
//! </tool_call>
//! ```
//!
//! The grammar is llguidance Lark with one `%json{...}` per tool, so every call the model
//! can emit parses and validates against its tool's input schema. Schemas are first
//! *capped* ([`cap_schema`]): strings get a `maxLength`, arrays a `maxItems`, objects
//! without `additionalProperties` get `false`, so the language is finite and generation
//! always terminates. (Digit runs are bounded in the decode loop, see `engine`.)

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use keel_core::{GroundedArgument, ToolChoice, ToolDefinition};

use crate::options::LocalModelOptions;

/// The literal that opens a tool-call block.
pub const CALL_OPEN: &str = "<tool_call>";
/// The literal that closes a tool-call block.
pub const CALL_CLOSE: &str = "</tool_call>";

/// Free text that cannot be mistaken for a tool-call block (it does not start with `<`).
const TEXT_RULE: &str = "answer: TEXT\nTEXT: /[^<\\s](?s:.)*/\n";

/// The same for the Hermes format, where text cannot start with `{` either: Qwen2.5-Coder
/// 0.5B otherwise often writes a bare call object (`{"name": ...}`) as text instead of a
/// `<tool_call>` block, which would escape the schema check.
const HERMES_TEXT_RULE: &str = "answer: TEXT\nTEXT: /[^<{\\s](?s:.)*/\n";

/// How a model family writes tool calls (and how its prompt shows tools and results).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// SmolLM2's: the catalogue and call format in the system turn, one
    /// `<tool_call>[{..}, {..}]</tool_call>` block holding a JSON array, tool results as
    /// user turns ("The calculator tool returned: 391"); the prompt is rendered by
    /// llama.cpp's template engine from the file's chat template.
    JsonArray,
    /// Qwen2.5's (Hermes/ChatML): `# Tools` with `<tools>` in the system turn, one
    /// `<tool_call>\n{..}\n</tool_call>` block per call, results in `<tool_response>`
    /// blocks of a user turn; the prompt is rendered by Keel as Qwen's template does.
    Hermes,
}

impl ToolFormat {
    /// The format of a model, from its GGUF metadata: Hermes when its chat template
    /// speaks ChatML and mentions `<tool_call>`, or when the architecture is a Qwen one
    /// with a ChatML template; the JSON-array format otherwise.
    pub fn detect(architecture: Option<&str>, chat_template: Option<&str>) -> Self {
        let template = chat_template.unwrap_or_default();
        let chatml = template.contains("<|im_start|>");
        let qwen = architecture.is_some_and(|a| a.starts_with("qwen"));
        if chatml && (template.contains("<tool_call>") || qwen) {
            Self::Hermes
        } else {
            Self::JsonArray
        }
    }

    /// Parses a finished output in this format.
    pub fn parse_output(self, output: &str) -> Result<ParsedOutput, String> {
        match self {
            Self::JsonArray => parse_output(output),
            Self::Hermes => crate::hermes::parse_output(output),
        }
    }
}

/// What the grammar allows on one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Nothing: free text, no grammar.
    Free,
    /// A Lark grammar for llguidance.
    Lark(String),
}

/// Why a grammar could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GrammarError {
    /// `tool_choice` names a tool that is not offered.
    #[error("tool_choice names `{0}`, which is not among the offered tools")]
    UnknownTool(String),
    /// `tool_choice` requires a tool but none is offered.
    #[error("tool_choice requires a tool call but no tools are offered")]
    NoTools,
    /// A schema could not be serialized.
    #[error("schema of `{0}` could not be serialized: {1}")]
    Schema(String, String),
}

/// Builds the constraint for a request.
pub fn build_constraint(
    format: ToolFormat,
    tools: &[ToolDefinition],
    choice: &ToolChoice,
    response_schema: Option<&Value>,
    grounded: &[GroundedArgument],
    options: &LocalModelOptions,
) -> Result<Constraint, GrammarError> {
    let answer = match response_schema {
        Some(schema) => {
            let capped = with_json_options(cap_schema(schema, options));
            Some(format!(
                "answer: %json{}\n",
                to_json(&capped, "response_schema")?
            ))
        }
        None => None,
    };
    let offered: Vec<&ToolDefinition> = match choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Tool(name) => {
            let found: Vec<&ToolDefinition> = tools.iter().filter(|t| &t.name == name).collect();
            if found.is_empty() {
                return Err(GrammarError::UnknownTool(name.clone()));
            }
            found
        }
    };
    let must_call = matches!(choice, ToolChoice::Required | ToolChoice::Tool(_));
    let text_rule = match format {
        ToolFormat::JsonArray => TEXT_RULE,
        ToolFormat::Hermes => HERMES_TEXT_RULE,
    };
    if offered.is_empty() {
        if must_call {
            return Err(GrammarError::NoTools);
        }
        return Ok(match answer {
            Some(rule) => Constraint::Lark(format!("start: answer\n{rule}")),
            // Tools exist but must not be called: no text that imitates a call block.
            None if !tools.is_empty() => Constraint::Lark(format!("start: answer\n{text_rule}")),
            None => Constraint::Free,
        });
    }
    let mut lark = String::new();
    if must_call {
        lark.push_str("start: calls\n");
    } else {
        lark.push_str("start: answer | calls\n");
        // Free text that cannot be mistaken for a tool-call block.
        lark.push_str(&answer.unwrap_or_else(|| text_rule.to_string()));
    }
    let more = options.max_tool_calls.saturating_sub(1);
    match format {
        ToolFormat::Hermes => lark.push_str(&crate::hermes::calls_rule(more)),
        ToolFormat::JsonArray if more == 0 => {
            lark.push_str(&format!("calls: \"{CALL_OPEN}[\" call \"]{CALL_CLOSE}\"\n"));
        }
        ToolFormat::JsonArray => lark.push_str(&format!(
            "calls: \"{CALL_OPEN}[\" call (\", \" call){{0,{more}}} \"]{CALL_CLOSE}\"\n"
        )),
    }
    lark.push_str("call: ");
    for (i, tool) in offered.iter().enumerate() {
        if i > 0 {
            lark.push_str("\n    | ");
        }
        let schema = call_schema(tool, grounded, options);
        lark.push_str("%json");
        lark.push_str(&to_json(&schema, &tool.name)?);
    }
    lark.push('\n');
    Ok(Constraint::Lark(lark))
}

fn to_json(value: &Value, what: &str) -> Result<String, GrammarError> {
    serde_json::to_string(value).map_err(|e| GrammarError::Schema(what.to_string(), e.to_string()))
}

/// The schema of one call object: `{"name": <const>, "arguments": <capped input schema>}`,
/// with the tool's `$defs`/`definitions` hoisted to the root so `#/$defs/..` refs resolve,
/// and the strings of its grounded arguments required to quote a citation
/// ([`crate::grounding`]).
pub fn call_schema(
    tool: &ToolDefinition,
    grounded: &[GroundedArgument],
    options: &LocalModelOptions,
) -> Value {
    let mut arguments = cap_schema(&tool.input_schema, options);
    for argument in grounded.iter().filter(|g| g.tool == tool.name) {
        crate::grounding::require_citations(&mut arguments, argument);
    }
    let mut root = Map::new();
    if let Value::Object(map) = &mut arguments {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = map.remove(key) {
                root.insert(key.to_string(), defs);
            }
        }
        map.remove("$schema");
        map.remove("$id");
    }
    root.insert("type".into(), json!("object"));
    root.insert(
        "properties".into(),
        json!({ "name": { "const": tool.name }, "arguments": arguments }),
    );
    root.insert("required".into(), json!(["name", "arguments"]));
    root.insert("additionalProperties".into(), json!(false));
    with_json_options(Value::Object(root))
}

/// Compact, fixed whitespace (`", "` and `": "`), so whitespace cannot run on forever.
fn with_json_options(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "coerce_one_of": true,
                "lenient": true,
            }),
        );
    }
    schema
}

/// Returns a copy of `schema` whose language is finite: strings without `maxLength` get
/// `options.max_string_length`, arrays without `maxItems` get `options.max_array_items`
/// (or their `minItems`), objects with `properties` and no (or a `true`)
/// `additionalProperties` get `false`. Everything the result accepts, the original
/// accepts too.
pub fn cap_schema(schema: &Value, options: &LocalModelOptions) -> Value {
    let mut out = schema.clone();
    cap_in_place(&mut out, options);
    out
}

fn cap_in_place(schema: &mut Value, options: &LocalModelOptions) {
    let Value::Object(map) = schema else { return };
    let types = type_names(map.get("type"));
    let is = |name: &str| types.iter().any(|t| t == name);
    let constrained_value = map.contains_key("enum") || map.contains_key("const");
    if is("string") && !constrained_value && !map.contains_key("maxLength") {
        let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        map.insert(
            "maxLength".into(),
            json!(options.max_string_length.max(min)),
        );
    }
    if is("array") && !constrained_value && !map.contains_key("maxItems") {
        let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        map.insert("maxItems".into(), json!(options.max_array_items.max(min)));
    }
    if map.contains_key("properties") {
        match map.get("additionalProperties") {
            None | Some(Value::Bool(true)) => {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            _ => {}
        }
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            for child in children.values_mut() {
                cap_in_place(child, options);
            }
        }
    }
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
    ] {
        if let Some(child) = map.get_mut(key) {
            cap_in_place(child, options);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            for child in children {
                cap_in_place(child, options);
            }
        }
    }
}

fn type_names(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// One tool call parsed from a block.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// Tool name.
    pub name: String,
    /// The arguments JSON exactly as generated.
    pub arguments: String,
}

#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

/// What a finished generation contains.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedOutput {
    /// Plain text (or a JSON answer).
    Text(String),
    /// Tool calls.
    Calls(Vec<ParsedCall>),
}

/// Whether generated output is (the start of) a tool-call block.
pub fn starts_call_block(output: &str) -> bool {
    let trimmed = output.trim_start();
    !trimmed.is_empty() && (trimmed.starts_with(CALL_OPEN) || CALL_OPEN.starts_with(trimmed))
}

/// Parses a finished output. A tool-call block that does not parse (it can only happen
/// when generation was cut off) is an error naming what is wrong.
pub fn parse_output(output: &str) -> Result<ParsedOutput, String> {
    let trimmed = output.trim();
    let Some(rest) = trimmed.strip_prefix(CALL_OPEN) else {
        return Ok(ParsedOutput::Text(output.to_string()));
    };
    let Some(body) = rest.trim_end().strip_suffix(CALL_CLOSE) else {
        return Err(format!(
            "the tool-call block is not closed with {CALL_CLOSE}"
        ));
    };
    let raw: Vec<RawCall<'_>> = serde_json::from_str(body.trim())
        .map_err(|e| format!("the tool-call block is not a JSON array of calls: {e}"))?;
    Ok(ParsedOutput::Calls(
        raw.into_iter()
            .map(|c| ParsedCall {
                name: c.name,
                arguments: c.arguments.get().to_string(),
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, schema: Value) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: "d".into(),
            input_schema: schema,
        }
    }

    #[test]
    fn caps_unbounded_strings_arrays_and_objects() {
        let options = LocalModelOptions::default();
        let schema = json!({
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "e": {"type": "string", "enum": ["a", "b"]},
                "a": {"type": "array", "items": {"type": "string"}, "minItems": 20},
                "o": {"type": "object", "properties": {"x": {"type": ["string", "null"]}}}
            }
        });
        let capped = cap_schema(&schema, &options);
        assert_eq!(capped["additionalProperties"], json!(false));
        assert_eq!(capped["properties"]["s"]["maxLength"], json!(200));
        assert!(capped["properties"]["e"].get("maxLength").is_none());
        assert_eq!(capped["properties"]["a"]["maxItems"], json!(20));
        assert_eq!(capped["properties"]["a"]["items"]["maxLength"], json!(200));
        assert_eq!(
            capped["properties"]["o"]["properties"]["x"]["maxLength"],
            json!(200)
        );
    }

    #[test]
    fn grammar_by_tool_choice() {
        let options = LocalModelOptions::default();
        let tools = vec![tool("calc", json!({"type": "object"}))];
        let auto = build_constraint(
            ToolFormat::JsonArray,
            &tools,
            &ToolChoice::Auto,
            None,
            &[],
            &options,
        )
        .unwrap();
        let Constraint::Lark(auto) = auto else {
            panic!("expected a grammar")
        };
        assert!(auto.starts_with("start: answer | calls"));
        let required = build_constraint(
            ToolFormat::JsonArray,
            &tools,
            &ToolChoice::Required,
            None,
            &[],
            &options,
        )
        .unwrap();
        let Constraint::Lark(required) = required else {
            panic!("expected a grammar")
        };
        assert!(required.starts_with("start: calls"));
        let Constraint::Lark(none) = build_constraint(
            ToolFormat::JsonArray,
            &tools,
            &ToolChoice::None,
            None,
            &[],
            &options,
        )
        .unwrap() else {
            panic!("expected a text grammar")
        };
        assert!(none.contains("TEXT: /[^<"), "{none}");
        assert_eq!(
            build_constraint(
                ToolFormat::JsonArray,
                &[],
                &ToolChoice::Auto,
                None,
                &[],
                &options
            )
            .unwrap(),
            Constraint::Free
        );
        assert_eq!(
            build_constraint(
                ToolFormat::JsonArray,
                &tools,
                &ToolChoice::Tool("nope".into()),
                None,
                &[],
                &options
            ),
            Err(GrammarError::UnknownTool("nope".into()))
        );
        assert_eq!(
            build_constraint(
                ToolFormat::JsonArray,
                &[],
                &ToolChoice::Required,
                None,
                &[],
                &options
            ),
            Err(GrammarError::NoTools)
        );
    }

    #[test]
    fn hermes_grammar_and_detection() {
        let options = LocalModelOptions::default();
        let tools = vec![tool("calc", json!({"type": "object"}))];
        let Constraint::Lark(lark) = build_constraint(
            ToolFormat::Hermes,
            &tools,
            &ToolChoice::Auto,
            None,
            &[],
            &options,
        )
        .unwrap() else {
            panic!("expected a grammar")
        };
        assert!(lark.contains("TEXT: /[^<{"), "{lark}");
        assert!(lark.contains("calls: block (\"\\n\" block){0,3}"), "{lark}");
        assert!(
            lark.contains("block: \"<tool_call>\\n\" call \"\\n</tool_call>\""),
            "{lark}"
        );
        let qwen = "{%- if tools %}<|im_start|>system ... <tool_call> ...";
        assert_eq!(
            ToolFormat::detect(Some("qwen2"), Some(qwen)),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect(Some("qwen2"), Some("<|im_start|>{{ m }}")),
            ToolFormat::Hermes
        );
        let smol =
            "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}";
        assert_eq!(
            ToolFormat::detect(Some("llama"), Some(smol)),
            ToolFormat::JsonArray
        );
        assert_eq!(
            ToolFormat::detect(Some("qwen2"), None),
            ToolFormat::JsonArray
        );
    }

    #[test]
    fn parses_calls_and_text() {
        let out = r#"<tool_call>[{"name": "calc", "arguments": {"b": 1, "a": "x"}}, {"name": "p", "arguments": {}}]</tool_call>"#;
        assert_eq!(
            parse_output(out).unwrap(),
            ParsedOutput::Calls(vec![
                ParsedCall {
                    name: "calc".into(),
                    arguments: r#"{"b": 1, "a": "x"}"#.into()
                },
                ParsedCall {
                    name: "p".into(),
                    arguments: "{}".into()
                },
            ])
        );
        assert_eq!(
            parse_output("hello").unwrap(),
            ParsedOutput::Text("hello".into())
        );
        assert!(parse_output("<tool_call>[{\"name\"").is_err());
        assert!(starts_call_block("<too"));
        assert!(!starts_call_block("hi"));
    }
}
