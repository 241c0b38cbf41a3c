//! Keel's tools served over MCP ([`serve_stdio`], [`serve`]).
//!
//! `tools/list` advertises every tool of a [`ToolRegistry`] with its input and output
//! schemas and annotations derived from its effect. `tools/call` validates the arguments
//! against the input schema and runs the tool with its timeout, cancelled when the client
//! sends `notifications/cancelled`. Following MCP 2025-11-25, invalid arguments and tool
//! failures come back as tool results with `isError: true` (so a model can correct
//! itself) carrying Keel's error object as `structuredContent`; an unknown tool name is a
//! JSON-RPC `-32602` error.
//!
//! There is no human to ask here. Which calls need a decision is the served tools'
//! [`ApprovalGate`] (`keel mcp serve`: keel.toml `[approvals]`, resolved as for a run;
//! by default the specs' `approval = always`): a call it denies is refused with
//! `forbidden`, and a call that would need a human's approval is refused with `forbidden`
//! saying no approver is configured for an MCP-served tool — nothing runs either way. A
//! tool that panics answers `tool_bug` instead of taking the request down. Each served
//! connection is a session with its own id, and a call's idempotency key is the one the
//! client sent in `_meta` (`dev.keel/idempotencyKey`, what a Keel client sends: its call's
//! durable key) or else `mcp:<session id>:<JSON-RPC request id>`, unique across sessions
//! (clients restart their request ids at 0).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use keel_core::{
    ApprovalMode, CancellationToken, Effect, ToolContext, ToolError, ToolErrorCode, ToolRegistry,
    ToolSpec,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// Tools per `tools/list` page.
const PAGE_SIZE: usize = 100;
/// How long a cancelled or timed-out tool may take to wind down.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Why serving over MCP stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The client did not complete the handshake.
    #[error("MCP handshake with the client failed: {0}")]
    Handshake(String),
    /// The server task ended abnormally.
    #[error("MCP server task failed: {0}")]
    Task(String),
}

/// What may happen to a call of a served tool, decided before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedApproval {
    /// It runs.
    Run,
    /// It needs a human's approval first, which nobody can give over MCP: refused.
    Ask,
    /// Approvals deny it: refused.
    Deny,
}

/// Decides, from a tool's spec, what happens to its calls over MCP (see
/// [`KeelMcpServer::with_approvals`]).
pub type ApprovalGate = Arc<dyn Fn(&ToolSpec) -> ServedApproval + Send + Sync>;

/// The gate without configuration: a tool declared `approval = always` needs a human.
fn declared_approvals() -> ApprovalGate {
    Arc::new(|spec: &ToolSpec| {
        if spec.approval == ApprovalMode::Always {
            ServedApproval::Ask
        } else {
            ServedApproval::Run
        }
    })
}

/// An MCP server exposing the tools of a registry. [`serve`] gives every connection it
/// serves a new session id.
#[derive(Clone)]
pub struct KeelMcpServer {
    registry: ToolRegistry,
    approvals: ApprovalGate,
    validators: Arc<std::collections::BTreeMap<String, Result<jsonschema::Validator, String>>>,
    /// Part of every idempotency key; new per served connection.
    session: String,
    max_protocol_version: Option<ProtocolVersion>,
}

impl std::fmt::Debug for KeelMcpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeelMcpServer")
            .field("tools", &self.registry)
            .finish()
    }
}

impl KeelMcpServer {
    /// A server for these tools.
    pub fn new(registry: ToolRegistry) -> Self {
        let validators = registry
            .specs()
            .map(|spec| {
                let validator = jsonschema::validator_for(&spec.input_schema)
                    .map_err(|e| format!("input schema of `{}` does not compile: {e}", spec.name));
                (spec.name.clone(), validator)
            })
            .collect();
        Self {
            registry,
            approvals: declared_approvals(),
            validators: Arc::new(validators),
            session: new_session_id(),
            max_protocol_version: None,
        }
    }

    /// Decides with `gate` which calls run, need approval (refused) or are denied
    /// (refused), instead of the specs' `approval = always` alone. `keel mcp serve` passes
    /// keel.toml's `[approvals]`, resolved as keel-app resolves them for a run.
    pub fn with_approvals(mut self, gate: ApprovalGate) -> Self {
        self.approvals = gate;
        self
    }

    /// The MCP `Tool` for `spec` as this server offers it (saying when calls are refused).
    fn tool_for(&self, spec: &ToolSpec) -> Tool {
        let mut tool = mcp_tool_for_spec(spec);
        let gate = (self.approvals)(spec);
        let note = match gate {
            ServedApproval::Run => None,
            ServedApproval::Ask if spec.approval == ApprovalMode::Always => None,
            ServedApproval::Ask => {
                Some("Needs human approval before each call; calls over MCP are refused.")
            }
            ServedApproval::Deny => {
                Some("Denied by this server's approval settings; calls over MCP are refused.")
            }
        };
        if let Some(note) = note
            && let Some(description) = &mut tool.description
        {
            *description = format!("{description}\n\n{note}").into();
        }
        tool
    }

