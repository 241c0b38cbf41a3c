//! Every key of `docs/configuration.md`, with its effect. The test reads the key tables of
//! the document (each `| `key` |` row under a `## `[section]`` heading) and fails when a
//! documented key has no entry in [`KEYS`] or an entry names a key the document lacks.
//! Each entry demonstrates the key's effect: it builds the store, model, catalog, agent or
//! run context from a keel.toml setting that key and asserts what changes (the request a
//! mock provider receives, the cost a run reports, the budget, the approval outcome, the
//! tools offered, ...). Keys owned by other crates (`[telemetry]`, `[[mcp.servers]]`,
//! `[policies]`) are asserted through the public function of that crate that consumes
//! them, fed with the section keel.toml produced.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use keel_app::model::provider_options;
use keel_app::{AgentRef, AgentRequest, App, BuiltAgent, Env, StoreOrigin};
use keel_config::{KeelConfig, OutputFormat};
use keel_core::{EndState, Event, EventKind, EventStore, MemoryStore, Message, PlannerMode};
use keel_runtime::{RunApprovalMode, RunOutcome, RunStatus, Thread};
use keel_testkit::mock_llm::{MockLlmServer, MockRequest, MockScript};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde_json::{Value, json};

type Check = fn();

/// Every documented key and the check showing its effect.
const KEYS: &[(&str, Check)] = &[
    ("defaults.model", defaults_model),
    ("defaults.agent", defaults_agent),
    ("defaults.approve", defaults_approve),
    ("defaults.output", defaults_output),
    ("providers.<name>.kind", providers_kind),
    ("providers.<name>.base_url", providers_base_url),
    ("providers.<name>.api_key_env", providers_api_key_env),
    (
        "providers.<name>.connect_timeout_ms",
        providers_connect_timeout,
    ),
    ("providers.<name>.idle_timeout_ms", providers_idle_timeout),
    ("providers.<name>.loopback_only", providers_loopback_only),
    ("providers.<name>.retry.max_attempts", retry_max_attempts),
    (
        "providers.<name>.retry.initial_delay_ms",
        retry_initial_delay,
    ),
    ("providers.<name>.retry.max_delay_ms", retry_max_delay),
    ("providers.<name>.retry.factor", retry_factor),
    (
        "providers.<name>.retry.max_retry_after_ms",
        retry_max_retry_after,
    ),
    ("models.<alias>.model", models_model),
    ("models.<alias>.temperature", models_temperature),
    ("models.<alias>.max_output_tokens", models_max_output_tokens),
    ("models.<alias>.context_window", models_context_window),
    ("models.<alias>.pricing.input", pricing_input),
    ("models.<alias>.pricing.output", pricing_output),
    ("models.<alias>.pricing.cache_read", pricing_cache_read),
    ("models.<alias>.pricing.cache_write", pricing_cache_write),
    ("models.<alias>.retry", models_retry),
    ("models.<alias>.call_timeout_ms", models_call_timeout),
    ("agents.<name>.file", agents_file),
    ("agents.<name>.a2a", agents_a2a),
    ("agents.<name>.kind", agents_kind),
    ("agents.<name>.name", agents_name),
    ("agents.<name>.description", agents_description),
    ("agents.<name>.instructions", agents_instructions),
    ("agents.<name>.instructions_file", agents_instructions_file),
    ("agents.<name>.reminder", agents_reminder),
    ("agents.<name>.model", agents_model),
    ("agents.<name>.temperature", agents_temperature),
    ("agents.<name>.max_output_tokens", agents_max_output_tokens),
    ("agents.<name>.tools", agents_tools),
    ("agents.<name>.env", agents_env),
    ("agents.<name>.planner", agents_planner),
    ("agents.<name>.observation", agents_observation),
    ("agents.<name>.approve", agents_approve),
    ("agents.<name>.handoffs", agents_handoffs),
    ("agents.<name>.max_handoffs", agents_max_handoffs),
    ("agents.<name>.durability", agents_durability),
    ("agents.<name>.agents_as_tools", agents_agents_as_tools),
    ("agents.<name>.budget.max_turns", budget_max_turns),
    (
        "agents.<name>.budget.max_wall_clock_ms",
        budget_max_wall_clock,
    ),
    ("agents.<name>.budget.max_tokens", budget_max_tokens),
    ("agents.<name>.budget.max_cost_usd", budget_max_cost),
    ("agents.<name>.context.strategy", context_strategy),
    ("agents.<name>.context.context_window", context_window),
    (
        "agents.<name>.context.max_tool_result_chars",
        context_max_tool_result_chars,
    ),
    ("agents.<name>.context.timeout_ms", context_timeout),
    ("agents.<name>.critic.max_rejections", critic_max_rejections),
    ("agents.<name>.critic.require_calls", critic_require_calls),
    (
        "agents.<name>.critic.require_in_answer",
        critic_require_in_answer,
    ),
    ("agents.<name>.call_rules", agents_call_rules),
    ("tools.builtin", tools_builtin),
    ("tools.http", tools_http),
    ("mcp.servers.name", mcp_name),
    ("mcp.servers.command", mcp_command),
    ("mcp.servers.args", mcp_args),
    ("mcp.servers.env", mcp_env),
    ("mcp.servers.env_passthrough", mcp_env_passthrough),
    ("mcp.servers.cwd", mcp_cwd),
    ("mcp.servers.url", mcp_url),
    ("mcp.servers.headers", mcp_headers),
    ("mcp.servers.startup_timeout_ms", mcp_startup_timeout),
    ("mcp.servers.call_timeout_ms", mcp_call_timeout),
    ("a2a.agents.name", a2a_name),
    ("a2a.agents.url", a2a_url),
    ("a2a.agents.description", a2a_description),
    ("a2a.agents.auth", a2a_auth),
    ("a2a.agents.timeout_ms", a2a_timeout),
    ("a2a.agents.interface_origins", a2a_interface_origins),
    ("store.url", store_url),
    ("telemetry.endpoint", telemetry_endpoint),
    ("telemetry.protocol", telemetry_protocol),
    ("telemetry.headers", telemetry_headers),
    ("telemetry.ca_file", telemetry_ca_file),
    ("telemetry.service_name", telemetry_service_name),
    (
        "telemetry.resource_attributes",
        telemetry_resource_attributes,
    ),
    ("telemetry.export_timeout_ms", telemetry_export_timeout),
    ("telemetry.max_batch_size", telemetry_max_batch_size),
    ("telemetry.export_interval_ms", telemetry_export_interval),
    ("telemetry.queue_capacity", telemetry_queue_capacity),
    ("telemetry.metrics", telemetry_metrics),
    ("telemetry.metrics_interval_ms", telemetry_metrics_interval),
    ("telemetry.trace_dir", telemetry_trace_dir),
    ("telemetry.capture_content", telemetry_capture_content),
    ("telemetry.redaction.enabled", redaction_enabled),
    ("telemetry.redaction.patterns", redaction_patterns),
    ("telemetry.redaction.fields", redaction_fields),
    ("telemetry.redaction.replacement", redaction_replacement),
    ("telemetry.log.level", log_level),
    ("telemetry.log.console", log_console),
    ("telemetry.log.file", log_file),
    ("telemetry.log.rotation", log_rotation),
    ("policies.rules.<code>", policies_rules),
    ("policies.tools.<tool>.<code>", policies_tools),
    ("policies.fallbacks.<tool>", policies_fallbacks),
    ("policies.user_fields.<tool>", policies_user_fields),
    (
        "policies.missing_field_attempts",
        policies_missing_field_attempts,
    ),
    ("approvals.mode", approvals_mode),
    ("approvals.tools.<tool>", approvals_tools),
    ("workflows.<name>.kind", workflows_kind),
    ("workflows.<name>.description", workflows_description),
    ("workflows.<name>.steps", workflows_steps),
    ("workflows.<name>.agents", workflows_agents),
    ("workflows.<name>.then", workflows_then),
    ("workflows.<name>.max_parallel", workflows_max_parallel),
    ("workflows.<name>.routes.<route>", workflows_routes),
    ("workflows.<name>.router", workflows_router),
    ("workflows.<name>.model", workflows_model),
    ("workflows.<name>.default", workflows_default),
    ("server.bind", server_bind),
    ("server.public_url", server_public_url),
    ("server.allowed_hosts", server_allowed_hosts),
    ("server.operators", server_operators),
    ("local.allowed_sha256", local_allowed_sha256),
    ("outbound.allow_private", outbound_allow_private),
    ("server.workers", server_workers),
    ("server.max_body_bytes", server_max_body_bytes),
    ("server.request_timeout_ms", server_request_timeout),
    ("server.stream_timeout_ms", server_stream_timeout),
    ("server.shutdown_grace_ms", server_shutdown_grace),
    ("server.lease_ttl_ms", server_lease_ttl),
    ("server.max_attempts", server_max_attempts),
    ("server.retry_base_ms", server_retry_base),
    ("server.cors_origins", server_cors_origins),
    ("server.agents", server_agents),
    (
        "server.limits.concurrent_runs",
        server_limits_concurrent_runs,
    ),
    ("server.limits.open_streams", server_limits_open_streams),
    (
        "server.limits.open_streams_per_key",
        server_limits_open_streams_per_key,
    ),
    (
        "server.limits.requests_per_minute",
        server_limits_requests_per_minute,
    ),
    ("server.limits.tokens_per_day", server_limits_tokens_per_day),
    ("server.tenants.<tenant>", server_tenants),
    (
        "server.tenants.<tenant>.credentials.<NAME>",
        server_tenants_credentials,
    ),
];

// ---------------------------------------------------------------------------------------
// The document.

/// `(section, key)` of every key-table row of docs/configuration.md, as `section.key`.
fn documented_keys() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut keys = BTreeSet::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            // `## `[agents.<name>]``, `### `[providers.<name>.retry]``,
            // `## `[mcp]` — `[[mcp.servers]]``: the last bracketed name.
            section = backticked(line)
                .into_iter()
                .rfind(|b| b.starts_with('['))
                .map(|b| b.trim_matches(['[', ']']).to_string());
            continue;
        }
        let Some(section) = &section else { continue };
        let Some(first_cell) = line.strip_prefix("| `").map(|_| {
            line.trim_start_matches('|')
                .split('|')
                .next()
                .unwrap_or_default()
        }) else {
            continue;
        };
        for key in backticked(first_cell) {
            keys.insert(format!("{section}.{key}"));
        }
    }
    keys
}

fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_documented_key_has_an_entry_and_every_entry_is_documented() {
    let documented = documented_keys();
    assert!(documented.len() > 80, "parsed too few keys: {documented:?}");
    let tested: BTreeSet<String> = KEYS.iter().map(|(k, _)| (*k).to_string()).collect();
    let untested: Vec<&String> = documented.difference(&tested).collect();
    let undocumented: Vec<&String> = tested.difference(&documented).collect();
    assert!(
        untested.is_empty() && undocumented.is_empty(),
        "documented but not in KEYS: {untested:?}\nin KEYS but not documented: {undocumented:?}"
    );
    assert_eq!(tested.len(), KEYS.len(), "a key is listed twice");
}

