//! The `summarize` strategy (seed 004 §3 B, seed 001 compaction): past a threshold fraction
//! of the history limit, the oldest messages are summarized into ONE
//! [`Part::Summary`] message by a model call (the agent's model or a cheaper configured
//! one). The first user message and the most recent messages are protected; an earlier
//! summary is folded into the next one. The summary prompt asks to keep decisions, ids,
//! numbers, URLs and open questions, and carries the run's decision log. If the
//! summarization request itself would overflow (or the provider says it does), tool
//! results are pruned middle-out first, then it is summarized.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::units;
use super::{Compaction, CompactionInput, ContextError, ContextStrategy};
use crate::message::{Message, Part, Role};
use crate::model::{Model, ModelErrorKind, ModelRequest, complete, estimate_text_tokens};

/// The summarizer's instructions.
pub const SUMMARY_INSTRUCTIONS: &str = "You compress the earlier part of an AI agent's conversation so the agent can continue the task without it. Write a concise, factual summary in plain text. You MUST keep: every decision taken and why; every identifier (ticket, issue, call, run, file, commit and record ids, names); every number, result and measurement; every URL and path; every open question and unfinished step. Drop pleasantries and repeated or superseded tool output. Do not invent anything. Do not address the user; no preamble.";

/// Marker opening every summary message.
pub const SUMMARY_HEADER: &str = "Summary of the earlier conversation";

/// Summarizes the oldest messages into one summary message.
#[derive(Clone)]
pub struct SummarizeStrategy {
    /// The model that writes summaries (`None`: the agent's model).
    pub summarizer: Option<Arc<dyn Model>>,
    /// Compact once the history passes this fraction of its limit (default 0.8).
    pub threshold: f64,
    /// At most this many most recent messages are kept verbatim (default 6).
    pub keep_recent: usize,
    /// The recent messages kept may take at most this fraction of the limit (default 0.5).
    pub recent_fraction: f64,
    /// Output token limit of the summarization call (default 1024).
    pub max_summary_tokens: u32,
}

impl std::fmt::Debug for SummarizeStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SummarizeStrategy")
            .field("summarizer", &self.summarizer.as_ref().map(|m| m.id()))
            .field("threshold", &self.threshold)
            .field("keep_recent", &self.keep_recent)
            .field("max_summary_tokens", &self.max_summary_tokens)
            .finish()
    }
}

impl Default for SummarizeStrategy {
    fn default() -> Self {
        Self::new(None)
    }
}

/// One line of the transcript given to the summarizer.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    text: String,
    /// A tool result that may be pruned when the summarizer's window is too small.
    tool: Option<String>,
}

impl SummarizeStrategy {
    /// Default settings with this summarizer.
    pub fn new(summarizer: Option<Arc<dyn Model>>) -> Self {
        Self {
            summarizer,
            threshold: 0.8,
            keep_recent: 6,
            recent_fraction: 0.5,
            max_summary_tokens: 1024,
        }
    }

    fn threshold_tokens(&self, limit: u64) -> u64 {
        (limit as f64 * self.threshold.clamp(0.1, 1.0)) as u64
    }

