#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;
use std::path::Path;

use keel_config::env::expand;
use keel_config::{
    ConfigError, ContextStrategyName, DiagnosticCode, KeelConfig, check_in, check_str, render_json,
    render_text,
};
use keel_core::{ObservationMode, PlannerMode, ToolErrorCode};

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn example_text() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../keel.example.toml");
    std::fs::read_to_string(root).unwrap()
}

/// Issue 10's must-show: a misspelled key and a missing environment variable are both
/// reported, with key paths, positions and the nearest valid key.
#[test]
fn misspelled_key_and_missing_env_var_are_both_reported() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[defaults]\nmodel = \"openai:gpt-4.1-mini\"\n\n[telemetry]\nendpont = \"http://127.0.0.1:4318\"\n\n[[mcp.servers]]\nname = \"remote\"\nurl = \"http://127.0.0.1:3001/mcp\"\nheaders = { Authorization = \"Bearer ${KEEL_CFG_TEST_SURELY_UNSET_TOKEN}\" }\n";
    std::fs::write(dir.path().join("keel.toml"), text).unwrap();
    let diagnostics = check_in(dir.path(), None);
    let rendered = render_text(&diagnostics);
    println!("{rendered}");
    let unknown = diagnostics
        .iter()
        .find(|d| d.code == DiagnosticCode::UnknownKey)
        .unwrap_or_else(|| panic!("no unknown-key diagnostic in:\n{rendered}"));
    assert_eq!(unknown.key.as_deref(), Some("telemetry.endpont"));
    assert_eq!((unknown.line, unknown.column), (Some(5), Some(1)));
    assert!(
        unknown.message.contains("did you mean `endpoint`?"),
        "{}",
        unknown.message
    );
    assert!(
        rendered.contains(
            "keel.toml:5:1: error: unknown key `endpont` in [telemetry]; did you mean `endpoint`?"
        ),
        "{rendered}"
    );
    let missing = diagnostics
        .iter()
        .find(|d| d.code == DiagnosticCode::MissingEnv)
        .unwrap_or_else(|| panic!("no missing-env diagnostic in:\n{rendered}"));
    assert!(
        missing.message.contains("KEEL_CFG_TEST_SURELY_UNSET_TOKEN"),
        "{}",
        missing.message
    );
    assert_eq!(
        missing.key.as_deref(),
        Some("mcp.servers[0].headers.Authorization")
    );
    assert_eq!(missing.line, Some(10));
    let json = render_json(&diagnostics);
    assert_eq!(json["ok"], false);
    assert!(json["errors"].as_u64().unwrap() >= 2);
    assert_eq!(
        json["diagnostics"].as_array().unwrap().len(),
        diagnostics.len()
    );
    // And loading refuses the file, listing both.
    let error = KeelConfig::load_in(dir.path(), None).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("endpont") && text.contains("KEEL_CFG_TEST_SURELY_UNSET_TOKEN"),
        "{text}"
    );
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let text = r#"
[defaults]
approve = "maybe"
modle = "openai:x"

[telemetry.log]
levle = "debug"

[[mcp.servers]]
name = "a"
comand = "x"

[[mcp.servers]]
name = "b"
command = "y"
argz = []

[agents.x]
planner = "native"
observation = "normalised"

[store]
url = "ftp://nope"
"#;
    let diagnostics = check_str(text, "keel.toml", Path::new("."), &env_of(&[]));
    let rendered = render_text(&diagnostics);
    println!("{rendered}");
    let by_key = |key: &str| {
        diagnostics
            .iter()
            .find(|d| d.key.as_deref() == Some(key))
            .unwrap_or_else(|| panic!("nothing for `{key}` in:\n{rendered}"))
    };
    let approve = by_key("defaults.approve");
    assert_eq!(approve.code, DiagnosticCode::InvalidValue);
    assert!(
        approve.message.contains("`maybe`") && approve.message.contains("auto, ask, deny"),
        "{}",
        approve.message
    );
    assert!(
        by_key("defaults.modle")
            .message
            .contains("did you mean `model`?")
    );
    assert!(
        by_key("telemetry.log.levle")
            .message
            .contains("did you mean `level`?")
    );
    assert!(
        by_key("mcp.servers[0].comand")
            .message
            .contains("did you mean `command`?")
    );
    assert!(
        by_key("mcp.servers[1].argz")
            .message
            .contains("did you mean `args`?")
    );
    assert!(
        by_key("agents.x.observation")
            .message
            .contains("did you mean `normalized`?")
    );
    assert!(by_key("store.url").message.contains("ftp"));
    assert_eq!(by_key("telemetry.log.levle").line, Some(7));
    assert_eq!(by_key("mcp.servers[1].argz").line, Some(16));
}

