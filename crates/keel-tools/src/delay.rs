//! `delay`: waits for a number of milliseconds, honouring cancellation. Used to test
//! timeouts, parallelism and cancellation.

use std::time::{Duration, Instant};

use keel_core::{Tool, ToolContext, ToolError, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `delay`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelayArgs {
    /// Milliseconds to wait (0 to 600000).
    #[schemars(range(min = 0, max = 600_000))]
    pub ms: u64,
}

/// Output of `delay`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DelayOutput {
    /// Milliseconds requested.
    pub requested_ms: u64,
    /// Milliseconds actually waited.
    pub waited_ms: u64,
    /// True when the wait was cut short by cancellation.
    pub cancelled: bool,
    /// The thread the call ran in.
    pub thread_id: String,
    /// The run the call ran in.
    pub run_id: String,
}

/// The `delay` tool.
#[derive(Debug, Default, Clone, Copy)]
pub struct Delay;

const USAGE: &str = "\
delay — Usage Guide

Primary purpose:
- Wait for a given number of milliseconds, then report how long it waited.

Rules:
- Only use it when asked to wait or to test timing; it does nothing else.
- If the run is cancelled while waiting, it returns successfully with cancelled=true.

Arguments:
- ms: milliseconds to wait, 0 to 600000 (required).

Error codes:
- invalid_input: ms missing, negative or above 600000.

Good usage:
- {\"ms\": 200}

Bad usage:
- {\"ms\": \"two seconds\"} (ms must be an integer)";

impl Tool for Delay {
    type Args = DelayArgs;
    type Output = DelayOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "delay",
            "Wait for a number of milliseconds (cancellable).",
            USAGE,
        )
        .with_timeout(Duration::from_secs(660))
    }

    async fn call(&self, args: DelayArgs, ctx: &ToolContext) -> Result<DelayOutput, ToolError> {
        if args.ms > 600_000 {
            return Err(ToolError::invalid_input(format!(
                "ms must be at most 600000, got {}",
                args.ms
            )));
        }
        let started = Instant::now();
        let cancelled = tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(args.ms)) => false,
            () = ctx.cancel.cancelled() => true,
        };
        Ok(DelayOutput {
            requested_ms: args.ms,
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            cancelled,
            thread_id: ctx.thread_id.clone(),
            run_id: ctx.run_id.clone(),
        })
    }
}