#[test]
fn every_key_has_its_effect() {
    // Failures are collected with their key; no backtrace per failure.
    std::panic::set_hook(Box::new(|_| {}));
    let mut failures = Vec::new();
    for (key, check) in KEYS {
        if let Err(panic) = std::panic::catch_unwind(check) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            failures.push(format!("{key}: {message}"));
        }
    }
    drop(std::panic::take_hook());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Helpers.

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn env_of(pairs: &[(&str, &str)]) -> Env {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    Arc::new(move |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// An application over `toml` in `dir`, with an environment holding test API keys.
fn app_in(dir: &Path, toml: &str) -> App {
    App::from_toml_str(
        toml,
        dir,
        env_of(&[
            ("OPENAI_API_KEY", "sk-test"),
            ("ANTHROPIC_API_KEY", "sk-test"),
        ]),
    )
    .unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

fn app(toml: &str) -> App {
    app_in(Path::new("."), toml)
}

fn config(toml: &str) -> KeelConfig {
    app(toml).config().clone()
}

fn named(name: &str) -> Option<AgentRef> {
    Some(AgentRef::Named(name.into()))
}

fn scripted(steps: Vec<ScriptStep>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(steps))
}

async fn build(app: &App, request: AgentRequest) -> BuiltAgent {
    app.agent(&request).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Builds `[agents.a]` of `toml` on a scripted model.
fn agent_a(toml: &str, model: Arc<ScriptedModel>) -> BuiltAgent {
    let app = app(toml);
    block_on(build(
        &app,
        AgentRequest {
            agent: named("a"),
            model_override: Some(model),
            ..AgentRequest::default()
        },
    ))
}

/// Runs `agent` on `message` in a fresh memory store with `context`'s approval modes.
async fn run_with(
    agent: &keel_runtime::ToolAgent,
    app: &App,
    approve: Option<RunApprovalMode>,
    message: &str,
) -> (RunOutcome, Vec<Event>) {
    let store = Arc::new(MemoryStore::new());
    let context = app.run_context(store.clone(), None, approve);
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user(message)], &mut thread, &context)
        .await
        .unwrap();
    let events = store.load(thread.id()).await.unwrap();
    (outcome, events)
}

/// `toml` with `MOCK` replaced by a mock server's URL; runs the plain assistant (or the
/// agent `a` when declared) once against it and returns the requests it received and the
/// outcome.
fn mock_run(toml: &str, turns: Value, model: Option<&str>) -> (Vec<MockRequest>, RunOutcome) {
    block_on(async {
        let script = MockScript::from_json(&json!({ "turns": turns }).to_string()).unwrap();
        let mock = MockLlmServer::start(script).await.unwrap();
        let toml = toml.replace("MOCK", &mock.base_url());
        let app = app(&toml);
        let agent = app
            .config()
            .agents
            .contains_key("a")
            .then(|| AgentRef::Named("a".into()));
        let built = build(
            &app,
            AgentRequest {
                agent,
                model: model.map(str::to_string),
                ..AgentRequest::default()
            },
        )
        .await;
        let (outcome, _) = run_with(&built.agent, &app, None, "hello").await;
        let requests = mock.requests();
        mock.shutdown().await;
        (requests, outcome)
    })
}

fn hello() -> Value {
    json!([{ "text": "hi" }])
}

const OPENAI_MOCK: &str = "[providers.openai]\nbase_url = \"MOCK/v1\"\n";

fn options(toml: &str, spec: &str) -> keel_providers::ProviderOptions {
    let config = config(toml);
    provider_options(&config, spec, None, &|name: &str| {
        (name == "MY_KEY").then(|| "from-env".to_string())
    })
    .1
}

// ---------------------------------------------------------------------------------------
// [defaults]

fn defaults_model() {
    let (requests, outcome) = mock_run(
        &format!("{OPENAI_MOCK}[defaults]\nmodel = \"openai:model-from-defaults\"\n"),
        hello(),
        None,
    );
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    assert_eq!(requests[0].body["model"], "model-from-defaults");
}

fn defaults_agent() {
    let app = app("[defaults]\nagent = \"helper\"\n[agents.helper]\ninstructions = \"HELPER\"\n");
    let agent = app.default_agent().unwrap();
    assert_eq!(agent, named("helper"));
    let built = block_on(build(
        &app,
        AgentRequest {
            agent,
            model_override: Some(scripted(vec![])),
            ..AgentRequest::default()
        },
    ));
    assert!(built.agent.system_prompt().starts_with("HELPER"));
    assert!(self::app("").default_agent().unwrap().is_none());
}

/// A calculator call under `toml`'s approvals pauses the run (`ask`), is denied
/// (`deny`) or runs (`auto`).
fn calculator_run(toml: &str, agent_approve: Option<RunApprovalMode>) -> (RunOutcome, Vec<Event>) {
    let app = app(toml);
    let model = scripted(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "6*7"})),
        ScriptStep::text("42"),
    ]);
    block_on(async {
        let built = build(
            &app,
            AgentRequest {
                model_override: Some(model),
                tools: vec!["calculator".into(), "ping_pong".into()],
                ..AgentRequest::default()
            },
        )
        .await;
        run_with(&built.agent, &app, agent_approve, "6*7?").await
    })
}

fn paused(outcome: &RunOutcome) -> bool {
    matches!(outcome.status, RunStatus::AwaitingApproval { .. })
}

fn denied(events: &[Event]) -> bool {
    events
        .iter()
        .any(|e| matches!(e.kind, EventKind::ApprovalDenied { .. }))
}

fn defaults_approve() {
    assert!(!paused(&calculator_run("", None).0));
    assert!(paused(
        &calculator_run("[defaults]\napprove = \"ask\"\n", None).0
    ));
    // `[approvals] mode` wins over it.
    let toml = "[defaults]\napprove = \"ask\"\n[approvals]\nmode = \"auto\"\n";
    assert!(!paused(&calculator_run(toml, None).0));
}

fn defaults_output() {
    assert_eq!(app("").output_format(None), OutputFormat::Text);
    let app = app("[defaults]\noutput = \"json\"\n");
    assert_eq!(app.output_format(None), OutputFormat::Json);
    assert_eq!(
        app.output_format(Some(OutputFormat::Text)),
        OutputFormat::Text
    );
}

// ---------------------------------------------------------------------------------------
// [providers.<name>]

fn providers_kind() {
    let toml = "[providers.gateway]\nkind = \"anthropic\"\nbase_url = \"MOCK\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n";
    let (requests, _) = mock_run(toml, hello(), Some("gateway:claude-x"));
    assert_eq!(
        requests[0].path, "/v1/messages",
        "spoke the Anthropic protocol"
    );
}

fn providers_base_url() {
    let (requests, outcome) = mock_run(OPENAI_MOCK, hello(), Some("openai:m"));
    assert_eq!(requests.len(), 1, "the request went to the configured URL");
    assert_eq!(outcome.final_text.as_deref(), Some("hi"));
}

fn providers_api_key_env() {
    let toml = format!("{OPENAI_MOCK}api_key_env = \"ANTHROPIC_API_KEY\"\n");
    let (requests, _) = mock_run(&toml, hello(), Some("openai:m"));
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    let options = options("[providers.openai]\napi_key_env = \"MY_KEY\"\n", "openai:m");
    assert!(options.api_key.is_some());
}

fn providers_connect_timeout() {
    let o = options(
        "[providers.openai]\nconnect_timeout_ms = 1234\n",
        "openai:m",
    );
    assert_eq!(o.connect_timeout, Duration::from_millis(1234));
}

fn providers_idle_timeout() {
    let o = options("[providers.openai]\nidle_timeout_ms = 4321\n", "openai:m");
    assert_eq!(o.idle_timeout, Duration::from_millis(4321));
}

fn providers_loopback_only() {
    let toml =
        "[providers.openai]\nbase_url = \"https://api.example.com/v1\"\nloopback_only = true\n";
    assert!(options(toml, "openai:m").loopback_only);
    let app = app(toml);
    let Err(error) = keel_app::model::build_model(app.config(), "openai:m", None, app.env()) else {
        panic!("a non-loopback URL is refused");
    };
    assert!(error.to_string().contains("loopback"), "{error}");
}

fn retry_option(key_value: &str) -> keel_providers::RetryConfig {
    options(
        &format!("[providers.openai.retry]\n{key_value}\n"),
        "openai:m",
    )
    .retry
}

fn retry_max_attempts() {
    assert_eq!(retry_option("max_attempts = 7").max_attempts, 7);
    // A retryable error is retried up to that many attempts.
    let toml = format!("{OPENAI_MOCK}retry = {{ max_attempts = 2, initial_delay_ms = 1 }}\n");
    let turns = json!([{ "error": { "status": 500 } }, { "text": "second" }]);
    let (requests, outcome) = mock_run(&toml, turns, Some("openai:m"));
    assert_eq!(requests.len(), 2);
    assert_eq!(outcome.final_text.as_deref(), Some("second"));
}

fn retry_initial_delay() {
    assert_eq!(
        retry_option("initial_delay_ms = 77").initial_delay,
        Duration::from_millis(77)
    );
}

fn retry_max_delay() {
    assert_eq!(
        retry_option("max_delay_ms = 880").max_delay,
        Duration::from_millis(880)
    );
}

fn retry_factor() {
    assert!((retry_option("factor = 3.5").factor - 3.5).abs() < f64::EPSILON);
}

fn retry_max_retry_after() {
    assert_eq!(
        retry_option("max_retry_after_ms = 999").max_retry_after,
        Duration::from_millis(999)
    );
}

// ---------------------------------------------------------------------------------------
// [models.<alias>]

fn models_model() {
    let toml = format!("{OPENAI_MOCK}[models.fast]\nmodel = \"openai:the-real-name\"\n");
    let (requests, _) = mock_run(&toml, hello(), Some("fast"));
    assert_eq!(requests[0].body["model"], "the-real-name");
}

fn models_temperature() {
    let toml = format!("{OPENAI_MOCK}[models.fast]\nmodel = \"openai:m\"\ntemperature = 0.25\n");
    let (requests, _) = mock_run(&toml, hello(), Some("fast"));
    assert_eq!(requests[0].body["temperature"], json!(0.25));
    let (requests, _) = mock_run(OPENAI_MOCK, hello(), Some("openai:m"));
    assert!(requests[0].body.get("temperature").is_none());
}

fn models_max_output_tokens() {
    let toml =
        format!("{OPENAI_MOCK}[models.fast]\nmodel = \"openai:m\"\nmax_output_tokens = 77\n");
    let (requests, _) = mock_run(&toml, hello(), Some("fast"));
    assert_eq!(requests[0].body["max_completion_tokens"], json!(77));
}

fn fingerprint(toml: &str, model: Option<&str>) -> keel_core::definition::AgentFingerprint {
    // A loopback URL that is never called: building an agent calls no model.
    let app = app(&format!(
        "[providers.openai]\nbase_url = \"http://127.0.0.1:9/v1\"\n{toml}"
    ));
    let agent = app
        .config()
        .agents
        .contains_key("a")
        .then(|| AgentRef::Named("a".into()));
    let built = block_on(build(
        &app,
        AgentRequest {
            agent,
            model: model.map(str::to_string),
            ..AgentRequest::default()
        },
    ));
    built.agent.definition().fingerprint.clone()
}

fn models_context_window() {
    let toml = "[models.big]\nmodel = \"openai:m\"\ncontext_window = 5000\n";
    assert_eq!(fingerprint(toml, Some("big")).context_window, Some(5000));
    assert_eq!(fingerprint(toml, Some("openai:m")).context_window, None);
}

/// The cost of one Anthropic-protocol turn under `pricing`.
fn cost_with(pricing: &str) -> f64 {
    let toml = format!(
        "[providers.anthropic]\nbase_url = \"MOCK\"\n[models.priced]\nmodel = \"anthropic:claude-test\"\npricing = {{ {pricing} }}\n"
    );
    let turns = json!([{ "text": "hi", "usage": {
        "input_tokens": 1_000_000, "output_tokens": 100_000,
        "cache_read_tokens": 200_000, "cache_write_tokens": 50_000 } }]);
    let (_, outcome) = mock_run(&toml, turns, Some("priced"));
    outcome.cost_usd.expect("a priced model reports a cost")
}

const PRICES: [&str; 4] = ["input", "output", "cache_read", "cache_write"];

