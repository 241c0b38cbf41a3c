//! Declarative HTTP tools: a tool for any HTTP/JSON service, declared in configuration
//! (a TOML table of an agent file or `keel.toml`) instead of code.
//!
//! ```toml
//! [[tools]]
//! name = "get_release_summary"
//! description = "Fetch the summary of a release."
//! usage = "get_release_summary — Usage Guide ..."
//! method = "GET"
//! url = "${RELEASE_SERVICE_URL:-http://127.0.0.1:8787}/releases/{release_id}/summary"
//! headers = { Authorization = "Bearer ${RELEASE_TOKEN:-none}" }
//! input_schema = { type = "object", properties = { release_id = { type = "string" } }, required = ["release_id"] }
//! timeout_ms = 10000
//! ```
//!
//! `${VAR}` and `${VAR:-default}` in the URL and header values are resolved from the
//! environment when the tool is built ([`HttpTool::new`] names any missing variable).
//! Secrets that depend on who calls go in `auth` instead (`auth = { bearer_env =
//! "CRM_TOKEN" }`, `auth = { headers = { "X-Api-Key" = "CRM_KEY" } }`): the variables it
//! names are resolved at each call, through the call's credential source first (in `keel
//! serve`, the tenant's own secret; see [`auth`](self::HttpAuth)), else the environment;
//! `{argument}` placeholders in the URL are filled from the call's arguments at call time
//! (percent-encoded as one path segment; `.` and `..` are refused). Arguments not used in
//! the URL go to the JSON body (POST, PUT, PATCH) or the query string (GET, DELETE), unless
//! `body` lists them explicitly; arguments `input_schema` does not declare are refused
//! unless it allows them (`additionalProperties`). Mutating tools send an
//! `Idempotency-Key` header (stable across retries and resumes of the same call).
//!
//! Redirects follow the declaration's [`RedirectPolicy`] (default: same origin only), and
//! the configured headers never travel to another origin. Every request, and every hop of
//! a redirect, obeys the tool's [`OutboundPolicy`] (keel-outbound): loopback, private,
//! link-local and metadata addresses are refused (`forbidden`, `details.error =
//! "outbound_refused"`) unless the policy allows them — by default it allows the host the
//! declaration's `url` names, since the operator wrote it ([`HttpTool::with_outbound`]). HTTP statuses map to the tool
//! error taxonomy with [`ToolErrorCode::from_http_status`]; the error keeps the status and
//! an excerpt of the body capped at 512 bytes and redacted (configured secrets and
//! anything that looks like a credential) in `details`, and `Retry-After` becomes
//! `retry_after_ms`. Error texts never show query strings, userinfo or header values.
//! JSON responses are parsed; anything else is returned as text. Every request has a
//! timeout and honours `ToolContext::cancel`.

mod auth;
mod errors;
mod redact;
/// Redirect policies and hops (shared with the other outbound clients: keel-outbound).
pub use keel_outbound::redirect;
mod response;
pub mod template;

use auth::AuthHeaders;
pub use auth::{CallEnv, HttpAuth, process_env};
use redact::{Secrets, display_url};
pub use redirect::RedirectPolicy;
use response::retry_after_ms;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use keel_core::{
    ApprovalMode, DynTool, Effect, RetryPolicy, ToolContext, ToolError, ToolErrorCode, ToolSpec,
};
pub use keel_outbound::OutboundPolicy;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Longest response body read, in bytes; larger bodies are cut (and reported as an error
/// for non-JSON-parsable results).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Time allowed to open a connection (bounded further by the tool's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client of an outbound policy, shared by every HTTP tool of the process with
/// an equal policy ([`OutboundPolicy::cache_key`]), built on first use. Building a client
/// loads the system's trusted certificates (milliseconds each time, and a copy of the
/// store per client) and each client keeps its own connection pool, so one per tool made
/// start-up cost grow with the number of tools and kept tools that call the same host
/// from sharing connections. The client resolves names through the policy (keel-outbound's
/// `PolicyResolver`); per-call settings live on each request instead: the tool's timeout
/// (`send`), and redirects, which are never followed by the client — `send` follows them
/// itself, checking each target and dropping the configured headers when a hop leaves
/// the origin.
fn client_for(policy: &OutboundPolicy) -> Result<reqwest::Client, String> {
    keel_outbound::resolve::shared_client(policy, CONNECT_TIMEOUT)
}

/// An HTTP method of a declarative tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// GET (default effect: read-only).
    #[serde(alias = "get")]
    Get,
    /// POST (default effect: mutating).
    #[serde(alias = "post")]
    Post,
    /// PUT (default effect: idempotent).
    #[serde(alias = "put")]
    Put,
    /// PATCH (default effect: mutating).
    #[serde(alias = "patch")]
    Patch,
    /// DELETE (default effect: idempotent).
    #[serde(alias = "delete")]
    Delete,
}