#[test]
fn unknown_keys_error_naming_the_key() {
    let error =
        KeelConfig::from_toml_str("[store]\nurl = \"memory:\"\nsurprise = 1\n").unwrap_err();
    let ConfigError::Invalid { diagnostics, .. } = &error else {
        panic!("{error}")
    };
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0].key.as_deref(), Some("store.surprise"));
    assert!(
        error
            .to_string()
            .contains("unknown key `surprise` in [store]"),
        "{error}"
    );
    let error = KeelConfig::from_toml_str("nonsense = true\n").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("unknown key `nonsense` in the top level"),
        "{error}"
    );
}

#[test]
fn every_documented_section_parses_from_the_example() {
    let env = env_of(&[("OPENAI_API_KEY", "sk-test")]);
    let (config, diagnostics) = KeelConfig::parse_with_env(
        &example_text(),
        "keel.example.toml",
        Path::new("/nonexistent"),
        &env,
    );
    let config = config.unwrap();
    // Only the agent file is missing (it lives elsewhere in the repository).
    for d in &diagnostics {
        assert_eq!(d.code, DiagnosticCode::MissingFile, "{}", d.render());
    }
    assert_eq!(config.defaults.model.as_deref(), Some("fast"));
    assert_eq!(
        config.providers["openai"].base_url.as_deref(),
        Some("https://api.openai.com/v1")
    );
    assert_eq!(
        config.providers["openai"]
            .retry
            .as_ref()
            .unwrap()
            .max_attempts,
        Some(4)
    );
    assert_eq!(config.providers["gateway"].kind.as_deref(), Some("openai"));
    assert_eq!(
        config.models["careful"].pricing.as_ref().unwrap().output,
        15.0
    );
    let resolved = config.resolve_model("fast").unwrap();
    assert_eq!(
        (resolved.provider.as_str(), resolved.model.as_str()),
        ("openai", "gpt-4.1-mini")
    );
    let helper = &config.agents["helper"];
    assert_eq!(helper.planner, Some(PlannerMode::Native));
    assert_eq!(helper.observation, Some(ObservationMode::Raw));
    assert_eq!(
        helper.budget.as_ref().unwrap().to_budget().max_turns,
        Some(16)
    );
    assert_eq!(
        helper.context.as_ref().unwrap().strategy,
        Some(ContextStrategyName::Truncate)
    );
    let critic = helper.critic.as_ref().unwrap();
    assert_eq!(critic.require_calls[0].tool, "calculator");
    assert_eq!(critic.require_in_answer[0].text, "result");
    assert_eq!(config.tools.http.len(), 1);
    assert_eq!(
        config.tools.http[0].url,
        "http://127.0.0.1:8787/releases/{id}/summary"
    );
    assert_eq!(config.mcp.servers.len(), 2);
    assert_eq!(config.mcp.servers[0].transport_kind(), "stdio");
    assert_eq!(config.store.url, "sqlite://.keel/keel.db");
    assert_eq!(
        config.telemetry.endpoint.as_deref(),
        Some("http://127.0.0.1:6006")
    );
    assert_eq!(
        config.telemetry.redaction.patterns,
        vec!["ACME-[0-9]{6}".to_string()]
    );
    assert_eq!(config.telemetry.log.rotation, "daily");
    assert_eq!(config.policies.fallbacks["search"], "search_cache");
    assert!(config.policies.tools["file_risk_report"].contains_key(&ToolErrorCode::Unauthorized));
    assert_eq!(
        config.approval_mode("file_risk_report"),
        keel_runtime::RunApprovalMode::Ask
    );
    assert_eq!(
        config.approval_mode("calculator"),
        keel_runtime::RunApprovalMode::Auto
    );
}

