//! The tool executor: the single entry point for every tool call.
//!
//! For each call it looks the tool up, parses and validates the arguments against the
//! input schema (validators compiled once per tool), runs the tool under its timeout with
//! panics contained, retries retryable failures with decorrelated jitter (honouring a
//! tool's retry-after hint), validates the output against the output schema, and caps the
//! payload with a truncation notice. Whatever happens, the result is a [`ToolOutcome`]:
//! failures are data for the model, never a crash of the run.
//!
//! Calls of one model turn run concurrently: read-only and idempotent tools share a read
//! lock, mutating tools take the write lock so they never overlap with anything.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use keel_core::tool::{CredentialSource, NoCredentials};
use keel_core::{
    CancellationToken, DynTool, Effect, ToolCall, ToolContext, ToolError, ToolErrorCode,
    ToolOutcome, ToolRegistry, ToolResultKind, ToolSpec,
};
use serde_json::Value;
use tokio::sync::RwLock;

/// The longest server-suggested wait the executor honours before a retry.
const MAX_RETRY_AFTER_MS: u64 = 60_000;

/// How long a cancelled tool may take to return its own answer before it is abandoned
/// (a worker's lease must outlast it: see `keel_app::worker`).
pub const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// Where a call runs.
#[derive(Debug, Clone, Copy)]
pub struct CallEnv<'a> {
    /// Thread id.
    pub thread_id: &'a str,
    /// Run id.
    pub run_id: &'a str,
    /// The run's cancellation token; each call gets a child of it.
    pub cancel: &'a CancellationToken,
    /// What the calling run lends its tools (trace, call spans, run context); `None`
    /// lends nothing.
    pub extras: Option<&'a CallExtras>,
}

/// What a run lends the tools it calls, through [`ToolContext`]: its trace id, each call's
/// span id, and a shared value tools may downcast (keel-runtime lends the run's
/// [`crate::RunContext`], which an agent offered as a tool runs with).
#[derive(Clone, Default)]
pub struct CallExtras {
    /// The run's W3C trace id.
    pub trace_id: String,
    /// Call id → the span id of the call's events.
    pub spans: HashMap<String, String>,
    /// Call id → the idempotency key the call's start recorded (a call not named here
    /// gets `thread_id:call_id`).
    pub keys: HashMap<String, String>,
    /// Lent as [`ToolContext::runtime`].
    pub runtime: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// The run's credential source ([`crate::RunContext::credentials`]), used over the
    /// executor's own.
    pub credentials: Option<Arc<dyn CredentialSource>>,
}

impl std::fmt::Debug for CallExtras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallExtras")
            .field("trace_id", &self.trace_id)
            .field("spans", &self.spans)
            .field("keys", &self.keys)
            .field("runtime", &self.runtime.is_some())
            .field("credentials", &self.credentials.is_some())
            .finish()
    }
}

/// One retry the executor made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRecord {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// Why.
    pub code: ToolErrorCode,
    /// How long it waited before the next attempt.
    pub wait_ms: u64,
}

/// The outcome of one call plus what happened on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// The outcome.
    pub outcome: ToolOutcome,
    /// Retries made.
    pub retries: Vec<RetryRecord>,
}

struct CompiledTool {
    tool: Arc<dyn DynTool>,
    input: Option<jsonschema::Validator>,
    output: Option<jsonschema::Validator>,
}

/// Runs tool calls under the tool contract.
pub struct ToolExecutor {
    tools: HashMap<String, CompiledTool>,
    names: Vec<String>,
    mutation_lock: Arc<RwLock<()>>,
    credentials: Arc<dyn CredentialSource>,
    max_parallel_calls: usize,
}

/// Calls of one model turn that run at once by default; the rest wait for a free slot.
pub const DEFAULT_MAX_PARALLEL_CALLS: usize = 8;

impl std::fmt::Debug for ToolExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolExecutor")
            .field("tools", &self.names)
            .finish_non_exhaustive()
    }
}

