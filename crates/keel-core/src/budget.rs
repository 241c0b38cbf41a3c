//! Run budgets: how many model turns, how much wall-clock time, tokens and money a run may
//! spend before it ends with `budget_exceeded`.

use serde::{Deserialize, Serialize};

/// Limits on one run. `None` means unlimited.
///
/// ```
/// use keel_core::Budget;
///
/// let budget = Budget { max_turns: Some(4), max_cost_usd: Some(0.50), ..Budget::default() };
/// assert_eq!(budget.max_wall_clock_ms, Some(600_000)); // the default 10 minutes
/// assert_eq!(Budget::unlimited().max_turns, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Maximum model calls in the run.
    pub max_turns: Option<u32>,
    /// Maximum wall-clock time of the run, in milliseconds.
    pub max_wall_clock_ms: Option<u64>,
    /// Maximum input plus output tokens over the run.
    pub max_tokens: Option<u64>,
    /// Maximum cost over the run, in US dollars (when the cost is known).
    pub max_cost_usd: Option<f64>,
}

impl Default for Budget {
    /// 16 turns and 10 minutes (seed 000's example policy), no token or cost limit.
    fn default() -> Self {
        Self {
            max_turns: Some(16),
            max_wall_clock_ms: Some(600_000),
            max_tokens: None,
            max_cost_usd: None,
        }
    }
}

impl Budget {
    /// No limits at all. Use with care: nothing stops a looping model.
    pub fn unlimited() -> Self {
        Self {
            max_turns: None,
            max_wall_clock_ms: None,
            max_tokens: None,
            max_cost_usd: None,
        }
    }

    /// Sets the turn limit.
    pub fn with_max_turns(mut self, turns: u32) -> Self {
        self.max_turns = Some(turns);
        self
    }
}

/// What is spent so far in a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// Model calls made.
    pub turns: u32,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Known cost in US dollars.
    pub cost_usd: f64,
    /// Milliseconds since the run started.
    pub elapsed_ms: u64,
}

impl Budget {
    /// The first limit `spent` has reached, as a human-readable reason.
    pub fn exceeded(&self, spent: &Spent) -> Option<String> {
        if let Some(max) = self.max_turns
            && spent.turns >= max
        {
            return Some(format!("max_turns reached ({} of {max})", spent.turns));
        }
        if let Some(max) = self.max_tokens
            && spent.tokens >= max
        {
            return Some(format!("max_tokens reached ({} of {max})", spent.tokens));
        }
        if let Some(max) = self.max_cost_usd
            && spent.cost_usd >= max
        {
            return Some(format!(
                "max_cost_usd reached ({:.4} of {max:.4})",
                spent.cost_usd
            ));
        }
        if let Some(max) = self.max_wall_clock_ms
            && spent.elapsed_ms >= max
        {
            return Some(format!(
                "max_wall_clock reached ({} ms of {max} ms)",
                spent.elapsed_ms
            ));
        }
        None
    }
}
