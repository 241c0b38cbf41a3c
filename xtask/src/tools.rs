//! The chaos harness's tools, each counting what it did so the harness can check the
//! executor's promises from the tools' side:
//!
//! - `book_order` — mutating, honours the idempotency key: the booking takes effect once
//!   per key; a seeded share of attempts then "loses the response" (a retryable error after
//!   the effect), which the executor may retry with the same key. Counted: attempts and
//!   effects per call.
//! - `notify_customer` — mutating, does NOT honour the key: it must run at most once per
//!   call; a seeded share of calls fails with a retryable error that must not be retried.
//! - `lookup_stock` — read-only with a short timeout; a seeded share of attempts hangs
//!   past it (a tool timeout), then the retry answers.
//!
//! Faults are decided from the seed, the call (thread and call id) and the attempt number,
//! so the same seed gives the same tool faults whatever the interleaving.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::{
    Effect, RegistryError, RetryPolicy, Tool, ToolContext, ToolError, ToolErrorCode, ToolRegistry,
    ToolSpec,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which tool calls fail, and how often.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolFaults {
    /// Seed of the decisions.
    pub seed: u64,
    /// Share of attempts that fail, 0.0 to 1.0.
    pub rate: f64,
}

impl ToolFaults {
    /// Whether attempt `attempt` of `tool`'s call `ctx` fails.
    fn fails(&self, tool: &str, ctx: &ToolContext, attempt: u32) -> bool {
        let key = fnv1a(&[tool, &ctx.thread_id, &ctx.call_id]);
        let mut rng = fastrand::Rng::with_seed(
            self.seed ^ key ^ u64::from(attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        rng.f64() < self.rate
    }
}

/// FNV-1a over the parts (with a separator), stable across Rust releases.
fn fnv1a(parts: &[&str]) -> u64 {
    parts
        .iter()
        .flat_map(|part| part.bytes().chain(std::iter::once(0xff)))
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// A tool call, as the tools see it: (thread, call id).
pub type CallKey = (String, String);

#[derive(Debug, Default)]
struct Counts {
    book_attempts: HashMap<CallKey, u32>,
    book_effects: HashMap<CallKey, u32>,
    /// Idempotency key → the booking it made.
    bookings: HashMap<String, String>,
    book_lost_responses: u64,
    book_deduplicated: u64,
    notify_attempts: HashMap<CallKey, u32>,
    notify_failures: u64,
    stock_attempts: HashMap<CallKey, u32>,
    stock_timeouts: u64,
}

/// What the tools did, shared by every copy of them.
#[derive(Debug, Default)]
pub struct Effects {
    counts: Mutex<Counts>,
}

/// A summary of [`Effects`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectsSummary {
    /// Distinct `book_order` calls.
    pub book_calls: usize,
    /// `book_order` attempts (executor retries included).
    pub book_attempts: u64,
    /// Bookings that took effect.
    pub book_effects: u64,
    /// Attempts answered from an earlier booking with the same idempotency key.
    pub book_deduplicated: u64,
    /// Attempts whose response was "lost" after the booking took effect.
    pub book_lost_responses: u64,
    /// `book_order` calls that took effect more than once.
    pub book_twice: Vec<CallKey>,
    /// Distinct `notify_customer` calls.
    pub notify_calls: usize,
    /// `notify_customer` executions.
    pub notify_attempts: u64,
    /// `notify_customer` calls that failed (retryable, not retried).
    pub notify_failures: u64,
    /// `notify_customer` calls executed more than once.
    pub notify_twice: Vec<CallKey>,
    /// `lookup_stock` attempts.
    pub stock_attempts: u64,
    /// `lookup_stock` attempts that hung past the timeout.
    pub stock_timeouts: u64,
}

impl Effects {
    fn with<T>(&self, f: impl FnOnce(&mut Counts) -> T) -> T {
        let mut counts = match self.counts.lock() {
            Ok(counts) => counts,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut counts)
    }

    /// The figures so far.
    pub fn summary(&self) -> EffectsSummary {
        self.with(|c| {
            let twice = |map: &HashMap<CallKey, u32>| {
                let mut keys: Vec<CallKey> = map
                    .iter()
                    .filter(|(_, n)| **n > 1)
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.sort();
                keys
            };
            EffectsSummary {
                book_calls: c.book_attempts.len(),
                book_attempts: c.book_attempts.values().map(|n| u64::from(*n)).sum(),
                book_effects: c.book_effects.values().map(|n| u64::from(*n)).sum(),
                book_deduplicated: c.book_deduplicated,
                book_lost_responses: c.book_lost_responses,
                book_twice: twice(&c.book_effects),
                notify_calls: c.notify_attempts.len(),
                notify_attempts: c.notify_attempts.values().map(|n| u64::from(*n)).sum(),
                notify_failures: c.notify_failures,
                notify_twice: twice(&c.notify_attempts),
                stock_attempts: c.stock_attempts.values().map(|n| u64::from(*n)).sum(),
                stock_timeouts: c.stock_timeouts,
            }
        })
    }
}

/// A registry with the three tools (sharing `effects`) and `failure_injection`.
pub fn registry(effects: &Arc<Effects>, faults: ToolFaults) -> Result<ToolRegistry, RegistryError> {
    let mut tools = ToolRegistry::new();
    tools.register_typed(BookOrder {
        effects: effects.clone(),
        faults,
    })?;
    tools.register_typed(NotifyCustomer {
        effects: effects.clone(),
        faults,
    })?;
    tools.register_typed(LookupStock {
        effects: effects.clone(),
        faults,
    })?;
    tools.register_typed(keel_tools::FailureInjection::default())?;
    Ok(tools)
}

fn key(ctx: &ToolContext) -> CallKey {
    (ctx.thread_id.clone(), ctx.call_id.clone())
}

/// Arguments of `book_order`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BookOrderArgs {
    /// The order to book.
    pub order: String,
}

/// Output of `book_order`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BookOrderOutput {
    /// The booking reference.
    pub booking: String,
    /// True when an earlier attempt with the same idempotency key already booked it.
    pub deduplicated: bool,
}