/// Raising one price by 1 USD per million tokens raises the run's cost by that many
/// tokens' worth.
fn pricing_changes_cost(which: &str, tokens: f64) {
    let pricing = |bump: bool| {
        PRICES
            .iter()
            .map(|p| format!("{p} = {}", if bump && *p == which { 2.0 } else { 1.0 }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let base = cost_with(&pricing(false));
    let bumped = cost_with(&pricing(true));
    let delta = bumped - base;
    assert!(
        (delta - tokens / 1_000_000.0).abs() < 1e-9,
        "{which}: {base} -> {bumped}"
    );
}

fn pricing_input() {
    // Uncached input: 1,000,000 - 200,000 read - 50,000 written.
    pricing_changes_cost("input", 750_000.0);
}

fn pricing_output() {
    pricing_changes_cost("output", 100_000.0);
}

fn pricing_cache_read() {
    pricing_changes_cost("cache_read", 200_000.0);
}

fn pricing_cache_write() {
    pricing_changes_cost("cache_write", 50_000.0);
}

fn models_retry() {
    let toml = "[providers.openai.retry]\nmax_attempts = 3\n[models.fast]\nmodel = \"openai:m\"\nretry = { max_attempts = 9 }\n";
    assert_eq!(options(toml, "fast").retry.max_attempts, 9);
    assert_eq!(options(toml, "openai:m").retry.max_attempts, 3);
}

fn models_call_timeout() {
    let toml = "[models.fast]\nmodel = \"openai:m\"\ncall_timeout_ms = 1234\n";
    assert_eq!(
        options(toml, "fast").call_timeout,
        Duration::from_millis(1234)
    );
}

// ---------------------------------------------------------------------------------------
// [agents.<name>]

fn agents_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mine.toml"),
        "name = \"from-file\"\ninstructions = \"FILE INSTRUCTIONS\"\ntools = [\"ping_pong\"]\n",
    )
    .unwrap();
    let app = app_in(
        dir.path(),
        "[agents.a]\nfile = \"mine.toml\"\ntools = [\"calculator\"]\n",
    );
    let built = block_on(build(
        &app,
        AgentRequest {
            agent: named("a"),
            model_override: Some(scripted(vec![])),
            ..AgentRequest::default()
        },
    ));
    assert_eq!(built.agent.name(), "from-file");
    assert!(built.agent.system_prompt().starts_with("FILE INSTRUCTIONS"));
    // The table's keys override the file's.
    let tools: Vec<&str> = built.agent.tools().names().collect();
    assert_eq!(tools, ["calculator"]);
}

fn agents_kind() {
    // `tool` (the default) is the tool-calling agent.
    let built = agent_a("[agents.a]\nkind = \"tool\"\n", scripted(vec![]));
    assert_eq!(built.agent.name(), "a");
    // `openai-responses`: the conversation is stored by the provider, so the second run
    // sends only its message, after the first answer's id.
    block_on(async {
        let script = MockScript::new(vec![
            keel_testkit::mock_llm::MockTurn::text("one"),
            keel_testkit::mock_llm::MockTurn::text("two"),
        ]);
        let mock = MockLlmServer::start(script).await.unwrap();
        let toml = format!(
            "[providers.openai-responses]\nbase_url = \"{}\"\n\n[agents.a]\n\
             kind = \"openai-responses\"\nmodel = \"openai-responses:gpt-5\"\n",
            mock.base_url()
        );
        let app = app(&toml);
        let request = AgentRequest {
            agent: named("a"),
            ..AgentRequest::default()
        };
        // Not a tool-calling agent: refused at its `kind` line.
        let refused = app.agent(&request).await.unwrap_err().to_string();
        assert!(refused.contains(":5:1:"), "{refused}");
        let (agent, _) = app.responses_agent(&request).await.unwrap();
        let store: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
        let context = app.run_context(store, None, None);
        let mut thread = Thread::new();
        for text in ["first", "second"] {
            keel_runtime::Agent::run(&agent, vec![Message::user(text)], &mut thread, &context)
                .await
                .unwrap();
        }
        let bodies: Vec<Value> = mock.requests().into_iter().map(|r| r.body).collect();
        assert_eq!(bodies[0]["store"], json!(true));
        assert_eq!(bodies[1]["previous_response_id"], json!("resp_mock_1"));
        assert_eq!(bodies[1]["input"].as_array().unwrap().len(), 1);
        mock.shutdown().await;
    });
}

fn agents_name() {
    let built = agent_a("[agents.a]\nname = \"custom\"\n", scripted(vec![]));
    assert_eq!(built.agent.name(), "custom");
    assert_eq!(agent_a("[agents.a]\n", scripted(vec![])).agent.name(), "a");
}

fn agents_description() {
    // For people: kept with the definition, never sent to the model.
    let built = agent_a(
        "[agents.a]\ndescription = \"SAYS WHAT IT IS FOR\"\n",
        scripted(vec![]),
    );
    let definition = built.resolution.definition.unwrap();
    assert_eq!(
        definition.description.as_deref(),
        Some("SAYS WHAT IT IS FOR")
    );
    assert!(!built.agent.system_prompt().contains("SAYS WHAT IT IS FOR"));
}

fn agents_instructions() {
    let built = agent_a(
        "[agents.a]\ninstructions = \"BE BRIEF\"\n",
        scripted(vec![]),
    );
    assert!(built.agent.system_prompt().starts_with("BE BRIEF"));
}

fn agents_instructions_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prompt.md"), "FROM THE PROMPT FILE").unwrap();
    let app = app_in(
        dir.path(),
        "[agents.a]\ninstructions_file = \"prompt.md\"\n",
    );
    let built = block_on(build(
        &app,
        AgentRequest {
            agent: named("a"),
            model_override: Some(scripted(vec![])),
            ..AgentRequest::default()
        },
    ));
    assert!(
        built
            .agent
            .system_prompt()
            .starts_with("FROM THE PROMPT FILE")
    );
}

fn agents_model() {
    let toml = format!("{OPENAI_MOCK}[agents.a]\nmodel = \"openai:agents-own-model\"\n");
    let (requests, _) = mock_run(&toml, hello(), None);
    assert_eq!(requests[0].body["model"], "agents-own-model");
}

fn agents_reminder() {
    // Sent at the end of the user's message, after a blank line.
    let toml =
        format!("{OPENAI_MOCK}[agents.a]\nmodel = \"openai:m\"\nreminder = \"Cite the tools.\"\n");
    let (requests, _) = mock_run(&toml, hello(), None);
    let messages = requests[0].body["messages"].as_array().unwrap();
    let user = messages.last().unwrap();
    assert_eq!(user["role"], "user");
    assert_eq!(user["content"], "hello\n\nCite the tools.", "{user}");
    // An empty reminder is a located error.
    let request = AgentRequest {
        agent: named("a"),
        model_override: Some(scripted(vec![])),
        ..AgentRequest::default()
    };
    let error = block_on(app("[agents.a]\nreminder = \" \"\n").agent(&request))
        .unwrap_err()
        .to_string();
    assert!(error.contains("reminder must not be empty"), "{error}");
}

fn agents_temperature() {
    let toml = format!(
        "{OPENAI_MOCK}[models.fast]\nmodel = \"openai:m\"\ntemperature = 0.9\n[agents.a]\nmodel = \"fast\"\ntemperature = 0.1\n"
    );
    let (requests, _) = mock_run(&toml, hello(), None);
    assert_eq!(
        requests[0].body["temperature"],
        json!(0.1_f32),
        "over the alias's"
    );
}

fn agents_max_output_tokens() {
    let f = fingerprint("[agents.a]\nmax_output_tokens = 99\n", Some("openai:m"));
    assert_eq!(f.max_output_tokens, Some(99));
}

fn agents_tools() {
    let built = agent_a("[agents.a]\ntools = [\"ping_pong\"]\n", scripted(vec![]));
    let names: Vec<&str> = built.agent.tools().names().collect();
    assert_eq!(names, ["ping_pong"]);
    // Inline HTTP tools sit in the same list.
    let toml = "[agents.a]\ntools = [\"calculator\", { name = \"lookup\", description = \"Look up.\", usage = \"lookup — pass q.\", method = \"GET\", url = \"http://127.0.0.1:9/{q}\", input_schema = { type = \"object\", properties = { q = { type = \"string\" } }, required = [\"q\"] } }]\n";
    let built = agent_a(toml, scripted(vec![]));
    let names: Vec<&str> = built.agent.tools().names().collect();
    assert_eq!(names, ["calculator", "lookup"]);
}

fn agents_env() {
    let toml = |env: &str| {
        format!(
            "[agents.a]\n{env}\ntools = [{{ name = \"lookup\", description = \"Look up.\", usage = \"lookup — pass q.\", method = \"GET\", url = \"$${{SVC}}/{{q}}\", input_schema = {{ type = \"object\", properties = {{ q = {{ type = \"string\" }} }}, required = [\"q\"] }} }}]\n"
        )
    };
    let app_with = |text: &str| {
        App::from_toml_str(
            text,
            Path::new("."),
            env_of(&[("SVC", "http://127.0.0.1:9")]),
        )
        .unwrap()
    };
    let request = AgentRequest {
        agent: named("a"),
        model_override: Some(scripted(vec![])),
        ..AgentRequest::default()
    };
    let refused = block_on(app_with(&toml("")).agent(&request)).unwrap_err();
    assert!(refused.to_string().contains("env = [\"SVC\"]"), "{refused}");
    block_on(app_with(&toml("env = [\"SVC\"]")).agent(&request)).unwrap();
}

fn agents_planner() {
    let f = fingerprint("[agents.a]\nplanner = \"structured\"\n", Some("openai:m"));
    assert_eq!(f.planner, PlannerMode::Structured);
    let f = fingerprint("[agents.a]\n", Some("openai:m"));
    assert_eq!(f.planner, PlannerMode::Native);
}

fn agents_observation() {
    let f = fingerprint(
        "[agents.a]\nobservation = \"normalized\"\n",
        Some("openai:m"),
    );
    assert_eq!(f.observation, keel_core::ObservationMode::Normalized);
}

fn agents_approve() {
    let built = agent_a("[agents.a]\napprove = \"ask\"\n", scripted(vec![]));
    assert_eq!(built.resolution.approve, Some(RunApprovalMode::Ask));
    assert!(paused(&calculator_run("", built.resolution.approve).0));
}

/// Builds `[agents.a]` of `toml` with what it composes, on one scripted model shared by
/// every agent, and runs it once; returns the outcome and the composed agent.
fn composed_run(toml: &str, steps: Vec<ScriptStep>) -> (RunOutcome, keel_app::ComposedAgent) {
    let app = app(toml);
    block_on(async {
        let request = AgentRequest {
            agent: named("a"),
            model_override: Some(scripted(steps)),
            ..AgentRequest::default()
        };
        let (agent, _) = app
            .composed_agent(&request)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let store = Arc::new(MemoryStore::new());
        let context = app.run_context(store, None, None);
        let mut thread = Thread::new();
        let outcome = agent
            .run(vec![Message::user("go")], &mut thread, &context)
            .await
            .unwrap();
        (outcome, agent)
    })
}

fn agents_handoffs() {
    let (outcome, agent) = composed_run(
        "[agents.a]\nhandoffs = [\"b\"]\n[agents.b]\ndescription = \"Does b.\"\n",
        vec![
            ScriptStep::tool_call("transfer_to_b", json!({})),
            ScriptStep::text("b answers"),
        ],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("b answers"));
    assert!(agent.member("b").is_some());
    // A cycle is refused before any model call, at the key closing it.
    let refused = block_on(
        app("[agents.a]\nhandoffs = [\"b\"]\n[agents.b]\nhandoffs = [\"a\"]\n").composed_agent(
            &AgentRequest {
                agent: named("a"),
                model_override: Some(scripted(vec![])),
                ..AgentRequest::default()
            },
        ),
    )
    .unwrap_err();
    assert!(
        refused.to_string().contains("agents.b.handoffs[0]"),
        "{refused}"
    );
}

fn agents_max_handoffs() {
    let steps = || {
        vec![
            ScriptStep::tool_call("transfer_to_b", json!({})),
            ScriptStep::text("a answers itself"),
        ]
    };
    let (outcome, _) = composed_run(
        "[agents.a]\nhandoffs = [\"b\"]\nmax_handoffs = 0\n[agents.b]\n",
        steps(),
    );
    assert_eq!(outcome.final_text.as_deref(), Some("a answers itself"));
}

