//! The statistics of repeated trials: the Wilson score interval of a pass rate (95%),
//! unbiased pass@k ("at least one of k trials passes") and pass^k ("all k trials pass")
//! estimated from n trials with c passes, and the flaky flag.

use serde::{Deserialize, Serialize};

/// z for a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// A closed interval `[lo, hi]` within 0..=1. Serialized as `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "[f64; 2]", into = "[f64; 2]")]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

impl From<[f64; 2]> for Interval {
    fn from([lo, hi]: [f64; 2]) -> Self {
        Self { lo, hi }
    }
}

impl From<Interval> for [f64; 2] {
    fn from(i: Interval) -> Self {
        [i.lo, i.hi]
    }
}

impl Interval {
    /// Whether `x` lies inside (bounds included, with a 1e-12 tolerance).
    pub fn contains(&self, x: f64) -> bool {
        x >= self.lo - 1e-12 && x <= self.hi + 1e-12
    }
}

/// The 95% Wilson score interval of `successes` out of `trials`. With no trials nothing is
/// known: `[0, 1]`. `successes` above `trials` counts as `trials`.
pub fn wilson(successes: u64, trials: u64) -> Interval {
    if trials == 0 {
        return Interval { lo: 0.0, hi: 1.0 };
    }
    let n = trials as f64;
    let p = successes.min(trials) as f64 / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let margin = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Interval {
        lo: (center - margin).clamp(0.0, 1.0),
        hi: (center + margin).clamp(0.0, 1.0),
    }
}

/// Why an estimate cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// `k` must be at least 1.
    #[error("k must be at least 1")]
    ZeroK,
    /// `k` above the number of trials: the estimate needs at least k trials.
    #[error("k = {k} exceeds the {n} trials run: run at least k trials or lower `suite.k`")]
    KExceedsTrials {
        /// k.
        k: u64,
        /// Trials.
        n: u64,
    },
    /// More passes than trials.
    #[error("{c} passes out of {n} trials is impossible")]
    TooManyPasses {
        /// Passes.
        c: u64,
        /// Trials.
        n: u64,
    },
}

fn validate(n: u64, c: u64, k: u64) -> Result<(), StatsError> {
    if k == 0 {
        return Err(StatsError::ZeroK);
    }
    if k > n {
        return Err(StatsError::KExceedsTrials { k, n });
    }
    if c > n {
        return Err(StatsError::TooManyPasses { c, n });
    }
    Ok(())
}

/// C(a, k) / C(n, k) for a ≤ n, as a product (no overflow): 0 when a < k.
fn choose_ratio(a: u64, n: u64, k: u64) -> f64 {
    if a < k {
        return 0.0;
    }
    (0..k).fold(1.0, |acc, i| acc * (a - i) as f64 / (n - i) as f64)
}

/// Unbiased pass@k from `n` trials with `c` passes: `1 - C(n-c, k) / C(n, k)`, the
/// probability that at least one of k trials drawn without replacement passes. Errors when
/// `k` is 0 or above `n`, or `c > n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> Result<f64, StatsError> {
    validate(n, c, k)?;
    Ok(1.0 - choose_ratio(n - c, n, k))
}

/// pass^k from `n` trials with `c` passes: `C(c, k) / C(n, k)`, the probability that all of
/// k trials drawn without replacement pass. Errors like [`pass_at_k`].
pub fn pass_pow_k(n: u64, c: u64, k: u64) -> Result<f64, StatsError> {
    validate(n, c, k)?;
    Ok(choose_ratio(c, n, k))
}

/// Some but not all trials passed.
pub fn is_flaky(n: u64, c: u64) -> bool {
    c > 0 && c < n
}
