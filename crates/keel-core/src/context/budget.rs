//! The token budget of one request (seed 004 §3 "Token Budget Allocation"): the context
//! window, minus the fixed part (system prompt and tool definitions), minus the tokens
//! reserved for the answer, minus a 10% safety margin for estimation errors. A correction
//! ratio learnt from provider-reported usage scales the heuristic estimates.

use crate::message::Message;
use crate::model::{Model, ModelRequest};

/// Percent of the context window kept free for estimation errors.
pub const SAFETY_MARGIN_PERCENT: u64 = 10;

/// Lowest and highest correction ratio accepted from provider-reported usage.
const RATIO_RANGE: (f64, f64) = (0.25, 4.0);

/// How many tokens one request may use, and how the history may fill it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBudget {
    /// The model's context window in tokens (capabilities or an agent override).
    pub context_window: u64,
    /// Tokens reserved for the answer (`max_output_tokens`).
    pub reserved_output: u64,
    /// Estimated tokens of the fixed part: system prompt and tool definitions.
    pub fixed: u64,
    /// Multiplier applied to estimates: provider-reported input tokens divided by our
    /// estimate of the same request (1.0 until a provider has reported usage).
    pub correction: f64,
}

impl TokenBudget {
    /// A budget without correction.
    pub fn new(context_window: u64, reserved_output: u64, fixed: u64) -> Self {
        Self {
            context_window,
            reserved_output,
            fixed,
            correction: 1.0,
        }
    }

    /// Sets the correction ratio (clamped to 0.25..=4; non-finite values are ignored).
    pub fn with_correction(mut self, ratio: f64) -> Self {
        if ratio.is_finite() {
            self.correction = ratio.clamp(RATIO_RANGE.0, RATIO_RANGE.1);
        }
        self
    }

    /// The safety margin in tokens (10% of the window).
    pub fn safety_margin(&self) -> u64 {
        self.context_window.saturating_mul(SAFETY_MARGIN_PERCENT) / 100
    }

    /// The most a whole request (system, tools and history) may take, in corrected tokens.
    pub fn request_limit(&self) -> u64 {
        self.context_window
            .saturating_sub(self.reserved_output)
            .saturating_sub(self.safety_margin())
    }

    /// The most the conversation history may take, in corrected tokens.
    pub fn history_limit(&self) -> u64 {
        self.request_limit()
            .saturating_sub(self.corrected(self.fixed))
    }

    /// An estimate scaled by the correction ratio, rounded up.
    pub fn corrected(&self, estimate: u64) -> u64 {
        if (self.correction - 1.0).abs() < f64::EPSILON {
            return estimate;
        }
        let scaled = (estimate as f64 * self.correction).ceil();
        if scaled >= u64::MAX as f64 {
            u64::MAX
        } else {
            scaled as u64
        }
    }

    /// Whether a request of this (uncorrected) estimate fits.
    pub fn fits(&self, request_estimate: u64) -> bool {
        self.corrected(request_estimate) <= self.request_limit()
    }
}

/// The correction ratio implied by one request: what the provider reported divided by
/// what we estimated. `None` when either is zero (nothing learnt).
pub fn correction_ratio(estimated: u64, reported: u64) -> Option<f64> {
    (estimated > 0 && reported > 0).then(|| reported as f64 / estimated as f64)
}

/// The model's estimate of one message on its own (uncorrected).
pub fn message_tokens(model: &dyn Model, message: &Message) -> u64 {
    model.estimate_tokens(&ModelRequest::new(std::slice::from_ref(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_subtract_output_margin_and_fixed() {
        let budget = TokenBudget::new(10_000, 1_000, 500);
        assert_eq!(budget.safety_margin(), 1_000);
        assert_eq!(budget.request_limit(), 8_000);
        assert_eq!(budget.history_limit(), 7_500);
        let corrected = budget.with_correction(2.0);
        assert_eq!(corrected.history_limit(), 7_000);
        assert!(corrected.fits(4_000));
        assert!(!corrected.fits(4_001));
        assert_eq!(budget.with_correction(100.0).correction, 4.0);
        assert_eq!(correction_ratio(0, 5), None);
    }
}
