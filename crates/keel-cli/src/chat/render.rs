//! How `keel chat` shows a turn: assistant text streamed to stdout as it arrives, tool
//! calls and results as compact `→` / `←` lines, a spinner on stderr while a tool runs
//! (only when stderr is a terminal), and approvals / the agent's questions asked inline.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_core::{EndState, Event, EventKind, StreamEvent, ToolCall, ToolResultKind};
use keel_runtime::{ApprovalDecision, ApprovalHandler, RunObserver, UserInputSource};

use super::input::{Ask, Input, InputHandle};

/// Longest tool argument text shown on one line.
const SHOWN_CHARS: usize = 160;
/// Longest tool result (or error message) preview.
const RESULT_CHARS: usize = 72;

#[derive(Default)]
struct State {
    /// Something was printed on the current stdout line (streamed text).
    mid_line: bool,
    /// Tool calls running now: call id → tool name.
    running: BTreeMap<String, String>,
    spinner: Option<ProgressBar>,
}

/// The live printer of a chat session (one per session, shared by its turns).
pub struct ChatPrinter {
    state: Mutex<State>,
    spinner_enabled: bool,
}

impl std::fmt::Debug for ChatPrinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatPrinter")
            .field("spinner_enabled", &self.spinner_enabled)
            .finish_non_exhaustive()
    }
}

impl Default for ChatPrinter {
    fn default() -> Self {
        Self::new()
    }
}

impl ChatPrinter {
    /// A printer; the spinner is on only when stderr is a terminal.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            spinner_enabled: std::io::stderr().is_terminal(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Prints a full line on stdout, after ending a streamed line and around the spinner.
    pub fn line(&self, text: &str) {
        let mut state = self.lock();
        Self::print_line(&mut state, text);
    }

    fn print_line(state: &mut State, text: &str) {
        let mut out = String::new();
        if state.mid_line {
            out.push('\n');
            state.mid_line = false;
        }
        out.push_str(text);
        out.push('\n');
        let write = || {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(out.as_bytes());
            let _ = stdout.flush();
        };
        match &state.spinner {
            Some(spinner) => spinner.suspend(write),
            None => write(),
        }
    }

    /// Stops the spinner (before asking a question, or when a turn ends).
    pub fn clear_spinner(&self) {
        let mut state = self.lock();
        if let Some(spinner) = state.spinner.take() {
            spinner.finish_and_clear();
        }
    }

    /// Ends the current streamed line, if any (before the next prompt).
    pub fn end_line(&self) {
        let mut state = self.lock();
        if state.mid_line {
            state.mid_line = false;
            println!();
        }
    }

    /// Forgets running calls and stops the spinner (a turn ended).
    pub fn reset(&self) {
        let mut state = self.lock();
        state.running.clear();
        if let Some(spinner) = state.spinner.take() {
            spinner.finish_and_clear();
        }
        if state.mid_line {
            state.mid_line = false;
            println!();
        }
    }

    fn update_spinner(&self, state: &mut State) {
        if state.running.is_empty() {
            if let Some(spinner) = state.spinner.take() {
                spinner.finish_and_clear();
            }
            return;
        }
        if !self.spinner_enabled {
            return;
        }
        let names: Vec<&str> = state.running.values().map(String::as_str).collect();
        let message = format!("running {}", names.join(", "));
        let spinner = state.spinner.get_or_insert_with(|| {
            let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
                spinner.set_style(style);
            }
            spinner.enable_steady_tick(Duration::from_millis(100));
            spinner
        });
        spinner.set_message(message);
    }
}

/// Cuts `text` to about `max` bytes (on a character boundary), marking the cut with `…`.
pub fn shorten(text: &str, max: usize) -> String {
    let flat = text.replace('\n', " ");
    if flat.len() <= max {
        return flat;
    }
    let mut cut = max;
    while !flat.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", flat.get(..cut).unwrap_or_default())
}

impl RunObserver for ChatPrinter {
    /// The terminal shows each step as it happens, durable or staged.
    fn live(&self) -> bool {
        true
    }

    fn on_event(&self, event: &Event) {
        let mut state = self.lock();
        match &event.kind {
            EventKind::ToolCallRequested { call, .. } => {
                let line = format!("→ {} {}", call.name, shorten(&call.arguments, SHOWN_CHARS));
                Self::print_line(&mut state, &line);
            }
            EventKind::ToolCallStarted { call_id, name, .. } => {
                state.running.insert(call_id.clone(), name.clone());
                self.update_spinner(&mut state);
            }
            EventKind::ToolCallFinished { result } => {
                state.running.remove(&result.call_id);
                self.update_spinner(&mut state);
                let outcome = &result.outcome;
                let line = match &outcome.result {
                    ToolResultKind::Ok { .. } => format!(
                        "← {} ok {} ms: {}",
                        result.name,
                        outcome.latency_ms,
                        shorten(&result.content, RESULT_CHARS)
                    ),
                    ToolResultKind::Error { code, message, .. } => format!(
                        "← {} error {code} {} ms: {}",
                        result.name,
                        outcome.latency_ms,
                        shorten(message, RESULT_CHARS)
                    ),
                };
                Self::print_line(&mut state, &line);
            }
            EventKind::ApprovalDenied { reason, .. } => {
                let line = match reason {
                    Some(reason) => format!("  (denied: {reason})"),
                    None => "  (denied)".to_string(),
                };
                Self::print_line(&mut state, &line);
            }
            EventKind::Retry {
                scope,
                attempt,
                class,
                wait_ms,
                ..
            } => {
                let line = format!(
                    "  retry {scope} attempt {attempt} after {class}, waiting {wait_ms} ms"
                );
                Self::print_line(&mut state, &line);
            }
            EventKind::ModelFailed { error, .. } => {
                let line = format!("model error: {}: {}", error.kind, error.message);
                Self::print_line(&mut state, &line);
            }
            EventKind::Notice { message, .. } => {
                Self::print_line(&mut state, &format!("note: {message}"));
            }
            EventKind::RunEnded {
                end_state, reason, ..
            } => {
                state.running.clear();
                self.update_spinner(&mut state);
                if *end_state != EndState::Done {
                    let line = match reason {
                        Some(reason) => format!("[{end_state}: {reason}]"),
                        None => format!("[{end_state}]"),
                    };
                    Self::print_line(&mut state, &line);
                }
            }
            _ => {}
        }
    }