#[test]
fn missing_default_file_is_defaults_and_missing_explicit_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = KeelConfig::load_in(dir.path(), None).unwrap();
    assert_eq!(loaded.config, KeelConfig::default());
    assert_eq!(loaded.config.store.url, "sqlite://.keel/keel.db");
    assert!(loaded.path.is_none());
    let error = KeelConfig::load_in(dir.path(), Some(Path::new("other.toml"))).unwrap_err();
    assert_eq!(error.code(), "not_found");
    assert!(error.to_string().contains("other.toml"), "{error}");
}

#[test]
fn dotenv_is_loaded_without_overriding_existing_variables() {
    let first = tempfile::tempdir().unwrap();
    std::fs::write(
        first.path().join(".env"),
        "KEEL_CFG_TEST_DOTENV=first\nPATH=/from/dotenv\n",
    )
    .unwrap();
    std::fs::write(
        first.path().join("keel.toml"),
        "[store]\nurl = \"${KEEL_CFG_TEST_DOTENV}.db\"\n",
    )
    .unwrap();
    let path_before = std::env::var("PATH").unwrap();
    let loaded = KeelConfig::load_in(first.path(), None).unwrap();
    assert_eq!(loaded.dotenv, Some(first.path().join(".env")));
    assert_eq!(loaded.config.store.url, "first.db");
    assert_eq!(
        std::env::var("PATH").unwrap(),
        path_before,
        ".env must not override PATH"
    );
    // A second .env with another value does not override what the first one set.
    let second = tempfile::tempdir().unwrap();
    std::fs::write(second.path().join(".env"), "KEEL_CFG_TEST_DOTENV=second\n").unwrap();
    std::fs::write(
        second.path().join("keel.toml"),
        "[store]\nurl = \"${KEEL_CFG_TEST_DOTENV}.db\"\n",
    )
    .unwrap();
    let loaded = KeelConfig::load_in(second.path(), None).unwrap();
    assert_eq!(loaded.config.store.url, "first.db");
    assert_eq!(std::env::var("KEEL_CFG_TEST_DOTENV").unwrap(), "first");
}

#[test]
fn variable_expansion_with_defaults() {
    let env = env_of(&[("HOST", "example.test"), ("EMPTY", "")]);
    assert_eq!(
        expand("http://${HOST}/x", &env),
        ("http://example.test/x".into(), vec![])
    );
    assert_eq!(expand("${PORT:-8787}", &env).0, "8787");
    assert_eq!(expand("${HOST:-other}", &env).0, "example.test");
    assert_eq!(expand("${EMPTY:-fallback}", &env).0, "fallback");
    assert_eq!(expand("cost $$5 and $PLAIN", &env).0, "cost $5 and $PLAIN");
    let (_, errors) = expand("${NOPE} ${ALSO_NOPE}", &env);
    assert_eq!(errors.len(), 2);
    let (_, errors) = expand("${unterminated", &env);
    assert_eq!(errors.len(), 1);
    // In a file: defaults apply and the result is typed normally.
    let (config, diagnostics) = KeelConfig::parse_with_env(
        "[store]\nurl = \"${KEEL_STORE:-memory:}\"\n[defaults]\nmodel = \"${MODEL:-ollama:llama3}\"\n",
        "keel.toml",
        Path::new("."),
        &env,
    );
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let config = config.unwrap();
    assert_eq!(config.store.url, "memory:");
    assert_eq!(config.defaults.model.as_deref(), Some("ollama:llama3"));
}

