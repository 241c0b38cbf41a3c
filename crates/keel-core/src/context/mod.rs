//! Context window management (seed 004 §3, seed 001): keeping what the model sees within
//! its context window over long runs.
//!
//! - [`budget`]: the token budget of a request, corrected by provider-reported usage;
//! - [`units`]: messages grouped so a tool call and its result are kept or dropped together;
//! - [`ContextStrategy`] and its three implementations: [`TruncateStrategy`] (first user
//!   message plus the most recent messages that fit), [`SummarizeStrategy`] (older messages
//!   summarized into one [`Part::Summary`](crate::Part::Summary) message by a model call),
//!   [`ImportanceStrategy`] (lowest-scored units dropped first);
//! - [`tool_output`]: oversized tool results cut with seed 001's notice.
//!
//! Strategies are pure apart from the summarizer's model call: they take the context and
//! return a new one plus what was replaced. The runner in `keel-runtime` decides when to
//! call them and records the result as a `Compacted` event (the originals stay in the log).

pub mod budget;
pub mod importance;
pub mod summarize;
pub mod tool_output;
pub mod truncate;
pub mod units;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::message::{Message, Usage};
use crate::model::{Model, ModelError};

pub use budget::TokenBudget;
pub use importance::ImportanceStrategy;
pub use summarize::SummarizeStrategy;
pub use tool_output::{truncate_tool_output, truncate_tool_results};
pub use truncate::TruncateStrategy;

/// `Notice` code recorded when history had to be trimmed beyond what the strategy planned.
pub const HISTORY_TRIMMED_NOTICE: &str = "history_trimmed";
/// `Notice` code recorded when a tool result was cut to the configured maximum.
pub const TOOL_RESULT_TRUNCATED_NOTICE: &str = "tool_result_truncated";
/// `Notice` code recorded alongside every `Compacted` event, naming the replaced ranges.
pub const CONTEXT_COMPACTED_NOTICE: &str = "context_compacted";
/// `Notice` code recorded when the provider reported a context overflow.
pub const CONTEXT_OVERFLOW_NOTICE: &str = "context_overflow";

/// After compacting, a strategy aims at this fraction of the history limit so it does not
/// compact again on the very next step.
pub const DEFAULT_TARGET_FRACTION: f64 = 0.75;

/// What a strategy gets to work on.
pub struct CompactionInput<'a> {
    /// The current context (as `RunState::messages()`).
    pub messages: &'a [Message],
    /// The budget of the request this context is for.
    pub budget: TokenBudget,
    /// The agent's model: estimates tokens, and summarizes when no summarizer is set.
    pub model: &'a dyn Model,
    /// The run's working-memory digest (observations and decision log).
    pub digest: &'a str,
    /// Compact even if the context looks like it fits (the provider said it does not).
    pub force: bool,
}

impl fmt::Debug for CompactionInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactionInput")
            .field("messages", &self.messages.len())
            .field("budget", &self.budget)
            .field("force", &self.force)
            .finish_non_exhaustive()
    }
}

impl CompactionInput<'_> {
    /// A message's tokens as the model estimates them, corrected.
    pub fn cost(&self, message: &Message) -> u64 {
        self.budget
            .corrected(budget::message_tokens(self.model, message))
    }

    /// The history limit to aim for: a fraction of the limit normally, and when forced at
    /// most three quarters of the current size (the provider disagreed with our estimate).
    pub fn target(&self, current: u64, fraction: f64) -> u64 {
        let limit = self.budget.history_limit();
        let aimed = (limit as f64 * fraction.clamp(0.1, 1.0)) as u64;
        if self.force {
            aimed.min(current.saturating_mul(3) / 4)
        } else {
            aimed
        }
    }
}

/// A new context produced by a strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// The context after compaction.
    pub messages: Vec<Message>,
    /// Ranges of the input context that were replaced (dropped or summarized).
    pub replaced: Vec<Range<usize>>,
    /// Messages replaced in all (including by the final trim).
    pub replaced_count: u32,
    /// Token usage of the summarization call, if one was made.
    pub summary_usage: Option<Usage>,
    /// Messages dropped beyond the strategy's plan because the context still did not fit.
    pub trimmed: u32,
    /// Estimated (corrected) history tokens before and after.
    pub tokens_before: u64,
    /// See `tokens_before`.
    pub tokens_after: u64,
}

/// Why a compaction could not produce a context that fits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContextError {
    /// Even the smallest context (the first user message and the latest exchange) is
    /// larger than the limit.
    #[error(
        "the request needs about {request_tokens} tokens but the limit is {limit_tokens} tokens (context window {context_window}, {reserved_output} reserved for output, 10% safety margin); shorten the input, raise the context window, or lower max_output_tokens"
    )]
    Overflow {
        /// Estimated tokens of the smallest request that could be built.
        request_tokens: u64,
        /// The request limit.
        limit_tokens: u64,
        /// The context window.
        context_window: u64,
        /// Tokens reserved for the answer.
        reserved_output: u64,
    },
    /// The summarization model call failed.
    #[error("the summarization call failed: {0}")]
    Summarizer(ModelError),
}

