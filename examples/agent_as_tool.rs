// Agent as tool: a `research` agent offered to a `lead` agent as a tool. Each call runs
// research on a child thread of the lead's (same store, same trace, its own budget) with
// the `task` the lead's model gives, and returns research's final answer as the result.
// (keel.toml: `agents_as_tools = ["research"]`.) The model is KEEL_MODEL.
use std::sync::Arc;

use keel::core::{Budget, ToolRegistry};
use keel::runtime::{AgentTool, ToolAgent};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::var("KEEL_MODEL").unwrap_or_else(|_| "openai:gpt-4.1-mini".into());
    let model = keel::providers::model_from_spec(&spec, &Default::default())?;
    let research = ToolAgent::builder("research", model.clone())
        .description("Finds one fact. Ask it one precise question.")
        .instructions("Answer with the fact only.")
        .budget(Budget {
            max_turns: Some(4),
            ..Budget::default()
        })
        .build();
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(AgentTool::new(Arc::new(research))))?;
    let lead = ToolAgent::builder("lead", model)
        .instructions("Ask the research tool for facts, then answer in one sentence.")
        .tools(tools)
        .build();
    let agent = keel::Agent::new(lead);
    println!("{}", agent.prompt("What is the capital of France?").await?);
    Ok(())
}