impl HttpMethod {
    fn as_reqwest(self) -> reqwest::Method {
        match self {
            Self::Get => reqwest::Method::GET,
            Self::Post => reqwest::Method::POST,
            Self::Put => reqwest::Method::PUT,
            Self::Patch => reqwest::Method::PATCH,
            Self::Delete => reqwest::Method::DELETE,
        }
    }

    /// Whether unused arguments travel in a JSON body (else in the query string).
    fn has_body(self) -> bool {
        matches!(self, Self::Post | Self::Put | Self::Patch)
    }

    /// The effect a tool with this method has unless declared otherwise.
    pub fn default_effect(self) -> Effect {
        match self {
            Self::Get => Effect::ReadOnly,
            Self::Put | Self::Delete => Effect::Idempotent,
            Self::Post | Self::Patch => Effect::Mutating,
        }
    }
}

fn default_version() -> String {
    "1.0.0".into()
}

fn default_input_schema() -> Value {
    json!({"type": "object", "properties": {}})
}

fn default_timeout_ms() -> u64 {
    30_000
}

/// The declaration of an HTTP tool (one TOML table or JSON object). Unknown keys are
/// refused, naming the key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// Unique `lowercase_snake_case` tool name.
    pub name: String,
    /// One or two sentences telling the model when to call the tool.
    pub description: String,
    /// LLM-facing usage guidance rendered into the system prompt.
    pub usage: String,
    /// Contract version (default `1.0.0`).
    #[serde(default = "default_version")]
    pub version: String,
    /// The HTTP method.
    pub method: HttpMethod,
    /// URL template: `${ENV}` / `${ENV:-default}` from the environment, `{argument}` from
    /// the call's arguments.
    pub url: String,
    /// Request headers; values may reference `${ENV}` (resolved once, when the tool is
    /// built: the same for every caller).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Credentials by the names of the variables holding them, resolved at each call
    /// through the call's credential source first (a server's tenant), else the
    /// environment: `{ bearer_env = "VAR" }`, `{ headers = { "X-Api-Key" = "VAR" } }`.
    #[serde(default, skip_serializing_if = "HttpAuth::is_empty")]
    pub auth: HttpAuth,
    /// JSON Schema of the arguments (an object schema).
    #[serde(default = "default_input_schema")]
    pub input_schema: Value,
    /// JSON Schema of the response, when declared (the executor checks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Arguments sent in the JSON body (POST/PUT/PATCH) or query string (GET/DELETE).
    /// Default: every argument not used in the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Vec<String>>,
    /// Per-attempt timeout in milliseconds (default 30000).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Retry policy for retryable failures (default: 3 attempts).
    #[serde(default)]
    pub retry: RetryPolicy,
    /// What the tool does to the world (default from the method: GET read_only, PUT and
    /// DELETE idempotent, POST and PATCH mutating).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Whether calls need human approval (default never).
    #[serde(default)]
    pub approval: ApprovalMode,
    /// Output larger than this (serialized JSON bytes) is truncated with a notice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_payload_bytes: Option<usize>,
    /// Which redirects are followed: `same_origin` (default), `none` or `any` (then the
    /// configured headers are not sent to other origins).
    #[serde(default)]
    pub redirects: RedirectPolicy,
    /// The service deduplicates on the `Idempotency-Key` header every non-read-only call
    /// sends (default false). Only then are failed `mutating` calls retried.
    #[serde(default)]
    pub honours_idempotency_key: bool,
}

