//! The `truncate` strategy (seed 004 §3 A): keep the first user message and the most
//! recent units that fit; drop everything older. Simple and predictable.

use futures::future::BoxFuture;

use super::units::{self, UnitKind};
use super::{Compaction, CompactionInput, ContextError, ContextStrategy, DEFAULT_TARGET_FRACTION};

/// Keeps the first user message plus the most recent messages that fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TruncateStrategy {
    /// Fraction of the history limit to shrink to (default 0.75), so that the next steps
    /// do not compact again at once.
    pub target_fraction: f64,
}

impl Default for TruncateStrategy {
    fn default() -> Self {
        Self {
            target_fraction: DEFAULT_TARGET_FRACTION,
        }
    }
}

impl TruncateStrategy {
    /// Plans the compaction without any I/O.
    pub fn plan(&self, input: &CompactionInput<'_>) -> Result<Option<Compaction>, ContextError> {
        let cost = |m: &crate::message::Message| input.cost(m);
        let units = units::split(input.messages, &cost);
        let total = units::total(&units);
        if !input.force && total <= input.budget.history_limit() {
            return Ok(None);
        }
        let target = input.target(total, self.target_fraction);
        let mut keep = vec![false; units.len()];
        let mut used = 0u64;
        if let Some(first) = units::first_user(&units) {
            if let Some(slot) = keep.get_mut(first) {
                *slot = true;
            }
            used = units.get(first).map(|u| u.tokens).unwrap_or(0);
        }
        let last = units.len().checked_sub(1);
        for (index, unit) in units.iter().enumerate().rev() {
            if keep.get(index).copied().unwrap_or(true) {
                continue;
            }
            if Some(index) != last
                && (unit.is_broken() || used.saturating_add(unit.tokens) > target)
            {
                break;
            }
            if unit.kind == UnitKind::OrphanResults {
                break;
            }
            if let Some(slot) = keep.get_mut(index) {
                *slot = true;
            }
            used = used.saturating_add(unit.tokens);
        }
        super::finish(input, &units, keep, true)
    }
}

impl ContextStrategy for TruncateStrategy {
    fn name(&self) -> &'static str {
        "truncate"
    }

    fn compact<'a>(
        &'a self,
        input: CompactionInput<'a>,
    ) -> BoxFuture<'a, Result<Option<Compaction>, ContextError>> {
        Box::pin(async move { self.plan(&input) })
    }
}
