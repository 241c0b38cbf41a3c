//! `keel chat`: an interactive session with an agent. Each entry starts a run on the
//! current thread, streamed as it happens (see `render`); Ctrl-C cancels only that turn
//! (the run ends `cancelled` with a consistent log) and the session continues; Ctrl-D or
//! `/exit` ends the session with exit code 0. Slash commands are in `commands`.

mod commands;
mod input;
mod render;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use keel_core::{CancellationToken, EventStore, Message};
use keel_runtime::{RunContext, RunObserver, RunOutcome, Thread};
use keel_telemetry::TelemetrySink;

use crate::CliError;
use crate::agents::{self, AgentArgs, RecipeExt, StoreArgs};
use commands::{Command, SessionCost};
use input::{Ask, Input, InputHandle};
use render::{ChatPrinter, InlineApprovals, InlineUserInput};

/// The history file, under the working directory.
pub const HISTORY_FILE: &str = ".keel/chat_history";
/// The trace directory, under the working directory, unless keel.toml says otherwise.
pub const TRACE_DIR: &str = ".keel/traces";

/// Flags of `keel chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Continue this thread (created with this id if it does not exist).
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
}

/// Runs `keel chat` until `/exit` or Ctrl-D (exit code 0).
pub async fn run(args: ChatArgs) -> Result<u8, CliError> {
    let spec = args.agent.new_run_spec()?;
    let built = spec.build(0).await?;
    let opened = args.store.open().await?;
    let store = opened.events;
    let thread = match &args.thread {
        Some(id) => Thread::load(store.as_ref(), id)
            .await
            .map_err(|e| CliError::failure(format!("cannot load thread {id}: {e}")))?,
        None => Thread::new(),
    };
    let input = InputHandle::start(PathBuf::from(HISTORY_FILE))
        .map_err(|e| CliError::failure(format!("cannot start the input thread: {e}")))?;
    let printer = Arc::new(ChatPrinter::new());
    let (telemetry, trace_dir) = start_telemetry();
    let mut context = spec
        .base_context(&built, store.clone())
        .with_observer(printer.clone())
        .with_approvals(Arc::new(InlineApprovals::new(
            input.clone(),
            printer.clone(),
        )))
        .with_user_input(Arc::new(InlineUserInput::new(
            input.clone(),
            printer.clone(),
        )));
    if let Some(sink) = &telemetry {
        context = context.with_observer(Arc::new(TraceObserver(sink.clone())));
    }
    let mut session = Session {
        agent: built.agent,
        store,
        queue: opened.queue,
        thread,
        context,
        printer,
        telemetry,
        trace_dir,
        last_trace: None,
        cost: SessionCost::default(),
    };
    session.banner();
    let result = session.repl(&input).await;
    if let Some(sink) = &session.telemetry {
        stop_telemetry(sink, telemetry_shutdown_limit()).await;
    }
    result
}

/// How long the session waits for its telemetry to flush and stop: one OTLP export
/// (`export_timeout_ms` of `[telemetry]`) plus a margin for the trace files.
fn telemetry_shutdown_limit() -> Duration {
    Duration::from_millis(crate::config::get().telemetry.export_timeout_ms) + Duration::from_secs(5)
}

/// Flushes and stops the telemetry sink, giving up after `limit` (the session then exits
/// anyway; trace files may lack their last lines), so `/exit` and Ctrl-D always end the
/// process in bounded time.
async fn stop_telemetry(sink: &TelemetrySink, limit: Duration) {
    stop_within("telemetry", limit, sink.shutdown()).await;
}

/// Awaits a shutdown step for at most `limit`, reporting an error or the timeout on
/// stderr. Returns whether it finished in time.
async fn stop_within<T, E: std::fmt::Display>(
    what: &str,
    limit: Duration,
    stop: impl std::future::Future<Output = Result<T, E>>,
) -> bool {
    match tokio::time::timeout(limit, stop).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) => {
            eprintln!(
                "{}",
                crate::redaction::for_stderr(&format!("keel chat: {what} shutdown: {error}"))
            );
            true
        }
        Err(_) => {
            eprintln!(
                "keel chat: {what} did not stop within {} ms; exiting without it",
                limit.as_millis()
            );
            false
        }
    }
}