impl ToolExecutor {
    /// An executor for a registry. Schemas were checked at registration, so compiling them
    /// here only fails for exotic schemas; such a tool then runs without that validation.
    pub fn new(registry: &ToolRegistry) -> Self {
        let mut tools = HashMap::new();
        for spec in registry.specs() {
            let Some(tool) = registry.get(&spec.name) else {
                continue;
            };
            let input = jsonschema::validator_for(&spec.input_schema).ok();
            let output = spec
                .output_schema
                .as_ref()
                .and_then(|s| jsonschema::validator_for(s).ok());
            tools.insert(
                spec.name.clone(),
                CompiledTool {
                    tool: Arc::clone(tool),
                    input,
                    output,
                },
            );
        }
        Self {
            names: registry.names().map(str::to_string).collect(),
            tools,
            mutation_lock: Arc::new(RwLock::new(())),
            credentials: Arc::new(NoCredentials),
            max_parallel_calls: DEFAULT_MAX_PARALLEL_CALLS,
        }
    }

    /// At most this many calls of one turn run at once (default
    /// [`DEFAULT_MAX_PARALLEL_CALLS`]; at least 1): a model asking for 500 calls in one turn
    /// does not open 500 connections.
    pub fn with_max_parallel_calls(mut self, calls: usize) -> Self {
        self.max_parallel_calls = calls.max(1);
        self
    }

    /// Uses this credential source for every call (a run's own source,
    /// [`crate::RunContext::credentials`], takes precedence).
    pub fn with_credentials(mut self, credentials: Arc<dyn CredentialSource>) -> Self {
        self.credentials = credentials;
        self
    }

