//! The tool contract: specs, the typed [`Tool`] trait, its erased form [`DynTool`], and the
//! per-call [`ToolContext`].
//!
//! A typed tool declares Rust argument and output types deriving `JsonSchema` and serde;
//! [`TypedTool`] generates the input and output JSON Schemas from those types, so the
//! schema the model sees cannot drift from the code. Tools defined at run time (MCP
//! servers, HTTP tools from configuration) implement [`DynTool`] directly.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cancel::CancellationToken;
use crate::outcome::{ToolError, ToolErrorCode};

/// What a tool does to the world; decides parallelism, re-execution on resume and approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Only reads; safe to run concurrently and to repeat.
    #[default]
    ReadOnly,
    /// Changes state, but repeating the same call has the same effect.
    Idempotent,
    /// Changes state; never repeated without the policy's consent.
    Mutating,
}

/// Whether a human must approve a call before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Runs without asking (unless the run's approval default says otherwise).
    #[default]
    Never,
    /// Always asks.
    Always,
}

/// How the executor retries a failing tool call (retryable codes only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 = no retry).
    pub max_attempts: u32,
    /// Base delay of the decorrelated-jitter backoff, in milliseconds.
    pub base_delay_ms: u64,
    /// Upper bound of one wait, in milliseconds.
    pub max_delay_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base_delay_ms: 200,
            max_delay_ms: 5_000,
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }
}

/// The full, declared contract of a tool (seed 000 §2.1, seed 002 §7). When deserialized
/// (tool catalogs, configuration), missing fields take the defaults of [`ToolSpec::new`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolSpec {
    /// Unique `lowercase_snake_case` name (optionally namespaced `prefix__name`, see
    /// [`is_tool_name`]), at most 64 characters.
    pub name: String,
    /// Contract version, bumped on incompatible change.
    pub version: String,
    /// One or two sentences telling the model when to call the tool.
    pub description: String,
    /// LLM-facing usage guidance rendered into the system prompt (required, non-empty).
    pub usage: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
    /// JSON Schema of the output, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Per-attempt timeout in milliseconds.
    pub timeout_ms: u64,
    /// Retry policy for retryable failures.
    pub retry: RetryPolicy,
    /// Maximum items per page for paginated tools.
    pub page_limit: u32,
    /// Output larger than this (serialized JSON bytes) is truncated with a notice.
    pub max_payload_bytes: usize,
    /// What the tool does to the world.
    pub effect: Effect,
    /// Whether calls need human approval.
    pub approval: ApprovalMode,
    /// The tool deduplicates on [`ToolContext::idempotency_key`] (e.g. sends it as an
    /// `Idempotency-Key` header the service honours), so repeating a call with the same key
    /// cannot repeat its effect. Only then is a failed `mutating` call retried; without it a
    /// mutating call runs at most once and a retryable failure goes to the model and the
    /// policy as data.
    #[serde(default, skip_serializing_if = "is_false")]
    pub honours_idempotency_key: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Default for ToolSpec {
    /// The defaults of [`ToolSpec::new`] with an empty name, description and usage (which
    /// [`ToolSpec::contract_violations`] reports).
    fn default() -> Self {
        Self::new("", "", "")
    }
}