#[test]
fn default_model_api_key_and_file_references_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("present.toml"), "").unwrap();
    let text = "[defaults]\nmodel = \"anthropic:claude-sonnet-4-5\"\nagent = \"absent.toml\"\n[agents.a]\nfile = \"present.toml\"\n[agents.b]\nfile = \"gone.toml\"\n[models.m]\nmodel = \"opneai:gpt\"\n";
    let diagnostics = check_str(text, "keel.toml", dir.path(), &env_of(&[]));
    let rendered = render_text(&diagnostics);
    assert!(
        diagnostics
            .iter()
            .any(|d| d.code == DiagnosticCode::MissingApiKey
                && d.message.contains("ANTHROPIC_API_KEY")),
        "{rendered}"
    );
    assert!(
        diagnostics
            .iter()
            .any(|d| d.code == DiagnosticCode::MissingFile
                && d.key.as_deref() == Some("defaults.agent")),
        "{rendered}"
    );
    assert!(
        diagnostics
            .iter()
            .any(|d| d.code == DiagnosticCode::MissingFile
                && d.key.as_deref() == Some("agents.b.file")),
        "{rendered}"
    );
    assert!(
        !diagnostics
            .iter()
            .any(|d| d.key.as_deref() == Some("agents.a.file")),
        "{rendered}"
    );
    assert!(
        rendered.contains("unknown provider `opneai`")
            && rendered.contains("did you mean `openai`?"),
        "{rendered}"
    );
    // With the key set, that diagnostic goes away.
    let diagnostics = check_str(
        text,
        "keel.toml",
        dir.path(),
        &env_of(&[("ANTHROPIC_API_KEY", "k")]),
    );
    assert!(
        !diagnostics
            .iter()
            .any(|d| d.code == DiagnosticCode::MissingApiKey)
    );
}

#[test]
fn syntax_errors_have_positions() {
    let diagnostics = check_str(
        "[store\nurl = 1\n",
        "keel.toml",
        Path::new("."),
        &env_of(&[]),
    );
    assert!(!diagnostics.is_empty());
    assert_eq!(diagnostics[0].code, DiagnosticCode::Syntax);
    assert_eq!(diagnostics[0].line, Some(1));
}

/// Issue 14, defect 17: the retry budget (and the call deadline) of one model is set in
/// its `[models.<alias>]` entry; values no retry loop can use are errors naming the key.
#[test]
fn per_model_retry_budget_and_call_timeout() {
    let text = r#"
[models.flaky]
model = "openai:gpt-4o-mini"
retry = { max_attempts = 8, initial_delay_ms = 100, max_retry_after_ms = 5000 }
call_timeout_ms = 90000

[models.broken]
model = "anthropic:claude-sonnet-4-5"
retry = { max_attempts = 0, factor = 0.5, initial_delay_ms = 900, max_delay_ms = 100 }
call_timeout_ms = 0
"#;
    let diagnostics = check_str(text, "keel.toml", Path::new("."), &env_of(&[]));
    let rendered = render_text(&diagnostics);
    let keys: Vec<&str> = diagnostics
        .iter()
        .filter_map(|d| d.key.as_deref())
        .collect();
    for key in [
        "models.broken.retry.max_attempts",
        "models.broken.retry.factor",
        "models.broken.retry.initial_delay_ms",
        "models.broken.call_timeout_ms",
    ] {
        assert!(keys.contains(&key), "nothing for `{key}` in:\n{rendered}");
    }
    assert!(
        diagnostics
            .iter()
            .all(|d| d.code == DiagnosticCode::InvalidValue
                && d.key
                    .as_deref()
                    .is_some_and(|k| k.starts_with("models.broken"))),
        "{rendered}"
    );
    let good = text.split("[models.broken]").next().unwrap();
    let config = KeelConfig::from_toml_str(good).unwrap();
    let flaky = &config.models["flaky"];
    let retry = flaky.retry.as_ref().unwrap();
    assert_eq!(retry.max_attempts, Some(8));
    assert_eq!(retry.initial_delay_ms, Some(100));
    assert_eq!(retry.max_retry_after_ms, Some(5000));
    assert_eq!(retry.max_delay_ms, None);
    assert_eq!(flaky.call_timeout_ms, Some(90_000));
    assert!(
        KeelConfig::from_toml_str(text).is_err(),
        "invalid values block loading"
    );
}
