//! How `keel` shows a run: live text as events happen, or one JSON object at the end.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use keel_core::{Event, EventKind, StreamEvent, ToolResultKind};
use keel_runtime::RunObserver;
use keel_runtime::outcome::{RunOutcome, RunStatus};

/// `--output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Live, human-readable.
    #[default]
    Text,
    /// One JSON object on stdout at the end.
    Json,
}

impl OutputFormat {
    /// The same format in keel.toml's terms.
    pub fn config(self) -> keel_config::OutputFormat {
        match self {
            Self::Text => keel_config::OutputFormat::Text,
            Self::Json => keel_config::OutputFormat::Json,
        }
    }
}

/// Prints a run live: answer text to stdout as it streams, tool activity to stderr.
#[derive(Debug, Default)]
pub struct TextPrinter;

/// Whether the last text delta printed left stdout in the middle of a line (answers of
/// custom and remote agents end with an `agent_message`, which ends that line).
static STDOUT_MID_LINE: AtomicBool = AtomicBool::new(false);

impl RunObserver for TextPrinter {
    /// The terminal shows each step as it happens, durable or staged.
    fn live(&self) -> bool {
        true
    }

    fn on_event(&self, event: &Event) {
        match &event.kind {
            EventKind::ToolCallRequested { call, .. } => {
                eprintln!("\n→ {} {}", call.name, call.arguments);
            }
            EventKind::ToolCallFinished { result } => match &result.outcome.result {
                ToolResultKind::Ok { .. } => eprintln!(
                    "← {} ok ({} ms, {} attempt{}): {}",
                    result.name,
                    result.outcome.latency_ms,
                    result.outcome.attempts,
                    if result.outcome.attempts == 1 {
                        ""
                    } else {
                        "s"
                    },
                    shorten(&result.content, 300)
                ),
                ToolResultKind::Error { code, message, .. } => {
                    eprintln!(
                        "← {} error {code} ({} attempts): {message}",
                        result.name, result.outcome.attempts
                    )
                }
            },
            EventKind::Retry {
                scope,
                attempt,
                class,
                wait_ms,
                ..
            } => {
                eprintln!("  retry {scope} attempt {attempt} after {class}, waiting {wait_ms} ms");
            }
            EventKind::ApprovalRequested {
                name,
                arguments,
                call_id,
            } => {
                eprintln!("? approval needed for {name} {arguments} (call {call_id})");
            }
            EventKind::ModelFailed { error, .. } => {
                eprintln!(
                    "model error: {}: {}",
                    error.kind,
                    crate::redaction::for_stderr(&error.message)
                );
            }
            EventKind::Notice { message, .. } => {
                eprintln!("note: {}", crate::redaction::for_stderr(message));
            }
            EventKind::ModelResponded { message, .. } if !message.text().is_empty() => {
                STDOUT_MID_LINE.store(false, Ordering::Relaxed);
                println!()
            }
            // A custom or remote agent's answer, streamed as text deltas: end its line.
            EventKind::AgentMessage { .. } if STDOUT_MID_LINE.swap(false, Ordering::Relaxed) => {
                println!()
            }
            EventKind::RunEnded {
                end_state, reason, ..
            } => match reason {
                Some(reason) => eprintln!("[{end_state}: {reason}]"),
                None => eprintln!("[{end_state}]"),
            },
            _ => {}
        }
    }

    fn on_stream(&self, _thread_id: &str, _run_id: &str, event: &StreamEvent) {
        if let StreamEvent::TextDelta(text) = event {
            if !text.is_empty() {
                STDOUT_MID_LINE.store(!text.ends_with('\n'), Ordering::Relaxed);
            }
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", text.get(..cut).unwrap_or_default())
}

/// The `--output json` object: one definition, shared with `keel serve`'s answers.
pub use keel_server::outcome::outcome_json;

/// The exit code for an outcome (see `docs/cli.md`).
pub fn exit_code(outcome: &RunOutcome) -> u8 {
    match &outcome.status {
        RunStatus::Ended { end_state } => u8::try_from(end_state.exit_code()).unwrap_or(1),
        RunStatus::AwaitingApproval { .. } => 10,
    }
}