impl ToolSpec {
    /// A spec with the seed's defaults: version 1.0.0, 30 s timeout, 3 attempts, page limit
    /// 100, 512,000-byte payload cap, read-only, no approval, and an empty object schema.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        usage: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            version: "1.0.0".into(),
            description: description.into(),
            usage: usage.into(),
            input_schema: serde_json::json!({"type": "object", "properties": {}}),
            output_schema: None,
            timeout_ms: 30_000,
            retry: RetryPolicy::default(),
            page_limit: 100,
            max_payload_bytes: 512_000,
            effect: Effect::ReadOnly,
            approval: ApprovalMode::Never,
            honours_idempotency_key: false,
        }
    }

    /// Declares that the tool deduplicates on the call's idempotency key (see
    /// [`ToolSpec::honours_idempotency_key`]).
    pub fn with_idempotency_key(mut self, honoured: bool) -> Self {
        self.honours_idempotency_key = honoured;
        self
    }

    /// Attempts the executor may make for one call: the retry policy's, except for a
    /// mutating tool that does not honour the idempotency key, which runs at most once.
    pub fn max_attempts(&self) -> u32 {
        if self.effect == Effect::Mutating && !self.honours_idempotency_key {
            1
        } else {
            self.retry.max_attempts.max(1)
        }
    }

    /// Sets the effect.
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// Sets the approval mode.
    pub fn with_approval(mut self, approval: ApprovalMode) -> Self {
        self.approval = approval;
        self
    }

    /// Sets the per-attempt timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the version.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Sets the input schema.
    pub fn with_input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    /// Sets the output schema.
    pub fn with_output_schema(mut self, schema: Option<Value>) -> Self {
        self.output_schema = schema;
        self
    }

    /// Sets the payload cap.
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// The per-attempt timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// What a provider sends to the model for this tool.
    pub fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self.input_schema.clone(),
        }
    }

    /// Every way this spec breaks the tool contract, each naming the tool and the rule.
    /// Empty when the spec is compliant.
    ///
    /// ```
    /// use keel_core::ToolSpec;
    ///
    /// let problems = ToolSpec::new("GetWeather", "The current weather.", "").contract_violations();
    /// assert!(problems.iter().any(|p| p.contains("e.g. `get_weather`")), "{problems:?}");
    /// assert!(problems.iter().any(|p| p.contains("usage guidance must not be empty")));
    ///
    /// let spec = ToolSpec::new("get_weather", "The current weather.", "get_weather — Usage Guide …");
    /// assert!(spec.contract_violations().is_empty());
    /// ```
    pub fn contract_violations(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let name = &self.name;
        if !is_tool_name(name) {
            problems.push(format!(
                "tool `{name}`: name must be lowercase_snake_case (a-z, 0-9 and single \
                 underscores, starting with a letter), optionally namespaced as \
                 `prefix__name` with exactly one double underscore, e.g. `{}`",
                suggest_snake_case(name)
            ));
        }
        if name.len() > 64 {
            problems.push(format!(
                "tool `{name}`: name is {} characters; the limit is 64",
                name.len()
            ));
        }
        if self.description.trim().is_empty() {
            problems.push(format!("tool `{name}`: description must not be empty"));
        }
        if self.usage.trim().is_empty() {
            problems.push(format!(
                "tool `{name}`: usage guidance must not be empty (it is rendered into the \
                 system prompt; see the `<tool> — Usage Guide` format)"
            ));
        }
        if self.version.trim().is_empty() {
            problems.push(format!("tool `{name}`: version must not be empty"));
        }
        if self.timeout_ms == 0 {
            problems.push(format!("tool `{name}`: timeout_ms must be greater than 0"));
        }
        if self.retry.max_attempts == 0 {
            problems.push(format!(
                "tool `{name}`: retry.max_attempts must be at least 1"
            ));
        }
        if self.max_payload_bytes == 0 {
            problems.push(format!(
                "tool `{name}`: max_payload_bytes must be greater than 0"
            ));
        }
        match self.input_schema.get("type").and_then(Value::as_str) {
            Some("object") => {}
            _ => problems.push(format!(
                "tool `{name}`: input schema must be a JSON Schema with \"type\": \"object\""
            )),
        }
        if let Err(error) = jsonschema::meta::validate(&self.input_schema) {
            problems.push(format!(
                "tool `{name}`: input schema is not a valid JSON Schema: {error}"
            ));
        }
        if let Some(output) = &self.output_schema
            && let Err(error) = jsonschema::meta::validate(output)
        {
            problems.push(format!(
                "tool `{name}`: output schema is not a valid JSON Schema: {error}"
            ));
        }
        problems
    }
}

/// True for `lowercase_snake_case`: starts with a letter, then letters, digits and single
/// underscores, not ending in an underscore.
pub fn is_snake_case_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if !first.is_ascii_lowercase() || name.ends_with('_') || name.contains("__") {
        return false;
    }
    chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// True for a valid tool name: `lowercase_snake_case`, optionally namespaced with exactly