/// `book_order`: a mutating tool that deduplicates on the idempotency key.
#[derive(Debug)]
pub struct BookOrder {
    effects: Arc<Effects>,
    faults: ToolFaults,
}

impl Tool for BookOrder {
    type Args = BookOrderArgs;
    type Output = BookOrderOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "book_order",
            "Book an order in the order ledger.",
            "book_order — Usage Guide\n\nPrimary purpose:\n- Book the order the user asks for, once.\n\nArguments:\n- order: the order reference (required).\n\nError codes:\n- retryable_server: the ledger did not confirm; retried with the same idempotency key.",
        )
        .with_effect(Effect::Mutating)
        .with_idempotency_key(true)
        .with_timeout(Duration::from_secs(10))
        .with_retry(RetryPolicy {
            max_attempts: 4,
            base_delay_ms: 5,
            max_delay_ms: 50,
        })
    }

    async fn call(
        &self,
        args: BookOrderArgs,
        ctx: &ToolContext,
    ) -> Result<BookOrderOutput, ToolError> {
        let call = key(ctx);
        let (attempt, booking, deduplicated) = self.effects.with(|c| {
            let attempt = c.book_attempts.entry(call.clone()).or_insert(0);
            *attempt += 1;
            let attempt = *attempt;
            match c.bookings.get(&ctx.idempotency_key) {
                Some(booking) => {
                    c.book_deduplicated += 1;
                    (attempt, booking.clone(), true)
                }
                None => {
                    let booking = format!("bk-{}-{}", args.order, c.bookings.len() + 1);
                    c.bookings
                        .insert(ctx.idempotency_key.clone(), booking.clone());
                    *c.book_effects.entry(call.clone()).or_insert(0) += 1;
                    (attempt, booking, false)
                }
            }
        });
        if self.faults.fails("book_order", ctx, attempt) {
            self.effects.with(|c| c.book_lost_responses += 1);
            return Err(ToolError::new(
                ToolErrorCode::RetryableServer,
                "the ledger did not confirm the booking (connection reset)",
            ));
        }
        Ok(BookOrderOutput {
            booking,
            deduplicated,
        })
    }
}

