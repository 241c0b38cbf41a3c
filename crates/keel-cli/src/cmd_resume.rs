//! `keel resume`, `keel approve`, `keel deny` and `keel reply`: continue a stored thread
//! from another process — after a crash, a pause for approval, or a question to the user.
//! Each prints the same JSON object as `keel run` and uses the same exit codes.

use std::path::PathBuf;
use std::sync::Arc;

use keel_app::resume::{self, Latest, Runner};
use keel_core::{CancellationToken, EventStore, Message};
use keel_runtime::thread::HumanInputError;
use keel_runtime::{RunOutcome, Thread};
use keel_testkit::ScriptedModel;
use serde_json::json;

use crate::CliError;
use crate::agents::{self, AgentArgs, AgentSpec, Built, RecipeExt, StoreArgs};
use crate::cmd_run::{report, spawn_ctrl_c_handler};
use crate::config::app_error;
use crate::output::OutputFormat;
use crate::recorded;

/// Flags of `keel resume`.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The thread whose run to continue.
    #[arg(value_name = "THREAD")]
    pub thread: String,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Write every request the scripted model received to this JSON file.
    #[arg(long, value_name = "FILE", requires = "script")]
    pub record_requests: Option<PathBuf>,
    /// UNSAFE: run again a call that started as mutating and was interrupted, when its
    /// tool is now declared repeatable (idempotent, or honouring its idempotency key). The
    /// call may already have taken effect, so its effect may happen twice. Without this
    /// flag the effect its start recorded governs: the call is not run again and the model
    /// is told it may have run.
    #[arg(long)]
    pub rerun_relaxed_calls: bool,
}

