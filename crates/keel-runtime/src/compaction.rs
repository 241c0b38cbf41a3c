//! Context window management in the runner: before every model call, measure the request
//! against the [`TokenBudget`], cut oversized tool results that just entered the context,
//! and run the agent's [`ContextStrategy`] when the history is too large. Whatever
//! changes is journaled as a `Compacted` event (the originals stay in the log) preceded
//! by `Notice` records naming what was replaced (`context_compacted`,
//! `tool_result_truncated`, `history_trimmed`).
//!
//! The common path costs one estimate of the request and no copy of the history; the
//! history is cloned only when a compaction actually happens.

use std::sync::Arc;
use std::time::Duration;

use keel_core::context::tool_output::{DEFAULT_MAX_TOOL_RESULT_CHARS, has_oversized_result};
use keel_core::context::{
    CONTEXT_COMPACTED_NOTICE, CompactionInput, ContextError, ContextStrategy,
    HISTORY_TRIMMED_NOTICE, StrategyKind, TOOL_RESULT_TRUNCATED_NOTICE, TokenBudget,
    TruncateStrategy, budget::correction_ratio, truncate_tool_results,
};
use keel_core::{EventKind, Message, Model, ModelRequest, Role};
use serde_json::json;

use crate::journal::Journal;
use crate::outcome::RunError;
use crate::tool_agent::ToolAgent;

/// Context settings as given to the [`crate::ToolAgentBuilder`].
#[derive(Clone)]
pub struct ContextSettings {
    /// The built-in strategy to use (default `truncate`).
    pub kind: Option<StrategyKind>,
    /// A custom strategy (wins over `kind`).
    pub custom: Option<Arc<dyn ContextStrategy>>,
    /// The model that writes summaries (default: the agent's model).
    pub summarizer: Option<Arc<dyn Model>>,
    /// Overrides the model's context window, in tokens.
    pub context_window: Option<u32>,
    /// Longest tool result the model sees, in characters (default 40,000).
    pub max_tool_result_chars: usize,
    /// Longest a compaction (including the summarization call) may take.
    pub timeout: Duration,
}

impl Default for ContextSettings {
    fn default() -> Self {
        Self {
            kind: Some(StrategyKind::Truncate),
            custom: None,
            summarizer: None,
            context_window: None,
            max_tool_result_chars: DEFAULT_MAX_TOOL_RESULT_CHARS,
            timeout: Duration::from_secs(120),
        }
    }
}

impl std::fmt::Debug for ContextSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextSettings")
            .field("kind", &self.kind)
            .field("custom", &self.custom)
            .field("context_window", &self.context_window)
            .field("max_tool_result_chars", &self.max_tool_result_chars)
            .finish_non_exhaustive()
    }
}

/// The resolved configuration an [`ToolAgent`] runs with.
#[derive(Debug, Clone)]
pub struct ContextConfig {
    /// The strategy (`None`: context management disabled).
    pub strategy: Option<Arc<dyn ContextStrategy>>,
    /// Overrides the model's context window, in tokens.
    pub context_window: Option<u32>,
    /// Longest tool result the model sees, in characters.
    pub max_tool_result_chars: usize,
    /// Longest a compaction may take.
    pub timeout: Duration,
}

impl ContextSettings {
    /// Resolves the strategy.
    pub fn build(self) -> ContextConfig {
        let strategy = match (self.custom, self.kind) {
            (Some(custom), _) => Some(custom),
            (None, Some(kind)) => Some(kind.build(self.summarizer)),
            (None, None) => None,
        };
        ContextConfig {
            strategy,
            context_window: self.context_window,
            max_tool_result_chars: self.max_tool_result_chars.max(1),
            timeout: self.timeout,
        }
    }
}

/// What preparing the context came to.
pub(crate) enum Prepared {
    /// The context is ready to send.
    Ready,
    /// Nothing fits: the run must fail with this error.
    Overflow(ContextError),
    /// The run was cancelled meanwhile.
    Cancelled,
}