/// Arguments of `notify_customer`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifyArgs {
    /// The message to send.
    pub message: String,
}

/// Output of `notify_customer`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NotifyOutput {
    /// Always true.
    pub sent: bool,
}

/// `notify_customer`: a mutating tool with no idempotency key — at most once per call.
#[derive(Debug)]
pub struct NotifyCustomer {
    effects: Arc<Effects>,
    faults: ToolFaults,
}

impl Tool for NotifyCustomer {
    type Args = NotifyArgs;
    type Output = NotifyOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "notify_customer",
            "Send the customer a message.",
            "notify_customer — Usage Guide\n\nPrimary purpose:\n- Tell the customer what happened, once.\n\nArguments:\n- message: the text to send (required).\n\nError codes:\n- retryable_server: the message may not have been sent; do not repeat it blindly.",
        )
        .with_effect(Effect::Mutating)
        .with_timeout(Duration::from_secs(10))
    }

    async fn call(&self, _args: NotifyArgs, ctx: &ToolContext) -> Result<NotifyOutput, ToolError> {
        let attempt = self.effects.with(|c| {
            let attempt = c.notify_attempts.entry(key(ctx)).or_insert(0);
            *attempt += 1;
            *attempt
        });
        if self.faults.fails("notify_customer", ctx, attempt) {
            self.effects.with(|c| c.notify_failures += 1);
            return Err(ToolError::new(
                ToolErrorCode::RetryableServer,
                "the messaging service timed out; the message may or may not have been sent",
            ));
        }
        Ok(NotifyOutput { sent: true })
    }
}

/// Arguments of `lookup_stock`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StockArgs {
    /// The item.
    pub sku: String,
}

/// Output of `lookup_stock`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StockOutput {
    /// The item.
    pub sku: String,
    /// Units in stock.
    pub units: u32,
}

/// The attempt timeout of `lookup_stock`.
pub const STOCK_TIMEOUT: Duration = Duration::from_millis(150);

/// `lookup_stock`: read-only; a slow attempt outlives its timeout and is retried.
#[derive(Debug)]
pub struct LookupStock {
    effects: Arc<Effects>,
    faults: ToolFaults,
}

impl Tool for LookupStock {
    type Args = StockArgs;
    type Output = StockOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "lookup_stock",
            "Look up how many units of an item are in stock.",
            "lookup_stock — Usage Guide\n\nPrimary purpose:\n- Check stock before promising a delivery.\n\nArguments:\n- sku: the item (required).\n\nError codes:\n- timeout: the warehouse did not answer in time (retried automatically).",
        )
        .with_effect(Effect::ReadOnly)
        .with_timeout(STOCK_TIMEOUT)
        .with_retry(RetryPolicy {
            max_attempts: 4,
            base_delay_ms: 5,
            max_delay_ms: 50,
        })
    }

    async fn call(&self, args: StockArgs, ctx: &ToolContext) -> Result<StockOutput, ToolError> {
        let attempt = self.effects.with(|c| {
            let attempt = c.stock_attempts.entry(key(ctx)).or_insert(0);
            *attempt += 1;
            *attempt
        });
        if self.faults.fails("lookup_stock", ctx, attempt) {
            self.effects.with(|c| c.stock_timeouts += 1);
            // Far past the timeout: the executor gives up on this attempt and retries.
            tokio::select! {
                () = tokio::time::sleep(STOCK_TIMEOUT * 20) => {}
                () = ctx.cancel.cancelled() => {}
            }
            return Err(ToolError::new(
                ToolErrorCode::Timeout,
                "the warehouse is slow",
            ));
        }
        Ok(StockOutput {
            sku: args.sku,
            units: 7,
        })
    }
}