/// Flags of `keel approve` / `keel deny`.
#[derive(Debug, clap::Args)]
pub struct DecideArgs {
    /// The thread.
    #[arg(value_name = "THREAD")]
    pub thread: String,
    /// The call awaiting approval (the `awaiting.call_id` of the paused run).
    #[arg(value_name = "CALL_ID")]
    pub call_id: String,
    /// Why (deny only; shown to the model).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Who decided (recorded in the log with the approval or denial).
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Only record the decision; do not continue the run.
    #[arg(long)]
    pub no_resume: bool,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Flags of `keel reply`.
#[derive(Debug, clap::Args)]
pub struct ReplyArgs {
    /// The thread.
    #[arg(value_name = "THREAD")]
    pub thread: String,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// The answer.
    #[arg(value_name = "ANSWER", required = true)]
    pub answer: Vec<String>,
}

/// Runs `keel resume`: whatever ran the thread (a workflow, or the agent its run
/// recorded — flags given explicitly override it, with a notice) continues its run.
pub async fn resume(args: ResumeArgs) -> Result<u8, CliError> {
    let claim = args.store.claim(&args.thread, "keel resume").await?;
    let result = resume_claimed(&args, claim.store()).await;
    claim.release().await;
    result
}

/// [`resume`] under the thread's lease.
async fn resume_claimed(args: &ResumeArgs, store: Arc<dyn EventStore>) -> Result<u8, CliError> {
    let id = &args.thread;
    let thread = Thread::load(store.as_ref(), id)
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {id}: {e}")))?;
    if thread.is_empty() {
        return Err(CliError::failure(format!(
            "thread {id} has no events: nothing to resume (start it with `keel run --thread {id} MESSAGE`)"
        )));
    }
    let recorded = match resume::recorded_runner(&thread).map_err(app_error)? {
        Runner::Workflow(workflow) => {
            return crate::cmd_workflow::resume(workflow, &args.agent, store, thread, args.output)
                .await;
        }
        Runner::Agent(recorded) => recorded,
    };
    let spec = recorded::spec_from(recorded, &args.agent)?;
    let (outcome, scripted) =
        continue_with(&spec, store, thread, args.output, args.rerun_relaxed_calls).await?;
    let record = args.record_requests.as_ref();
    report(&outcome, args.output, scripted.as_ref(), record)
}

/// Runs `keel approve` (`approve = true`) or `keel deny`. The log is read once: the
/// decision is recorded on the loaded thread, which then continues.
pub async fn decide(args: DecideArgs, approve: bool) -> Result<u8, CliError> {
    let command = if approve { "keel approve" } else { "keel deny" };
    let claim = args.store.claim(&args.thread, command).await?;
    let result = decide_claimed(&args, approve, claim.store()).await;
    claim.release().await;
    result
}

/// [`decide`] under the thread's lease.
async fn decide_claimed(
    args: &DecideArgs,
    approve: bool,
    store: Arc<dyn EventStore>,
) -> Result<u8, CliError> {
    let mut thread = load_existing(store.as_ref(), &args.thread).await?;
    let spec = recorded::spec_for_thread(&thread, &args.agent)?;
    if !args.no_resume {
        // Check that the run's agent can be rebuilt and continue it before anything is
        // written.
        rebuild_resumable(&spec, &thread).await?;
    }
    let context = keel_runtime::RunContext::new(store.clone());
    let recorded = if approve {
        let by = args.by.clone();
        thread.approve(&context, &args.call_id, by).await
    } else {
        let reason = args.reason.clone();
        thread
            .deny_by(&context, &args.call_id, reason, args.by.clone())
            .await
    };
    recorded.map_err(human_error)?;
    let decision = if approve { "approved" } else { "denied" };
    if args.no_resume {
        match args.output {
            OutputFormat::Json => println!(
                "{}",
                json!({"thread_id": args.thread, "call_id": args.call_id, "decision": decision})
            ),
            OutputFormat::Text => {
                eprintln!("{decision} call {} on thread {}", args.call_id, args.thread)
            }
        }
        return Ok(0);
    }
    let (outcome, scripted) = continue_with(&spec, store, thread, args.output, false).await?;
    report(&outcome, args.output, scripted.as_ref(), None)
}

/// Runs `keel reply`: answers the question a run in progress waits on and continues it,
/// or — when the last run ended (e.g. `clarify_needed`) — starts a new run on the thread
/// with the answer as the user message, with the agent of the thread's last run.
pub async fn reply(args: ReplyArgs) -> Result<u8, CliError> {
    let claim = args.store.claim(&args.thread, "keel reply").await?;
    let result = reply_claimed(&args, claim.store()).await;
    claim.release().await;
    result
}

/// [`reply`] under the thread's lease.
async fn reply_claimed(args: &ReplyArgs, store: Arc<dyn EventStore>) -> Result<u8, CliError> {
    let answer = args.answer.join(" ");
    let mut thread = load_existing(store.as_ref(), &args.thread).await?;
    let spec = recorded::spec_for_thread(&thread, &args.agent)?;
    if thread.state().run_in_progress() {
        rebuild_resumable(&spec, &thread).await?;
        let context = keel_runtime::RunContext::new(store.clone());
        thread
            .answer_user(&context, &answer)
            .await
            .map_err(human_error)?;
        let (outcome, scripted) = continue_with(&spec, store, thread, args.output, false).await?;
        return report(&outcome, args.output, scripted.as_ref(), None);
    }
    let built = rebuild(&spec, thread.id(), 0).await?;
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = spec.context(&built, store, args.output, true, cancel);
    let outcome = built
        .agent
        .run(vec![Message::user(answer)], &mut thread, &context)
        .await
        .map_err(agents::run_error)?;
    report(&outcome, args.output, built.scripted.as_ref(), None)
}

/// Continues the run in progress on `thread` — or, when its last run ended `failed` on a
/// retryable model error, the conversation in a new run — with the agent `spec` builds
/// (a scripted model continues at the step the run reached); when the last run ended
/// otherwise, returns that run's outcome.
async fn continue_with(
    spec: &AgentSpec,
    store: Arc<dyn EventStore>,
    mut thread: Thread,
    output: OutputFormat,
    rerun_relaxed_calls: bool,
) -> Result<(RunOutcome, Option<Arc<ScriptedModel>>), CliError> {
    let mut steps = match resume::latest_run(&thread).map_err(app_error)? {
        Latest::Ended(outcome) => return Ok((*outcome, None)),
        Latest::Continue {
            consumed_steps,
            notice,
            ..
        } => {
            if let Some(notice) = notice {
                eprintln!("keel: {notice}");
            }
            consumed_steps
        }
    };
    if spec.script.is_some() {
        steps = resume::script_steps(store.as_ref(), &thread, steps)
            .await
            .map_err(app_error)?;
    }
    let built = rebuild(spec, thread.id(), steps).await?;
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = spec
        .context(&built, store, output, true, cancel)
        .with_rerun_relaxed_calls(rerun_relaxed_calls);
    let outcome = built
        .agent
        .resume(&mut thread, &context)
        .await
        .map_err(agents::run_error)?;
    Ok((outcome, built.scripted))
}

/// Builds the agent of `spec` (a failure said in terms of the thread).
async fn rebuild(spec: &AgentSpec, thread_id: &str, steps: usize) -> Result<Built, CliError> {
    spec.build(steps).await.map_err(|error| CliError {
        code: error.code,
        message: format!(
            "cannot rebuild the agent of thread {thread_id}'s run: {}",
            error.message
        ),
    })
}

/// Checks that the agent of `spec` can be rebuilt and continue `thread`'s run.
async fn rebuild_resumable(spec: &AgentSpec, thread: &Thread) -> Result<(), CliError> {
    let built = rebuild(spec, thread.id(), 0).await?;
    built
        .agent
        .check_resumable(thread)
        .map_err(agents::run_error)?;
    Ok(())
}

/// Loads a thread that must exist.
async fn load_existing(store: &dyn EventStore, id: &str) -> Result<Thread, CliError> {
    resume::load_existing(store, id).await.map_err(app_error)
}

fn human_error(error: HumanInputError) -> CliError {
    match error {
        HumanInputError::Run(run) => agents::run_error(run),
        other => CliError::failure(format!("{} ({})", other, other.code())),
    }
}
