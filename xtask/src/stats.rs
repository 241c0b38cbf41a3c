//! Small figures for the reports: percentiles of durations and shares.

use std::time::Duration;

/// The `p`-th percentile (0–100) of `values` by the nearest-rank method; zero when empty.
pub fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted.get(index).copied().unwrap_or_default()
}

/// `part / whole` as a percentage (100 when `whole` is 0).
pub fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// A duration as seconds with milliseconds (`1.234 s`).
pub fn secs(duration: Duration) -> String {
    format!("{:.3} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&values, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&values, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(
            percentile(&[Duration::from_secs(3)], 99.0),
            Duration::from_secs(3)
        );
        assert!((percent(1, 3) - 33.333).abs() < 0.01);
    }
}
