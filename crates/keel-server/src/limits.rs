//! Per-tenant limits of keel.toml `[server.limits]` / `[server.tenants.<tenant>]`, answered
//! with 429 and `Retry-After`:
//!
//! - requests per minute: a token bucket per tenant (capacity = the limit, refilled
//!   continuously), so a burst of the whole minute's allowance is accepted at once;
//! - tokens per day: model tokens (input + output) of the tenant's runs driven by this
//!   process's workers since 00:00 UTC;
//! - concurrent runs: checked by the chat handlers against the store (see
//!   `api::chat`).
//!
//! The counters live in this process: with several server processes, each enforces the
//! limits on what it sees (documented in docs/server.md).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{NaiveDate, Utc};

use crate::error::ApiError;

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Requests per minute, per tenant.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// Takes one request of `tenant`'s allowance of `per_minute` (0: unlimited); the error
    /// says when to retry.
    pub fn check(&self, tenant: &str, per_minute: u64) -> Result<(), ApiError> {
        if per_minute == 0 {
            return Ok(());
        }
        let capacity = per_minute as f64;
        let rate = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = locked(&self.buckets);
        let bucket = buckets.entry(tenant.to_string()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = Duration::from_secs_f64(((1.0 - bucket.tokens) / rate).max(0.0));
        Err(ApiError::too_many(
            "rate_limited",
            format!(
                "tenant {tenant} is limited to {per_minute} requests per minute \
                 ([server.limits] requests_per_minute in keel.toml); retry after the \
                 Retry-After seconds"
            ),
            wait.as_secs().saturating_add(1),
        ))
    }
}

/// Model tokens per tenant per UTC day.
#[derive(Debug, Default)]
pub struct Usage {
    days: Mutex<HashMap<String, (NaiveDate, u64)>>,
}

impl Usage {
    /// Adds `tokens` to `tenant`'s count for today.
    pub fn add(&self, tenant: &str, tokens: u64) {
        let today = Utc::now().date_naive();
        let mut days = locked(&self.days);
        let entry = days.entry(tenant.to_string()).or_insert((today, 0));
        if entry.0 != today {
            *entry = (today, 0);
        }
        entry.1 = entry.1.saturating_add(tokens);
    }

    /// `tenant`'s tokens today.
    pub fn today(&self, tenant: &str) -> u64 {
        let today = Utc::now().date_naive();
        match locked(&self.days).get(tenant) {
            Some((day, tokens)) if *day == today => *tokens,
            _ => 0,
        }
    }

    /// Refuses a new run when `tenant` used its `per_day` tokens (0: unlimited).
    pub fn check(&self, tenant: &str, per_day: u64) -> Result<(), ApiError> {
        let used = self.today(tenant);
        if per_day == 0 || used < per_day {
            return Ok(());
        }
        let now = Utc::now();
        let midnight = now
            .date_naive()
            .succ_opt()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc());
        let wait = midnight.map_or(3600, |m| (m - now).num_seconds().max(1) as u64);
        Err(ApiError::too_many(
            "token_limit",
            format!(
                "tenant {tenant} used {used} of its {per_day} model tokens for today (UTC) \
                 ([server.limits] tokens_per_day in keel.toml); new runs are accepted again \
                 after midnight UTC"
            ),
            wait,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_burst_of_the_allowance_passes_then_429_with_retry_after() {
        let limiter = RateLimiter::default();
        for _ in 0..3 {
            limiter.check("a", 3).unwrap();
        }
        let error = limiter.check("a", 3).unwrap_err();
        assert_eq!(error.status.as_u16(), 429);
        assert!(error.retry_after.unwrap() >= 1);
        limiter.check("b", 3).unwrap();
        limiter.check("a", 0).unwrap();
    }

    #[test]
    fn tokens_per_day_refuse_once_used() {
        let usage = Usage::default();
        usage.check("a", 10).unwrap();
        usage.add("a", 10);
        let error = usage.check("a", 10).unwrap_err();
        assert_eq!(error.code, "token_limit");
        usage.check("a", 0).unwrap();
        usage.check("b", 10).unwrap();
    }
}