    /// A tool by name.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn DynTool>> {
        self.tools.get(name).map(|t| &t.tool)
    }

    /// The spec of a tool.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).map(|t| t.tool.spec())
    }

    /// Executes one call. Never panics, never hangs past the tool's timeout.
    pub async fn execute(&self, call: &ToolCall, env: CallEnv<'_>) -> Execution {
        let started = Instant::now();
        let mut retries = Vec::new();
        let mut repairs = Vec::new();
        let (result, attempts) = self
            .execute_inner(call, env, &mut retries, &mut repairs)
            .await;
        // Whatever a tool puts into an error goes into the log and the next prompt: bounded.
        let result = match result {
            ToolResultKind::Error {
                code,
                message,
                details,
            } => {
                let capped = keel_core::cap::cap_tool_error(
                    ToolError {
                        code,
                        message,
                        details,
                        retry_after_ms: None,
                    },
                    &call.name,
                );
                error_kind(capped)
            }
            ok => ok,
        };
        let outcome = ToolOutcome {
            tool: call.name.clone(),
            call_id: call.id.clone(),
            thread_id: env.thread_id.to_string(),
            run_id: env.run_id.to_string(),
            attempts,
            latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            repairs,
            result,
        };
        Execution { outcome, retries }
    }

    async fn execute_inner(
        &self,
        call: &ToolCall,
        env: CallEnv<'_>,
        retries: &mut Vec<RetryRecord>,
        repairs: &mut Vec<String>,
    ) -> (ToolResultKind, u32) {
        let Some(compiled) = self.tools.get(&call.name) else {
            let error = ToolError::new(
                ToolErrorCode::NotFound,
                format!(
                    "unknown tool `{}`; available tools: {}",
                    call.name,
                    if self.names.is_empty() {
                        "none".to_string()
                    } else {
                        self.names.join(", ")
                    }
                ),
            );
            return (error_kind(error), 0);
        };
        let spec = compiled.tool.spec();
        let args = match call.parse_arguments() {
            Ok(args) => args,
            Err(error) => {
                let error = ToolError::invalid_input(format!(
                    "arguments for `{}` are not valid JSON ({error}); send one JSON object matching the tool's input schema",
                    call.name
                ))
                .with_details(serde_json::json!({ "raw_arguments": call.arguments }));
                return (error_kind(error), 0);
            }
        };
        if let Some(validator) = &compiled.input
            && let Some(error) = schema_errors(validator, &args, "input")
        {
            return (
                error_kind(error.prefixed(&format!("invalid arguments for `{}`", spec.name))),
                0,
            );
        }

        // A mutating call is repeated only when the tool deduplicates on its idempotency key.
        let max_attempts = spec.max_attempts();
        let mut previous_wait = spec.retry.base_delay_ms.max(1);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = {
                // Held for the attempt only, never through a retry's wait.
                let _guard = match spec.effect {
                    Effect::Mutating => LockGuard::Write(self.mutation_lock.write().await),
                    Effect::ReadOnly | Effect::Idempotent => {
                        LockGuard::Read(self.mutation_lock.read().await)
                    }
                };
                self.attempt(compiled, args.clone(), call, env).await
            };
            let error = match result {
                Ok(data) => return (self.check_output(compiled, data, repairs), attempt),
                Err(error) => error,
            };
            if !error.code.is_retryable() || attempt >= max_attempts || env.cancel.is_cancelled() {
                return (error_kind(error), attempt);
            }
            let wait_ms = match error.retry_after_ms {
                // A server-given wait is honoured, up to a minute.
                Some(ms) => ms.min(MAX_RETRY_AFTER_MS),
                None => decorrelated_jitter(
                    spec.retry.base_delay_ms,
                    previous_wait,
                    spec.retry.max_delay_ms,
                ),
            };
            previous_wait = wait_ms.max(1);
            retries.push(RetryRecord {
                attempt,
                code: error.code,
                wait_ms,
            });
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                () = env.cancel.cancelled() => {
                    return (error_kind(ToolError::new(ToolErrorCode::Cancelled, "cancelled while waiting to retry")), attempt);
                }
            }
        }
    }

    async fn attempt(
        &self,
        compiled: &CompiledTool,
        args: Value,
        call: &ToolCall,
        env: CallEnv<'_>,
    ) -> Result<Value, ToolError> {
        let spec = compiled.tool.spec();
        let call_token = env.cancel.child();
        let mut ctx = ToolContext::new(
            env.thread_id,
            env.run_id,
            call.id.clone(),
            call_token.clone(),
        );
        ctx.credentials = Arc::clone(&self.credentials);
        if let Some(extras) = env.extras {
            ctx.trace_id.clone_from(&extras.trace_id);
            if let Some(span) = extras.spans.get(&call.id) {
                ctx.span_id.clone_from(span);
            }
            if let Some(key) = extras.keys.get(&call.id) {
                ctx.idempotency_key.clone_from(key);
            }
            ctx.runtime.clone_from(&extras.runtime);
            if let Some(credentials) = &extras.credentials {
                ctx.credentials = Arc::clone(credentials);
            }
        }
        let work = AssertUnwindSafe(compiled.tool.call(args, &ctx)).catch_unwind();
        let mut work = std::pin::pin!(tokio::time::timeout(spec.timeout(), work));
        let result = tokio::select! {
            result = &mut work => result,
            () = env.cancel.cancelled() => {
                // The tool sees its token cancelled; give it a moment to answer for itself
                // (seed 002 §8: a cancelled tool returns a result describing the cancellation).
                call_token.cancel();
                match tokio::time::timeout(CANCEL_GRACE, &mut work).await {
                    Ok(result) => result,
                    Err(_) => {
                        return Err(ToolError::new(
                            ToolErrorCode::Cancelled,
                            format!("`{}` was cancelled", spec.name),
                        ));
                    }
                }
            }
        };
        match result {
            Err(_elapsed) => {
                call_token.cancel();
                Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!(
                        "`{}` did not answer within {} ms",
                        spec.name, spec.timeout_ms
                    ),
                ))
            }
            Ok(Err(panic)) => Err(ToolError::new(
                ToolErrorCode::ToolBug,
                format!("`{}` crashed: {}", spec.name, panic_message(panic.as_ref())),
            )),
            Ok(Ok(result)) => result,
        }
    }

    /// Validates output against the output schema, applying bounded repair when it does
    /// not match, then caps the payload.
    fn check_output(
        &self,
        compiled: &CompiledTool,
        mut data: Value,
        repairs: &mut Vec<String>,
    ) -> ToolResultKind {
        let spec = compiled.tool.spec();
        let schema_validated = match (&compiled.output, &spec.output_schema) {
            (Some(validator), Some(schema)) => {
                if let Some(mismatch) = schema_errors(validator, &data, "output") {
                    let mut repaired = data.clone();
                    let applied = crate::repair::repair(&mut repaired, schema);
                    let fixed = !applied.is_empty()
                        && crate::repair::within_bounds(&applied)
                        && schema_errors(validator, &repaired, "output").is_none();
                    if !fixed {
                        let error = mismatch.prefixed(&format!(
                            "`{}` returned output that does not match its output schema (not repairable)",
                            spec.name
                        ));
                        let mut details = error.details.clone().unwrap_or(Value::Null);
                        if let Some(map) = details.as_object_mut() {
                            map.insert("attempted_repairs".into(), serde_json::json!(applied));
                        }
                        return error_kind(ToolError {
                            details: Some(details),
                            ..error
                        });
                    }
                    data = repaired;
                    repairs.extend(applied);
                }
                true
            }
            _ => false,
        };
        let (data, truncated) = cap_payload(data, spec.max_payload_bytes, &spec.name);
        ToolResultKind::Ok {
            data,
            schema_validated,
            truncated,
        }
    }

    /// Executes the calls of one model turn concurrently — at most
    /// [`ToolExecutor::with_max_parallel_calls`] at once — and yields their executions in
    /// call order, so results can be committed in order as they come.
    pub fn execute_ordered<'s>(
        &'s self,
        calls: Vec<ToolCall>,
        env: CallEnv<'s>,
    ) -> futures::stream::BoxStream<'s, (ToolCall, Execution)> {
        use futures::StreamExt;
        futures::stream::iter(calls)
            .map(move |call| async move {
                let execution = self.execute(&call, env).await;
                (call, execution)
            })
            .buffered(self.max_parallel_calls)
            .boxed()
    }
}