    fn on_stream(&self, _thread_id: &str, _run_id: &str, event: &StreamEvent) {
        if let StreamEvent::TextDelta(text) = event {
            if text.is_empty() {
                return;
            }
            let mut state = self.lock();
            let write = || {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(text.as_bytes());
                let _ = stdout.flush();
            };
            match &state.spinner {
                Some(spinner) => spinner.suspend(write),
                None => write(),
            }
            state.mid_line = !text.ends_with('\n');
        }
    }
}

/// Asks for approvals inline: `y` approves; anything else (or Ctrl-C, Ctrl-D) denies.
pub struct InlineApprovals {
    input: InputHandle,
    printer: Arc<ChatPrinter>,
}

impl InlineApprovals {
    /// Asks through the session's input thread, pausing the printer's spinner.
    pub fn new(input: InputHandle, printer: Arc<ChatPrinter>) -> Self {
        Self { input, printer }
    }
}

/// The decision a typed answer means (`y`/`yes` approve; anything else denies).
pub fn decision_from_answer(answer: &Input) -> ApprovalDecision {
    match answer {
        Input::Line(line) => {
            let line = line.trim();
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word.to_ascii_lowercase().as_str() {
                "y" | "yes" => ApprovalDecision::Approve,
                "n" | "no" => ApprovalDecision::Deny {
                    reason: Some(rest.trim().to_string()).filter(|r| !r.is_empty()),
                },
                _ => ApprovalDecision::Deny {
                    reason: Some("not approved by the user".into()),
                },
            }
        }
        Input::Interrupted | Input::Eof => ApprovalDecision::Deny {
            reason: Some("approval interrupted by the user".into()),
        },
    }
}

#[async_trait]
impl ApprovalHandler for InlineApprovals {
    async fn decide(&self, _thread_id: &str, call: &ToolCall) -> ApprovalDecision {
        self.printer.clear_spinner();
        self.printer.end_line();
        let question = format!(
            "approve {} {}? [y/N] ",
            call.name,
            shorten(&call.arguments, SHOWN_CHARS)
        );
        decision_from_answer(&self.input.read(Ask::Question(question)).await)
    }
}

/// Answers the agent's `ask_user` questions inline (Ctrl-C / Ctrl-D leave it unanswered,
/// and the run ends waiting for the answer as the next message).
pub struct InlineUserInput {
    input: InputHandle,
    printer: Arc<ChatPrinter>,
}

impl InlineUserInput {
    /// Asks through the session's input thread.
    pub fn new(input: InputHandle, printer: Arc<ChatPrinter>) -> Self {
        Self { input, printer }
    }
}

#[async_trait]
impl UserInputSource for InlineUserInput {
    async fn answer(
        &self,
        _thread_id: &str,
        question: &str,
        missing_fields: &[String],
    ) -> Option<String> {
        self.printer.clear_spinner();
        let mut shown = format!("? {question}");
        if !missing_fields.is_empty() {
            shown.push_str(&format!(" ({})", missing_fields.join(", ")));
        }
        self.printer.line(&shown);
        match self.input.read(Ask::Question("answer> ".into())).await {
            Input::Line(answer) if !answer.trim().is_empty() => Some(answer),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_decisions() {
        assert_eq!(
            decision_from_answer(&Input::Line("Y".into())),
            ApprovalDecision::Approve
        );
        assert_eq!(
            decision_from_answer(&Input::Line("n too risky".into())),
            ApprovalDecision::Deny {
                reason: Some("too risky".into())
            }
        );
        assert!(matches!(
            decision_from_answer(&Input::Line(String::new())),
            ApprovalDecision::Deny { .. }
        ));
        assert!(matches!(
            decision_from_answer(&Input::Interrupted),
            ApprovalDecision::Deny { .. }
        ));
    }

    #[test]
    fn shorten_cuts_on_char_boundaries() {
        assert_eq!(shorten("abc", 10), "abc");
        assert_eq!(shorten("a\nb", 10), "a b");
        assert_eq!(shorten("ééé", 3), "é…");
    }
}
