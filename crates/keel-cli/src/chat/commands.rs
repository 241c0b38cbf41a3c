//! The slash commands of `keel chat` (`/new`, `/fork`, `/history`, `/trace`, `/cost`,
//! `/help`, `/exit`): parsing, and rendering the conversation and the session's cost.

use keel_core::{Event, EventKind, ToolResultKind, Usage};

use super::render::shorten;

/// A slash command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a new thread.
    New,
    /// Fork the current thread at its last event and switch to the fork.
    Fork,
    /// Print the conversation of the current thread.
    History,
    /// Print the last run's trace id and trace file.
    Trace,
    /// Print the session's tokens and cost.
    Cost,
    /// Print the commands.
    Help,
    /// End the session.
    Exit,
    /// Something else starting with `/`.
    Unknown(String),
}

/// The commands and what they do, for `/help`.
pub const HELP: &[(&str, &str)] = &[
    ("/new", "start a new thread"),
    (
        "/fork",
        "fork the current thread at its last event and switch to the fork",
    ),
    ("/history", "print the conversation of the current thread"),
    ("/trace", "print the last run's trace id and trace file"),
    ("/cost", "print the tokens and cost of this session"),
    ("/help", "print this list"),
    ("/exit", "end the session (or Ctrl-D)"),
];

/// The help text (also printed for unknown commands).
pub fn help_text() -> String {
    let mut text = String::from("commands:\n");
    for (name, what) in HELP {
        text.push_str(&format!("  {name:<10} {what}\n"));
    }
    text.push_str("  end a line with \\ to continue on the next; Ctrl-C cancels a turn");
    text
}

/// The command an entry is, or `None` when it is a message for the agent.
pub fn parse(entry: &str) -> Option<Command> {
    let trimmed = entry.trim();
    let rest = trimmed.strip_prefix('/')?;
    let word = rest.split_whitespace().next().unwrap_or_default();
    Some(match word.to_ascii_lowercase().as_str() {
        "new" | "reset" => Command::New,
        "fork" => Command::Fork,
        "history" => Command::History,
        "trace" => Command::Trace,
        "cost" => Command::Cost,
        "help" | "?" => Command::Help,
        "exit" | "quit" => Command::Exit,
        _ => Command::Unknown(trimmed.to_string()),
    })
}

/// The conversation in a thread's log, one block per message, for `/history`.
pub fn render_history(events: &[Event]) -> String {
    let mut out = String::new();
    for event in events {
        match &event.kind {
            EventKind::UserMessage { message } => {
                out.push_str(&format!("you> {}\n", message.text()));
            }
            EventKind::ModelResponded { message, .. } => {
                let text = message.text();
                if !text.is_empty() {
                    out.push_str(&format!("assistant> {text}\n"));
                }
                for call in message.tool_calls() {
                    out.push_str(&format!(
                        "  → {} {}\n",
                        call.name,
                        shorten(&call.arguments, 160)
                    ));
                }
            }
            EventKind::ToolCallFinished { result } => {
                let status = match &result.outcome.result {
                    ToolResultKind::Ok { .. } => "ok".to_string(),
                    ToolResultKind::Error { code, .. } => format!("error {code}"),
                };
                out.push_str(&format!(
                    "  ← {} {status}: {}\n",
                    result.name,
                    shorten(&result.content, 160)
                ));
            }
            EventKind::UserAnswered { answer } => {
                out.push_str(&format!("you (answer)> {answer}\n"));
            }
            EventKind::RunEnded { end_state, .. } if *end_state != keel_core::EndState::Done => {
                out.push_str(&format!("  [{end_state}]\n"));
            }
            _ => {}
        }
    }
    if out.is_empty() {
        out.push_str("(no messages yet)\n");
    }
    out
}

/// Tokens and cost of the session, summed over its runs' outcomes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionCost {
    /// Runs counted.
    pub runs: u32,
    /// Token usage.
    pub usage: Usage,
    /// Cost in US dollars, when any run reported one.
    pub cost_usd: Option<f64>,
    /// Runs whose cost was unknown.
    pub runs_without_cost: u32,
}

impl SessionCost {
    /// Adds one run.
    pub fn add(&mut self, usage: &Usage, cost_usd: Option<f64>) {
        self.runs += 1;
        self.usage.add(usage);
        match cost_usd {
            Some(cost) => *self.cost_usd.get_or_insert(0.0) += cost,
            None => self.runs_without_cost += 1,
        }
    }

    /// The `/cost` text.
    pub fn render(&self) -> String {
        let cost = match self.cost_usd {
            Some(cost) if self.runs_without_cost == 0 => format!("${cost:.6}"),
            Some(cost) => format!(
                "${cost:.6} (+ {} run(s) with unknown cost)",
                self.runs_without_cost
            ),
            None => "unknown (the model reports no prices)".to_string(),
        };
        format!(
            "{} run(s): {} input tokens ({} cached), {} output tokens, {} total; cost {cost}",
            self.runs,
            self.usage.input_tokens,
            self.usage.cache_read_tokens,
            self.usage.output_tokens,
            self.usage.total()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands() {
        assert_eq!(parse("/new"), Some(Command::New));
        assert_eq!(parse("  /EXIT "), Some(Command::Exit));
        assert_eq!(parse("/fork now"), Some(Command::Fork));
        assert_eq!(parse("/bogus"), Some(Command::Unknown("/bogus".into())));
        assert_eq!(parse("hello /new"), None);
        assert!(help_text().contains("/history"));
    }

    #[test]
    fn cost_sums_runs() {
        let mut cost = SessionCost::default();
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        };
        cost.add(&usage, Some(0.5));
        cost.add(&usage, None);
        assert_eq!(cost.usage.total(), 30);
        assert_eq!(cost.cost_usd, Some(0.5));
        assert!(cost.render().contains("2 run(s)"));
        assert!(cost.render().contains("unknown cost"));
    }
}