/// one double-underscore separator as `prefix__name` where both halves are
/// `lowercase_snake_case` (tools proxied from MCP servers are named `<server>__<tool>`).
pub fn is_tool_name(name: &str) -> bool {
    match name.split_once("__") {
        None => is_snake_case_name(name),
        Some((prefix, rest)) => is_snake_case_name(prefix) && is_snake_case_name(rest),
    }
}

/// Turns any string into a valid tool name (`BadName` → `bad_name`, `a-b.c` → `a_b_c`).
pub fn suggest_snake_case(name: &str) -> String {
    let mut out = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if previous_lower && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            previous_lower = false;
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
            previous_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        } else {
            if !out.is_empty() && !out.ends_with('_') {
                out.push('_');
            }
            previous_lower = false;
        }
    }
    let trimmed = out.trim_matches('_');
    let mut result = String::new();
    for c in trimmed.chars() {
        if !(c == '_' && result.ends_with('_')) {
            result.push(c);
        }
    }
    if !result.starts_with(|c: char| c.is_ascii_lowercase()) {
        result.insert_str(0, "tool_");
    }
    result
        .chars()
        .take(64)
        .collect::<String>()
        .trim_end_matches('_')
        .to_string()
}

/// The part of a tool a provider sends to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Tool name.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
}

/// Looks up per-tool credentials (API keys, tokens) without putting them in prompts or logs.
///
/// `key` is the credential's name as the tool declares it (for keel-tools' HTTP tools and
/// keel-a2a's tools: the environment variable named in their `auth`). A tool asks
/// [`lookup`](Self::lookup) first and reads its own default place (its environment) only
/// when the answer is [`CredentialLookup::Unmanaged`]: a source that decides every
/// credential of a call (a server answering for one tenant) answers
/// [`CredentialLookup::Missing`] instead, so nothing falls back to the process's own
/// secrets.
pub trait CredentialSource: Send + Sync {
    /// The credential `key` for `tool`, if configured.
    fn credential(&self, tool: &str, key: &str) -> Option<String>;

    /// The credential `key` for `tool`: found, missing (the tool must fail, naming the
    /// fix, without looking elsewhere), or not this source's to answer (the tool reads its
    /// usual place). By default: [`credential`](Self::credential), and `Unmanaged` when it
    /// has none.
    fn lookup(&self, tool: &str, key: &str) -> CredentialLookup {
        match self.credential(tool, key) {
            Some(secret) => CredentialLookup::Found(secret),
            None => CredentialLookup::Unmanaged,
        }
    }
}

/// What a [`CredentialSource`] answers for one credential. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum CredentialLookup {
    /// The secret.
    Found(String),
    /// The source decides this call's credentials and has none for it: the call fails
    /// (`unauthorized`) with `fix`, a sentence naming the setting to add; the tool must
    /// not read its environment instead.
    Missing {
        /// What to configure, e.g. "add `[server.tenants.acme.credentials] CRM_TOKEN = …`".
        fix: String,
    },
    /// Not managed by this source: the tool reads its usual place (its environment).
    Unmanaged,
}

impl std::fmt::Debug for CredentialLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Found(_) => f.write_str("Found([redacted])"),
            Self::Missing { fix } => f.debug_struct("Missing").field("fix", fix).finish(),
            Self::Unmanaged => f.write_str("Unmanaged"),
        }
    }
}

/// A credential source with nothing in it.
#[derive(Debug, Default, Clone)]
pub struct NoCredentials;

impl CredentialSource for NoCredentials {
    fn credential(&self, _tool: &str, _key: &str) -> Option<String> {
        None
    }
}

/// Credentials held in memory, keyed by `(tool, key)`.
#[derive(Debug, Default, Clone)]
pub struct StaticCredentials(pub BTreeMap<(String, String), String>);

impl CredentialSource for StaticCredentials {
    fn credential(&self, tool: &str, key: &str) -> Option<String> {
        self.0.get(&(tool.to_string(), key.to_string())).cloned()
    }
}

