//! Test-only tools, registered only when `KEEL_TEST_TOOLS=1`: `test_append`, a
//! *mutating* tool that appends one line `IDEMPOTENCY_KEY<TAB>TEXT` to the file named by
//! `KEEL_TEST_APPEND_FILE`. The crash and worker tests count those lines to prove that no
//! mutating call ran twice.

use std::io::Write;
use std::time::Duration;

use keel_core::registry::RegistryError;
use keel_core::{Effect, Tool, ToolContext, ToolError, ToolErrorCode, ToolRegistry, ToolSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The environment variable that enables the test tools.
pub const ENABLE_VAR: &str = "KEEL_TEST_TOOLS";
/// The file `test_append` appends to.
pub const FILE_VAR: &str = "KEEL_TEST_APPEND_FILE";

/// Whether the test tools are enabled.
pub fn enabled() -> bool {
    std::env::var(ENABLE_VAR).is_ok_and(|v| v == "1")
}

/// Adds the test tools to a catalog.
pub fn register(catalog: &mut ToolRegistry) -> Result<(), RegistryError> {
    catalog.register_typed(TestAppend)
}

/// Arguments of `test_append`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendArgs {
    /// The text to append.
    pub text: String,
    /// Milliseconds to wait before writing (0 to 10000).
    #[serde(default)]
    pub delay_before_ms: u64,
    /// Milliseconds to wait after writing (0 to 10000).
    #[serde(default)]
    pub delay_after_ms: u64,
    /// Before writing, wait until this file exists (tests use it to decide exactly when
    /// the effect happens). A cancelled call returns without writing.
    #[serde(default)]
    pub wait_for_file: Option<String>,
}

/// Output of `test_append`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AppendOutput {
    /// The idempotency key written with the line.
    pub idempotency_key: String,
}

/// The `test_append` tool.
#[derive(Debug, Default, Clone, Copy)]
pub struct TestAppend;

const USAGE: &str = "\
test_append — Usage Guide

Primary purpose:
- Append one line to the test file (a mutating effect), for durability tests.

Rules:
- Only for tests; it changes state, so it is never repeated after an interruption.

Arguments:
- text: the text to append (required).
- delay_before_ms / delay_after_ms: waits around the write, 0 to 10000.
- wait_for_file: a path; the write waits until it exists (a cancelled call never writes).

Error codes:
- invalid_input: a delay above 10000.
- tool_bug: KEEL_TEST_APPEND_FILE unset or the file cannot be written.

Good usage:
- {\"text\": \"hello\"}

Bad usage:
- {\"text\": 5} (text must be a string)";

impl Tool for TestAppend {
    type Args = AppendArgs;
    type Output = AppendOutput;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "test_append",
            "Append a line to the test file (mutating).",
            USAGE,
        )
        .with_effect(Effect::Mutating)
        .with_timeout(Duration::from_secs(30))
    }

    async fn call(&self, args: AppendArgs, ctx: &ToolContext) -> Result<AppendOutput, ToolError> {
        if args.delay_before_ms > 10_000 || args.delay_after_ms > 10_000 {
            return Err(ToolError::invalid_input("delays must be at most 10000 ms"));
        }
        let path = std::env::var(FILE_VAR).map_err(|_| {
            ToolError::new(ToolErrorCode::ToolBug, format!("{FILE_VAR} is not set"))
        })?;
        tokio::time::sleep(Duration::from_millis(args.delay_before_ms)).await;
        if let Some(gate) = &args.wait_for_file {
            while !std::path::Path::new(gate).exists() && !ctx.cancel.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::new(
                ToolErrorCode::Cancelled,
                "cancelled before writing",
            ));
        }
        let line = format!(
            "{}\t{}\n",
            ctx.idempotency_key,
            args.text.replace('\n', " ")
        );
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .map_err(|e| {
                ToolError::new(
                    ToolErrorCode::ToolBug,
                    format!("cannot append to {path}: {e}"),
                )
            })?;
        tokio::time::sleep(Duration::from_millis(args.delay_after_ms)).await;
        Ok(AppendOutput {
            idempotency_key: ctx.idempotency_key.clone(),
        })
    }
}