fn agents_durability() {
    let built = |toml: &str| agent_a(toml, scripted(vec![])).agent.durability();
    assert_eq!(built("[agents.a]\n"), keel_core::RunDurability::Effects);
    assert_eq!(
        built("[agents.a]\ndurability = \"steps\"\n"),
        keel_core::RunDurability::Steps
    );
    let refused = App::from_toml_str(
        "[agents.a]\ndurability = \"always\"\n",
        Path::new("."),
        env_of(&[]),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(
        refused.to_string().contains("effects") && refused.to_string().contains("steps"),
        "the valid values are named: {refused}"
    );
}

fn agents_agents_as_tools() {
    let (outcome, agent) = composed_run(
        "[agents.a]\nagents_as_tools = [\"r\"]\n[agents.r]\ndescription = \"Researches.\"\n",
        vec![
            ScriptStep::tool_call("r", json!({"task": "find it"})),
            ScriptStep::text("found"),
            ScriptStep::text("a says: found"),
        ],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("a says: found"));
    let tool = agent.entry().unwrap().tools().get("r").unwrap();
    assert_eq!(tool.spec().description, "Researches.");
    assert!(outcome.tool_calls.iter().all(|c| c.ok));
}

fn budget(toml_budget: &str) -> keel_core::Budget {
    agent_a(
        &format!("[agents.a]\nbudget = {{ {toml_budget} }}\n"),
        scripted(vec![]),
    )
    .agent
    .budget()
}

fn budget_max_turns() {
    assert_eq!(budget("max_turns = 3").max_turns, Some(3));
    assert_eq!(budget("max_turns = 0").max_turns, None, "0 = unlimited");
    // A run stops there.
    let model = scripted(vec![
        ScriptStep::tool_call("calculator", json!({"expression": "1+1"})),
        ScriptStep::tool_call("calculator", json!({"expression": "1+2"})),
        ScriptStep::text("done"),
    ]);
    let built = agent_a(
        "[agents.a]\ntools = [\"calculator\"]\nbudget = { max_turns = 1 }\n",
        model,
    );
    let (outcome, _) = block_on(run_with(&built.agent, &app(""), None, "go"));
    assert_eq!(outcome.end_state(), Some(EndState::BudgetExceeded));
}

fn budget_max_wall_clock() {
    assert_eq!(
        budget("max_wall_clock_ms = 1234").max_wall_clock_ms,
        Some(1234)
    );
}

fn budget_max_tokens() {
    assert_eq!(budget("max_tokens = 500").max_tokens, Some(500));
}

fn budget_max_cost() {
    assert_eq!(budget("max_cost_usd = 0.5").max_cost_usd, Some(0.5));
    // The pricing override and the cost budget together: a run costing more stops.
    let toml = "[providers.anthropic]\nbase_url = \"MOCK\"\n[models.priced]\nmodel = \"anthropic:claude-test\"\npricing = { input = 1000.0, output = 1000.0 }\n[agents.a]\nmodel = \"priced\"\ntools = [\"calculator\"]\nbudget = { max_cost_usd = 0.01 }\n";
    let turns = json!([
        { "tool_calls": [{ "name": "calculator", "arguments": { "expression": "1+1" } }],
          "usage": { "input_tokens": 1000, "output_tokens": 10 } },
        { "text": "done" }
    ]);
    let (_, outcome) = mock_run(toml, turns, None);
    assert_eq!(outcome.end_state(), Some(EndState::BudgetExceeded));
}

fn context_strategy() {
    let f = fingerprint(
        "[agents.a]\ncontext = { strategy = \"summarize\" }\n",
        Some("openai:m"),
    );
    assert_eq!(f.context_strategy.as_deref(), Some("summarize"));
    let f = fingerprint(
        "[agents.a]\ncontext = { strategy = \"none\" }\n",
        Some("openai:m"),
    );
    assert_eq!(f.context_strategy, None);
}

fn context_window() {
    let f = fingerprint(
        "[agents.a]\ncontext = { context_window = 4096 }\n",
        Some("openai:m"),
    );
    assert_eq!(f.context_window, Some(4096));
}

fn long_ping(toml_context: &str) -> String {
    let model = scripted(vec![
        ScriptStep::tool_call("ping_pong", json!({"message": "x".repeat(3000)})),
        ScriptStep::text("done"),
    ]);
    let built = agent_a(
        &format!("[agents.a]\ntools = [\"ping_pong\"]\n{toml_context}"),
        model.clone(),
    );
    block_on(run_with(&built.agent, &app(""), None, "ping"));
    model.requests()[1].tool_result_contents().join("\n")
}

fn context_max_tool_result_chars() {
    let cut = long_ping("context = { max_tool_result_chars = 200 }\n");
    assert!(cut.contains("[OUTPUT TRUNCATED"), "{cut}");
    assert!(!long_ping("").contains("[OUTPUT TRUNCATED"));
}

fn context_timeout() {
    // A summarizer taking a minute: within the default 120 s, but not within
    // `timeout_ms = 1000`, after which the compaction gives up and truncates (a notice says
    // so). Virtual time: nothing depends on the machine's speed.
    assert!(!compaction_fell_back(""));
    assert!(compaction_fell_back(", timeout_ms = 1000"));
}

fn compaction_fell_back(timeout: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let app = app(&format!(
            "[agents.a]\ncontext = {{ strategy = \"summarize\", context_window = 1000{timeout} }}\n"
        ));
        let store = Arc::new(MemoryStore::new());
        let context = app.run_context(store.clone(), None, None);
        let mut thread = Thread::new();
        // A long history from a roomy agent, then the small-window agent.
        let roomy = keel_runtime::ToolAgent::builder(
            "roomy",
            scripted((0..6).map(|_| ScriptStep::text("ok")).collect()),
        )
        .build();
        for i in 0..6 {
            let message = Message::user(format!("{i} {}", "y".repeat(1200)));
            roomy
                .run(vec![message], &mut thread, &context)
                .await
                .unwrap();
        }
        let slow_summary = ScriptStep {
            delay_ms: Some(60_000),
            ..ScriptStep::text("summary")
        };
        let model = scripted(vec![slow_summary, ScriptStep::text("short answer")]);
        let built = build(
            &app,
            AgentRequest {
                agent: named("a"),
                model_override: Some(model),
                ..AgentRequest::default()
            },
        )
        .await;
        built
            .agent
            .run(vec![Message::user("and now?")], &mut thread, &context)
            .await
            .unwrap();
        let events = store.load(thread.id()).await.unwrap();
        events.iter().any(
            |e| matches!(&e.kind, EventKind::Notice { code, .. } if code == "compaction_fallback"),
        )
    })
}

fn critiques(events: &[Event]) -> Vec<Vec<String>> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Critique {
                satisfied: false,
                known_gaps,
                ..
            } => Some(known_gaps.clone()),
            _ => None,
        })
        .collect()
}

fn critic_run(critic: &str) -> Vec<Vec<String>> {
    let model = scripted(vec![
        ScriptStep::text("no"),
        ScriptStep::text("no"),
        ScriptStep::text("no"),
        ScriptStep::text("no"),
    ]);
    let built = agent_a(
        &format!("[agents.a]\ntools = [\"calculator\"]\n{critic}"),
        model,
    );
    critiques(&block_on(run_with(&built.agent, &app(""), None, "go")).1)
}

const REQUIRE_CALC: &str = "[[agents.a.critic.require_calls]]\ntool = \"calculator\"\n";

fn critic_max_rejections() {
    assert_eq!(
        critic_run(REQUIRE_CALC).len(),
        3,
        "default 2 rejections, then fail"
    );
    let toml = format!("[agents.a.critic]\nmax_rejections = 0\n{REQUIRE_CALC}");
    assert_eq!(critic_run(&toml).len(), 1);
}

fn critic_require_calls() {
    let gaps = critic_run(REQUIRE_CALC);
    assert!(gaps[0].iter().any(|g| g.contains("calculator")), "{gaps:?}");
    assert!(critic_run("").is_empty());
}

fn critic_require_in_answer() {
    let gaps = critic_run(
        "[[agents.a.critic.require_in_answer]]\ntext = \"result\"\ngap = \"STATE THE RESULT\"\n",
    );
    assert!(
        gaps[0].iter().any(|g| g.contains("STATE THE RESULT")),
        "{gaps:?}"
    );
}