    /// The idempotency key of the call with JSON-RPC id `request_id` in this session.
    fn idempotency_key(&self, request_id: &str) -> String {
        format!("mcp:{}:{request_id}", self.session)
    }

    /// Speaks no protocol revision newer than `version` (e.g. `"2025-06-18"`), for
    /// clients that mis-handle newer ones. By default every revision rmcp knows is
    /// offered: the discovery-based 2026-07-28 and the `initialize` handshake of
    /// 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05.
    pub fn with_max_protocol_version(mut self, version: &str) -> Self {
        self.max_protocol_version = serde_json::from_value(Value::String(version.into())).ok();
        self
    }
}

fn new_session_id() -> String {
    keel_core::new_id("session")
}

/// The MCP `Tool` for a Keel spec: usage guidance appended to the description (and, for a
/// tool that needs human approval, that calls over MCP are refused), annotations from the
/// effect.
pub fn mcp_tool_for_spec(spec: &ToolSpec) -> Tool {
    let mut description = format!("{}\n\n{}", spec.description.trim(), spec.usage.trim());
    if spec.approval == ApprovalMode::Always {
        description
            .push_str("\n\nNeeds human approval before each call; calls over MCP are refused.");
    }
    let annotations = json!({
        "title": spec.name,
        "readOnlyHint": spec.effect == Effect::ReadOnly,
        "destructiveHint": spec.effect == Effect::Mutating,
        "idempotentHint": spec.effect != Effect::Mutating,
        "openWorldHint": false,
    });
    let mut tool = json!({
        "name": spec.name,
        "description": description,
        "inputSchema": spec.input_schema,
        "annotations": annotations,
    });
    if let Some(output) = &spec.output_schema
        && output.get("type").and_then(Value::as_str) == Some("object")
        && let Value::Object(map) = &mut tool
    {
        map.insert("outputSchema".into(), output.clone());
    }
    serde_json::from_value(tool).unwrap_or_else(|_| {
        Tool::new(
            spec.name.clone(),
            spec.description.clone(),
            Arc::new(serde_json::Map::new()),
        )
    })
}

fn error_result(error: &ToolError) -> CallToolResult {
    let mut body = serde_json::Map::new();
    body.insert("code".into(), Value::String(error.code.as_str().into()));
    body.insert("message".into(), Value::String(error.message.clone()));
    if let Some(details) = &error.details {
        body.insert("details".into(), details.clone());
    }
    let value = json!({ "error": body });
    let mut result = CallToolResult::structured_error(value);
    result.content = vec![ContentBlock::text(format!(
        "{}: {}",
        error.code, error.message
    ))];
    result
}

