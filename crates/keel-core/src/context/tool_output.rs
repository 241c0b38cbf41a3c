//! Oversized tool results: cut to a configured maximum of characters with seed 001's
//! notice, `[OUTPUT TRUNCATED: Showing X of Y characters from TOOL]`, so the model knows
//! data was lost and can ask for a narrower operation.

use crate::message::{Message, Part};

/// Default maximum characters of one tool result in the context (seed 001).
pub const DEFAULT_MAX_TOOL_RESULT_CHARS: usize = 40_000;

/// A tool result that was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedResult {
    /// The call it answers.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Characters kept.
    pub shown: usize,
    /// Characters the result had.
    pub total: usize,
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The text cut to `max_chars` characters with the notice appended, or `None` when it
/// fits.
pub fn truncate_tool_output(
    text: &str,
    max_chars: usize,
    tool: &str,
) -> Option<(String, usize, usize)> {
    let cut = text.char_indices().nth(max_chars).map(|(byte, _)| byte)?;
    let total = text.chars().count();
    let kept = text.get(..cut).unwrap_or_default();
    Some((
        format!(
            "{kept}\n[OUTPUT TRUNCATED: Showing {} of {} characters from {tool}]",
            thousands(max_chars),
            thousands(total)
        ),
        max_chars,
        total,
    ))
}

/// Cuts every tool result of `message` longer than `max_chars` (what the model sees,
/// `ToolResult::content`; the full outcome stays in the log). Returns what was cut.
pub fn truncate_tool_results(message: &mut Message, max_chars: usize) -> Vec<TruncatedResult> {
    let mut cut = Vec::new();
    for part in &mut message.parts {
        if let Part::ToolResult(result) = part
            && let Some((text, shown, total)) =
                truncate_tool_output(&result.content, max_chars, &result.name)
        {
            // Copies the result only when the log still shares it (it keeps the full text).
            std::sync::Arc::make_mut(result).content = text;
            cut.push(TruncatedResult {
                call_id: result.call_id.clone(),
                tool: result.name.clone(),
                shown,
                total,
            });
        }
    }
    cut
}

/// Whether some tool result of `message` is longer than `max_chars` (cheap: stops at the
/// first one found, counts characters only for results longer than `max_chars` bytes).
pub fn has_oversized_result(message: &Message, max_chars: usize) -> bool {
    message
        .tool_results()
        .any(|r| r.content.len() > max_chars && r.content.chars().nth(max_chars).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_matches_seed_001() {
        let text = "x".repeat(120_000);
        let (cut, shown, total) = truncate_tool_output(&text, 40_000, "bash").unwrap_or_default();
        assert_eq!((shown, total), (40_000, 120_000));
        assert!(
            cut.ends_with("[OUTPUT TRUNCATED: Showing 40,000 of 120,000 characters from bash]")
        );
        assert!(truncate_tool_output("short", 10, "t").is_none());
        let (cut, ..) = truncate_tool_output("héllo wörld", 4, "t").unwrap_or_default();
        assert!(cut.starts_with("héll\n"));
    }
}