fn agents_call_rules() {
    // `after`: the calculator may only run once ping_pong succeeded; the first call is
    // refused (never run), the second runs.
    let model = scripted(vec![
        ScriptStep::tool_call("calculator", serde_json::json!({"expression": "1+1"})),
        ScriptStep::tool_call("ping_pong", serde_json::json!({"message": "hi"})),
        ScriptStep::tool_call("calculator", serde_json::json!({"expression": "1+1"})),
        ScriptStep::text("2"),
    ]);
    let built = agent_a(
        "[agents.a]\ntools = [\"calculator\", \"ping_pong\"]\n\
         [[agents.a.call_rules]]\ntool = \"calculator\"\nafter = [\"ping_pong\"]\n",
        model,
    );
    let (_, events) = block_on(run_with(&built.agent, &app(""), None, "go"));
    let calculator: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallFinished { result } if result.name == "calculator" => {
                Some(result.outcome.is_ok())
            }
            _ => None,
        })
        .collect();
    assert_eq!(calculator, [false, true], "{events:#?}");
    // An unknown tool in a rule is a located error naming the key.
    let error = app(
        "[agents.a]\ntools = [\"calculator\"]\n[[agents.a.call_rules]]\ntool = \"calculater\"\n",
    );
    let error = block_on(error.agent(&AgentRequest {
        agent: named("a"),
        model_override: Some(scripted(vec![])),
        ..AgentRequest::default()
    }))
    .err()
    .unwrap()
    .to_string();
    assert!(
        error.contains("call_rules") && error.contains("did you mean `calculator`"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------
// [tools]

fn default_tools(toml: &str) -> Vec<String> {
    let app = app(toml);
    block_on(build(
        &app,
        AgentRequest {
            model_override: Some(scripted(vec![])),
            ..AgentRequest::default()
        },
    ))
    .resolution
    .tools
}

fn tools_builtin() {
    assert!(default_tools("").is_empty());
    assert_eq!(
        default_tools("[tools]\nbuiltin = [\"ping_pong\"]\n"),
        ["ping_pong"]
    );
}

fn tools_http() {
    let toml = "[[tools.http]]\nname = \"status\"\ndescription = \"Service status.\"\nusage = \"status — no arguments.\"\nmethod = \"GET\"\nurl = \"http://127.0.0.1:9/status\"\n";
    assert_eq!(default_tools(toml), ["status"]);
    let catalog = block_on(app(toml).catalog()).unwrap();
    assert!(catalog.registry.get("status").is_some());
}

// ---------------------------------------------------------------------------------------
// [[a2a.agents]]: remote agents as tools, against keel-a2a's echo agent on loopback.

/// Calls catalog tool `name` of `toml` (`ECHO` replaced by the echo agent's URL) with
/// `message`, in an environment of `env`.
fn a2a_call(
    toml: &str,
    name: &str,
    message: &str,
    env: &[(&str, &str)],
) -> Result<Value, keel_core::ToolError> {
    block_on(async {
        let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
        let app =
            App::from_toml_str(&toml.replace("ECHO", &url), Path::new("."), env_of(env)).unwrap();
        let catalog = app.catalog().await.unwrap();
        let tool = catalog.registry.get(name).cloned().unwrap();
        let ctx = keel_core::ToolContext::new("thr", "run", "call", Default::default());
        tool.call(json!({ "message": message }), &ctx).await
    })
}

const A2A_AGENT: &str = "[[a2a.agents]]\nname = \"helper\"\nurl = \"ECHO\"\n";

fn a2a_name() {
    let toml = A2A_AGENT.replace("ECHO", "http://127.0.0.1:9/a2a/echo");
    assert_eq!(default_tools(&toml), ["helper"]);
    let catalog = block_on(app(&toml).catalog()).unwrap();
    assert_eq!(
        catalog.registry.get("helper").unwrap().spec().name,
        "helper"
    );
}

fn a2a_url() {
    let output = a2a_call(A2A_AGENT, "helper", "hi", &[]).unwrap();
    assert_eq!(output["reply"], "echo: hi");
    assert_eq!(output["state"], "completed");
}

fn a2a_description() {
    let toml = format!("{A2A_AGENT}description = \"Ask the helper.\"\n")
        .replace("ECHO", "http://127.0.0.1:9/");
    let catalog = block_on(app(&toml).catalog()).unwrap();
    assert_eq!(
        catalog.registry.get("helper").unwrap().spec().description,
        "Ask the helper."
    );
}

fn a2a_auth() {
    let toml = format!("{A2A_AGENT}auth = {{ bearer_env = \"HELPER_TOKEN\" }}\n");
    let missing = a2a_call(&toml, "helper", "hi", &[]).unwrap_err();
    assert_eq!(missing.code, keel_core::ToolErrorCode::Unauthorized);
    assert!(
        missing.message.contains("HELPER_TOKEN"),
        "{}",
        missing.message
    );
    let output = a2a_call(&toml, "helper", "hi", &[("HELPER_TOKEN", "t0ken")]).unwrap();
    assert_eq!(output["reply"], "echo: hi");
}

/// `[agents.<name>] a2a`: the agent is the remote A2A agent — a run sends the user's
/// message to it and its reply is the run's answer (no model of ours is called).
fn agents_a2a() {
    block_on(async {
        let (url, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
        let toml = format!(
            "{}[agents.remote]\na2a = \"helper\"\n",
            A2A_AGENT.replace("ECHO", &url)
        );
        let app = app(&toml);
        let built = keel_app::recipe::Recipe {
            agent_name: Some("remote".into()),
            ..keel_app::recipe::Recipe::default()
        }
        .build_agent(&app, None)
        .await
        .unwrap();
        assert_eq!(built.agent.model_id(), "a2a:helper");
        let store = Arc::new(MemoryStore::new());
        let context = app.run_context(store, None, built.approve);
        let mut thread = Thread::new();
        let outcome = tokio::time::timeout(
            Duration::from_secs(60),
            keel_runtime::Agent::run(
                &built.agent,
                vec![Message::user("hi")],
                &mut thread,
                &context,
            ),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(outcome.end_state(), Some(EndState::Done), "{outcome:?}");
        assert_eq!(outcome.final_text.as_deref(), Some("echo: hi"));
    });
}

/// Serves, on a loopback port, a 1.0 agent card naming `interface` for every request;
/// answers its base URL.
async fn card_naming(interface: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = json!({
        "name": "elsewhere",
        "supportedInterfaces": [{"url": interface, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": false}
    })
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = vec![0; 4096];
            let _ = socket.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    url
}

/// `interface_origins`: a card naming its interface on another origin is refused unless
/// the origin is listed.
fn a2a_interface_origins() {
    block_on(async {
        let (echo, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
        let card = card_naming(echo.clone()).await;
        let origin = echo.trim_end_matches("/a2a/echo").to_string();
        let call = |extra: String| {
            let toml = format!("{A2A_AGENT}{extra}").replace("ECHO", &card);
            async move {
                let app = App::from_toml_str(&toml, Path::new("."), env_of(&[])).unwrap();
                let catalog = app.catalog().await.unwrap();
                let tool = catalog.registry.get("helper").cloned().unwrap();
                let ctx = keel_core::ToolContext::new("thr", "run", "call", Default::default());
                tool.call(json!({ "message": "hi" }), &ctx).await
            }
        };
        let refused = call(String::new()).await.unwrap_err();
        assert_eq!(refused.code, keel_core::ToolErrorCode::Forbidden);
        assert!(
            refused.message.contains("interface_origins"),
            "{}",
            refused.message
        );
        let output = call(format!("interface_origins = [\"{origin}\"]\n"))
            .await
            .unwrap();
        assert_eq!(output["reply"], "echo: hi");
    });
    let problem = App::from_toml_str(
        &format!("{A2A_AGENT}interface_origins = [\"https://h/path\"]\n")
            .replace("ECHO", "http://127.0.0.1:9/"),
        Path::new("."),
        env_of(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(problem.contains("interface_origins"), "{problem}");
}

fn a2a_timeout() {
    let toml = format!("{A2A_AGENT}timeout_ms = 300\n");
    let catalog = block_on(app(&toml.replace("ECHO", "http://127.0.0.1:9/")).catalog()).unwrap();
    assert_eq!(
        catalog.registry.get("helper").unwrap().spec().timeout_ms,
        5_300
    );
    // A `slow` task never ends: the deadline stops the call.
    let error = a2a_call(&toml, "helper", "slow", &[]).unwrap_err();
    assert_eq!(error.code, keel_core::ToolErrorCode::Timeout);
}

// ---------------------------------------------------------------------------------------
// [[mcp.servers]]: a small stdio MCP server (Python) reporting what it was started with.

const MCP_SERVER: &str = r#"
import json, os, sys, time
if os.environ.get("MCP_SLOW_START"):
    time.sleep(3600)
for line in sys.stdin:
    msg = json.loads(line)
    mid = msg.get("id")
    method = msg.get("method")
    if mid is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "probe", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "probe", "description": "Reports the server's start-up settings.",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        if os.environ.get("MCP_SLOW_CALL"):
            time.sleep(3600)
        report = {"args": sys.argv[1:], "cwd": os.getcwd(), "PROBE_VAR": os.environ.get("PROBE_VAR"),
                  "PASSED": os.environ.get("CARGO_PKG_NAME")}
        result = {"content": [{"type": "text", "text": json.dumps(report)}]}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

fn python() -> Option<String> {
    ["python3", "python"]
        .into_iter()
        .find(|p| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_string)
}

/// Connects the `[[mcp.servers]]` of `server` (TOML lines) and calls `<name>__probe`;
/// returns the catalog's tool names, its warnings and the probe's report (if it ran).
fn mcp_probe(server: &str) -> (Vec<String>, Vec<String>, Option<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("probe.py");
    std::fs::write(&script, MCP_SERVER).unwrap();
    let python = python().expect("python3 runs the probe MCP server");
    let toml = format!(
        "[[mcp.servers]]\n{}\n",
        server
            .replace("PYTHON", &python)
            .replace("SCRIPT", &script.display().to_string())
            .replace("DIR", &dir.path().display().to_string())
    );
    block_on(async {
        let app = app(&toml);
        let catalog = app.catalog().await.unwrap();
        let names: Vec<String> = catalog.registry.names().map(str::to_string).collect();
        let probe = names.iter().find(|n| n.ends_with("__probe")).cloned();
        let report = match probe {
            Some(name) => {
                let tool = catalog.registry.get(&name).unwrap().clone();
                let ctx = keel_core::ToolContext::new(
                    "thread",
                    "run",
                    "call-1",
                    keel_core::CancellationToken::new(),
                );
                Some(match tool.call(json!({}), &ctx).await {
                    Ok(value) => value,
                    Err(error) => json!({ "error": error.code.as_str() }),
                })
            }
            None => None,
        };
        app.shutdown().await;
        (names, catalog.warnings, report)
    })
}

/// The probe's report (an object with `cwd`) wherever the MCP result carries it.
fn find_report(value: &Value) -> Option<Value> {
    match value {
        Value::Object(map) if map.contains_key("cwd") => Some(value.clone()),
        Value::Object(map) => map.values().find_map(find_report),
        Value::Array(items) => items.iter().find_map(find_report),
        Value::String(text) => serde_json::from_str::<Value>(text)
            .ok()
            .as_ref()
            .and_then(find_report),
        _ => None,
    }
}

fn report_field(report: &Option<Value>, field: &str) -> Value {
    let report = report.as_ref().expect("the probe ran");
    let inner = find_report(report).unwrap_or_else(|| panic!("probe report: {report}"));
    inner[field].clone()
}

const PROBE: &str = "name = \"probe\"\ncommand = \"PYTHON\"\nargs = [\"SCRIPT\"]\n";

fn mcp_name() {
    let (names, _, _) =
        mcp_probe("name = \"renamed\"\ncommand = \"PYTHON\"\nargs = [\"SCRIPT\"]\n");
    assert!(names.contains(&"renamed__probe".to_string()), "{names:?}");
}

fn mcp_command() {
    let (names, _, _) = mcp_probe(PROBE);
    assert!(names.contains(&"probe__probe".to_string()), "{names:?}");
    let (names, warnings, _) =
        mcp_probe("name = \"probe\"\ncommand = \"/nonexistent/keel-mcp-server\"\n");
    assert!(!names.iter().any(|n| n.starts_with("probe__")));
    assert!(warnings.iter().any(|w| w.contains("probe")), "{warnings:?}");
}

fn mcp_args() {
    let (_, _, report) = mcp_probe(&PROBE.replace("[\"SCRIPT\"]", "[\"SCRIPT\", \"--flag\"]"));
    assert_eq!(report_field(&report, "args"), json!(["--flag"]));
}

fn mcp_env() {
    let (_, _, report) = mcp_probe(&format!("{PROBE}env = {{ PROBE_VAR = \"set-by-keel\" }}\n"));
    assert_eq!(report_field(&report, "PROBE_VAR"), json!("set-by-keel"));
}

fn mcp_env_passthrough() {
    let parent: Vec<(std::ffi::OsString, std::ffi::OsString)> = vec![
        ("PASSED".into(), "yes".into()),
        ("SECRET".into(), "no".into()),
    ];
    let with =
        keel_mcp::child_environment(parent.clone(), &["PASSED".to_string()], &Default::default())
            .unwrap();
    assert_eq!(
        with.get(std::ffi::OsStr::new("PASSED")).map(|v| v.to_str()),
        Some(Some("yes"))
    );
    assert!(!with.contains_key(std::ffi::OsStr::new("SECRET")));
    let without = keel_mcp::child_environment(parent, &[], &Default::default()).unwrap();
    assert!(!without.contains_key(std::ffi::OsStr::new("PASSED")));
    // A variable of this process (cargo sets it) reaches the server only when passed.
    let expected = std::env::var("CARGO_PKG_NAME").expect("set by cargo");
    let (_, _, report) = mcp_probe(&format!("{PROBE}env_passthrough = [\"CARGO_PKG_NAME\"]\n"));
    assert_eq!(report_field(&report, "PASSED"), json!(expected));
    let (_, _, report) = mcp_probe(PROBE);
    assert_eq!(report_field(&report, "PASSED"), Value::Null);
}

fn mcp_cwd() {
    let (_, _, report) = mcp_probe(&format!("{PROBE}cwd = \"DIR\"\n"));
    let cwd = report_field(&report, "cwd");
    let cwd = PathBuf::from(cwd.as_str().unwrap());
    // The server ran in the probe's temporary directory, not in this process's.
    assert!(
        cwd.starts_with(std::env::temp_dir().canonicalize().unwrap()),
        "{}",
        cwd.display()
    );
    assert_ne!(Some(cwd), std::env::current_dir().ok());
}

/// A TCP listener that records the first HTTP request it receives and answers 500.
fn one_request_listener() -> (String, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buffer = vec![0u8; 65536];
        let n = stream.read(&mut buffer).unwrap_or(0);
        let _ = stream.write_all(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        );
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    });
    (url, handle)
}

fn mcp_http(extra: &str) -> String {
    let (url, handle) = one_request_listener();
    let toml = format!(
        "[[mcp.servers]]\nname = \"remote\"\nurl = \"{url}/mcp\"\nstartup_timeout_ms = 20000\n{extra}"
    );
    block_on(async {
        let app = app(&toml);
        let catalog = app.catalog().await.unwrap();
        assert!(
            catalog.warnings.iter().any(|w| w.contains("remote")),
            "{:?}",
            catalog.warnings
        );
        app.shutdown().await;
    });
    handle.join().unwrap()
}

fn mcp_url() {
    let request = mcp_http("");
    assert!(request.starts_with("POST /mcp "), "{request}");
}

fn mcp_headers() {
    let request = mcp_http("headers = { X-Probe = \"header-value\" }\n");
    assert!(
        request.to_lowercase().contains("x-probe: header-value"),
        "{request}"
    );
}

fn mcp_startup_timeout() {
    let (names, warnings, _) = mcp_probe(&format!(
        "{PROBE}env = {{ MCP_SLOW_START = \"1\" }}\nstartup_timeout_ms = 300\n"
    ));
    assert!(!names.iter().any(|n| n.starts_with("probe__")), "{names:?}");
    assert!(warnings.iter().any(|w| w.contains("probe")), "{warnings:?}");
}

fn mcp_call_timeout() {
    let (_, _, report) = mcp_probe(&format!(
        "{PROBE}env = {{ MCP_SLOW_CALL = \"1\" }}\ncall_timeout_ms = 300\n"
    ));
    assert_eq!(report, Some(json!({ "error": "timeout" })));
}

// ---------------------------------------------------------------------------------------
// [store]

fn store_url() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("from-config.db");
    let toml = format!("[store]\nurl = \"sqlite://{}\"\n", db.display());
    let app = App::from_toml_str(&toml, dir.path(), env_of(&[])).unwrap();
    let (url, origin) = app.store_url(None);
    assert_eq!(origin, StoreOrigin::Config);
    let opened = block_on(app.open_store(None)).unwrap();
    assert_eq!(opened.backend, "sqlite");
    assert!(db.is_file(), "the configured SQLite file was created");
    assert!(url.contains("from-config.db"));
    // KEEL_STORE beats the file, the flag beats both.
    let app = App::from_toml_str(&toml, dir.path(), env_of(&[("KEEL_STORE", "memory:")])).unwrap();
    assert_eq!(
        app.store_url(None),
        ("memory:".to_string(), StoreOrigin::Env)
    );
    assert_eq!(block_on(app.open_store(None)).unwrap().backend, "memory");
    assert_eq!(app.store_url(Some("sqlite://x.db")).1, StoreOrigin::Flag);
}

// ---------------------------------------------------------------------------------------
// [telemetry]: through keel-telemetry, which the CLI hands the section to.

fn telemetry(toml: &str) -> keel_telemetry::TelemetryConfig {
    config(&format!("[telemetry]\n{toml}")).telemetry
}

fn telemetry_endpoint() {
    assert_eq!(telemetry("").traces_endpoint(), None);
    let t = telemetry("endpoint = \"http://127.0.0.1:4318\"\n");
    assert_eq!(
        t.traces_endpoint().as_deref(),
        Some("http://127.0.0.1:4318/v1/traces")
    );
    assert!(
        keel_telemetry::OtlpSpanExporter::from_config(&telemetry(""))
            .unwrap()
            .is_none()
    );
}

/// Exports one span to a listener with `toml`'s settings; returns what arrived.
fn export_to_listener(toml: &str) -> String {
    let (url, handle) = one_request_listener();
    let t = telemetry(&format!(
        "endpoint = \"{url}\"\nexport_timeout_ms = 3000\n{toml}"
    ));
    let spans = sample_spans();
    block_on(async {
        let exporter = keel_telemetry::OtlpSpanExporter::from_config(&t)
            .unwrap()
            .unwrap();
        let _ = exporter.export(&spans).await;
    });
    handle.join().unwrap()
}

fn sample_events() -> Vec<Event> {
    let model = scripted(vec![ScriptStep::text("the answer is CONTENT-42")]);
    let agent = keel_runtime::ToolAgent::builder("t", model).build();
    block_on(run_with(&agent, &app(""), None, "question CONTENT-41")).1
}

fn sample_spans() -> Vec<keel_telemetry::SpanRecord> {
    keel_telemetry::spans_for_events(
        &sample_events(),
        keel_telemetry::SpanOptions {
            capture_content: false,
        },
    )
    .into_iter()
    .filter_map(|completed| match completed {
        keel_telemetry::Completed::Span(span) => Some(span),
        keel_telemetry::Completed::Turn(_) => None,
    })
    .collect()
}

fn telemetry_protocol() {
    let http = export_to_listener("protocol = \"http\"\n");
    assert!(http.starts_with("POST /v1/traces"), "{http}");
    let grpc = export_to_listener("protocol = \"grpc\"\n");
    assert!(
        grpc.starts_with("PRI * HTTP/2.0"),
        "gRPC speaks HTTP/2: {grpc:?}"
    );
}

fn telemetry_headers() {
    let request = export_to_listener("headers = { x-probe = \"telemetry-header\" }\n");
    assert!(
        request.to_lowercase().contains("x-probe: telemetry-header"),
        "{request}"
    );
}

fn telemetry_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("not-a-cert.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let t = telemetry(&format!(
        "endpoint = \"https://127.0.0.1:4318\"\nca_file = \"{}\"\n",
        bad.display()
    ));
    let Err(error) = keel_telemetry::OtlpSpanExporter::from_config(&t) else {
        panic!("an unusable CA file is refused");
    };
    assert!(
        error.to_string().contains("ca_file") || error.to_string().contains("certificate"),
        "{error}"
    );
}

fn resource_has(t: &keel_telemetry::TelemetryConfig, key: &str, value: &str) -> bool {
    keel_telemetry::export::resource(t)
        .iter()
        .any(|(k, v)| k.as_str() == key && v.as_str() == value)
}

fn telemetry_service_name() {
    assert!(resource_has(
        &telemetry("service_name = \"svc-x\"\n"),
        "service.name",
        "svc-x"
    ));
}

fn telemetry_resource_attributes() {
    let t = telemetry("resource_attributes = { \"deployment.environment\" = \"stage\" }\n");
    assert!(resource_has(&t, "deployment.environment", "stage"));
}

fn telemetry_export_timeout() {
    // A collector that accepts the connection and never answers: the export gives up.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let t = telemetry(&format!("endpoint = \"{url}\"\nexport_timeout_ms = 200\n"));
    let spans = sample_spans();
    let result = block_on(async {
        let exporter = keel_telemetry::OtlpSpanExporter::from_config(&t)
            .unwrap()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(60), exporter.export(&spans)).await
    });
    drop(listener);
    assert!(
        matches!(result, Ok(Err(_))),
        "the export failed on its own deadline"
    );
}

/// Keys tuning the background exporter (batching, intervals, queue): keel-telemetry
/// validates and uses them; a value it cannot use is refused when keel.toml loads.
fn sink_refuses(toml: &str) -> bool {
    let text = format!("[telemetry]\ntrace_dir = \"\"\n{toml}");
    match App::from_toml_str(&text, Path::new("."), env_of(&[])) {
        Err(_) => true,
        Ok(app) => keel_telemetry::TelemetrySink::new(&app.config().telemetry).is_err(),
    }
}

fn telemetry_max_batch_size() {
    assert_eq!(telemetry("max_batch_size = 7\n").max_batch_size, 7);
    assert!(!sink_refuses("max_batch_size = 7\n"));
    assert!(sink_refuses("max_batch_size = 0\n"));
}

fn telemetry_export_interval() {
    assert_eq!(
        telemetry("export_interval_ms = 250\n").export_interval_ms,
        250
    );
    assert!(!sink_refuses("export_interval_ms = 250\n"));
}

fn telemetry_queue_capacity() {
    assert_eq!(telemetry("queue_capacity = 3\n").queue_capacity, 3);
    assert!(!sink_refuses("queue_capacity = 3\n"));
    assert!(sink_refuses("queue_capacity = 0\n"));
}

fn telemetry_metrics() {
    let on = telemetry("endpoint = \"http://127.0.0.1:9\"\n");
    let off = telemetry("endpoint = \"http://127.0.0.1:9\"\nmetrics = false\n");
    assert!(
        keel_telemetry::otel_metrics::OtlpMetrics::from_config(&on)
            .unwrap()
            .is_some()
    );
    assert!(
        keel_telemetry::otel_metrics::OtlpMetrics::from_config(&off)
            .unwrap()
            .is_none()
    );
}

fn telemetry_metrics_interval() {
    assert_eq!(
        telemetry("metrics_interval_ms = 1500\n").metrics_interval_ms,
        1500
    );
    let t = telemetry("endpoint = \"http://127.0.0.1:9\"\nmetrics_interval_ms = 1500\n");
    assert!(
        keel_telemetry::otel_metrics::OtlpMetrics::from_config(&t)
            .unwrap()
            .is_some()
    );
}

/// Runs the sample through a sink with `toml`'s settings; returns the trace files'
/// contents.
fn traced(toml: &str, dir: &Path) -> String {
    let t = telemetry(&format!("trace_dir = \"{}\"\n{toml}", dir.display()));
    let events = sample_events();
    block_on(async {
        let sink = keel_telemetry::TelemetrySink::new(&t).unwrap();
        for event in &events {
            sink.record(event);
        }
        sink.shutdown().await.unwrap();
    });
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn telemetry_trace_dir() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        !traced("", dir.path()).is_empty(),
        "a trace file was written there"
    );
}

fn telemetry_capture_content() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!traced("", dir.path()).contains("gen_ai.input.messages"));
    let dir = tempfile::tempdir().unwrap();
    let captured = traced("capture_content = true\n", dir.path());
    assert!(captured.contains("gen_ai.input.messages") && captured.contains("CONTENT-41"));
}