    async fn run(&self, input: CompactionInput<'_>) -> Result<Option<Compaction>, ContextError> {
        let cost = |m: &Message| input.cost(m);
        let units = units::split(input.messages, &cost);
        let total = units::total(&units);
        let limit = input.budget.history_limit();
        if !input.force && total <= self.threshold_tokens(limit) {
            return Ok(None);
        }
        let first_user = units::first_user(&units);
        let recent_budget = input.target(total, self.recent_fraction);
        // The protected recent suffix.
        let last = units.len().checked_sub(1);
        let mut recent_start = units.len();
        let (mut messages_kept, mut tokens_kept) = (0usize, 0u64);
        for (index, unit) in units.iter().enumerate().rev() {
            if Some(index) == first_user {
                break;
            }
            let fits = messages_kept.saturating_add(unit.range.len()) <= self.keep_recent
                && tokens_kept.saturating_add(unit.tokens) <= recent_budget
                && !unit.is_broken();
            if Some(index) != last && !fits {
                break;
            }
            recent_start = index;
            messages_kept = messages_kept.saturating_add(unit.range.len());
            tokens_kept = tokens_kept.saturating_add(unit.tokens);
        }
        let middle: Vec<usize> = (0..recent_start)
            .filter(|i| Some(*i) != first_user)
            .collect();
        if middle.is_empty() {
            // Nothing old enough to summarize: fall back to trimming.
            let keep = vec![true; units.len()];
            return super::finish(&input, &units, keep, false);
        }
        let mut entries = Vec::new();
        for index in &middle {
            if let Some(unit) = units.get(*index) {
                for message in input.messages.get(unit.range.clone()).unwrap_or_default() {
                    render(message, &mut entries);
                }
            }
        }
        let summarizer: &dyn Model = self.summarizer.as_deref().unwrap_or(input.model);
        let (text, usage) = self.summarize(summarizer, entries, input.digest).await?;
        let replaced_messages: usize = middle
            .iter()
            .filter_map(|i| units.get(*i))
            .map(|u| u.range.len())
            .sum();
        let summary = Message {
            role: Role::User,
            parts: vec![Part::Summary {
                text: format!("{SUMMARY_HEADER} ({replaced_messages} messages):\n{text}"),
                replaced: u32::try_from(replaced_messages).unwrap_or(u32::MAX),
            }],
        };
        let summary_tokens = cost(&summary);
        // Assemble: kept units in order, the summary where the first summarized unit was.
        let mut keep: Vec<bool> = (0..units.len()).map(|i| !middle.contains(&i)).collect();
        let mut used = summary_tokens.saturating_add(
            units
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(u, _)| u.tokens)
                .sum::<u64>(),
        );
        // Last resort: drop the oldest protected recent units (never the latest one).
        let mut trimmed = 0usize;
        for index in recent_start..units.len() {
            if used <= limit || Some(index) == last {
                break;
            }
            if let (Some(slot), Some(unit)) = (keep.get_mut(index), units.get(index)) {
                *slot = false;
                used = used.saturating_sub(unit.tokens);
                trimmed = trimmed.saturating_add(unit.range.len());
            }
        }
        if used > limit {
            return Err(super::overflow(&input, used));
        }
        let first_middle = middle.first().copied();
        let mut out = Vec::new();
        let mut replaced: Vec<std::ops::Range<usize>> = Vec::new();
        for (index, unit) in units.iter().enumerate() {
            if Some(index) == first_middle {
                out.push(summary.clone());
            }
            if keep.get(index).copied().unwrap_or(false) {
                out.extend(
                    input
                        .messages
                        .get(unit.range.clone())
                        .unwrap_or_default()
                        .iter()
                        .cloned(),
                );
            } else {
                match replaced.last_mut() {
                    Some(prev) if prev.end == unit.range.start => prev.end = unit.range.end,
                    _ => replaced.push(unit.range.clone()),
                }
            }
        }
        Ok(Some(Compaction {
            messages: out,
            replaced_count: u32::try_from(units::count(&replaced)).unwrap_or(u32::MAX),
            replaced,
            summary_usage: Some(usage),
            trimmed: u32::try_from(trimmed).unwrap_or(u32::MAX),
            tokens_before: total,
            tokens_after: used,
        }))
    }

    /// Calls the summarizer, pruning tool results middle-out when the request would not
    /// fit its window, and once more (harder) if the provider reports an overflow.
    async fn summarize(
        &self,
        model: &dyn Model,
        mut entries: Vec<Entry>,
        digest: &str,
    ) -> Result<(String, crate::message::Usage), ContextError> {
        let caps = model.capabilities();
        let window = u64::from(caps.context_window);
        let output = u64::from(self.max_summary_tokens.min(caps.max_output_tokens.max(1)));
        let limit = window.saturating_sub(output).saturating_sub(window / 10);
        let mut budget = limit;
        for attempt in 0..2 {
            let fixed = {
                let messages = [Message::user(prompt(&[], digest))];
                let request = summary_request(&messages, output);
                model.estimate_tokens(&request)
            };
            prune_middle_out(&mut entries, budget.saturating_sub(fixed));
            let messages = [Message::user(prompt(&entries, digest))];
            let request = summary_request(&messages, output);
            match complete(model, request).await {
                Ok(response) => {
                    let mut text = response.message.text();
                    let max_chars = usize::try_from(output.saturating_mul(4)).unwrap_or(usize::MAX);
                    if let Some((byte, _)) = text.char_indices().nth(max_chars) {
                        text.truncate(byte);
                    }
                    return Ok((text.trim().to_string(), response.usage));
                }
                Err(error) if error.kind == ModelErrorKind::ContextOverflow && attempt == 0 => {
                    budget /= 2;
                }
                Err(error) => return Err(ContextError::Summarizer(error)),
            }
        }
        Err(ContextError::Summarizer(crate::model::ModelError::new(
            ModelErrorKind::ContextOverflow,
            "the summarization request overflowed twice",
        )))
    }
}