/// A way of shrinking the context.
pub trait ContextStrategy: Send + Sync + fmt::Debug {
    /// Short name recorded in `Compacted` events (`truncate`, `summarize`, `importance`).
    fn name(&self) -> &'static str;

    /// Whether a context of `history_tokens` (corrected) should be compacted now.
    fn should_compact(&self, history_tokens: u64, budget: &TokenBudget) -> bool {
        history_tokens > budget.history_limit()
    }

    /// Compacts the context. `Ok(None)` means nothing needed (or could) be replaced.
    fn compact<'a>(
        &'a self,
        input: CompactionInput<'a>,
    ) -> BoxFuture<'a, Result<Option<Compaction>, ContextError>>;
}

/// The built-in strategies by name (`keel run --context-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StrategyKind {
    /// [`TruncateStrategy`].
    #[default]
    Truncate,
    /// [`SummarizeStrategy`].
    Summarize,
    /// [`ImportanceStrategy`].
    Importance,
}

impl StrategyKind {
    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Truncate => "truncate",
            Self::Summarize => "summarize",
            Self::Importance => "importance",
        }
    }

    /// The strategy with default settings; `summarizer` is used by `summarize` (the
    /// agent's model when `None`).
    pub fn build(self, summarizer: Option<Arc<dyn Model>>) -> Arc<dyn ContextStrategy> {
        match self {
            Self::Truncate => Arc::new(TruncateStrategy::default()),
            Self::Summarize => Arc::new(SummarizeStrategy::new(summarizer)),
            Self::Importance => Arc::new(ImportanceStrategy::default()),
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StrategyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "truncate" | "truncation" => Ok(Self::Truncate),
            "summarize" | "summarise" | "summary" => Ok(Self::Summarize),
            "importance" => Ok(Self::Importance),
            other => Err(format!(
                "unknown context strategy `{other}`: expected truncate, summarize or importance"
            )),
        }
    }
}

/// The last resort of every strategy: drops the oldest units (never the first user
/// message, never the latest unit) until the context fits `limit`, and always drops broken
/// units (orphans). Returns the dropped input ranges.
pub fn trim_to_fit(units: &[units::Unit], keep: &mut [bool], limit: u64) -> usize {
    let first_user = units::first_user(units);
    let last = units.len().checked_sub(1);
    let mut used: u64 = units
        .iter()
        .zip(keep.iter())
        .filter(|(_, kept)| **kept)
        .map(|(u, _)| u.tokens)
        .fold(0, u64::saturating_add);
    let mut dropped = 0;
    for (index, (unit, kept)) in units.iter().zip(keep.iter_mut()).enumerate() {
        if !*kept {
            continue;
        }
        let protected = Some(index) == first_user || Some(index) == last;
        if unit.is_broken() && Some(index) != last || used > limit && !protected {
            *kept = false;
            used = used.saturating_sub(unit.tokens);
            dropped += unit.range.len();
        }
    }
    dropped
}

/// Runs the shared finishing steps: trims what still does not fit, assembles the context
/// and checks the result against the limit.
pub(crate) fn finish(
    input: &CompactionInput<'_>,
    units: &[units::Unit],
    mut keep: Vec<bool>,
    planned_trim: bool,
) -> Result<Option<Compaction>, ContextError> {
    let limit = input.budget.history_limit();
    let before = units::total(units);
    let trimmed = trim_to_fit(units, &mut keep, limit);
    let (messages, replaced) = units::assemble(input.messages, units, &keep);
    if replaced.is_empty() {
        return if before > limit {
            Err(overflow(input, before))
        } else {
            Ok(None)
        };
    }
    let after = units
        .iter()
        .zip(keep.iter())
        .filter(|(_, k)| **k)
        .map(|(u, _)| u.tokens)
        .fold(0, u64::saturating_add);
    if after > limit {
        return Err(overflow(input, after));
    }
    Ok(Some(Compaction {
        replaced_count: u32::try_from(units::count(&replaced)).unwrap_or(u32::MAX),
        messages,
        replaced,
        summary_usage: None,
        trimmed: if planned_trim {
            0
        } else {
            u32::try_from(trimmed).unwrap_or(u32::MAX)
        },
        tokens_before: before,
        tokens_after: after,
    }))
}

/// The overflow error for a history of `history_tokens` (corrected).
pub fn overflow(input: &CompactionInput<'_>, history_tokens: u64) -> ContextError {
    let budget = input.budget;
    ContextError::Overflow {
        request_tokens: history_tokens.saturating_add(budget.corrected(budget.fixed)),
        limit_tokens: budget.request_limit(),
        context_window: budget.context_window,
        reserved_output: budget.reserved_output,
    }
}
