//! `keel trace list|show`: read the per-run trace files (`.keel/traces/<trace_id>.jsonl`).

use std::path::PathBuf;

use crate::CliError;

/// `keel trace` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TraceCommand {
    /// List recorded traces, newest first.
    List {
        /// The trace directory.
        #[arg(long, value_name = "DIR", default_value = ".keel/traces")]
        dir: PathBuf,
    },
    /// Print a run's timeline: durations, tokens, cost, tool outcomes, retries, end state,
    /// and its spans as a tree (agents called as tools and handoff targets nested under
    /// the call that started them).
    Show {
        /// A trace id (or a unique prefix of one), or a thread id: every trace of the
        /// thread, oldest first.
        id: String,
        /// The trace directory.
        #[arg(long, value_name = "DIR", default_value = ".keel/traces")]
        dir: PathBuf,
    },
}

/// Runs `keel trace ...`.
pub fn run(command: TraceCommand) -> Result<u8, CliError> {
    match command {
        TraceCommand::List { dir } => {
            let traces = keel_telemetry::list_traces(&dir).map_err(|e| {
                CliError::failure(format!("cannot list traces in {}: {e}", dir.display()))
            })?;
            print!("{}", keel_telemetry::render_trace_list(&traces));
            Ok(0)
        }
        TraceCommand::Show { id, dir } => {
            let records = match keel_telemetry::read_trace(&dir, &id) {
                Ok(records) => vec![records],
                Err(e) => {
                    let of_thread =
                        keel_telemetry::read_thread_traces(&dir, &id).unwrap_or_default();
                    if of_thread.is_empty() {
                        return Err(CliError::usage(format!(
                            "trace {id} in {}: {e} (see `keel trace list`)",
                            dir.display()
                        )));
                    }
                    of_thread
                }
            };
            let rendered: Vec<String> = records
                .iter()
                .map(|r| keel_telemetry::render_timeline(r))
                .collect();
            print!("{}", rendered.join("\n"));
            Ok(0)
        }
    }
}