fn redactor(toml: &str) -> keel_telemetry::Redactor {
    keel_telemetry::Redactor::from_config(&telemetry(toml).redaction).unwrap()
}

const KEY_TEXT: &str = "key sk-ant-api03-abcdefghijklmnopqrstuvwx and ACME-123456";

fn redaction_enabled() {
    assert!(
        !redactor("")
            .redact_str(KEY_TEXT)
            .contains("abcdefghijklmnop")
    );
    let off = redactor("redaction = { enabled = false }\n");
    assert!(off.redact_str(KEY_TEXT).contains("abcdefghijklmnop"));
}

fn redaction_patterns() {
    assert!(redactor("").redact_str(KEY_TEXT).contains("ACME-123456"));
    let r = redactor("redaction = { patterns = [\"ACME-[0-9]{6}\"] }\n");
    assert!(!r.redact_str(KEY_TEXT).contains("ACME-123456"));
}

fn redaction_fields() {
    let r = redactor("redaction = { fields = [\"customer_ssn\"] }\n");
    assert!(r.is_secret_field("customer_ssn"));
    assert!(!redactor("").is_secret_field("customer_ssn"));
    let value = r.redacted_value(&json!({"customer_ssn": "123"}));
    assert_ne!(value["customer_ssn"], "123");
}

fn redaction_replacement() {
    let r = redactor("redaction = { replacement = \"<gone>\" }\n");
    assert!(r.redact_str(KEY_TEXT).contains("<gone>"));
}

/// Logs one info and one warn line through a subscriber built from `toml`; returns the
/// names of the files written in the log directory and their text.
fn logged(toml: &str) -> (Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.log");
    let t = telemetry(&format!(
        "[telemetry.log]\nconsole = false\nfile = \"{}\"\n{toml}",
        file.display()
    ));
    let (subscriber, guard) = keel_telemetry::build_subscriber(&t).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        tracing::info!(target: "keel", "INFO-LINE");
        tracing::warn!(target: "keel", "WARN-LINE");
    });
    drop(guard);
    let mut names = Vec::new();
    let mut text = String::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
    }
    (names, text)
}

fn log_level() {
    let (_, text) = logged("level = \"info\"\n");
    assert!(
        text.contains("INFO-LINE") && text.contains("WARN-LINE"),
        "{text}"
    );
    let (_, text) = logged("level = \"warn\"\n");
    assert!(
        !text.contains("INFO-LINE") && text.contains("WARN-LINE"),
        "{text}"
    );
}

fn log_console() {
    // The console layer writes to stderr, which a test cannot read back; the setting
    // reaches the subscriber builder, and the file still gets the lines without it.
    let t = telemetry("[telemetry.log]\nconsole = false\nfile = \"\"\n");
    assert!(!t.log.console);
    assert!(telemetry("").log.console);
    let (_, text) = logged("");
    assert!(text.contains("WARN-LINE"));
}

fn log_file() {
    let (names, text) = logged("");
    assert!(!names.is_empty() && text.contains("WARN-LINE"), "{names:?}");
    assert!(text.trim_start().starts_with('{'), "JSON lines: {text}");
}

fn log_rotation() {
    let (names, _) = logged("rotation = \"never\"\n");
    assert_eq!(names, ["keel.log"]);
    let (names, _) = logged("rotation = \"daily\"\n");
    assert!(
        names.iter().all(|n| n.starts_with("keel.log.")),
        "{names:?}"
    );
}

// ---------------------------------------------------------------------------------------
// [policies]: applied to the agents keel-app builds.