/// Why an HTTP tool could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpToolError {
    /// A `${VAR}` without default refers to an unset environment variable.
    #[error(
        "tool `{tool}`: environment variable `{variable}` (used in {field}) is not set; set \
         it, or give a default as `${{{variable}:-value}}`"
    )]
    MissingEnv {
        /// The tool.
        tool: String,
        /// The variable.
        variable: String,
        /// Where it is used (`url` or `headers.NAME`).
        field: String,
    },
    /// The declaration breaks a rule; each problem names the field and the fix.
    #[error("tool `{tool}` is misconfigured: {}", problems.join("; "))]
    Invalid {
        /// The tool.
        tool: String,
        /// One line per problem.
        problems: Vec<String>,
    },
    /// The HTTP client could not be created.
    #[error("tool `{tool}`: cannot create the HTTP client: {message}")]
    Client {
        /// The tool.
        tool: String,
        /// The reason.
        message: String,
    },
}

impl HttpToolConfig {
    /// Environment variables referenced (without a default) by the URL or a header that are
    /// not set in the process environment, with where each is used (`url`, `headers.X`).
    pub fn missing_env_vars(&self) -> Vec<(String, String)> {
        self.missing_env_vars_with(&|name| std::env::var(name).ok())
    }

    /// Every `${VAR}` the declaration references (with or without a default), as
    /// `(variable, field)`.
    pub fn env_references(&self) -> Vec<(String, String)> {
        self.missing_env_vars_with(&|_| None)
            .into_iter()
            .chain(self.defaulted_env_refs())
            .collect()
    }

    fn defaulted_env_refs(&self) -> Vec<(String, String)> {
        std::iter::once(("url".to_string(), &self.url))
            .chain(
                self.headers
                    .iter()
                    .map(|(k, v)| (format!("headers.{k}"), v)),
            )
            .flat_map(|(field, text)| {
                template::env_refs(text)
                    .into_iter()
                    .filter(|reference| reference.default.is_some())
                    .map(move |reference| (reference.name, field.clone()))
            })
            .collect()
    }

    /// [`missing_env_vars`](Self::missing_env_vars) with an explicit environment lookup.
    pub fn missing_env_vars_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let fields = std::iter::once(("url".to_string(), &self.url)).chain(
            self.headers
                .iter()
                .map(|(k, v)| (format!("headers.{k}"), v)),
        );
        for (field, text) in fields {
            for reference in template::env_refs(text) {
                if reference.default.is_none() && env(&reference.name).is_none() {
                    out.push((reference.name, field.clone()));
                }
            }
        }
        out
    }

    /// The tool contract this declaration produces.
    pub fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(&self.name, &self.description, &self.usage)
            .with_version(self.version.clone())
            .with_input_schema(self.input_schema.clone())
            .with_output_schema(self.output_schema.clone())
            .with_effect(self.effect.unwrap_or_else(|| self.method.default_effect()))
            .with_approval(self.approval)
            .with_retry(self.retry)
            .with_idempotency_key(self.honours_idempotency_key)
            .with_timeout(Duration::from_millis(self.timeout_ms));
        if let Some(bytes) = self.max_payload_bytes {
            spec = spec.with_max_payload_bytes(bytes);
        }
        spec
    }
}

/// The argument names `input_schema` declares, or `None` when it explicitly allows other
/// arguments (`additionalProperties` `true` or a schema, or any `patternProperties`).
/// Without such a declaration, undeclared arguments are refused rather than forwarded.
fn declared_args(input_schema: &Value) -> Option<Vec<String>> {
    let allows_more = match input_schema.get("additionalProperties") {
        Some(Value::Bool(allowed)) => *allowed,
        Some(Value::Object(_)) => true,
        _ => false,
    } || input_schema.get("patternProperties").is_some();
    if allows_more {
        return None;
    }
    Some(
        input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|properties| properties.keys().cloned().collect())
            .unwrap_or_default(),
    )
}

/// A tool calling an HTTP/JSON endpoint, built from an [`HttpToolConfig`].
pub struct HttpTool {
    spec: ToolSpec,
    method: HttpMethod,
    /// The URL with `${ENV}` resolved; `{argument}` placeholders remain.
    url_template: String,
    /// Arguments used by the URL.
    url_args: Vec<String>,
    body_args: Option<Vec<String>>,
    /// The arguments a call may have; `None` when the schema allows others
    /// (`additionalProperties` true or a schema, or `patternProperties`).
    declared_args: Option<Vec<String>>,
    headers: reqwest::header::HeaderMap,
    /// `auth`: credential headers resolved at each call.
    auth: AuthHeaders,
    /// Where `auth` variables are read when the call's credential source leaves them to
    /// the tool.
    call_env: CallEnv,
    redirects: RedirectPolicy,
    /// Which non-public addresses the tool may reach.
    outbound: OutboundPolicy,
    /// Header values and URL-template credentials, kept out of error texts.
    secrets: Secrets,
    client: reqwest::Client,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may hold secrets: only their names are shown.
        f.debug_struct("HttpTool")
            .field("name", &self.spec.name)
            .field("method", &self.method)
            .field("url", &self.url_template)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("redirects", &self.redirects)
            .field("outbound", &self.outbound)
            .finish_non_exhaustive()
    }
}

