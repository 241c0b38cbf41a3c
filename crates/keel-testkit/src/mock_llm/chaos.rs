//! Seeded random faults ("chaos"): a share of model requests is answered with a fault — a
//! 429 with `retry-after`, a 5xx, a 529, a dropped connection, a malformed chunk or a
//! mid-stream error — instead of the scripted turn.
//!
//! Whether a request fails depends only on the seed, the conversation (its first user
//! message), how many assistant answers the conversation already holds and how many times
//! this same step was asked before — never on how concurrent conversations interleave — so
//! a run of many parallel conversations injects the same faults every time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::script::{MockError, MockStreamError, MockTurn, assistant_answers};

/// One kind of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChaosFault {
    /// HTTP 429 with a `retry-after` header (seconds, up to `max_retry_after_ms`).
    RateLimited,
    /// HTTP 500, 502 or 503.
    ServerError,
    /// HTTP 529 (Anthropic's "overloaded").
    Overloaded,
    /// The connection is cut after the first frames of the stream.
    Drop,
    /// A chunk that is not valid JSON early in the stream.
    Malformed,
    /// The protocol's mid-stream error event after the content (an overload).
    StreamError,
}

impl ChaosFault {
    /// Every kind, in a fixed order.
    pub const ALL: [ChaosFault; 6] = [
        Self::RateLimited,
        Self::ServerError,
        Self::Overloaded,
        Self::Drop,
        Self::Malformed,
        Self::StreamError,
    ];

    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::ServerError => "server_error",
            Self::Overloaded => "overloaded",
            Self::Drop => "drop",
            Self::Malformed => "malformed",
            Self::StreamError => "stream_error",
        }
    }

    /// Whether the fault needs a streamed answer (the others work on any request).
    fn needs_stream(self) -> bool {
        matches!(self, Self::Drop | Self::Malformed | Self::StreamError)
    }
}

impl std::fmt::Display for ChaosFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn all_faults() -> Vec<ChaosFault> {
    ChaosFault::ALL.to_vec()
}

fn default_max_retry_after_ms() -> u64 {
    1000
}

/// The script's `chaos` section: seeded random faults on top of the scripted turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockChaos {
    /// The seed: the same seed injects the same faults.
    pub seed: u64,
    /// Share of requests that get a fault, from 0.0 to 1.0.
    pub rate: f64,
    /// The kinds to choose from, with equal weight (default: all of them).
    #[serde(default = "all_faults")]
    pub faults: Vec<ChaosFault>,
    /// Longest wait a 429 asks for, in milliseconds (default 1000). The `retry-after`
    /// header is in whole seconds, uniform in `0..=max_retry_after_ms / 1000`.
    #[serde(default = "default_max_retry_after_ms")]
    pub max_retry_after_ms: u64,
}

impl MockChaos {
    /// Faults of every kind at `rate`, seeded with `seed`.
    pub fn new(seed: u64, rate: f64) -> Self {
        Self {
            seed,
            rate,
            faults: all_faults(),
            max_retry_after_ms: default_max_retry_after_ms(),
        }
    }

    /// Only these kinds of faults.
    pub fn with_faults(mut self, faults: Vec<ChaosFault>) -> Self {
        self.faults = faults;
        self
    }

    /// The longest wait a 429 asks for.
    pub fn with_max_retry_after_ms(mut self, ms: u64) -> Self {
        self.max_retry_after_ms = ms;
        self
    }
}

/// What the server remembers to make faults deterministic, and what it injected.
#[derive(Debug, Default)]
pub(super) struct ChaosState {
    /// Requests seen per (conversation, answers so far): the attempt number of a step.
    attempts: Mutex<HashMap<(u64, usize), u32>>,
    /// Faults injected, by kind.
    injected: Mutex<BTreeMap<ChaosFault, u64>>,
}