fn success_result(spec: &ToolSpec, output: Value) -> CallToolResult {
    let text = match &output {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let declared = spec
        .output_schema
        .as_ref()
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        == Some("object");
    if output.is_object() && declared {
        let mut result = CallToolResult::structured(output);
        result.content = vec![ContentBlock::text(text)];
        result
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    }
}

impl ServerHandler for KeelMcpServer {
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        match &self.max_protocol_version {
            Some(max) => std::borrow::Cow::Owned(ProtocolVersion::known_up_to(max).to_vec()),
            None => std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("keel", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Keel's tools. Each tool's description ends with its usage guide; errors come \
                 back as results with isError and a structured {\"error\":{code,message}}.",
            )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().map_err(|_| {
                ErrorData::invalid_params(format!("invalid cursor `{cursor}`"), None)
            })?,
        };
        let specs: Vec<&ToolSpec> = self.registry.specs().collect();
        let page: Vec<Tool> = specs
            .iter()
            .skip(start)
            .take(PAGE_SIZE)
            .map(|spec| self.tool_for(spec))
            .collect();
        let end = start + page.len();
        Ok(ListToolsResult {
            tools: page,
            next_cursor: (end < specs.len()).then(|| end.to_string()),
            ..ListToolsResult::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let Some(tool) = self.registry.get(&name) else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{name}`; call tools/list for the available tools"),
                None,
            ));
        };
        let spec = tool.spec();
        match (self.approvals)(spec) {
            ServedApproval::Run => {}
            ServedApproval::Ask => {
                return Ok(error_result(&approval_required_error(spec)).into());
            }
            ServedApproval::Deny => return Ok(error_result(&denied_error(&name)).into()),
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        match self.validators.get(&name) {
            Some(Ok(validator)) => {
                let problems: Vec<String> = validator
                    .iter_errors(&args)
                    .map(|e| {
                        let path = e.instance_path().to_string();
                        let at = if path.is_empty() {
                            "arguments".to_string()
                        } else {
                            format!("`{path}`")
                        };
                        format!("{at}: {e}")
                    })
                    .collect();
                if !problems.is_empty() {
                    let error = ToolError::invalid_input(format!(
                        "arguments for `{name}` do not match its input schema: {}",
                        problems.join("; ")
                    ))
                    .with_details(json!({ "problems": problems }));
                    return Ok(error_result(&error).into());
                }
            }
            Some(Err(problem)) => {
                let error = ToolError::new(ToolErrorCode::ToolBug, problem.clone());
                return Ok(error_result(&error).into());
            }
            None => {}
        }
        let cancel = CancellationToken::new();
        let call_id = format!(
            "{}",
            serde_json::to_value(&context.id).unwrap_or(Value::Null)
        );
        let mut ctx = ToolContext::new("mcp", self.session.clone(), call_id, cancel.clone());
        // A client's own durable key (a Keel client sends its call's) is the call's key:
        // the same on the client's every attempt and resume. Else one of this session.
        ctx.idempotency_key = crate::convert::idempotency_key_from_meta(Some(&context.meta))
            .unwrap_or_else(|| self.idempotency_key(&ctx.call_id));
        // A panicking tool answers `tool_bug`; the session and other calls go on.
        let call = AssertUnwindSafe(tool.call(args, &ctx))
            .catch_unwind()
            .map(|result| result.unwrap_or_else(|panic| Err(panic_error(&name, panic.as_ref()))));
        tokio::pin!(call);
        let stopped = tokio::select! {
            result = &mut call => Ok(result),
            _ = context.ct.cancelled() => {
                Err(ToolError::new(ToolErrorCode::Cancelled, "cancelled by the MCP client"))
            }
            _ = tokio::time::sleep(spec.timeout()) => Err(ToolError::new(
                ToolErrorCode::Timeout,
                format!("`{name}` did not finish within {} ms", spec.timeout_ms),
            )),
        };
        let outcome = match stopped {
            Ok(result) => result,
            Err(error) => {
                // Tell the tool, and give it a moment to clean up before dropping it.
                cancel.cancel();
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut call).await;
                Err(error)
            }
        };
        Ok(match outcome {
            Ok(output) => success_result(spec, output),
            Err(error) => error_result(&error),
        }
        .into())
    }
}

fn approval_required_error(spec: &ToolSpec) -> ToolError {
    let name = &spec.name;
    let (why, approval) = if spec.approval == ApprovalMode::Always {
        ("its approval mode is `always`", "always")
    } else {
        ("keel.toml `[approvals]` sets it to `ask`", "ask")
    };
    ToolError::new(
        ToolErrorCode::Forbidden,
        format!(
            "`{name}` needs a human's approval before each call ({why}), and no approver is \
             configured for an MCP-served tool: `keel mcp serve` cannot ask anyone, so the \
             call was refused and nothing was done. Run it from an agent that can ask for \
             approval (`keel run`, `keel chat`), or serve only tools without approval \
             (`keel mcp serve --tool NAME`)."
        ),
    )
    .with_details(json!({ "approval": approval, "reason": "approval_required" }))
}

fn denied_error(name: &str) -> ToolError {
    ToolError::new(
        ToolErrorCode::Forbidden,
        format!(
            "calls of `{name}` are denied by keel.toml `[approvals]` (`[approvals.tools] \
             {name} = \"deny\"`, or `[approvals] mode = \"deny\"` for a tool that needs \
             approval), so the call was refused and nothing was done"
        ),
    )
    .with_details(json!({ "approval": "deny", "reason": "denied" }))
}

fn panic_error(name: &str, panic: &(dyn std::any::Any + Send)) -> ToolError {
    let message = if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-string payload".to_string()
    };
    ToolError::new(
        ToolErrorCode::ToolBug,
        format!("`{name}` crashed (panic: {message}); this is a bug in the tool, not in the call"),
    )
}

/// Serves `server` on any rmcp transport until the client disconnects, as a new session
/// (its own idempotency keys).
pub async fn serve<T, E, A>(server: KeelMcpServer, transport: T) -> Result<(), ServeError>
where
    T: rmcp::transport::IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let server = KeelMcpServer {
        session: new_session_id(),
        ..server
    };
    let running = server
        .serve(transport)
        .await
        .map_err(|e| ServeError::Handshake(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| ServeError::Task(e.to_string()))?;
    Ok(())
}

/// Serves the tools of `registry` as an MCP server on this process's stdin/stdout until
/// the client closes the connection. Nothing else may write to stdout meanwhile; log to
/// stderr.
pub async fn serve_stdio(registry: ToolRegistry) -> Result<(), ServeError> {
    serve_stdio_with(KeelMcpServer::new(registry)).await
}

/// [`serve_stdio`] of a configured server (`keel mcp serve`: with keel.toml's approvals,
/// [`KeelMcpServer::with_approvals`]).
pub async fn serve_stdio_with(server: KeelMcpServer) -> Result<(), ServeError> {
    serve(server, rmcp::transport::stdio()).await
}