/// Runs a calculator call with `arguments` (then a text answer) under `toml`'s policies.
fn policy_run(toml: &str, arguments: Value) -> (RunOutcome, Vec<Event>) {
    let model = scripted(vec![
        ScriptStep::tool_call("calculator", arguments),
        ScriptStep::text("answered"),
        ScriptStep::text("answered again"),
    ]);
    let app = app(&format!(
        "{toml}\n[agents.a]\ntools = [\"calculator\", \"ping_pong\"]\n"
    ));
    block_on(async {
        let built = build(
            &app,
            AgentRequest {
                agent: named("a"),
                model_override: Some(model),
                ..AgentRequest::default()
            },
        )
        .await;
        run_with(&built.agent, &app, None, "compute").await
    })
}

const STOP: &str = "{ steps = [{ step = \"stop\", end_state = \"failed\" }] }";

fn policies_rules() {
    let bad = json!({"expression": 5});
    assert_eq!(
        policy_run("", bad.clone()).0.end_state(),
        Some(EndState::Done)
    );
    let toml = format!("[policies.rules]\ninvalid_input = {STOP}\n");
    assert_eq!(policy_run(&toml, bad).0.end_state(), Some(EndState::Failed));
}

fn policies_tools() {
    let bad = json!({"expression": 5});
    let toml = format!("[policies.tools.calculator]\ninvalid_input = {STOP}\n");
    assert_eq!(
        policy_run(&toml, bad.clone()).0.end_state(),
        Some(EndState::Failed)
    );
    let other = format!("[policies.tools.ping_pong]\ninvalid_input = {STOP}\n");
    assert_eq!(policy_run(&other, bad).0.end_state(), Some(EndState::Done));
}

fn policies_fallbacks() {
    let toml = "[policies]\nfallbacks = { calculator = \"ping_pong\" }\n[policies.tools.calculator]\ninvalid_input = { steps = [{ step = \"fallback\" }, { step = \"return_to_model\" }] }\n";
    let (_, events) = policy_run(toml, json!({"expression": 5}));
    let log = serde_json::to_string(&events).unwrap();
    assert!(log.contains("fallback.ping_pong"), "the fallback ran");
    let (_, events) = policy_run("", json!({"expression": 5}));
    assert!(
        !serde_json::to_string(&events)
            .unwrap()
            .contains("fallback.ping_pong")
    );
}

fn policies_user_fields() {
    let missing = json!({});
    assert_eq!(
        policy_run("", missing.clone()).0.end_state(),
        Some(EndState::Done)
    );
    let toml = "[policies]\nuser_fields = { calculator = [\"expression\"] }\n";
    assert_eq!(
        policy_run(toml, missing).0.end_state(),
        Some(EndState::ClarifyNeeded),
        "only the user can give `expression`: asked at once"
    );
}

fn policies_missing_field_attempts() {
    // The model misses `expression` twice.
    let model = || {
        scripted(vec![
            ScriptStep::tool_call("calculator", json!({})),
            ScriptStep::tool_call("calculator", json!({})),
            ScriptStep::text("gave up"),
        ])
    };
    let run = |toml: &str| {
        let app = app(&format!("{toml}\n[agents.a]\ntools = [\"calculator\"]\n"));
        block_on(async {
            let built = build(
                &app,
                AgentRequest {
                    agent: named("a"),
                    model_override: Some(model()),
                    ..AgentRequest::default()
                },
            )
            .await;
            run_with(&built.agent, &app, None, "compute").await.0
        })
    };
    assert_eq!(
        run("").end_state(),
        Some(EndState::ClarifyNeeded),
        "default: 2 misses"
    );
    assert_eq!(
        run("[policies]\nmissing_field_attempts = 3\n").end_state(),
        Some(EndState::Done)
    );
}

// ---------------------------------------------------------------------------------------
// [approvals]

fn approvals_mode() {
    assert!(paused(
        &calculator_run("[approvals]\nmode = \"ask\"\n", None).0
    ));
    let (outcome, events) = calculator_run(
        "[approvals]\nmode = \"ask\"\n[approvals.tools]\ncalculator = \"deny\"\n",
        None,
    );
    assert!(!paused(&outcome) && denied(&events));
}

fn approvals_tools() {
    let toml = "[approvals.tools]\ncalculator = \"ask\"\n";
    let (outcome, _) = calculator_run(toml, None);
    assert!(
        matches!(&outcome.status, RunStatus::AwaitingApproval { tool, .. } if tool == "calculator")
    );
    // Another tool's override leaves the calculator alone.
    assert!(!paused(
        &calculator_run("[approvals.tools]\nping_pong = \"ask\"\n", None).0
    ));
}

// ---------------------------------------------------------------------------------------
// [workflows.<name>]

const WORKFLOW_AGENTS: &str = "[agents.a]\ninstructions = \"A.\"\ntools = []\n\
                               [agents.b]\ninstructions = \"B.\"\ntools = []\n\
                               [agents.c]\ninstructions = \"C.\"\ntools = []\n";

/// Builds workflow `w` of `[agents.a|b|c]` + `workflow` (the `[workflows.w]` body).
fn workflow_of(workflow: &str, model: Option<Arc<ScriptedModel>>) -> keel_runtime::Workflow {
    let app = app(&format!("{WORKFLOW_AGENTS}[workflows.w]\n{workflow}"));
    let request = keel_app::workflow::WorkflowRequest {
        // Without a script, a model that is never called (the default model's hosted
        // URL is refused in test mode, KEEL_TEST_MODE=1).
        model_override: Some(
            model.unwrap_or_else(|| scripted(Vec::new())) as Arc<dyn keel_core::Model>
        ),
        ..keel_app::workflow::WorkflowRequest::new("w")
    };
    block_on(app.workflow(&request)).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs workflow `w` on scripted answers (one sequence for all its agents); returns the
/// outcome and the requests the model received.
fn workflow_run(
    workflow: &str,
    answers: &[&str],
) -> (RunOutcome, Vec<keel_testkit::RecordedRequest>) {
    let model = scripted(answers.iter().map(|a| ScriptStep::text(*a)).collect());
    let built = workflow_of(workflow, Some(model.clone()));
    let outcome = block_on(async {
        let context = keel_runtime::RunContext::default();
        let mut thread = Thread::new();
        keel_runtime::Agent::run(&built, vec![Message::user("go")], &mut thread, &context)
            .await
            .unwrap()
    });
    (outcome, model.requests())
}

fn last_user_text(request: &keel_testkit::RecordedRequest) -> String {
    request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == keel_core::Role::User)
        .map(Message::text)
        .unwrap_or_default()
}

fn workflows_kind() {
    let sequential = workflow_of("kind = \"sequential\"\nsteps = [\"a\", \"b\"]\n", None);
    assert_eq!(sequential.plan().kind(), "sequential");
    let parallel = workflow_of("kind = \"parallel\"\nagents = [\"a\", \"b\"]\n", None);
    assert_eq!(parallel.plan().kind(), "parallel");
    let missing = App::from_toml_str(
        &format!("{WORKFLOW_AGENTS}[workflows.w]\nsteps = [\"a\"]\n"),
        Path::new("."),
        env_of(&[]),
    );
    assert!(missing.unwrap_err().to_string().contains("needs `kind"));
}

fn workflows_description() {
    let w = workflow_of(
        "kind = \"sequential\"\nsteps = [\"a\"]\ndescription = \"Drafts.\"\n",
        None,
    );
    assert_eq!(keel_runtime::Agent::description(&w), "Drafts.");
}

fn workflows_steps() {
    let (outcome, requests) = workflow_run(
        "kind = \"sequential\"\nsteps = [\"a\", \"b\"]\n",
        &["one", "two"],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("two"));
    assert_eq!(last_user_text(&requests[1]), "one", "b gets a's output");
}

fn workflows_agents() {
    let (outcome, requests) = workflow_run(
        "kind = \"parallel\"\nagents = [\"a\", \"b\"]\nmax_parallel = 1\n",
        &["one", "two"],
    );
    assert_eq!(requests.len(), 2);
    let text = outcome.final_text.unwrap();
    assert!(
        text.contains("## a (a)\none") && text.contains("## b (b)\ntwo"),
        "{text}"
    );
}

fn workflows_then() {
    let (outcome, requests) = workflow_run(
        "kind = \"parallel\"\nagents = [\"a\", \"b\"]\nthen = \"c\"\nmax_parallel = 1\n",
        &["one", "two", "three"],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("three"));
    let fan_in = last_user_text(&requests[2]);
    assert!(fan_in.contains("one") && fan_in.contains("two"), "{fan_in}");
}

fn workflows_max_parallel() {
    let w = workflow_of(
        "kind = \"parallel\"\nagents = [\"a\", \"b\"]\nmax_parallel = 1\n",
        None,
    );
    assert_eq!(w.max_parallel(), 1);
    let default = workflow_of("kind = \"parallel\"\nagents = [\"a\", \"b\"]\n", None);
    assert_eq!(default.max_parallel(), 4);
}

fn workflows_routes() {
    let (outcome, requests) = workflow_run(
        "kind = \"router\"\nrouter = \"c\"\nroutes = { first = \"a\", second = \"b\" }\n",
        &["second", "from b"],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("from b"));
    assert_eq!(requests.len(), 2, "only the chosen route runs");
}

fn workflows_router() {
    let (_, requests) = workflow_run(
        "kind = \"router\"\nrouter = \"c\"\nroutes = { first = \"a\", second = \"b\" }\n",
        &["first", "from a"],
    );
    let asked = last_user_text(&requests[0]);
    assert!(
        asked.contains("- first") && asked.contains("- second"),
        "{asked}"
    );
    assert!(
        requests[0]
            .system
            .as_deref()
            .unwrap_or_default()
            .contains("C.")
    );
}

