//! The approval prompt of `keel run` on a terminal.

use std::io::{BufRead, Write};

use async_trait::async_trait;
use keel_core::ToolCall;
use keel_runtime::{ApprovalDecision, ApprovalHandler};

/// Asks on the terminal: `y` approves, `n` (optionally followed by a reason) denies, an
/// empty line or end of input defers (the run pauses, exit 10).
pub struct TerminalPrompt;

#[async_trait]
impl ApprovalHandler for TerminalPrompt {
    async fn decide(&self, _thread_id: &str, call: &ToolCall) -> ApprovalDecision {
        let prompt = format!(
            "approve {} {} (call {})? [y]es / [n]o [reason] / Enter to decide later: ",
            call.name, call.arguments, call.id
        );
        let line = tokio::task::spawn_blocking(move || {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(prompt.as_bytes());
            let _ = stderr.flush();
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line),
            }
        })
        .await
        .ok()
        .flatten();
        let Some(line) = line else {
            return ApprovalDecision::Defer;
        };
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word.to_ascii_lowercase().as_str() {
            "y" | "yes" => ApprovalDecision::Approve,
            "n" | "no" => ApprovalDecision::Deny {
                reason: Some(rest.trim().to_string()).filter(|r| !r.is_empty()),
            },
            _ => ApprovalDecision::Defer,
        }
    }
}