/// Everything a tool call knows about where it runs.
#[derive(Clone)]
pub struct ToolContext {
    /// The thread (conversation) id.
    pub thread_id: String,
    /// The run id.
    pub run_id: String,
    /// The tool call id.
    pub call_id: String,
    /// Stable across retries and resumes of the same call: a mutating tool can use it to
    /// deduplicate (`thread_id:call_id`).
    pub idempotency_key: String,
    /// Cancelled when the run is cancelled or the call times out.
    pub cancel: CancellationToken,
    /// Per-tool credential lookup.
    pub credentials: Arc<dyn CredentialSource>,
    /// The trace of the calling run (W3C trace id; empty when the caller keeps none).
    pub trace_id: String,
    /// The call's span in that trace (empty when unknown): a tool that starts runs of its
    /// own (an agent offered as a tool) nests them under it.
    pub span_id: String,
    /// What the runtime driving the call lends to tools that need more than the call
    /// itself: keel-runtime lends the calling run's `RunContext` (store, observers,
    /// approval handler), which an agent offered as a tool runs with.
    pub runtime: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("thread_id", &self.thread_id)
            .field("run_id", &self.run_id)
            .field("call_id", &self.call_id)
            .field("idempotency_key", &self.idempotency_key)
            .field("span_id", &self.span_id)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl ToolContext {
    /// A context for a call, with no credentials.
    pub fn new(
        thread_id: impl Into<String>,
        run_id: impl Into<String>,
        call_id: impl Into<String>,
        cancel: CancellationToken,
    ) -> Self {
        let thread_id = thread_id.into();
        let call_id = call_id.into();
        Self {
            idempotency_key: format!("{thread_id}:{call_id}"),
            thread_id,
            run_id: run_id.into(),
            call_id,
            cancel,
            credentials: Arc::new(NoCredentials),
            trace_id: String::new(),
            span_id: String::new(),
            runtime: None,
        }
    }

    /// A credential for `tool`.
    pub fn credential(&self, tool: &str, key: &str) -> Option<String> {
        self.credentials.credential(tool, key)
    }

    /// What the call's credential source answers for credential `key` of `tool` (see
    /// [`CredentialSource::lookup`]).
    pub fn lookup_credential(&self, tool: &str, key: &str) -> CredentialLookup {
        self.credentials.lookup(tool, key)
    }
}

/// A tool with typed arguments and output. Wrap it in [`TypedTool`] to register it
/// ([`ToolRegistry::register_typed`](crate::ToolRegistry::register_typed) does).
///
/// The argument type's doc comments become the descriptions the model reads, and
/// arguments that do not match its schema are refused before `call` runs.
///
/// ```
/// use keel_core::{Tool, ToolContext, ToolError, ToolRegistry, ToolSpec};
/// use schemars::JsonSchema;
/// use serde::{Deserialize, Serialize};
///
/// /// The arguments of `add`.
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArgs {
///     /// The first term.
///     a: i64,
///     /// The second term.
///     b: i64,
/// }
///
/// /// The output of `add`.
/// #[derive(Serialize, JsonSchema)]
/// struct Sum {
///     sum: i64,
/// }
///
/// struct Add;
///
/// impl Tool for Add {
///     type Args = AddArgs;
///     type Output = Sum;
///
///     fn spec(&self) -> ToolSpec {
///         ToolSpec::new("add", "Add two integers.", "add — Usage Guide\n\nAdds two integers.")
///     }
///
///     async fn call(&self, args: AddArgs, _ctx: &ToolContext) -> Result<Sum, ToolError> {
///         let sum = args.a.checked_add(args.b);
///         sum.map(|sum| Sum { sum }).ok_or_else(|| ToolError::invalid_input("the sum overflows"))
///     }
/// }
///
/// let mut tools = ToolRegistry::new();
/// tools.register_typed(Add)?;
/// let add = tools.get("add").expect("registered");
/// // The input schema was generated from `AddArgs`.
/// assert_eq!(add.spec().input_schema["required"], serde_json::json!(["a", "b"]));
///
/// let ctx = ToolContext::new("thr_1", "run_1", "call_1", Default::default());
/// let output = futures::executor::block_on(add.call(serde_json::json!({"a": 2, "b": 3}), &ctx))?;
/// assert_eq!(output, serde_json::json!({"sum": 5}));
/// let refused = futures::executor::block_on(add.call(serde_json::json!({"a": "two"}), &ctx));
/// assert_eq!(refused.unwrap_err().code, keel_core::ToolErrorCode::InvalidInput);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Tool: Send + Sync + 'static {
    /// The arguments; their JSON Schema becomes the tool's input schema.
    type Args: DeserializeOwned + JsonSchema + Send + 'static;
    /// The output; its JSON Schema becomes the tool's output schema.
    type Output: Serialize + JsonSchema + Send + 'static;

    /// The tool's contract. `input_schema` and `output_schema` are ignored: [`TypedTool`]
    /// generates them from `Args` and `Output`.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool. Must not panic for bad input (the executor contains panics anyway,
    /// reporting them as `tool_bug`).
    fn call(
        &self,
        args: Self::Args,
        ctx: &ToolContext,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;
}

/// A tool whose schemas are plain JSON, called with JSON. Every tool in a registry is one.
pub trait DynTool: Send + Sync {
    /// The tool's contract.
    fn spec(&self) -> &ToolSpec;

    /// Runs the tool with already-parsed JSON arguments.
    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>>;

    /// The tool's own observation of an outcome, when it knows its output better than the
    /// default normalizer does.
    fn normalize(
        &self,
        _outcome: &crate::outcome::ToolOutcome,
    ) -> Option<crate::observation::Observation> {
        None
    }
}

/// Generates the JSON Schema for `T` in the form providers accept (no `$schema`, no title).
///
/// ```
/// /// A city.
/// #[derive(schemars::JsonSchema)]
/// struct City {
///     /// Its name.
///     name: String,
///     /// Inhabitants, if known.
///     population: Option<u64>,
/// }
///
/// let schema = keel_core::tool::schema_for::<City>();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["required"], serde_json::json!(["name"]));
/// assert_eq!(schema["properties"]["name"]["description"], "Its name.");
/// assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
/// ```
pub fn schema_for<T: JsonSchema>() -> Value {
    let schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>();
    let mut value = serde_json::to_value(schema).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("title");
    }
    value
}

/// Adapts a typed [`Tool`] to [`DynTool`], generating its schemas from the Rust types.
pub struct TypedTool<T: Tool> {
    tool: T,
    spec: ToolSpec,
}

impl<T: Tool> TypedTool<T> {
    /// Wraps a typed tool.
    pub fn new(tool: T) -> Self {
        let spec = tool
            .spec()
            .with_input_schema(schema_for::<T::Args>())
            .with_output_schema(Some(schema_for::<T::Output>()));
        Self { tool, spec }
    }