/// Telemetry for the session's runs, from `[telemetry]` of keel.toml (with `OTEL_*`
/// variables applied): trace files (default `.keel/traces/<trace_id>.jsonl`) and OTLP export
/// when configured. Returns the sink and the trace directory (`None` when trace files are
/// off); a sink that cannot start is reported and the session runs without telemetry.
fn start_telemetry() -> (Option<Arc<TelemetrySink>>, Option<PathBuf>) {
    let config = match crate::config::get().telemetry.clone().with_process_env() {
        Ok(mut config) => {
            if config.trace_dir.is_none() {
                config.trace_dir = Some(PathBuf::from(TRACE_DIR));
            }
            config
        }
        Err(error) => {
            eprintln!(
                "{}",
                crate::redaction::for_stderr(&format!("keel chat: telemetry disabled: {error}"))
            );
            return (None, None);
        }
    };
    let trace_dir = config
        .trace_dir
        .clone()
        .filter(|dir| !dir.as_os_str().is_empty());
    match TelemetrySink::new(&config) {
        Ok(sink) => (Some(Arc::new(sink)), trace_dir),
        Err(error) => {
            eprintln!(
                "{}",
                crate::redaction::for_stderr(&format!("keel chat: telemetry disabled: {error}"))
            );
            (None, None)
        }
    }
}

/// Forwards events to the telemetry sink (non-blocking).
struct TraceObserver(Arc<TelemetrySink>);

impl RunObserver for TraceObserver {
    fn on_event(&self, event: &keel_core::Event) {
        self.0.record(event);
    }
}

struct Session {
    agent: keel_app::ComposedAgent,
    /// Unfenced: for reading (history, forks). Turns write through their claim's store.
    store: Arc<dyn EventStore>,
    /// Where each turn takes the thread's lease.
    queue: Arc<dyn keel_store::RunQueue>,
    thread: Thread,
    context: RunContext,
    printer: Arc<ChatPrinter>,
    telemetry: Option<Arc<TelemetrySink>>,
    trace_dir: Option<PathBuf>,
    last_trace: Option<String>,
    cost: SessionCost,
}

/// What the loop does after an entry.
enum Next {
    Continue,
    Exit,
}

impl Session {
    fn banner(&self) {
        println!(
            "keel chat · model {} · thread {} · /help for commands, Ctrl-D to exit",
            self.agent.model_id(),
            self.thread.id()
        );
        if self.thread.state().run_in_progress() {
            println!(
                "note: thread {id} has a run in progress (paused or interrupted); finish it with \
                 `keel resume {id}` or start a new thread with /new",
                id = self.thread.id()
            );
        }
    }

    async fn repl(&mut self, input: &InputHandle) -> Result<u8, CliError> {
        loop {
            self.printer.end_line();
            match input.read(Ask::Chat).await {
                Input::Eof => return Ok(0),
                Input::Interrupted => {}
                Input::Line(line) if line.trim().is_empty() => {}
                Input::Line(line) => {
                    let next = match commands::parse(&line) {
                        Some(command) => self.command(command).await,
                        None => {
                            self.turn(line).await;
                            Next::Continue
                        }
                    };
                    if let Next::Exit = next {
                        return Ok(0);
                    }
                }
            }
        }
    }

