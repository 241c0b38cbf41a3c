//! `keel run --workflow NAME` and `keel resume` of a workflow thread: thin wiring over
//! [`keel_app::workflow`] — the workflow is built from keel.toml (agent flags `--model`,
//! `--base-url`, `--max-turns` apply to every agent of it), run or resumed with the same
//! observers, approvals and cancellation as an agent's run, and reported the same way.

use std::io::IsTerminal;
use std::sync::Arc;

use keel_app::workflow::WorkflowRequest;
use keel_core::{CancellationToken, EventStore, Message};
use keel_runtime::{Agent, RunContext, Thread};

use crate::CliError;
use crate::agents::{self, AgentArgs, ApproveFlag};
use crate::cmd_run::{report, spawn_ctrl_c_handler};
use crate::config::{app, app_error};
use crate::output::{OutputFormat, TextPrinter};

/// The agent flags that make no sense for a workflow (its agents come from keel.toml).
fn refuse_agent_flags(flags: &AgentArgs) -> Result<(), CliError> {
    let given: Vec<&str> = [
        ("--agent", flags.agent.is_some()),
        ("--tool", !flags.tools.is_empty()),
        ("--instructions", flags.instructions.is_some()),
        ("--script", flags.model.script.is_some()),
        ("--context-strategy", flags.context_strategy.is_some()),
        ("--context-window", flags.context_window.is_some()),
        ("--max-output-tokens", flags.max_output_tokens.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect();
    if given.is_empty() {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "{} cannot be used with a workflow: its agents are the ones keel.toml \
             [workflows.<name>] names (--model, --base-url, --max-turns and --approve apply \
             to all of them)",
            given.join(", ")
        )))
    }
}

/// The run context of a workflow run: keel.toml's approval modes (`--approve` over
/// them), the live printer in text mode, telemetry, an approval prompt on a terminal.
fn context(
    flags: &AgentArgs,
    store: Arc<dyn EventStore>,
    output: OutputFormat,
    cancel: CancellationToken,
) -> RunContext {
    let mut context = app()
        .run_context(store, flags.approve.map(ApproveFlag::mode), None)
        .with_cancel(cancel);
    if output == OutputFormat::Text {
        context = context.with_observer(Arc::new(TextPrinter));
    }
    if let Some(telemetry) = crate::config::telemetry_observer() {
        context = context.with_observer(telemetry);
    }
    if std::io::stdin().is_terminal() {
        context = context.with_approvals(Arc::new(crate::terminal_prompt::TerminalPrompt));
    }
    context
}

/// `keel run --workflow NAME MESSAGE`.
pub async fn run(
    name: &str,
    flags: &AgentArgs,
    store: Arc<dyn EventStore>,
    thread: Thread,
    message: String,
    output: OutputFormat,
) -> Result<u8, CliError> {
    refuse_agent_flags(flags)?;
    let request = WorkflowRequest::new(name).with_overrides(
        flags.model.model.clone(),
        flags.model.base_url.clone(),
        flags.max_turns,
    );
    let workflow = app().workflow(&request).await.map_err(app_error)?;
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = context(flags, store, output, cancel);
    let mut thread = thread;
    let outcome = workflow
        .run(vec![Message::user(message)], &mut thread, &context)
        .await
        .map_err(agents::run_error)?;
    report(&outcome, output, None, None)
}

/// `keel resume THREAD` of a workflow thread: the workflow its run recorded (explicit
/// `--model`, `--base-url`, `--max-turns` override the recorded ones), continued where
/// it stopped; a run that already ended reports its outcome.
pub async fn resume(
    recorded: WorkflowRequest,
    flags: &AgentArgs,
    store: Arc<dyn EventStore>,
    mut thread: Thread,
    output: OutputFormat,
) -> Result<u8, CliError> {
    refuse_agent_flags(flags)?;
    let thread_id = thread.id().to_string();
    if let Some(outcome) = keel_app::resume::ended_outcome(&thread) {
        return report(&outcome, output, None, None);
    }
    let request = recorded.with_overrides(
        flags.model.model.clone(),
        flags.model.base_url.clone(),
        flags.max_turns,
    );
    let workflow = app().workflow(&request).await.map_err(|e| {
        let error = app_error(e);
        CliError {
            code: error.code,
            message: format!(
                "cannot rebuild workflow `{}` of thread {thread_id}: {}",
                request.workflow, error.message
            ),
        }
    })?;
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = context(flags, store, output, cancel);
    let outcome = workflow
        .resume(&mut thread, &context)
        .await
        .map_err(agents::run_error)?;
    report(&outcome, output, None, None)
}