/// The budget of a request with this system prompt and the agent's tools, corrected by
/// the last provider-reported usage of the run.
pub(crate) fn request_budget(
    agent: &ToolAgent,
    journal: &Journal<'_>,
    request: &ModelRequest<'_>,
) -> TokenBudget {
    let caps = agent.model.capabilities();
    let window = agent.context.context_window.unwrap_or(caps.context_window);
    let output = agent.output_reserve;
    let mut fixed_request = *request;
    fixed_request.messages = &[];
    let fixed =
        agent
            .fixed_tokens
            .estimate(agent.model.as_ref(), &fixed_request, precise_from(agent));
    let budget = TokenBudget::new(u64::from(window), u64::from(output), fixed);
    match last_correction(journal) {
        Some(ratio) => budget.with_correction(ratio),
        None => budget,
    }
}

/// From how many tokens on a request's estimate must be exact (see
/// [`Model::estimate_tokens_near`]): a tenth of the request limit, the lowest threshold a
/// compaction strategy accepts (the summarizer's is clamped to 0.1..=1 of its limit).
pub(crate) fn precise_from(agent: &ToolAgent) -> u64 {
    let window = agent
        .context
        .context_window
        .unwrap_or(agent.model.capabilities().context_window);
    TokenBudget::new(u64::from(window), u64::from(agent.output_reserve), 0).request_limit() / 10
}

/// Reported input tokens over our estimate, for the run's latest answered request.
fn last_correction(journal: &Journal<'_>) -> Option<f64> {
    let mut events = journal.run_events().iter().rev();
    let (turn, reported) = events.find_map(|e| match &e.kind {
        EventKind::ModelResponded { turn, usage, .. } => Some((*turn, usage.input_tokens)),
        _ => None,
    })?;
    let estimated = events.find_map(|e| match &e.kind {
        EventKind::ModelRequested {
            turn: t,
            estimated_input_tokens,
            ..
        } if *t == turn => Some(*estimated_input_tokens),
        _ => None,
    })?;
    correction_ratio(estimated, reported)
}

