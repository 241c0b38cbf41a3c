//! `keel threads list|show|fork|delete`: the stored conversations. A thread is its event
//! log; `show` prints the conversation folded from it and the events themselves, `fork`
//! copies a prefix of the log into a new thread. (Reset = start a new thread with the same
//! agent: `keel run` without `--thread`.) The queries and text renderings are
//! [`keel_app::threads`]; this file is the flags, printing and exit codes.

use chrono::Utc;
use keel_app::threads::{self, ThreadsError};
use keel_core::store::ThreadFilter;
use serde_json::json;

use crate::CliError;
use crate::agents::StoreArgs;
use crate::output::OutputFormat;

/// `keel threads` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ThreadsCommand {
    /// List threads, most recently updated first.
    List {
        /// Only threads whose latest run used this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only threads in this status: running, awaiting_approval, awaiting_user, or an end
        /// state (done, failed, clarify_needed, budget_exceeded, cancelled, …).
        #[arg(long)]
        status: Option<String>,
        /// Only threads updated since: RFC 3339 time, or an age like 30s, 15m, 2h, 7d.
        #[arg(long)]
        since: Option<String>,
        /// At most N threads.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Print a thread's conversation and its events.
    Show {
        /// The thread.
        thread: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Copy events 0..=SEQ of a thread into a new thread and print its id.
    Fork {
        /// The thread.
        thread: String,
        /// The last event (by seq) to copy.
        #[arg(long, value_name = "SEQ")]
        at: u64,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Delete a thread and its events.
    Delete {
        /// The thread.
        thread: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
}

/// Runs a `keel threads` subcommand.
pub async fn run(command: ThreadsCommand) -> Result<u8, CliError> {
    match command {
        ThreadsCommand::List {
            agent,
            status,
            since,
            limit,
            store,
            output,
        } => {
            let filter = ThreadFilter {
                agent,
                status: status
                    .as_deref()
                    .map(threads::parse_status)
                    .transpose()
                    .map_err(|e| CliError::usage(format!("--status {e}")))?,
                updated_since: since
                    .as_deref()
                    .map(|s| threads::parse_since(s, Utc::now()))
                    .transpose()
                    .map_err(|e| CliError::usage(format!("--since {e}")))?,
                limit,
                id_prefix: None,
            };
            let store = store.events().await?;
            let list = threads::list(store.as_ref(), &filter)
                .await
                .map_err(failure)?;
            match output {
                OutputFormat::Json => println!("{}", json!(list)),
                OutputFormat::Text => print_lines(&threads::render_list(&list)),
            }
            Ok(0)
        }
        ThreadsCommand::Show {
            thread,
            store,
            output,
        } => {
            let store = store.events().await?;
            let view = threads::show(store.as_ref(), &thread)
                .await
                .map_err(failure)?;
            match output {
                OutputFormat::Json => println!("{}", view.to_json()),
                OutputFormat::Text => print_lines(&threads::render_view(&view)),
            }
            Ok(0)
        }
        ThreadsCommand::Fork {
            thread,
            at,
            store,
            output,
        } => {
            let store = store.events().await?;
            let forked = threads::fork(store.as_ref(), &thread, at)
                .await
                .map_err(failure)?;
            match output {
                OutputFormat::Json => println!("{}", forked.to_json()),
                OutputFormat::Text => println!("{}", forked.thread_id),
            }
            Ok(0)
        }
        ThreadsCommand::Delete {
            thread,
            store,
            output,
        } => {
            let store = store.events().await?;
            let existed = threads::delete(store.as_ref(), &thread)
                .await
                .map_err(failure)?;
            match output {
                OutputFormat::Json => {
                    println!("{}", json!({"thread_id": thread, "deleted": existed}))
                }
                OutputFormat::Text if existed => eprintln!("deleted thread {thread}"),
                OutputFormat::Text => eprintln!("thread {thread} did not exist"),
            }
            Ok(if existed { 0 } else { 1 })
        }
    }
}

/// A thread query that failed at run time (exit 1).
fn failure(error: ThreadsError) -> CliError {
    CliError::failure(error.to_string())
}

fn print_lines(lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
}
