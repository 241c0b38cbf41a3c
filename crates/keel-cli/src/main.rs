//! The `keel` command-line tool: run agents, inspect tools and threads.
//!
//! Exit codes are part of the interface (see `docs/cli.md`): 0 done, 1 failed, 2 usage
//! error, 3 clarify_needed, 4 budget_exceeded, 5 unrecoverable_tool_contract,
//! 10 awaiting approval, 130 cancelled.

mod agents;
mod chat;
mod cmd_config;
mod cmd_detective;
mod cmd_eval;
mod cmd_keys;
mod cmd_mcp;
mod cmd_mock_llm;
mod cmd_models;
mod cmd_replay;
mod cmd_responses;
mod cmd_resume;
mod cmd_run;
mod cmd_serve;
mod cmd_stats;
mod cmd_threads;
mod cmd_tools;
mod cmd_trace;
mod cmd_ui;
mod cmd_worker;
mod cmd_workflow;
mod config;
mod eval_setup;
mod models;
mod output;
mod recorded;
mod redaction;
mod scripted;
mod telemetry;
mod terminal_prompt;
mod test_tools;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Exit code for usage errors (bad flags, unknown tools, unreadable files).
pub const EXIT_USAGE: u8 = 2;

/// Keel: durable, observable LLM agents.
#[derive(Debug, Parser)]
#[command(name = "keel", version, about, propagate_version = true)]
struct Cli {
    /// The configuration file (default: ./keel.toml when it exists). See docs/configuration.md.
    #[arg(long, global = true, value_name = "FILE", env = "KEEL_CONFIG")]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an agent on a message and print what happens.
    Run(cmd_run::RunArgs),
    /// Chat with an agent: streaming, tool calls, inline approvals, slash commands
    /// (see docs/chat.md).
    Chat(chat::ChatArgs),
    /// Continue a stored thread's run after a crash or a pause (same JSON as `run`).
    Resume(cmd_resume::ResumeArgs),
    /// Approve a call awaiting approval, then continue the run (unless --no-resume).
    Approve(cmd_resume::DecideArgs),
    /// Deny a call awaiting approval (the model is told), then continue the run.
    Deny(cmd_resume::DecideArgs),
    /// Answer the agent's question: continue the waiting run, or start a new run on the
    /// thread with the answer (after `clarify_needed`).
    Reply(cmd_resume::ReplyArgs),
    /// List, show, fork and delete stored threads.
    Threads {
        #[command(subcommand)]
        command: cmd_threads::ThreadsCommand,
    },
    /// Enqueue a run for `keel worker` processes and print its thread id.
    Submit(cmd_worker::SubmitArgs),
    /// Lease queued runs from the store and drive them (scale-out).
    Worker(cmd_worker::WorkerArgs),
    /// Serve the HTTP chat API (SSE, API keys, tenants) with embedded workers (see
    /// docs/server.md).
    Serve(cmd_serve::ServeArgs),
    /// Create, list and revoke the API keys of `keel serve`.
    Keys {
        #[command(subcommand)]
        command: cmd_keys::KeysCommand,
    },
    /// Inspect the tool catalog.
    Tools {
        #[command(subcommand)]
        command: cmd_tools::ToolsCommand,
    },
    /// Serve a scripted mock LLM on 127.0.0.1 speaking the Anthropic, OpenAI Chat, OpenAI
    /// Responses and Ollama protocols (see docs/mock-llm.md).
    MockLlm(cmd_mock_llm::MockLlmArgs),
    /// Show recorded run traces (timelines of spans, tokens, cost, tool outcomes).
    Trace {
        #[command(subcommand)]
        command: cmd_trace::TraceCommand,
    },
    /// Metrics over the runs in the store (summary or Prometheus text).
    Stats(cmd_stats::StatsArgs),
    /// The trace viewer and dashboard in the browser, over the store and trace files
    /// (loopback only unless --allow-remote; see docs/ui.md).
    Ui(cmd_ui::UiArgs),
    /// MCP: list the servers of keel.toml, or serve Keel's tools over MCP stdio.
    Mcp {
        #[command(subcommand)]
        command: cmd_mcp::McpCommand,
    },
    /// Embedded local models: pull and list.
    Models {
        #[command(subcommand)]
        command: cmd_models::ModelsCommand,
    },
    /// Check keel.toml.
    Config {
        #[command(subcommand)]
        command: cmd_config::ConfigCommand,
    },
    /// Evaluate an agent: run a suite, compare a report with a baseline
    /// (see docs/evaluation.md).
    Eval {
        #[command(subcommand)]
        command: cmd_eval::EvalCommand,
    },
    /// The Detective reference agent's release service.
    Detective {
        #[command(subcommand)]
        command: cmd_detective::DetectiveCommand,
    },
}