/// Makes the context fit before a model call. `full` is the estimate of the request as it
/// would be sent now, `budget` its budget; `force` compacts even if it looks like it fits (the provider said it does
/// not).
pub(crate) async fn prepare(
    agent: &ToolAgent,
    journal: &mut Journal<'_>,
    budget: TokenBudget,
    full: u64,
    force: bool,
) -> Result<Prepared, RunError> {
    let Some(strategy) = agent.context.strategy.clone() else {
        return Ok(Prepared::Ready);
    };
    let max_chars = agent.context.max_tool_result_chars;
    let oversized = journal
        .state()
        .messages()
        .last()
        .is_some_and(|m| m.role == Role::Tool && has_oversized_result(m, max_chars));
    let history = budget.corrected(full.saturating_sub(budget.fixed));
    if !force && !oversized && !strategy.should_compact(history, &budget) {
        return Ok(Prepared::Ready);
    }
    // A strategy may call a model (summarize): what it reads is stored first.
    journal.flush().await?;
    // Only now is the history copied.
    let mut working: Vec<Message> = journal.state().messages().to_vec();
    let mut batch = Vec::new();
    if oversized && let Some(last) = working.last_mut() {
        for cut in truncate_tool_results(last, max_chars) {
            batch.push(EventKind::Notice {
                code: TOOL_RESULT_TRUNCATED_NOTICE.into(),
                message: format!(
                    "[OUTPUT TRUNCATED: Showing {} of {} characters from {}]",
                    cut.shown, cut.total, cut.tool
                ),
                data: Some(json!({ "call_id": cut.call_id, "tool": cut.tool, "shown": cut.shown, "total": cut.total })),
            });
        }
    }
    let digest = journal
        .state()
        .run()
        .map(|r| r.working_memory.digest())
        .unwrap_or_default();
    let ctx = journal.ctx().clone();
    let mut name = strategy.name();
    let input = |messages| CompactionInput {
        messages,
        budget,
        model: agent.model.as_ref(),
        digest: &digest,
        force,
    };
    let compacted = tokio::select! {
        result = tokio::time::timeout(agent.context.timeout, strategy.compact(input(&working))) => result,
        () = ctx.cancel.cancelled() => return Ok(Prepared::Cancelled),
    };
    let compacted = match compacted {
        Ok(Ok(result)) => result,
        Ok(Err(error @ ContextError::Overflow { .. })) => return Ok(Prepared::Overflow(error)),
        failed => {
            let why = match failed {
                Ok(Err(error)) => error.to_string(),
                _ => format!(
                    "compaction took longer than {} s",
                    agent.context.timeout.as_secs()
                ),
            };
            // The summarizer failed or timed out: fall back to truncation so the run goes on.
            batch.push(EventKind::Notice {
                code: "compaction_fallback".into(),
                message: format!("{name} compaction failed ({why}); truncating instead"),
                data: None,
            });
            name = "truncate";
            match TruncateStrategy::default().plan(&input(&working)) {
                Ok(result) => result,
                Err(error) => return Ok(Prepared::Overflow(error)),
            }
        }
    };
    let kinds = match compacted {
        Some(compaction) => {
            batch.push(EventKind::Notice {
                code: CONTEXT_COMPACTED_NOTICE.into(),
                message: format!(
                    "{name}: replaced {} of {} messages (~{} → ~{} history tokens, limit {})",
                    compaction.replaced_count,
                    working.len(),
                    compaction.tokens_before,
                    compaction.tokens_after,
                    budget.history_limit()
                ),
                data: Some(json!({
                    "strategy": name,
                    "replaced_ranges": compaction.replaced.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
                    "messages_before": working.len(),
                    "messages_after": compaction.messages.len(),
                    "tokens_before": compaction.tokens_before,
                    "tokens_after": compaction.tokens_after,
                    "history_limit": budget.history_limit(),
                    "request_limit": budget.request_limit(),
                    "forced": force,
                    "summary_usage": compaction.summary_usage,
                })),
            });
            if compaction.trimmed > 0 {
                batch.push(EventKind::Notice {
                    code: HISTORY_TRIMMED_NOTICE.into(),
                    message: format!(
                        "the history still did not fit after {name}; the {} oldest unprotected messages were dropped",
                        compaction.trimmed
                    ),
                    data: Some(json!({ "dropped": compaction.trimmed })),
                });
            }
            batch.push(EventKind::Compacted {
                strategy: name.to_string(),
                replaced: compaction.replaced_count,
                messages: compaction.messages,
            });
            batch
        }
        None if oversized => {
            batch.push(EventKind::Compacted {
                strategy: "tool_result_truncation".into(),
                replaced: 1,
                messages: working,
            });
            batch
        }
        None if force => {
            return Ok(Prepared::Overflow(keel_core::context::overflow(
                &input(&working),
                history,
            )));
        }
        None => return Ok(Prepared::Ready),
    };
    let span = journal.run_span().to_string();
    journal
        .append_batch(kinds.into_iter().map(|k| (k, span.clone())).collect())
        .await?;
    Ok(Prepared::Ready)
}

/// The estimate of a request's fixed part (system prompt and tool definitions), which is
/// the same on nearly every call of an agent: kept for the last system prompt and tool set
/// seen, so a model call does not tokenize it again (tokenizing can cost more than the
/// rest of the step).
#[derive(Debug, Default)]
pub(crate) struct FixedTokens {
    last: std::sync::Mutex<Option<(u64, u64)>>,
}

impl FixedTokens {
    fn estimate(&self, model: &dyn Model, fixed: &ModelRequest<'_>, precise_from: u64) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        fixed.system.hash(&mut hasher);
        fixed.tools.len().hash(&mut hasher);
        for tool in fixed.tools {
            tool.name.hash(&mut hasher);
        }
        fixed.response_schema.is_some().hash(&mut hasher);
        model.id().hash(&mut hasher);
        let key = hasher.finish();
        let mut last = match self.last.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((cached_key, tokens)) = *last
            && cached_key == key
        {
            return tokens;
        }
        let tokens = model.estimate_tokens_near(fixed, precise_from);
        *last = Some((key, tokens));
        tokens
    }
}
