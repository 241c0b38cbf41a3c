//! `keel run`: drive one run of an agent on a message.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::{Budget, CancellationToken, EventStore, MemoryStore, Message, ToolRegistry};
use keel_runtime::{Agent, RunContext, Thread};

use crate::CliError;
use crate::models::{self, ModelArgs};
use crate::output::{self, OutputFormat, TextPrinter};

/// Flags of `keel run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Make a tool available (repeatable). See `keel tools list`.
    #[arg(long = "tool", value_name = "NAME")]
    pub tools: Vec<String>,
    /// Maximum model calls in the run.
    #[arg(long, value_name = "N")]
    pub max_turns: Option<u32>,
    /// Continue this thread (created with this id if it does not exist).
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// System instructions for the agent.
    #[arg(long, value_name = "TEXT")]
    pub instructions: Option<String>,
    /// Write every request the scripted model received to this JSON file.
    #[arg(long, value_name = "FILE", requires = "script")]
    pub record_requests: Option<PathBuf>,
    /// The user's message.
    #[arg(value_name = "MESSAGE", required = true)]
    pub message: Vec<String>,
}

/// Runs `keel run`.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    let selected = models::select(&args.model)?;
    let tools = select_tools(&args.tools)?;
    let mut budget = Budget::default();
    if let Some(turns) = args.max_turns {
        if turns == 0 {
            return Err(CliError::usage("--max-turns must be at least 1"));
        }
        budget.max_turns = Some(turns);
    }
    let agent = Agent::builder("keel", selected.model.clone())
        .instructions(args.instructions.clone().unwrap_or_else(|| {
            "You are a helpful assistant. Use the tools when they help; answer concisely.".into()
        }))
        .tools(tools)
        .budget(budget)
        .build();

    let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let mut context = RunContext::new(store.clone()).with_cancel(cancel);
    if args.output == OutputFormat::Text {
        context = context.with_observer(Arc::new(TextPrinter));
    }
    let mut thread = match &args.thread {
        Some(id) => Thread::load(store.as_ref(), id)
            .await
            .map_err(|e| CliError::failure(format!("cannot load thread {id}: {e}")))?,
        None => Thread::new(),
    };
    let message = Message::user(args.message.join(" "));
    let outcome = agent
        .run(vec![message], &mut thread, &context)
        .await
        .map_err(|e| CliError::failure(e.to_string()))?;

    if let (Some(path), Some(scripted)) = (&args.record_requests, &selected.scripted) {
        let json = serde_json::to_string_pretty(&scripted.requests())
            .map_err(|e| CliError::failure(format!("cannot serialize requests: {e}")))?;
        std::fs::write(path, json)
            .map_err(|e| CliError::failure(format!("cannot write {}: {e}", path.display())))?;
    }
    // Text mode already streamed everything through the TextPrinter.
    if args.output == OutputFormat::Json {
        println!("{}", output::outcome_json(&outcome));
    }
    Ok(output::exit_code(&outcome))
}

fn select_tools(names: &[String]) -> Result<ToolRegistry, CliError> {
    let catalog = keel_tools::builtin_registry().map_err(|e| CliError::failure(e.to_string()))?;
    catalog
        .subset(names.iter().map(String::as_str))
        .map_err(|unknown| {
            CliError::usage(format!(
                "unknown tool{} {}; available: {}",
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                catalog.names().collect::<Vec<_>>().join(", ")
            ))
        })
}

/// First Ctrl-C cancels the run (it ends `cancelled` with a consistent log); a second one
/// exits immediately.
fn spawn_ctrl_c_handler(cancel: CancellationToken) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ncancelling… (press Ctrl-C again to exit at once)");
            cancel.cancel();
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
}