/// A failure that maps to an exit code.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub code: u8,
    /// Message for stderr.
    pub message: String,
}

impl CliError {
    /// A usage error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    /// A runtime failure (exit 1).
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keel: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let config_path = cli.config.clone();
    // `keel config check` reports problems itself; everything else needs a valid config.
    if !matches!(cli.command, Command::Config { .. })
        && let Err(error) = config::init(config_path.as_deref())
    {
        eprintln!("keel: {}", redaction::for_stderr(&error.message));
        return ExitCode::from(error.code);
    }
    let _log_guard = start_logging(&cli.command);
    let result = runtime.block_on(async move {
        let result = match cli.command {
            Command::Run(args) => cmd_run::run(args).await,
            Command::Chat(args) => chat::run(args).await,
            Command::Resume(args) => cmd_resume::resume(args).await,
            Command::Approve(args) => cmd_resume::decide(args, true).await,
            Command::Deny(args) => cmd_resume::decide(args, false).await,
            Command::Reply(args) => cmd_resume::reply(args).await,
            Command::Threads { command } => cmd_threads::run(command).await,
            Command::Submit(args) => cmd_worker::submit(args).await,
            Command::Worker(args) => cmd_worker::worker(args).await,
            Command::Serve(args) => cmd_serve::serve(args).await,
            Command::Keys { command } => cmd_keys::run(command).await,
            Command::Tools { command } => cmd_tools::run(command),
            Command::MockLlm(args) => cmd_mock_llm::run(args).await,
            Command::Trace { command } => cmd_trace::run(command),
            Command::Stats(args) => cmd_stats::run(args).await,
            Command::Ui(args) => cmd_ui::run(args).await,
            Command::Mcp {
                command: cmd_mcp::McpCommand::List { json },
            } => cmd_mcp::list(config::get().mcp.servers.clone(), json).await,
            Command::Mcp {
                command: cmd_mcp::McpCommand::Serve { tools },
            } => {
                let catalog = config::app().catalog().await.map_err(config::app_error)?;
                cmd_mcp::serve(catalog.registry, &tools).await
            }
            Command::Models { command } => cmd_models::run(command).await,
            Command::Config { command } => cmd_config::run(command, config_path.as_deref()),
            Command::Detective { command } => cmd_detective::run(command).await,
            Command::Eval { command } => cmd_eval::run(command).await,
        };
        // Bounded: a stuck exporter or MCP server must not keep the process alive.
        let limit = Duration::from_millis(config::get().telemetry.export_timeout_ms)
            + Duration::from_secs(5);
        if tokio::time::timeout(limit, config::shutdown())
            .await
            .is_err()
        {
            eprintln!("keel: telemetry did not stop within {limit:?}; exiting without it");
        }
        if tokio::time::timeout(limit, config::app().shutdown())
            .await
            .is_err()
        {
            eprintln!("keel: MCP servers did not stop within {limit:?}; exiting without them");
        }
        result
    });
    // Dropping a runtime waits for every blocking task without limit; this does not.
    runtime.shutdown_timeout(Duration::from_secs(5));
    // Generations of runs that were cancelled or timed out stop at their next batch of
    // tokens; exiting while one is inside llama.cpp would crash (see the function).
    if !keel_local::wait_until_idle(Duration::from_secs(60)) {
        eprintln!("keel: a local model generation did not stop within 60 s of the end");
    }
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("keel: {}", redaction::for_stderr(&error.message));
            ExitCode::from(error.code)
        }
    }
}

/// Logs from `[telemetry.log]` (or RUST_LOG): human lines on stderr, JSON to a rolling file.
/// Chatty dependencies are capped at `warn` unless RUST_LOG says otherwise. `mcp serve`
/// speaks JSON-RPC on stdout, so it never logs to the console.
fn start_logging(command: &Command) -> Option<keel_telemetry::LogGuard> {
    let mut telemetry = config::get().telemetry.clone();
    if telemetry.log.level == "info" {
        telemetry.log.level = "warn,keel=info".into();
    }
    if matches!(command, Command::Mcp { .. } | Command::Config { .. }) {
        telemetry.log.console = false;
    }
    keel_telemetry::init_logging(&telemetry).ok()
}