    /// Takes the thread's lease for one turn (the lease `keel run` and a worker take: no
    /// other driver drives the thread meanwhile; between turns it is free, so `keel approve`
    /// from another terminal can continue a run this session left paused) and brings the
    /// session's copy of the thread up to what the log holds, which another driver may have
    /// extended since the last turn.
    async fn claim_turn(&mut self) -> Result<keel_app::claim::ThreadClaim, String> {
        let claim = keel_app::claim::ThreadClaim::take(
            self.store.clone(),
            self.queue.clone(),
            self.thread.id(),
            "keel chat",
        )
        .await
        .map_err(|e| e.to_string())?;
        let id = self.thread.id().to_string();
        let newer = claim
            .store()
            .load_from(&id, self.thread.state().next_seq())
            .await;
        let caught_up: Result<(), String> = match newer {
            Ok(newer) if newer.is_empty() => Ok(()),
            Ok(_) => Thread::load(claim.store().as_ref(), &id)
                .await
                .map(|thread| self.thread = thread)
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match caught_up {
            Ok(()) => Ok(claim),
            Err(error) => {
                claim.release().await;
                Err(format!("cannot reload thread {id}: {error}"))
            }
        }
    }

    /// One turn: a run on the current thread, cancelled (only it) by Ctrl-C.
    async fn turn(&mut self, text: String) {
        let claim = match self.claim_turn().await {
            Ok(claim) => claim,
            Err(error) => {
                self.printer.line(&format!("error: {error}"));
                return;
            }
        };
        let cancel = CancellationToken::new();
        let mut context = self.context.clone().with_cancel(cancel.clone());
        context.store = claim.store();
        let outcome = {
            let run = self
                .agent
                .run(vec![Message::user(text)], &mut self.thread, &context);
            tokio::pin!(run);
            loop {
                tokio::select! {
                    outcome = &mut run => break outcome,
                    signal = tokio::signal::ctrl_c() => {
                        if signal.is_err() {
                            // No signal handling here: the turn can only run to its end.
                            break run.await;
                        }
                        if !cancel.is_cancelled() {
                            self.printer.line("cancelling this turn…");
                            cancel.cancel();
                        }
                    }
                }
            }
        };
        claim.release().await;
        self.printer.reset();
        match outcome {
            Ok(outcome) => self.record(&outcome),
            Err(error) => {
                let error = agents::run_error(error);
                self.printer.line(&format!("error: {}", error.message));
                // The stored log is the truth: reload so the next turn starts from it.
                match Thread::load(self.store.as_ref(), self.thread.id()).await {
                    Ok(thread) => self.thread = thread,
                    Err(error) => self
                        .printer
                        .line(&format!("error: cannot reload the thread: {error}")),
                }
            }
        }
    }

    fn record(&mut self, outcome: &RunOutcome) {
        self.cost.add(&outcome.usage, outcome.cost_usd);
        if !outcome.trace_id.is_empty() {
            self.last_trace = Some(outcome.trace_id.clone());
        }
        if let keel_runtime::RunStatus::AwaitingApproval { call_id, tool } = &outcome.status {
            self.printer.line(&format!(
                "[paused: {tool} call {call_id} awaits approval — `keel approve {} {call_id}`]",
                outcome.thread_id
            ));
        }
    }

    async fn command(&mut self, command: Command) -> Next {
        match command {
            Command::Exit => return Next::Exit,
            Command::Help => println!("{}", commands::help_text()),
            Command::Unknown(entry) => {
                println!("unknown command {entry}");
                println!("{}", commands::help_text());
            }
            Command::New => {
                self.thread = Thread::new();
                println!("new thread {}", self.thread.id());
            }
            Command::Fork => self.fork().await,
            Command::History => match self.store.load(self.thread.id()).await {
                Ok(events) => print!("{}", commands::render_history(&events)),
                Err(error) => println!("error: cannot load thread {}: {error}", self.thread.id()),
            },
            Command::Trace => self.trace().await,
            Command::Cost => println!("{}", self.cost.render()),
        }
        Next::Continue
    }

    async fn fork(&mut self) {
        let next_seq = self.thread.state().next_seq();
        let Some(last) = next_seq.checked_sub(1) else {
            println!(
                "nothing to fork: thread {} has no events yet",
                self.thread.id()
            );
            return;
        };
        let from = self.thread.id().to_string();
        match Thread::fork(self.store.as_ref(), &from, last).await {
            Ok(forked) => {
                self.thread = forked;
                println!(
                    "forked {from} at event {last} → thread {}",
                    self.thread.id()
                );
            }
            Err(error) => println!("error: cannot fork {from}: {error}"),
        }
    }

    async fn trace(&self) {
        let Some(trace_id) = &self.last_trace else {
            println!("no run yet in this session");
            return;
        };
        println!("trace {trace_id}");
        match (&self.telemetry, &self.trace_dir) {
            (Some(sink), Some(dir)) => {
                if let Err(error) = sink.flush().await {
                    println!("warning: the trace file may be incomplete: {error}");
                }
                let path = keel_telemetry::trace_file_path(dir, trace_id);
                println!("file  {}", path.display());
            }
            _ => println!("(trace files are off in this session)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shutdown step that never finishes (a stuck exporter) must not keep the session
    /// from exiting: it is abandoned at the limit.
    #[tokio::test]
    async fn a_stuck_shutdown_step_is_abandoned_at_its_limit() {
        let stuck = std::future::pending::<Result<(), String>>();
        let finished = tokio::time::timeout(
            Duration::from_secs(60),
            stop_within("stuck", Duration::from_millis(50), stuck),
        )
        .await;
        assert_eq!(finished, Ok(false), "the stuck step was not abandoned");
        let done = stop_within("done", Duration::from_secs(60), async {
            Ok::<_, String>(())
        });
        assert!(done.await);
    }
}
