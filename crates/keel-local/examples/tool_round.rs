//! One tool round on any local model, to see its native tool-call format at work: the
//! calculator question with `ToolChoice::Auto` (eager tools as the model's defaults
//! decide), the call it makes, then the answer once the result is fed back. Prints the
//! rendered prompt of the first request, the events' outcome and the timings.
//!
//! ```text
//! cargo run --release -p keel-local --example tool_round -- [--model SPEC] [--threads N]
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use futures::StreamExt;
use keel_core::model::ResponseAssembler;
use keel_core::{
    Message, Model, ModelRequest, ModelResponse, Part, Role, ToolDefinition, ToolOutcome,
    ToolResult, ToolResultKind,
};
use keel_local::{LocalModel, LocalModelOptions};
use serde_json::json;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

async fn ask(model: &LocalModel, messages: &[Message], tools: &[ToolDefinition]) -> ModelResponse {
    let mut request = ModelRequest::new(messages);
    request.system = Some("You are a helpful assistant. Use the calculator tool for arithmetic.");
    request.tools = tools;
    request.max_output_tokens = Some(128);
    let mut stream = model.stream(request);
    let mut assembler = ResponseAssembler::new();
    while let Some(event) = stream.next().await {
        assembler.push(&event.expect("generation failed"));
    }
    let response = assembler.finish();
    println!(
        "--- {:?}: {:?}",
        response.stop_reason, response.message.parts
    );
    println!("    {:?}", model.last_generation());
    response
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spec = arg(&args, "--model").unwrap_or_else(|| "smollm2".into());
    let threads: u32 = arg(&args, "--threads").map_or(2, |v| v.parse().expect("--threads N"));
    let options = LocalModelOptions::default()
        .with_threads(threads)
        .with_context_size(4096);
    let model = LocalModel::load_spec(&spec, options).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "model {} format {:?} eager tools {}",
        model.name(),
        model.tool_format(),
        model.eager_tools()
    );
    let tools = vec![ToolDefinition {
        name: "calculator".into(),
        description: "Evaluates an arithmetic expression and returns the number.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 17*23"}},
            "required": ["expression"],
        }),
    }];
    let mut messages = vec![Message::user("What is 17*23?")];
    let mut request = ModelRequest::new(&messages);
    request.tools = &tools;
    println!("{}", model.render_prompt(&request).unwrap());
    let response = ask(&model, &messages, &tools).await;
    let Some(call) = response.message.parts.iter().find_map(|p| match p {
        Part::ToolCall(c) => Some(c.clone()),
        _ => None,
    }) else {
        println!("no tool call");
        return;
    };
    messages.push(response.message.clone());
    messages.push(Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult(std::sync::Arc::new(ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            outcome: ToolOutcome {
                tool: call.name.clone(),
                call_id: call.id.clone(),
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
            content: "391".into(),
        }))],
    });
    ask(&model, &messages, &tools).await;
}
