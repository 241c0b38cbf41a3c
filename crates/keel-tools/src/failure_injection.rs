//! `failure_injection`: fails on purpose — with a typed error, a panic, or a hang — for
//! the first `times` calls of a run, then succeeds. It proves the executor contains
//! failures: a panic becomes `tool_bug`, a hang becomes `timeout`, and the run goes on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use keel_core::{Effect, RetryPolicy, Tool, ToolContext, ToolError, ToolErrorCode, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the tool fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Return a typed error with `code`.
    Error,
    /// Panic inside the tool.
    Panic,
    /// Never return (until cancelled or timed out).
    Hang,
}

/// Error codes the tool can be asked to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InjectedCode {
    /// invalid_input
    InvalidInput,
    /// timeout
    Timeout,
    /// retryable_server
    RetryableServer,
    /// rate_limited
    RateLimited,
    /// output_schema_mismatch
    OutputSchemaMismatch,
    /// no_results
    NoResults,
    /// tool_bug
    ToolBug,
    /// unauthorized
    Unauthorized,
    /// forbidden
    Forbidden,
    /// not_found
    NotFound,
}

impl From<InjectedCode> for ToolErrorCode {
    fn from(code: InjectedCode) -> Self {
        match code {
            InjectedCode::InvalidInput => Self::InvalidInput,
            InjectedCode::Timeout => Self::Timeout,
            InjectedCode::RetryableServer => Self::RetryableServer,
            InjectedCode::RateLimited => Self::RateLimited,
            InjectedCode::OutputSchemaMismatch => Self::OutputSchemaMismatch,
            InjectedCode::NoResults => Self::NoResults,
            InjectedCode::ToolBug => Self::ToolBug,
            InjectedCode::Unauthorized => Self::Unauthorized,
            InjectedCode::Forbidden => Self::Forbidden,
            InjectedCode::NotFound => Self::NotFound,
        }
    }
}

/// Arguments of `failure_injection`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureInjectionArgs {
    /// How to fail.
    pub mode: FailureMode,
    /// The error code for mode `error` (default `tool_bug`).
    #[serde(default)]
    pub code: Option<InjectedCode>,
    /// Fail only the first `times` calls in this run, then succeed (default: always fail).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub times: Option<u32>,
}

/// Output of `failure_injection` once it stops failing.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FailureInjectionOutput {
    /// Always true.
    pub ok: bool,
    /// How many calls of this run failed before this one.
    pub failures_before: u32,
    /// The thread the call ran in.
    pub thread_id: String,
    /// The run the call ran in.
    pub run_id: String,
}

/// The `failure_injection` tool. Counts calls per run.
#[derive(Debug, Default)]
pub struct FailureInjection {
    calls_per_run: Mutex<HashMap<String, u32>>,
}

const USAGE: &str = "\
failure_injection — Usage Guide

Primary purpose:
- Test how the agent and its runtime handle failing tools. Never use it for real work.

Rules:
- mode error returns a typed error with `code`; mode panic crashes inside the tool; mode hang never answers.
- With `times: N` only the first N calls of the run fail; later calls succeed. Without it every call fails.
- Expect the runtime to retry retryable codes (rate_limited, retryable_server, timeout) automatically.

Arguments:
- mode: error | panic | hang (required).
- code: for mode error: invalid_input, timeout, retryable_server, rate_limited, output_schema_mismatch, no_results, tool_bug, unauthorized, forbidden, not_found (default tool_bug).
- times: number of calls to fail, 0 to 1000 (optional; default: always).

Error codes:
- whatever `code` says in mode error; tool_bug after a panic; timeout after a hang.

Good usage:
- {\"mode\": \"error\", \"code\": \"rate_limited\", \"times\": 2}
- {\"mode\": \"panic\"}

Bad usage:
- {\"mode\": \"explode\"} (unknown mode)";

impl Tool for FailureInjection {
    type Args = FailureInjectionArgs;
    type Output = FailureInjectionOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "failure_injection",
            "Fail on purpose (error, panic or hang) to test failure handling.",
            USAGE,
        )
        .with_effect(Effect::Idempotent)
        .with_timeout(Duration::from_secs(2))
        .with_retry(RetryPolicy {
            max_attempts: 3,
            base_delay_ms: 10,
            max_delay_ms: 100,
        })
    }

    async fn call(
        &self,
        args: FailureInjectionArgs,
        ctx: &ToolContext,
    ) -> Result<FailureInjectionOutput, ToolError> {
        let call_number = {
            let mut calls = match self.calls_per_run.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            let count = calls.entry(ctx.run_id.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let fails = args.times.is_none_or(|times| call_number <= times);
        if !fails {
            return Ok(FailureInjectionOutput {
                ok: true,
                failures_before: call_number.saturating_sub(1),
                thread_id: ctx.thread_id.clone(),
                run_id: ctx.run_id.clone(),
            });
        }
        match args.mode {
            FailureMode::Error => {
                let code: ToolErrorCode = args.code.unwrap_or(InjectedCode::ToolBug).into();
                Err(ToolError::new(
                    code,
                    format!("injected failure {call_number} ({code})"),
                ))
            }
            #[allow(clippy::panic)] // Panicking is this mode's whole purpose.
            FailureMode::Panic => panic!("failure_injection: injected panic {call_number}"),
            FailureMode::Hang => {
                ctx.cancel.cancelled().await;
                Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    "hang interrupted by cancellation",
                ))
            }
        }
    }
}
