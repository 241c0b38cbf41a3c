//! `keel run`: drive one run of an agent on a message, persisted to the store (SQLite
//! `.keel/keel.db` by default) so the thread can be continued, resumed or approved later.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::{CancellationToken, Message};
use keel_runtime::RunOutcome;
use keel_testkit::ScriptedModel;

use crate::CliError;
use crate::agents::{self, AgentArgs, RecipeExt, StoreArgs};
use crate::output::{self, OutputFormat};

/// Flags of `keel run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Run this keel.toml [workflows.<name>] instead of an agent (see docs/workflows.md);
    /// --model, --base-url, --max-turns and --approve apply to every agent of it.
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,
    /// Continue this thread (created with this id if it does not exist).
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// Output format (default: keel.toml [defaults] output, else text).
    #[arg(long, value_enum)]
    pub output: Option<OutputFormat>,
    /// Record the run as a golden conversation (a cassette: every model response and tool
    /// output) in this JSON file; `keel eval replay FILE` replays it offline.
    #[arg(long, value_name = "FILE", conflicts_with = "workflow")]
    pub record: Option<PathBuf>,
    /// Write every request the scripted model received to this JSON file.
    #[arg(long, value_name = "FILE", requires = "script")]
    pub record_requests: Option<PathBuf>,
    /// The user's message.
    #[arg(value_name = "MESSAGE", required = true)]
    pub message: Vec<String>,
}

/// Runs `keel run`.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    let output = match crate::config::app().output_format(args.output.map(OutputFormat::config)) {
        keel_config::OutputFormat::Json => OutputFormat::Json,
        keel_config::OutputFormat::Text => OutputFormat::Text,
    };
    if let Some(name) = &args.workflow {
        // The same lease a worker takes: no other driver drives this thread meanwhile.
        let (claim, thread) = args
            .store
            .claim_thread(args.thread.as_deref(), "keel run --workflow")
            .await?;
        let outcome = crate::cmd_workflow::run(
            name,
            &args.agent,
            claim.store(),
            thread,
            args.message.join(" "),
            output,
        )
        .await;
        claim.release().await;
        return outcome;
    }
    let spec = args.agent.new_run_spec()?;
    let message = args.message.join(" ");
    if let Some(code) = crate::cmd_responses::run_if_responses(
        &spec,
        &args.store,
        args.thread.as_deref(),
        message.clone(),
        output,
    )
    .await?
    {
        return Ok(code);
    }
    let built = spec.build(0).await?;
    // The same lease a worker takes: no other driver drives this thread meanwhile.
    let (claim, mut thread) = args
        .store
        .claim_thread(args.thread.as_deref(), "keel run")
        .await?;
    let store = claim.store();
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = spec.context(&built, store.clone(), output, true, cancel);
    let message = Message::user(message);
    let outcome = built
        .agent
        .run(vec![message], &mut thread, &context)
        .await
        .map_err(agents::run_error);
    claim.release().await;
    let outcome = outcome?;
    if let Some(path) = &args.record {
        crate::cmd_replay::record(store.as_ref(), &outcome.thread_id, &outcome.run_id, path)
            .await?;
    }
    report(
        &outcome,
        output,
        built.scripted.as_ref(),
        args.record_requests.as_ref(),
    )
}

/// Writes recorded requests (when asked), prints the JSON object in JSON mode (text mode
/// already streamed everything), and returns the exit code.
pub fn report(
    outcome: &RunOutcome,
    format: OutputFormat,
    scripted: Option<&Arc<ScriptedModel>>,
    record_requests: Option<&PathBuf>,
) -> Result<u8, CliError> {
    if let (Some(path), Some(scripted)) = (record_requests, scripted) {
        let json = serde_json::to_string_pretty(&scripted.requests())
            .map_err(|e| CliError::failure(format!("cannot serialize requests: {e}")))?;
        std::fs::write(path, json)
            .map_err(|e| CliError::failure(format!("cannot write {}: {e}", path.display())))?;
    }
    match format {
        OutputFormat::Json => println!("{}", output::outcome_json(outcome)),
        OutputFormat::Text => {
            if let keel_runtime::RunStatus::AwaitingApproval { call_id, tool } = &outcome.status {
                eprintln!(
                    "[paused: {tool} call {call_id} awaits approval — `keel approve {} {call_id}` or `keel deny {} {call_id}`]",
                    outcome.thread_id, outcome.thread_id
                );
            }
            if outcome.resumable {
                eprintln!(
                    "[the model kept failing with a retryable error; continue with `keel resume {}`]",
                    outcome.thread_id
                );
            }
        }
    }
    Ok(output::exit_code(outcome))
}

/// First Ctrl-C cancels the run (it ends `cancelled` with a consistent log); a second one
/// exits immediately.
pub fn spawn_ctrl_c_handler(cancel: CancellationToken) {
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
