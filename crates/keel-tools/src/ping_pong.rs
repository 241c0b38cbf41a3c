//! `ping_pong`: echoes a message back, the smallest possible round trip through the tool
//! contract (connectivity checks and tests).

use keel_core::{Tool, ToolContext, ToolError, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `ping_pong`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PingPongArgs {
    /// The message to echo back.
    pub message: String,
    /// How many times to repeat the reply (1 to 10, default 1).
    #[serde(default)]
    #[schemars(range(min = 1, max = 10))]
    pub count: Option<u32>,
}

/// Output of `ping_pong`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PingPongOutput {
    /// `pong: <message>` repeated `count` times.
    pub replies: Vec<String>,
    /// The thread the call ran in.
    pub thread_id: String,
    /// The run the call ran in.
    pub run_id: String,
}

/// The `ping_pong` tool.
#[derive(Debug, Default, Clone, Copy)]
pub struct PingPong;

const USAGE: &str = "\
ping_pong — Usage Guide

Primary purpose:
- Check that tool calling works end to end; echoes your message back as `pong: <message>`.

Rules:
- Use it only when asked to test connectivity or the tool pipeline; it has no other effect.
- Safe to call often; read-only and idempotent.

Arguments:
- message: the text to echo (required, any string).
- count: how many replies to return, 1 to 10 (optional, default 1).

Error codes:
- invalid_input: message missing, or count outside 1..10.

Good usage:
- {\"message\": \"hello\"}
- {\"message\": \"hello\", \"count\": 3}

Bad usage:
- {} (message is required)
- {\"message\": \"hi\", \"count\": 50} (count above 10)";

impl Tool for PingPong {
    type Args = PingPongArgs;
    type Output = PingPongOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "ping_pong",
            "Echo a message back as `pong: <message>`.",
            USAGE,
        )
    }

    async fn call(
        &self,
        args: PingPongArgs,
        ctx: &ToolContext,
    ) -> Result<PingPongOutput, ToolError> {
        let count = args.count.unwrap_or(1);
        if !(1..=10).contains(&count) {
            return Err(ToolError::invalid_input(format!(
                "count must be between 1 and 10, got {count}"
            )));
        }
        let reply = format!("pong: {}", args.message);
        Ok(PingPongOutput {
            replies: vec![reply; count as usize],
            thread_id: ctx.thread_id.clone(),
            run_id: ctx.run_id.clone(),
        })
    }
}
