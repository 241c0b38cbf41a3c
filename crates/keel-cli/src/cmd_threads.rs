//! `keel threads list|show|fork|delete`: the stored conversations. A thread is its event
//! log; `show` prints the conversation folded from it and the events themselves, `fork`
//! copies a prefix of the log into a new thread. (Reset = start a new thread with the same
//! agent: `keel run` without `--thread`.)

use chrono::{DateTime, Utc};
use keel_core::store::{ThreadFilter, ThreadStatus, ThreadSummary};
use keel_core::{EndState, Message, Part, RunState};
use keel_runtime::Thread;
use serde_json::json;

use crate::CliError;
use crate::agents::StoreArgs;
use crate::cmd_resume::load_existing;
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
                status: status.as_deref().map(parse_status).transpose()?,
                updated_since: since
                    .as_deref()
                    .map(|s| parse_since(s, Utc::now()))
                    .transpose()?,
                limit,
            };
            let store = store.events().await?;
            let threads = store
                .list_threads(&filter)
                .await
                .map_err(|e| CliError::failure(format!("cannot list threads: {e}")))?;
            match output {
                OutputFormat::Json => println!("{}", json!(threads)),
                OutputFormat::Text => print_list(&threads),
            }
            Ok(0)
        }
        ThreadsCommand::Show {
            thread,
            store,
            output,
        } => {
            let store = store.events().await?;
            let events = store
                .load(&thread)
                .await
                .map_err(|e| CliError::failure(format!("cannot load thread {thread}: {e}")))?;
            let Some(summary) = ThreadSummary::from_events(&thread, &events) else {
                return Err(CliError::failure(format!(
                    "thread {thread} does not exist in this store"
                )));
            };
            let state = RunState::from_events(&thread, &events);
            match output {
                OutputFormat::Json => println!(
                    "{}",
                    json!({
                        "thread": summary,
                        "messages": state.messages(),
                        "events": events,
                    })
                ),
                OutputFormat::Text => {
                    println!(
                        "thread {thread}  {}  {} events",
                        status_name(summary.status),
                        summary.event_count
                    );
                    println!("\n== conversation ==");
                    for message in state.messages() {
                        print_message(message);
                    }
                    println!("\n== events ==");
                    for event in &events {
                        println!(
                            "{:>5}  {}  {}  {}",
                            event.seq,
                            event.ts.format("%H:%M:%S%.3f"),
                            event.run_id,
                            event.kind.name()
                        );
                    }
                }
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
            load_existing(store.as_ref(), &thread).await?;
            let forked = Thread::fork(store.as_ref(), &thread, at)
                .await
                .map_err(|e| {
                    CliError::failure(format!("cannot fork thread {thread} at {at}: {e}"))
                })?;
            let copied = forked.state().next_seq();
            match output {
                OutputFormat::Json => println!(
                    "{}",
                    json!({"thread_id": forked.id(), "forked_from": thread, "at_seq": at, "events": copied})
                ),
                OutputFormat::Text => println!("{}", forked.id()),
            }
            Ok(0)
        }
        ThreadsCommand::Delete {
            thread,
            store,
            output,
        } => {
            let store = store.events().await?;
            let existed = store
                .delete_thread(&thread)
                .await
                .map_err(|e| CliError::failure(format!("cannot delete thread {thread}: {e}")))?;
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

fn status_name(status: ThreadStatus) -> String {
    match status {
        ThreadStatus::Running => "running".into(),
        ThreadStatus::AwaitingApproval => "awaiting_approval".into(),
        ThreadStatus::AwaitingUser => "awaiting_user".into(),
        ThreadStatus::Ended(end_state) => end_state.to_string(),
    }
}

fn parse_status(text: &str) -> Result<ThreadStatus, CliError> {
    let ends = [
        EndState::Done,
        EndState::ClarifyNeeded,
        EndState::BudgetExceeded,
        EndState::UnrecoverableToolContract,
        EndState::Cancelled,
        EndState::Failed,
    ];
    match text {
        "running" => Ok(ThreadStatus::Running),
        "awaiting_approval" => Ok(ThreadStatus::AwaitingApproval),
        "awaiting_user" => Ok(ThreadStatus::AwaitingUser),
        other => ends
            .into_iter()
            .find(|e| e.as_str() == other)
            .map(ThreadStatus::Ended)
            .ok_or_else(|| {
                CliError::usage(format!(
                    "--status {other:?}: use running, awaiting_approval, awaiting_user, {}",
                    ends.map(EndState::as_str).join(", ")
                ))
            }),
    }
}

/// Parses `--since`: an RFC 3339 time or an age (`90s`, `15m`, `2h`, `7d`) before `now`.
fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, CliError> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let bad = || {
        CliError::usage(format!(
            "--since {text:?}: give an RFC 3339 time or an age like 30s, 15m, 2h, 7d"
        ))
    };
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (number, unit) = (
        text.get(..split).ok_or_else(bad)?,
        text.get(split..).ok_or_else(bad)?,
    );
    let n: i64 = number.parse().map_err(|_| bad())?;
    let age = match unit {
        "s" => chrono::Duration::try_seconds(n),
        "m" => chrono::Duration::try_minutes(n),
        "h" => chrono::Duration::try_hours(n),
        "d" => chrono::Duration::try_days(n),
        _ => None,
    }
    .ok_or_else(bad)?;
    now.checked_sub_signed(age).ok_or_else(bad)
}

fn print_list(threads: &[ThreadSummary]) {
    println!(
        "{:<40} {:<18} {:>7}  {:<10} UPDATED",
        "THREAD", "STATUS", "EVENTS", "AGENT"
    );
    for t in threads {
        println!(
            "{:<40} {:<18} {:>7}  {:<10} {}",
            t.thread_id,
            status_name(t.status),
            t.event_count,
            t.agent.as_deref().unwrap_or("-"),
            t.updated_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
}

fn print_message(message: &Message) {
    let role = serde_json::to_value(message.role)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    for part in &message.parts {
        match part {
            Part::Text { text } => println!("{role}: {text}"),
            Part::ToolCall(call) => {
                println!("{role}: → {} {} ({})", call.name, call.arguments, call.id)
            }
            Part::ToolResult(result) => println!(
                "{role}: ← {} ({}): {}",
                result.name, result.call_id, result.content
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn since_accepts_ages_and_times() {
        let now = Utc::now();
        assert_eq!(
            parse_since("2h", now).unwrap(),
            now - chrono::Duration::hours(2)
        );
        assert!(parse_since("2026-01-01T00:00:00Z", now).is_ok());
        assert!(parse_since("2x", now).is_err());
        assert!(parse_since("", now).is_err());
        assert_eq!(
            parse_status("done").unwrap(),
            ThreadStatus::Ended(EndState::Done)
        );
        assert!(parse_status("nope").is_err());
    }
}