fn workflows_model() {
    block_on(async {
        let script =
            MockScript::from_json(r#"{"turn_by": "conversation", "turns": [{"text": "first"}]}"#)
                .unwrap();
        let mock = MockLlmServer::start(script).await.unwrap();
        let toml = format!(
            "[providers.openai]\nbase_url = \"{}/v1\"\n[agents.a]\nmodel = \"openai:gpt-4.1\"\n\
             instructions = \"A.\"\ntools = []\n[workflows.w]\nkind = \"router\"\n\
             model = \"openai:gpt-4.1-mini\"\nroutes = {{ first = \"a\" }}\n",
            mock.base_url()
        );
        let app = app(&toml);
        let built = app
            .workflow(&keel_app::workflow::WorkflowRequest::new("w"))
            .await
            .unwrap();
        let context = keel_runtime::RunContext::default();
        let mut thread = Thread::new();
        let outcome =
            keel_runtime::Agent::run(&built, vec![Message::user("go")], &mut thread, &context)
                .await
                .unwrap();
        assert_eq!(outcome.end_state(), Some(EndState::Done));
        let models: Vec<Value> = mock
            .requests()
            .iter()
            .map(|r| r.body["model"].clone())
            .collect();
        assert_eq!(models, [json!("gpt-4.1-mini"), json!("gpt-4.1")]);
    });
}

fn workflows_default() {
    let (outcome, _) = workflow_run(
        "kind = \"router\"\nrouter = \"c\"\nroutes = { first = \"a\", second = \"b\" }\n\
         default = \"second\"\n",
        &["no idea", "from b"],
    );
    assert_eq!(outcome.final_text.as_deref(), Some("from b"));
    let (failed, _) = workflow_run(
        "kind = \"router\"\nrouter = \"c\"\nroutes = { first = \"a\", second = \"b\" }\n",
        &["no idea"],
    );
    assert_eq!(failed.end_state(), Some(EndState::Failed));
}

// ---------------------------------------------------------------------------------------
// [server]: consumed by keel-server (above keel-app); asserted through keel-config's
// `ServerConfig`, whose values and `limits_for` / `allows_agent` / `problems` the server
// uses as they are (its tests show the effects over HTTP).

fn server(toml: &str) -> keel_config::ServerConfig {
    config(&format!("[server]\n{toml}")).server
}

/// What `keel config check` (and loading keel.toml) reports about `[server]` text.
fn server_problem(toml: &str) -> String {
    let text = format!("[server]\n{toml}");
    keel_config::check_str(&text, "keel.toml", Path::new("."), &|_| None)
        .into_iter()
        .map(|d| format!("{}: {}", d.key.unwrap_or_default(), d.message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn server_bind() {
    assert_eq!(server("").bind, "127.0.0.1:8080");
    assert_eq!(server("bind = \"0.0.0.0:9000\"").bind, "0.0.0.0:9000");
    assert!(server_problem("bind = \"localhost\"").starts_with("server.bind"));
}

fn server_public_url() {
    assert_eq!(server("").public_url, None);
    let public = server("public_url = \"https://agents.example/\"");
    let everywhere: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
    assert_eq!(public.base_url(everywhere), "https://agents.example");
    assert!(public.serving_problems(everywhere).is_empty());
    // Without it, only a loopback address may serve (`keel serve` checks at start-up).
    assert!(server("").serving_problems(everywhere)[0].contains("[server] public_url"));
    assert!(server_problem("public_url = \"agents.example\"").starts_with("server.public_url"));
}

fn server_allowed_hosts() {
    assert!(server("").allowed_hosts.is_empty());
    let hosts = server("allowed_hosts = [\"keel.internal\", \"*\"]").allowed_hosts;
    assert_eq!(hosts, ["keel.internal", "*"]);
    assert!(
        server_problem("allowed_hosts = [\"https://a.example/\"]")
            .starts_with("server.allowed_hosts")
    );
}

fn server_operators() {
    assert!(server("").operators.is_empty());
    assert_eq!(
        server("operators = [\"ops\"]").operators,
        vec!["ops".to_string()]
    );
}

/// The allowed list reaches the loaded model's options: a file not listed is refused
/// before it is parsed (so a file that is not even a model says so).
fn local_allowed_sha256() {
    assert!(config("").local.allowed_sha256.is_empty());
    let listed = config("[local]\nallowed_sha256 = [\"ab\"]");
    assert_eq!(listed.local.allowed_sha256, vec!["ab".to_string()]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    std::fs::write(&file, b"GGUF not really").unwrap();
    let spec = format!("local:{}", file.display());
    let Err(error) = keel_app::model::build_model(&listed, &spec, None, &|_| None) else {
        panic!("a file outside allowed_sha256 loaded");
    };
    assert!(error.to_string().contains("allowed_sha256"), "{error}");
}

/// `[outbound] allow_private`: a non-public address keel.toml does not name as a
/// destination (here a tool's `{host}` filled by the model) is refused unless listed.
fn outbound_allow_private() {
    let tool = |allow: &str| {
        format!(
            "{allow}[[tools.http]]\nname = \"fetch\"\ndescription = \"Fetch.\"\nusage = \"fetch — host: where.\"\nmethod = \"GET\"\nurl = \"http://{{host}}:PORT/x\"\ninput_schema = {{ type = \"object\", properties = {{ host = {{ type = \"string\" }} }}, required = [\"host\"] }}\n"
        )
    };
    block_on(async {
        let (echo, _backend) = keel_a2a::testing::serve_echo().await.unwrap();
        let port = echo
            .trim_start_matches("http://127.0.0.1:")
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let call = |allow: &str| {
            let toml = tool(allow).replace("PORT", &port);
            async move {
                let app = App::from_toml_str(&toml, Path::new("."), env_of(&[])).unwrap();
                let catalog = app.catalog().await.unwrap();
                let tool = catalog.registry.get("fetch").cloned().unwrap();
                let ctx = keel_core::ToolContext::new("thr", "run", "call", Default::default());
                tool.call(json!({ "host": "127.0.0.1" }), &ctx).await
            }
        };
        let refused = call("").await.unwrap_err();
        assert_eq!(refused.code, keel_core::ToolErrorCode::Forbidden);
        assert_eq!(refused.details.unwrap()["error"], "outbound_refused");
        // Listed: the request reaches the server (which has no `/x`).
        let reached = call("[outbound]\nallow_private = [\"127.0.0.1\"]\n")
            .await
            .unwrap_err();
        assert_eq!(
            reached.code,
            keel_core::ToolErrorCode::NotFound,
            "{}",
            reached.message
        );
    });
    let problem = App::from_toml_str(
        "[outbound]\nallow_private = [\"http://db.internal\"]\n",
        Path::new("."),
        env_of(&[]),
    )
    .unwrap_err()
    .to_string();
    assert!(problem.contains("outbound.allow_private"), "{problem}");
}

fn server_workers() {
    assert_eq!(server("").workers, 2);
    assert_eq!(server("workers = 0").workers, 0);
}

fn server_max_body_bytes() {
    assert_eq!(server("").max_body_bytes, 1024 * 1024);
    assert_eq!(server("max_body_bytes = 4096").max_body_bytes, 4096);
    assert!(server_problem("max_body_bytes = 10").contains("[1024, 1073741824]"));
}

fn server_request_timeout() {
    assert_eq!(server("").request_timeout_ms, 120_000);
    assert_eq!(server("request_timeout_ms = 5000").request_timeout_ms, 5000);
    assert!(server_problem("request_timeout_ms = 1").contains("request_timeout_ms"));
}

fn server_stream_timeout() {
    assert_eq!(server("").stream_timeout_ms, 600_000);
    assert_eq!(
        server("stream_timeout_ms = 60000").stream_timeout_ms,
        60_000
    );
}

fn server_shutdown_grace() {
    assert_eq!(server("").shutdown_grace_ms, 30_000);
    assert_eq!(server("shutdown_grace_ms = 100").shutdown_grace_ms, 100);
    // Bounded where it becomes a deadline: no overflow at shutdown.
    assert!(server_problem("shutdown_grace_ms = 9223372036854775807").contains("[0, 3600000]"));
}

fn server_lease_ttl() {
    assert_eq!(server("").lease_ttl_ms, 30_000);
    assert!(server_problem("lease_ttl_ms = 10").contains("lease_ttl_ms"));
    // A third of the TTL must outlast a cancelled tool's 0.5 s grace.
    assert!(server_problem("lease_ttl_ms = 1500").contains("[2000, 86400000]"));
}

fn server_max_attempts() {
    assert_eq!(server("").max_attempts, 20);
    assert_eq!(server("max_attempts = 3").max_attempts, 3);
    assert!(server_problem("max_attempts = 0").contains("[1, 1000]"));
}

fn server_retry_base() {
    assert_eq!(server("").retry_base_ms, 1_000);
    assert_eq!(server("retry_base_ms = 5").retry_base_ms, 5);
    assert!(server_problem("retry_base_ms = 0").contains("retry_base_ms"));
}

fn server_cors_origins() {
    assert!(
        server("").cors_origins.is_empty(),
        "no CORS unless configured"
    );
    let origins = server("cors_origins = [\"https://app.example\"]").cors_origins;
    assert_eq!(origins, ["https://app.example"]);
    assert!(server_problem("cors_origins = [\"https://app.example/x\"]").contains("not an origin"));
}

fn server_agents() {
    assert!(server("").allows_agent("any"));
    let only = server("agents = [\"helper\"]");
    assert!(only.allows_agent("helper") && !only.allows_agent("other"));
}

fn server_limits_concurrent_runs() {
    assert_eq!(server("").limits_for("t").concurrent_runs, 16);
    let set = server("[server.limits]\nconcurrent_runs = 2");
    assert_eq!(set.limits_for("t").concurrent_runs, 2);
}

/// The effect on streams (429 beyond, slots given back) is shown over real sockets by
/// keel-server's `streams` tests; here: the default and the override.
fn server_limits_open_streams() {
    assert_eq!(server("").limits_for("t").open_streams, 32);
    let set = server("[server.limits]\nopen_streams = 3\n[server.tenants.t]\nopen_streams = 1");
    assert_eq!(set.limits_for("other").open_streams, 3);
    assert_eq!(set.limits_for("t").open_streams, 1);
}

fn server_limits_open_streams_per_key() {
    assert_eq!(server("").limits_for("t").open_streams_per_key, 8);
    let set = server("[server.limits]\nopen_streams_per_key = 0");
    assert_eq!(set.limits_for("t").open_streams_per_key, 0, "0 = unlimited");
}

fn server_limits_requests_per_minute() {
    assert_eq!(server("").limits_for("t").requests_per_minute, 600);
    let set = server("[server.limits]\nrequests_per_minute = 0");
    assert_eq!(set.limits_for("t").requests_per_minute, 0, "0 = unlimited");
}

fn server_limits_tokens_per_day() {
    assert_eq!(server("").limits_for("t").tokens_per_day, 0);
    let set = server("[server.limits]\ntokens_per_day = 100000");
    assert_eq!(set.limits_for("t").tokens_per_day, 100_000);
}

/// The effect on runs (each tenant's secret, never the server's) is shown over real
/// sockets by keel-server's `credentials` tests; here: what is kept and what is refused.
fn server_tenants_credentials() {
    let set = server(
        "[server.tenants.acme.credentials]\nCRM_TOKEN = { env = \"ACME_CRM_TOKEN\", tools = [\"crm\"] }\n",
    );
    let entry = &set.tenants["acme"].credentials["CRM_TOKEN"];
    assert_eq!(entry.env.as_deref(), Some("ACME_CRM_TOKEN"));
    assert!(entry.allows("crm") && !entry.allows("other"));
    let pasted = server_problem("[server.tenants.acme.credentials]\nCRM_TOKEN = \"tok-123456\"\n");
    assert!(pasted.contains("secrets never go in keel.toml"), "{pasted}");
    assert!(!pasted.contains("tok-123456"), "{pasted}");
    let provider = server_problem(
        "[server.tenants.acme.credentials]\nCRM_TOKEN = { env = \"OPENAI_API_KEY\" }\n",
    );
    assert!(
        provider.starts_with("server.tenants.acme.credentials.CRM_TOKEN.env")
            && provider.contains("model provider `openai`"),
        "{provider}"
    );
}

fn server_tenants() {
    let set = server(
        "[server.limits]\nconcurrent_runs = 4\n[server.tenants.acme]\nconcurrent_runs = 1\n",
    );
    assert_eq!(set.limits_for("acme").concurrent_runs, 1);
    assert_eq!(set.limits_for("other").concurrent_runs, 4);
    assert!(server_problem("[server.tenants.Acme]\n").contains("server.tenants.Acme"));
}

/// What resume compares besides the agent itself: every keel.toml section that shapes the
/// agent is fingerprinted, and a change in any is named (issue 44: `[agents.X]` bodies,
/// `[models]`, `[policies]`, `[approvals]`, MCP servers were invisible to a resume).
#[test]
fn a_resume_names_each_keel_toml_section_that_changed() {
    let base = "[agents.a]\ninstructions = \"be brief\"\nmodel = \"openai:m\"\n";
    let recorded = fingerprint(base, None);
    for section in [
        "[agents.a]",
        "[models]",
        "[policies]",
        "[approvals]",
        "[mcp]",
    ] {
        assert!(
            recorded.settings.contains_key(section),
            "{section} is not fingerprinted: {:?}",
            recorded.settings
        );
    }
    assert!(
        !recorded
            .settings
            .keys()
            .any(|s| s.starts_with("[providers")),
        "provider tables may hold keys: never hashed into a log"
    );
    assert!(
        fingerprint(base, None)
            .compare_with(&recorded)
            .changed
            .is_empty(),
        "the same configuration is no change"
    );
    let changes = [
        (
            "[agents.a]\ninstructions = \"be brief\"\nmodel = \"openai:m\"\ntemperature = 0.5\n",
            "keel.toml [agents.a] changed",
        ),
        (
            &format!("{base}[approvals.tools]\ncalculator = \"ask\"\n") as &str,
            "keel.toml [approvals] changed",
        ),
        (
            &format!("{base}[models.fast]\nmodel = \"openai:m\"\n"),
            "keel.toml [models] changed",
        ),
        (
            &format!("{base}[policies.rules]\ninvalid_input = {STOP}\n"),
            "keel.toml [policies] changed",
        ),
    ];
    for (toml, expected) in changes {
        let changed = fingerprint(toml, None).compare_with(&recorded).changed;
        assert!(
            changed.iter().any(|c| c.contains(expected)),
            "{expected:?} not in {changed:?} for\n{toml}"
        );
    }
}