    /// The wrapped tool.
    pub fn inner(&self) -> &T {
        &self.tool
    }
}

impl<T: Tool> DynTool for TypedTool<T> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: T::Args = serde_json::from_value(args).map_err(|error| {
                ToolError::invalid_input(format!(
                    "arguments for `{}` do not match its schema: {error}",
                    self.spec.name
                ))
            })?;
            let output = self.tool.call(args, ctx).await?;
            serde_json::to_value(output).map_err(|error| {
                ToolError::new(
                    ToolErrorCode::ToolBug,
                    format!(
                        "`{}` produced output that is not JSON: {error}",
                        self.spec.name
                    ),
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_rule() {
        for ok in ["calculator", "ping_pong", "a1", "get_release_summary"] {
            assert!(is_snake_case_name(ok), "{ok}");
        }
        for bad in ["BadName", "", "_x", "x_", "a__b", "1abc", "a-b", "a b"] {
            assert!(!is_snake_case_name(bad), "{bad}");
        }
        assert_eq!(suggest_snake_case("BadName"), "bad_name");
        assert_eq!(suggest_snake_case("a-b.c"), "a_b_c");
        assert!(is_snake_case_name(&suggest_snake_case("__9Weird--Name__")));
        for ok in [
            "calculator",
            "everything__echo",
            "time__get_current_time",
            "a1__b2",
        ] {
            assert!(is_tool_name(ok), "{ok}");
        }
        for bad in [
            "a__b__c", "__b", "a__", "a___b", "A__b", "a__B", "a__1b", "",
        ] {
            assert!(!is_tool_name(bad), "{bad}");
        }
    }
}