fn summary_request(messages: &[Message], max_output: u64) -> ModelRequest<'_> {
    let mut request = ModelRequest::new(messages);
    request.system = Some(SUMMARY_INSTRUCTIONS);
    request.max_output_tokens = Some(u32::try_from(max_output).unwrap_or(u32::MAX));
    request
}

/// The summarization prompt: the transcript, then the run's decision log.
fn prompt(entries: &[Entry], digest: &str) -> String {
    let mut text =
        String::from("Summarize this earlier part of the conversation:\n\n<transcript>\n");
    for entry in entries {
        text.push_str(&entry.text);
        text.push('\n');
    }
    text.push_str("</transcript>\n");
    if !digest.trim().is_empty() {
        text.push_str(
            "\nThe run's working memory (carry its decisions into the summary):\n<working_memory>\n",
        );
        text.push_str(digest.trim_end());
        text.push_str("\n</working_memory>\n");
    }
    text.push_str("\nKeep decisions, ids, numbers, URLs and open questions.");
    text
}

fn render(message: &Message, entries: &mut Vec<Entry>) {
    let plain = |text: String| Entry { text, tool: None };
    for part in &message.parts {
        match (message.role, part) {
            (_, Part::Summary { text, .. }) => {
                entries.push(plain(format!("[earlier summary] {text}")))
            }
            (role, Part::Text { text }) => {
                let who = match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System => "system",
                    Role::Tool => "tool",
                };
                entries.push(plain(format!("{who}: {text}")));
            }
            (_, Part::ToolCall(call)) => entries.push(plain(format!(
                "assistant called `{}` (call {}) with {}",
                call.name, call.id, call.arguments
            ))),
            (_, Part::ToolResult(result)) => entries.push(Entry {
                text: format!(
                    "`{}` (call {}) {}: {}",
                    result.name,
                    result.call_id,
                    if result.is_error() {
                        "FAILED"
                    } else {
                        "returned"
                    },
                    result.content
                ),
                tool: Some(result.name.clone()),
            }),
            (_, Part::ProviderItem { .. }) => {}
        }
    }
}

/// Replaces tool results with a short marker, starting from the middle of the transcript
/// and moving outwards, until the transcript fits `budget` tokens (heuristic count).
fn prune_middle_out(entries: &mut [Entry], budget: u64) {
    let mut total: u64 = entries.iter().map(|e| estimate_text_tokens(&e.text)).sum();
    if total <= budget {
        return;
    }
    let middle = entries.len() / 2;
    let mut order: Vec<usize> = (0..entries.len())
        .filter(|i| entries.get(*i).is_some_and(|e| e.tool.is_some()))
        .collect();
    order.sort_by_key(|i| i.abs_diff(middle));
    for index in order {
        if total <= budget {
            break;
        }
        if let Some(entry) = entries.get_mut(index) {
            let tool = entry.tool.take().unwrap_or_default();
            let before = estimate_text_tokens(&entry.text);
            entry.text = format!(
                "`{tool}` result omitted ({} characters) to fit the summarizer",
                entry.text.len()
            );
            total = total
                .saturating_sub(before)
                .saturating_add(estimate_text_tokens(&entry.text));
        }
    }
}

impl ContextStrategy for SummarizeStrategy {
    fn name(&self) -> &'static str {
        "summarize"
    }

    fn should_compact(&self, history_tokens: u64, budget: &super::TokenBudget) -> bool {
        history_tokens > self.threshold_tokens(budget.history_limit())
    }

    fn compact<'a>(
        &'a self,
        input: CompactionInput<'a>,
    ) -> BoxFuture<'a, Result<Option<Compaction>, ContextError>> {
        Box::pin(self.run(input))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_starts_in_the_middle() {
        let mut entries: Vec<Entry> = (0..5)
            .map(|i| Entry {
                text: format!("{i} {}", "x".repeat(400)),
                tool: Some("t".into()),
            })
            .collect();
        let all: u64 = entries.iter().map(|e| estimate_text_tokens(&e.text)).sum();
        prune_middle_out(&mut entries, all - 50);
        let pruned: Vec<bool> = entries.iter().map(|e| e.tool.is_none()).collect();
        assert_eq!(pruned, [false, false, true, false, false]);
    }

    #[test]
    fn prompt_carries_the_digest_and_the_rules() {
        let text = prompt(
            &[Entry {
                text: "user: hi".into(),
                tool: None,
            }],
            "Decision log:\n- stop\n",
        );
        assert!(text.contains("user: hi") && text.contains("- stop") && text.contains("URLs"));
    }
}
