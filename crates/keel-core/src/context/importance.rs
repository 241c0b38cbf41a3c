//! The `importance` strategy (seed 004 §3 C): score every unit and drop the lowest first.
//! User messages, summaries and tool errors weigh more; successful tool results weigh
//! less the staler they are. The first user message and the latest units are protected.

use futures::future::BoxFuture;

use super::units::{self, Unit, UnitKind};
use super::{Compaction, CompactionInput, ContextError, ContextStrategy, DEFAULT_TARGET_FRACTION};

/// Drops the lowest-scored units first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImportanceStrategy {
    /// Fraction of the history limit to shrink to (default 0.75).
    pub target_fraction: f64,
    /// The most recent units are never dropped by scoring (default 2), only by the last
    /// resort trim.
    pub keep_recent: usize,
}

impl Default for ImportanceStrategy {
    fn default() -> Self {
        Self {
            target_fraction: DEFAULT_TARGET_FRACTION,
            keep_recent: 2,
        }
    }
}

/// The score of a unit at `position` of `count` (0 = oldest). Higher is kept longer.
pub fn score(unit: &Unit, position: usize, count: usize) -> f64 {
    let base = match unit.kind {
        UnitKind::User => 100.0,
        UnitKind::Summary => 90.0,
        UnitKind::ToolExchange {
            has_error: true, ..
        } => 80.0,
        UnitKind::AssistantText | UnitKind::Other => 50.0,
        UnitKind::ToolExchange {
            has_error: false, ..
        } => 20.0,
        UnitKind::OrphanResults => 0.0,
    };
    // Recency: up to +15, so a fresh successful result still ranks below any error.
    let recency = if count > 1 {
        15.0 * position as f64 / (count - 1) as f64
    } else {
        15.0
    };
    base + recency
}

impl ImportanceStrategy {
    /// Plans the compaction without any I/O.
    pub fn plan(&self, input: &CompactionInput<'_>) -> Result<Option<Compaction>, ContextError> {
        let cost = |m: &crate::message::Message| input.cost(m);
        let units = units::split(input.messages, &cost);
        let total = units::total(&units);
        if !input.force && total <= input.budget.history_limit() {
            return Ok(None);
        }
        let target = input.target(total, self.target_fraction);
        let first_user = units::first_user(&units);
        let protected_from = units.len().saturating_sub(self.keep_recent.max(1));
        let mut keep = vec![true; units.len()];
        let mut used = total;
        let mut order: Vec<(f64, usize)> = units
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != first_user && *index < protected_from)
            .map(|(index, unit)| {
                let score = if unit.is_broken() {
                    -1.0
                } else {
                    score(unit, index, units.len())
                };
                (score, index)
            })
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (score, index) in order {
            if used <= target && score >= 0.0 {
                break;
            }
            if let (Some(slot), Some(unit)) = (keep.get_mut(index), units.get(index)) {
                *slot = false;
                used = used.saturating_sub(unit.tokens);
            }
        }
        super::finish(input, &units, keep, false)
    }
}

impl ContextStrategy for ImportanceStrategy {
    fn name(&self) -> &'static str {
        "importance"
    }

    fn compact<'a>(
        &'a self,
        input: CompactionInput<'a>,
    ) -> BoxFuture<'a, Result<Option<Compaction>, ContextError>> {
        Box::pin(async move { self.plan(&input) })
    }
}
