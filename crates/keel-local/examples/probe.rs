#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, missing_docs)]
use keel_core::{Message, ModelRequest, ToolDefinition, model::complete};
use keel_local::{LocalModel, LocalModelOptions};
use serde_json::json;

#[tokio::main]
async fn main() {
    let model = LocalModel::load(keel_local::resolve_model("smollm2").unwrap(), LocalModelOptions::default().with_threads(2).with_context_size(2048)).unwrap();
    let tools = vec![ToolDefinition {
        name: "calculator".into(),
        description: "Evaluates an arithmetic expression such as `2 * (3 + 4)` and returns the number.".into(),
        input_schema: json!({"type":"object","properties":{"expression":{"type":"string","description":"The arithmetic expression to evaluate, e.g. 17*23"}},"required":["expression"],"additionalProperties":false}),
    }];
    let args: Vec<String> = std::env::args().collect();
    let system = args.get(2).cloned();
    for q in ["What is 17*23?", "what is 17*23?", "Compute 1234 + 5678.", "What is 12 times 9?", "Hi, how are you?"] {
        let messages = vec![Message::user(q)];
        let mut request = ModelRequest::new(&messages);
        request.tools = &tools;
        request.system = system.as_deref();
        request.max_output_tokens = Some(100);
        if args.get(1).map(String::as_str) == Some("prompt") { println!("{}", model.render_prompt(&request).unwrap()); return; }
        let r = complete(&model, request).await.unwrap();
        println!("{q:?} => {:?}", r.message.parts);
    }
}