enum LockGuard<'a> {
    Read(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'a, ()>),
}

trait Prefixed {
    fn prefixed(self, prefix: &str) -> Self;
}

impl Prefixed for ToolError {
    fn prefixed(mut self, prefix: &str) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }
}

fn error_kind(error: ToolError) -> ToolResultKind {
    ToolResultKind::Error {
        code: error.code,
        message: error.message,
        details: error.details,
    }
}

/// All schema violations of `value` (at most 5), as one error naming each failing path.
fn schema_errors(
    validator: &jsonschema::Validator,
    value: &Value,
    which: &str,
) -> Option<ToolError> {
    let errors: Vec<(String, String)> = validator
        .iter_errors(value)
        .take(5)
        .map(|e| {
            let path = e.instance_path().to_string();
            (
                if path.is_empty() {
                    "/".to_string()
                } else {
                    path
                },
                e.to_string(),
            )
        })
        .collect();
    if errors.is_empty() {
        return None;
    }
    let message = errors
        .iter()
        .map(|(path, message)| format!("at `{path}`: {message}"))
        .collect::<Vec<_>>()
        .join("; ");
    let details = serde_json::json!({
        "schema": which,
        "errors": errors.iter().map(|(path, message)| serde_json::json!({"path": path, "message": message})).collect::<Vec<_>>(),
    });
    let code = if which == "input" {
        ToolErrorCode::InvalidInput
    } else {
        ToolErrorCode::OutputSchemaMismatch
    };
    Some(ToolError::new(code, message).with_details(details))
}

/// Decorrelated jitter (AWS architecture blog): `min(cap, random(base, previous * 3))`.
pub fn decorrelated_jitter(base_ms: u64, previous_ms: u64, cap_ms: u64) -> u64 {
    let base = base_ms.max(1);
    let upper = previous_ms.saturating_mul(3).max(base + 1);
    fastrand::u64(base..upper).min(cap_ms.max(base))
}

/// Truncates output over the cap, appending `[OUTPUT TRUNCATED: showing X of Y bytes from
/// TOOL]`. Returns the (possibly) new data and whether it was truncated.
pub fn cap_payload(data: Value, max_bytes: usize, tool: &str) -> (Value, bool) {
    let text = match &data {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() <= max_bytes {
        return (data, false);
    }
    let mut cut = max_bytes;
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let kept = text.get(..cut).unwrap_or_default();
    let notice = format!(
        "\n[OUTPUT TRUNCATED: showing {cut} of {} bytes from {tool}; ask for a narrower query or the next page]",
        text.len()
    );
    (Value::String(format!("{kept}{notice}")), true)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}
