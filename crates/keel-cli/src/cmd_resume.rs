//! `keel resume`, `keel approve`, `keel deny` and `keel reply`: continue a stored thread
//! from another process — after a crash, a pause for approval, or a question to the user.
//! Each prints the same JSON object as `keel run` and uses the same exit codes.

use std::path::PathBuf;
use std::sync::Arc;

use keel_core::{CancellationToken, EventStore, Message};
use keel_runtime::thread::HumanInputError;
use keel_runtime::{RunOutcome, RunStatus, Thread};
use serde_json::json;

use crate::CliError;
use crate::agents::{self, AgentArgs, AgentSpec, StoreArgs};
use crate::cmd_run::{report, spawn_ctrl_c_handler};
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
    /// Who decided (approve only; recorded in the log).
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

/// Runs `keel resume`: the agent is rebuilt from the run's recorded definition (flags
/// given explicitly override it, with a notice).
pub async fn resume(args: ResumeArgs) -> Result<u8, CliError> {
    let store = args.store.events().await?;
    let id = &args.thread;
    let thread = Thread::load(store.as_ref(), id)
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {id}: {e}")))?;
    if thread.is_empty() {
        return Err(CliError::failure(format!(
            "thread {id} has no events: nothing to resume (start it with `keel run --thread {id} MESSAGE`)"
        )));
    }
    let (outcome, scripted) = continue_thread(&args.agent, store, thread, args.output).await?;
    report(
        &outcome,
        args.output,
        scripted.as_ref(),
        args.record_requests.as_ref(),
    )
}