impl HttpTool {
    /// Builds the tool, resolving `${ENV}` from the process environment.
    pub fn new(config: HttpToolConfig) -> Result<Self, HttpToolError> {
        Self::with_env(config, &|name| std::env::var(name).ok())
    }

    /// Builds the tool with an explicit environment lookup.
    pub fn with_env(
        config: HttpToolConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, HttpToolError> {
        let tool = config.name.clone();
        let missing = |field: String, names: Vec<String>| HttpToolError::MissingEnv {
            tool: tool.clone(),
            variable: names.into_iter().next().unwrap_or_default(),
            field,
        };
        let url_template =
            template::expand_env(&config.url, env).map_err(|names| missing("url".into(), names))?;
        let mut header_values = Vec::new();
        for (name, value) in &config.headers {
            let value = template::expand_env(value, env)
                .map_err(|names| missing(format!("headers.{name}"), names))?;
            header_values.push((name.clone(), value));
        }

        let spec = config.spec();
        let mut problems = spec.contract_violations();
        let properties = config
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let url_args = template::placeholders(&url_template);
        for arg in &url_args {
            if !properties.contains_key(arg) {
                problems.push(format!(
                    "url: placeholder `{{{arg}}}` is not a property of input_schema; add \
                     `{arg}` to input_schema.properties (and to `required`)"
                ));
            }
        }
        for arg in config.body.iter().flatten() {
            if !properties.contains_key(arg) {
                problems.push(format!(
                    "body: `{arg}` is not a property of input_schema; list only declared \
                     arguments"
                ));
            }
        }
        let probe: Map<String, Value> = url_args
            .iter()
            .map(|a| (a.clone(), Value::String("x".into())))
            .collect();
        match template::fill_placeholders(&url_template, &probe).map(|u| url::Url::parse(&u)) {
            Ok(Ok(url)) if matches!(url.scheme(), "http" | "https") => {}
            Ok(Ok(url)) => problems.push(format!(
                "url: scheme `{}` is not supported; use http:// or https://",
                url.scheme()
            )),
            Ok(Err(error)) => problems.push(format!(
                "url: `{url_template}` is not a valid absolute URL ({error}); write it as \
                 http://host:port/path/{{argument}}"
            )),
            Err(error) => problems.push(format!("url: {error}")),
        }
        if config.timeout_ms == 0 {
            problems.push("timeout_ms: must be greater than 0".into());
        }
        let auth = AuthHeaders::compile(&config.auth, &config.headers, &mut problems);
        let secrets = Secrets::of_tool(
            header_values.iter().map(|(_, value)| value.as_str()),
            &url_template,
        );
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in header_values {
            let header_name = reqwest::header::HeaderName::from_bytes(name.as_bytes());
            let header_value = reqwest::header::HeaderValue::from_str(&value);
            match (header_name, header_value) {
                (Ok(n), Ok(mut v)) => {
                    v.set_sensitive(true);
                    headers.insert(n, v);
                }
                (Err(_), _) => problems.push(format!(
                    "headers: `{name}` is not a valid header name (letters, digits and `-`)"
                )),
                (_, Err(_)) => problems.push(format!(
                    "headers.{name}: the value contains characters not allowed in a header \
                     (e.g. a newline)"
                )),
            }
        }
        problems.dedup();
        if !problems.is_empty() {
            return Err(HttpToolError::Invalid { tool, problems });
        }
        let outbound = OutboundPolicy::default().allowing_destination(&url_template);
        let client = client_for(&outbound).map_err(|message| HttpToolError::Client {
            tool: tool.clone(),
            message,
        })?;
        Ok(Self {
            spec,
            method: config.method,
            url_template,
            url_args,
            body_args: config.body,
            declared_args: declared_args(&config.input_schema),
            headers,
            auth,
            call_env: process_env(),
            redirects: config.redirects,
            outbound,
            secrets,
            client,
        })
    }

    /// Calls under `policy` instead of the default (public addresses and the host of the
    /// declaration's `url`). The policy is used as given: to keep the declared host
    /// reachable when it is not public, include it
    /// ([`OutboundPolicy::allowing_destination`] with [`url_template`](Self::url_template)).
    pub fn with_outbound(mut self, policy: OutboundPolicy) -> Result<Self, HttpToolError> {
        self.client = client_for(&policy).map_err(|message| HttpToolError::Client {
            tool: self.spec.name.clone(),
            message,
        })?;
        self.outbound = policy;
        Ok(self)
    }

    /// Reads the variables of `auth` through `env` (default: the process environment)
    /// when the call's credential source leaves them to the tool.
    #[must_use]
    pub fn with_call_env(mut self, env: CallEnv) -> Self {
        self.call_env = env;
        self
    }

    /// The URL template with `${ENV}` resolved.
    pub fn url_template(&self) -> &str {
        &self.url_template
    }

    /// Checks `args` and builds the request's URL and JSON body, or an `invalid_input`
    /// error naming the argument.
    fn prepare(&self, args: &Value) -> Result<Prepared, ToolError> {
        let empty = Map::new();
        let args = match args {
            Value::Object(map) => map,
            Value::Null => &empty,
            other => {
                return Err(ToolError::invalid_input(format!(
                    "arguments of `{}` must be a JSON object, got {other}",
                    self.spec.name
                )));
            }
        };
        if let Some(declared) = &self.declared_args
            && let Some(unknown) = args.keys().find(|key| !declared.contains(*key))
        {
            let accepted = if declared.is_empty() {
                "it takes no arguments".to_string()
            } else {
                format!("accepted arguments are {}", declared.join(", "))
            };
            return Err(ToolError::invalid_input(format!(
                "`{}` has no argument `{unknown}`; remove it from the call ({accepted})",
                self.spec.name
            ))
            .with_details(json!({"field": unknown})));
        }
        let url = template::fill_placeholders(&self.url_template, args)
            .map_err(ToolError::invalid_input)?;
        let mut url = url::Url::parse(&url).map_err(|error| {
            ToolError::invalid_input(format!(
                "the URL built from the arguments is invalid: {error}"
            ))
        })?;
        let rest: Map<String, Value> = args
            .iter()
            .filter(|(key, _)| match &self.body_args {
                Some(listed) => listed.contains(key),
                None => !self.url_args.contains(key),
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if self.method.has_body() {
            let body = serde_json::to_vec(&Value::Object(rest)).map_err(|error| {
                ToolError::invalid_input(format!("arguments cannot be serialized: {error}"))
            })?;
            return Ok(Prepared {
                url,
                body: Some(body),
            });
        }
        if !rest.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (key, value) in &rest {
                match value {
                    Value::Array(items) => {
                        for item in items {
                            let text =
                                template::scalar_text(item).unwrap_or_else(|| item.to_string());
                            pairs.append_pair(key, &text);
                        }
                    }
                    Value::Null => {}
                    other => {
                        let text =
                            template::scalar_text(other).unwrap_or_else(|| other.to_string());
                        pairs.append_pair(key, &text);
                    }
                }
            }
        }
        Ok(Prepared { url, body: None })
    }

    /// Sends the request, following redirects as the tool's policy allows (see
    /// [`redirect`]), all within the tool's timeout. Returns the final response.
    async fn send(
        &self,
        prepared: Prepared,
        ctx: &ToolContext,
        call: &CallAuth,
    ) -> Result<reqwest::Response, ToolError> {
        let deadline = tokio::time::Instant::now() + self.spec.timeout();
        let original = prepared.url.clone();
        let mut url = prepared.url;
        let mut body = prepared.body;
        let mut method = self.method.as_reqwest();
        // The configured headers go only to the tool's own origin: once a redirect leaves
        // it, they stay behind for the rest of the chain.
        let mut own_origin = true;
        for _ in 0..=redirect::MAX_REDIRECTS {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if remaining.is_zero() {
                return Err(self.timeout_error(&url));
            }
            // An IP-literal host is checked here; names are checked by the client's
            // resolver on the addresses it connects to.
            self.outbound
                .check_url(&url)
                .await
                .map_err(|refused| self.refused_address(&url, &refused))?;
            let mut builder = self
                .client
                .request(method.clone(), url.clone())
                .timeout(remaining)
                .header(
                    reqwest::header::ACCEPT,
                    "application/json, text/plain;q=0.9, */*;q=0.5",
                );
            if own_origin {
                builder = builder
                    .headers(self.headers.clone())
                    .headers(call.headers.clone());
            }
            if let Some(body) = &body {
                builder = builder
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
            }
            if self.spec.effect != Effect::ReadOnly {
                builder = builder.header("Idempotency-Key", &ctx.idempotency_key);
            }
            let response = builder
                .send()
                .await
                .map_err(|error| self.transport_error(error, &url, &call.secrets))?;
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok());
            let hop = match redirect::next_hop(
                self.redirects,
                &original,
                &url,
                response.status(),
                location,
            ) {
                None => return Ok(response),
                Some(Ok(hop)) => hop,
                Some(Err(refusal)) => {
                    return Err(self.refused_redirect(&url, &response, refusal, &call.secrets));
                }
            };
            if hop.becomes_get && method != reqwest::Method::GET {
                method = reqwest::Method::GET;
                body = None;
            }
            own_origin &= !hop.cross_origin;
            url = hop.url;
        }
        Err(ToolError::new(
            ToolErrorCode::ToolBug,
            format!(
                "`{}`: more than {} redirects starting at {}; point `url` at the final \
                 address",
                self.spec.name,
                redirect::MAX_REDIRECTS,
                display_url(&original)
            ),
        ))
    }

    /// The call's credential headers and every secret to keep out of its texts.
    fn call_auth(&self, ctx: &ToolContext) -> Result<CallAuth, ToolError> {
        if self.auth.is_empty() {
            return Ok(CallAuth {
                headers: reqwest::header::HeaderMap::new(),
                secrets: self.secrets.clone(),
                own: Secrets::default(),
            });
        }
        let resolved = self.auth.resolve(&self.spec.name, ctx, &self.call_env)?;
        Ok(CallAuth {
            headers: resolved.headers,
            secrets: self.secrets.with(resolved.secrets.iter().cloned()),
            own: Secrets::of_values(resolved.secrets),
        })
    }

    async fn perform(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let prepared = self.prepare(&args)?;
        let call = self.call_auth(ctx)?;
        let mut response = self.send(prepared, ctx, &call).await?;
        let name = &self.spec.name;
        let status = response.status();
        let url = response.url().clone();
        let retry_after_ms = retry_after_ms(response.headers());
        let mut body = Vec::new();
        let mut cut = false;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| self.transport_error(error, &url, &call.secrets))?
        {
            let room = MAX_BODY_BYTES.saturating_sub(body.len());
            body.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
            if chunk.len() > room {
                cut = true;
                break;
            }
        }
        // A service echoing the call's credentials: they never reach the log or the model.
        if !call.own.is_empty() && call.own.appear_in(&String::from_utf8_lossy(&body)) {
            body = call.own.scrub(&String::from_utf8_lossy(&body)).into_bytes();
        }
        let parsed: Option<Value> = serde_json::from_slice(&body).ok();
        if status.is_success() {
            let text = String::from_utf8_lossy(&body).into_owned();
            if cut && parsed.is_none() {
                return Err(ToolError::new(
                    ToolErrorCode::ToolBug,
                    format!("`{name}`: the response exceeds {MAX_BODY_BYTES} bytes"),
                ));
            }
            return Ok(match parsed {
                Some(value) => value,
                None if text.trim().is_empty() => json!({"status": status.as_u16()}),
                None => Value::String(text),
            });
        }
        let mut error = self.status_error(status, &url, &body, cut, parsed, &call.secrets);
        if let Some(ms) = retry_after_ms {
            error = error.with_retry_after_ms(ms);
        }
        Err(error)
    }
}

/// The credentials of one call.
struct CallAuth {
    /// `auth`'s headers (sensitive values).
    headers: reqwest::header::HeaderMap,
    /// The tool's fixed secrets and the call's.
    secrets: Secrets,
    /// The call's own credentials only (scrubbed from successful answers too).
    own: Secrets,
}

/// The URL and JSON body of one call, before sending.
struct Prepared {
    url: url::Url,
    body: Option<Vec<u8>>,
}

impl DynTool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    "the call was cancelled",
                ));
            }
            tokio::select! {
                result = self.perform(args, ctx) => result,
                () = ctx.cancel.cancelled() => Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    format!("`{}` was cancelled before the service answered", self.spec.name),
                )),
            }
        })
    }
}