impl ChaosState {
    /// Faults injected so far, by kind.
    pub(super) fn injected(&self) -> BTreeMap<ChaosFault, u64> {
        match self.injected.lock() {
            Ok(map) => map.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Decides whether this request gets a fault; if so returns it and the turn to render
    /// in place of `turn`.
    pub(super) fn inject(
        &self,
        chaos: &MockChaos,
        body: &Value,
        streamed: bool,
        turn: &MockTurn,
    ) -> Option<(ChaosFault, MockTurn)> {
        if chaos.faults.is_empty() || chaos.rate <= 0.0 {
            return None;
        }
        let conversation = fnv1a(first_user_message(body).as_bytes());
        let answers = assistant_answers(body);
        let attempt = {
            let mut attempts = match self.attempts.lock() {
                Ok(map) => map,
                Err(poisoned) => poisoned.into_inner(),
            };
            let count = attempts.entry((conversation, answers)).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let mut rng = fastrand::Rng::with_seed(
            chaos.seed
                ^ conversation.rotate_left(17)
                ^ (answers as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ u64::from(attempt).wrapping_mul(0xc2b2_ae3d_27d4_eb4f),
        );
        if rng.f64() >= chaos.rate {
            return None;
        }
        let mut fault = *chaos.faults.get(rng.usize(..chaos.faults.len()))?;
        if fault.needs_stream() && !streamed {
            fault = ChaosFault::ServerError;
        }
        let mut faulty = turn.clone();
        match fault {
            ChaosFault::RateLimited => {
                faulty.error = Some(MockError {
                    status: Some(429),
                    retry_after: Some(rng.u64(0..=chaos.max_retry_after_ms / 1000)),
                    ..MockError::default()
                });
            }
            ChaosFault::ServerError => {
                let status = [500, 502, 503].get(rng.usize(..3)).copied().unwrap_or(500);
                faulty.error = Some(MockError {
                    status: Some(status),
                    ..MockError::default()
                });
            }
            ChaosFault::Overloaded => {
                faulty.error = Some(MockError {
                    status: Some(529),
                    ..MockError::default()
                });
            }
            ChaosFault::Drop => faulty.faults.drop_after = Some(rng.usize(1..=2)),
            ChaosFault::Malformed => faulty.faults.malformed_after = Some(rng.usize(1..=2)),
            ChaosFault::StreamError => {
                faulty.faults.stream_error = Some(MockStreamError::default());
            }
        }
        let mut injected = match self.injected.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        };
        *injected.entry(fault).or_insert(0) += 1;
        Some((fault, faulty))
    }
}

/// The conversation's first user message as JSON text (any protocol): the first entry of
/// `messages` (or Responses' `input`) whose role is `user`.
fn first_user_message(body: &Value) -> String {
    let items = body
        .get("messages")
        .or_else(|| body.get("input"))
        .and_then(Value::as_array);
    items
        .and_then(|items| {
            items
                .iter()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        })
        .map(Value::to_string)
        .unwrap_or_default()
}

/// FNV-1a, 64 bits. Hand-written (five lines) because the value must stay the same across
/// Rust releases and platforms, which `std`'s hasher does not promise.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use serde_json::json;

    use super::*;

    fn body(user: &str, answers: usize) -> Value {
        let mut messages = vec![json!({"role": "user", "content": user})];
        for _ in 0..answers {
            messages.push(json!({"role": "assistant", "content": "ok"}));
            messages.push(json!({"role": "user", "content": "more"}));
        }
        json!({"model": "m", "messages": messages, "stream": true})
    }

    #[test]
    fn the_same_seed_injects_the_same_faults_whatever_the_order() {
        let chaos = MockChaos::new(7, 0.3);
        let turn = MockTurn::text("hi");
        let run = |order: &[usize]| {
            let state = ChaosState::default();
            let mut out = BTreeMap::new();
            for &i in order {
                for attempt in 0..3 {
                    let fault = state
                        .inject(&chaos, &body(&format!("conversation {i}"), 1), true, &turn)
                        .map(|(f, _)| f);
                    out.insert((i, attempt), fault);
                }
            }
            (out, state.injected())
        };
        let forward: Vec<usize> = (0..200).collect();
        let backward: Vec<usize> = (0..200).rev().collect();
        let (a, counts) = run(&forward);
        let (b, _) = run(&backward);
        assert_eq!(a, b);
        let total: u64 = counts.values().sum();
        // 600 draws at 30%: far from 0 and from 600.
        assert!((120..=240).contains(&total), "{total} faults of 600");
        assert!(counts.len() >= 5, "{counts:?}");
    }

    #[test]
    fn faults_become_turn_changes() {
        let turn = MockTurn::text("hi");
        let state = ChaosState::default();
        for fault in ChaosFault::ALL {
            let chaos = MockChaos::new(1, 1.0)
                .with_faults(vec![fault])
                .with_max_retry_after_ms(0);
            let (got, faulty) = state
                .inject(&chaos, &body(fault.as_str(), 0), true, &turn)
                .unwrap();
            assert_eq!(got, fault);
            match fault {
                ChaosFault::RateLimited => {
                    let error = faulty.error.unwrap();
                    assert_eq!((error.status, error.retry_after), (Some(429), Some(0)));
                }
                ChaosFault::ServerError => {
                    assert!([500, 502, 503].contains(&faulty.error.unwrap().status.unwrap()));
                }
                ChaosFault::Overloaded => assert_eq!(faulty.error.unwrap().status, Some(529)),
                ChaosFault::Drop => assert!(faulty.faults.drop_after.is_some()),
                ChaosFault::Malformed => assert!(faulty.faults.malformed_after.is_some()),
                ChaosFault::StreamError => assert!(faulty.faults.stream_error.is_some()),
            }
        }
        // A stream fault on a request that does not stream becomes a server error.
        let chaos = MockChaos::new(1, 1.0).with_faults(vec![ChaosFault::Drop]);
        let (got, _) = state
            .inject(
                &chaos,
                &json!({"messages": [{"role": "user", "content": "x"}]}),
                false,
                &turn,
            )
            .unwrap();
        assert_eq!(got, ChaosFault::ServerError);
        assert!(
            state
                .inject(&MockChaos::new(1, 0.0), &body("y", 0), true, &turn)
                .is_none()
        );
    }
}