/// Runs `keel approve` (`approve = true`) or `keel deny`. The log is read once: the
/// decision is recorded on the loaded thread, which then continues.
pub async fn decide(args: DecideArgs, approve: bool) -> Result<u8, CliError> {
    let store = args.store.events().await?;
    let mut thread = load_existing(store.as_ref(), &args.thread).await?;
    let spec = recorded::spec_for_thread(&thread, &args.agent)?;
    if !args.no_resume {
        // Check that the run's agent can be rebuilt and continue it before anything is
        // written.
        let built = spec
            .build(0)
            .await
            .map_err(|e| rebuild_error(&args.thread, e))?;
        built
            .agent
            .check_resumable(&thread)
            .map_err(agents::run_error)?;
    }
    let context = keel_runtime::RunContext::new(store.clone());
    let recorded = if approve {
        thread
            .approve(&context, &args.call_id, args.by.clone())
            .await
    } else {
        thread
            .deny(&context, &args.call_id, args.reason.clone())
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
    let (outcome, scripted) = continue_with(&spec, store, thread, args.output).await?;
    report(&outcome, args.output, scripted.as_ref(), None)
}

/// Runs `keel reply`: answers the question a run in progress waits on and continues it,
/// or — when the last run ended (e.g. `clarify_needed`) — starts a new run on the thread
/// with the answer as the user message, with the agent of the thread's last run.
pub async fn reply(args: ReplyArgs) -> Result<u8, CliError> {
    let store = args.store.events().await?;
    let answer = args.answer.join(" ");
    let mut thread = load_existing(store.as_ref(), &args.thread).await?;
    let spec = recorded::spec_for_thread(&thread, &args.agent)?;
    if thread.state().run_in_progress() {
        let built = spec
            .build(0)
            .await
            .map_err(|e| rebuild_error(&args.thread, e))?;
        built
            .agent
            .check_resumable(&thread)
            .map_err(agents::run_error)?;
        let context = keel_runtime::RunContext::new(store.clone());
        thread
            .answer_user(&context, &answer)
            .await
            .map_err(human_error)?;
        let (outcome, scripted) = continue_with(&spec, store, thread, args.output).await?;
        return report(&outcome, args.output, scripted.as_ref(), None);
    }
    let built = spec
        .build(0)
        .await
        .map_err(|e| rebuild_error(&args.thread, e))?;
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

/// Continues the run in progress on a loaded thread with the agent its log records
/// (explicit `flags` override it) — or, when its last run ended `failed` on a retryable
/// model error, continues the conversation in a new run; when the last run ended
/// otherwise, returns that run's outcome.
pub async fn continue_thread(
    flags: &AgentArgs,
    store: Arc<dyn EventStore>,
    thread: Thread,
    output: OutputFormat,
) -> Result<(RunOutcome, Option<Arc<keel_testkit::ScriptedModel>>), CliError> {
    let spec = recorded::spec_for_thread(&thread, flags)?;
    continue_with(&spec, store, thread, output).await
}

/// Continues the run in progress on `thread` (or the resumable failed run, see
/// [`continue_thread`]) with the agent `spec` builds (a scripted model continues at the
/// step the run reached).
async fn continue_with(
    spec: &AgentSpec,
    store: Arc<dyn EventStore>,
    mut thread: Thread,
    output: OutputFormat,
) -> Result<(RunOutcome, Option<Arc<keel_testkit::ScriptedModel>>), CliError> {
    let thread_id = thread.id().to_string();
    let Some(run) = thread.state().run() else {
        return Err(CliError::failure(format!(
            "thread {thread_id} has no run to resume"
        )));
    };
    let mut steps = agents::consumed_steps(thread.run_events(), &run.run_id);
    if let Some(end_state) = run.ended {
        let outcome = RunOutcome::from_run_events(
            &thread_id,
            &run.run_id,
            thread.run_events(),
            RunStatus::Ended { end_state },
        );
        if !outcome.resumable {
            return Ok((outcome, None));
        }
        eprintln!(
            "keel: run {} ended failed on a retryable model error; continuing the conversation in a new run",
            outcome.run_id
        );
    }
    if spec.script.is_some() {
        steps = script_steps(store.as_ref(), &thread, steps).await?;
    }
    let built = spec
        .build(steps)
        .await
        .map_err(|e| rebuild_error(&thread_id, e))?;
    let cancel = CancellationToken::new();
    spawn_ctrl_c_handler(cancel.clone());
    let context = spec.context(&built, store, output, true, cancel);
    let outcome = built
        .agent
        .resume(&mut thread, &context)
        .await
        .map_err(agents::run_error)?;
    Ok((outcome, built.scripted))
}

/// The script step a resumed run continues at: the model answers of its run plus those of
/// every earlier run it continues (`run_continued` notices), which consumed steps of the
/// same script.
async fn script_steps(
    store: &dyn EventStore,
    thread: &Thread,
    latest: usize,
) -> Result<usize, CliError> {
    let continues = |events: &[keel_core::Event]| {
        events.iter().find_map(|e| match &e.kind {
            keel_core::EventKind::Notice { code, data, .. }
                if code == keel_runtime::runner::RUN_CONTINUED_NOTICE =>
            {
                data.as_ref()
                    .and_then(|d| d.get("continues"))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            }
            _ => None,
        })
    };
    let mut previous = continues(thread.run_events());
    if previous.is_none() {
        return Ok(latest);
    }
    let events = store
        .load(thread.id())
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {}: {e}", thread.id())))?;
    let mut steps = latest;
    let mut seen = std::collections::HashSet::new();
    while let Some(run_id) = previous.filter(|id| seen.insert(id.clone())) {
        steps += agents::consumed_steps(&events, &run_id);
        let run: Vec<keel_core::Event> = events
            .iter()
            .filter(|e| e.run_id == run_id)
            .cloned()
            .collect();
        previous = continues(&run);
    }
    Ok(steps)
}

/// A failure to rebuild a run's agent, said in terms of the thread.
fn rebuild_error(thread_id: &str, error: CliError) -> CliError {
    CliError {
        code: error.code,
        message: format!(
            "cannot rebuild the agent of thread {thread_id}'s run: {}",
            error.message
        ),
    }
}

/// Loads a thread that must exist.
pub async fn load_existing(store: &dyn EventStore, id: &str) -> Result<Thread, CliError> {
    let thread = Thread::load(store, id)
        .await
        .map_err(|e| CliError::failure(format!("cannot load thread {id}: {e}")))?;
    if thread.is_empty() {
        return Err(CliError::failure(format!(
            "thread {id} does not exist in this store"
        )));
    }
    Ok(thread)
}

fn human_error(error: HumanInputError) -> CliError {
    match error {
        HumanInputError::Run(run) => agents::run_error(run),
        other => CliError::failure(format!("{} ({})", other, other.code())),
    }
}
