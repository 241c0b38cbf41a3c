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
    /// Print a run's timeline: durations, tokens, cost, tool outcomes, retries, end state.
    Show {
        /// A trace id (or a unique prefix of one).
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
            let records = keel_telemetry::read_trace(&dir, &id).map_err(|e| {
                CliError::usage(format!(
                    "trace {id} in {}: {e} (see `keel trace list`)",
                    dir.display()
                ))
            })?;
            print!("{}", keel_telemetry::render_timeline(&records));
            Ok(0)
        }
    }
}
