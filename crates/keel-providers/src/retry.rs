//! The retry policy for model calls: which failures are retried, how long to wait, and
//! an injectable [`Sleeper`] so tests can run on a virtual clock.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use keel_core::ModelError;
use serde::{Deserialize, Serialize};

/// How a backoff delay is randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// No randomness: exactly `initial * factor^(n-1)`, capped (useful in tests).
    None,
    /// Uniform in `[0, capped exponential]` ("full jitter").
    #[default]
    Full,
    /// Uniform in `[initial, 3 * previous]`, capped ("decorrelated jitter").
    Decorrelated,
}

/// Retry policy for retryable model failures (rate limits, overload, 5xx, network,
/// timeouts, interrupted streams). Non-retryable classes are never retried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RetryConfig {
    /// Total attempts including the first (1 = no retries).
    pub max_attempts: u32,
    /// First backoff delay.
    #[serde(with = "millis")]
    pub initial_delay: Duration,
    /// Upper bound of one backoff delay.
    #[serde(with = "millis")]
    pub max_delay: Duration,
    /// Growth factor between attempts.
    pub factor: f64,
    /// Randomisation.
    pub jitter: Jitter,
    /// The longest server-requested wait (`retry-after`) honoured; a longer request is
    /// not retried, because waiting less than asked cannot succeed.
    #[serde(with = "millis")]
    pub max_retry_after: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            factor: 2.0,
            jitter: Jitter::Full,
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl RetryConfig {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The wait before attempt `failed_attempt + 1`, or `None` when the error must not be
    /// retried (not retryable, attempts exhausted, or the server asks for too long).
    /// `previous` is the last wait (for decorrelated jitter).
    pub fn next_wait(
        &self,
        failed_attempt: u32,
        error: &ModelError,
        previous: Option<Duration>,
    ) -> Option<Duration> {
        if !error.is_retryable() || failed_attempt >= self.max_attempts {
            return None;
        }
        if let Some(ms) = error.retry_after_ms {
            let wait = Duration::from_millis(ms);
            return (wait <= self.max_retry_after).then_some(wait);
        }
        Some(self.backoff(failed_attempt, previous))
    }

    /// The backoff delay after `failed_attempt` failures, without a server hint.
    pub fn backoff(&self, failed_attempt: u32, previous: Option<Duration>) -> Duration {
        let initial = self.initial_delay.as_secs_f64();
        let cap = self.max_delay.as_secs_f64();
        let exponent = i32::try_from(failed_attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let factor = if self.factor.is_finite() && self.factor >= 1.0 {
            self.factor
        } else {
            1.0
        };
        let exponential = (initial * factor.powi(exponent)).min(cap);
        let seconds = match self.jitter {
            Jitter::None => exponential,
            Jitter::Full => fastrand::f64() * exponential,
            Jitter::Decorrelated => {
                let prev = previous.map(|d| d.as_secs_f64()).unwrap_or(initial);
                let high = (prev * 3.0).max(initial);
                (initial + fastrand::f64() * (high - initial)).min(cap)
            }
        };
        Duration::from_secs_f64(seconds.clamp(0.0, cap.max(0.0)))
    }
}

/// Waits between attempts. Injected so tests can use a virtual clock.
pub trait Sleeper: Send + Sync + std::fmt::Debug {
    /// Sleeps for `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// Sleeps on the tokio timer.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioSleeper;

impl Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A virtual clock for tests: records every requested wait and returns immediately.
#[derive(Debug, Default, Clone)]
pub struct RecordingSleeper {
    waits: Arc<std::sync::Mutex<Vec<Duration>>>,
}

impl RecordingSleeper {
    /// A new recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every wait requested so far, in order.
    pub fn waits(&self) -> Vec<Duration> {
        self.waits.lock().map(|w| w.clone()).unwrap_or_default()
    }

    /// The sum of all waits: the virtual time that passed.
    pub fn elapsed(&self) -> Duration {
        self.waits().iter().sum()
    }
}

impl Sleeper for RecordingSleeper {
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        if let Ok(mut waits) = self.waits.lock() {
            waits.push(duration);
        }
        Box::pin(std::future::ready(()))
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::ModelErrorKind;

    #[test]
    fn policy_rules() {
        let config = RetryConfig {
            jitter: Jitter::None,
            ..RetryConfig::default()
        };
        let rate = ModelError::new(ModelErrorKind::RateLimited, "x");
        assert_eq!(
            config.next_wait(1, &rate, None),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            config.next_wait(3, &rate, None),
            Some(Duration::from_millis(2000))
        );
        assert_eq!(config.next_wait(4, &rate, None), None);
        let hinted = rate.clone().with_retry_after_ms(Some(1500));
        assert_eq!(
            config.next_wait(1, &hinted, None),
            Some(Duration::from_millis(1500))
        );
        let too_long = rate.with_retry_after_ms(Some(10_000_000));
        assert_eq!(config.next_wait(1, &too_long, None), None);
        let auth = ModelError::new(ModelErrorKind::Authentication, "x");
        assert_eq!(config.next_wait(1, &auth, None), None);
    }

    #[test]
    fn jitter_bounds() {
        for jitter in [Jitter::Full, Jitter::Decorrelated] {
            let config = RetryConfig {
                jitter,
                ..RetryConfig::default()
            };
            let mut prev = None;
            for attempt in 1..20 {
                let wait = config.backoff(attempt, prev);
                assert!(wait <= config.max_delay);
                prev = Some(wait);
            }
        }
    }
}
