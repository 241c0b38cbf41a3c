//! Configuration: spec parsing, API keys from the environment, base URLs, and the
//! loopback-only guard that keeps tests off the internet.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;

use keel_core::ModelRequest;
use keel_core::model::complete;
use keel_providers::{ProviderConfigError, ProviderOptions, model_from_spec_with_env};
use keel_testkit::mock_llm::{MockLlmServer, MockScript, MockTurn};

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn err(spec: &str, options: &ProviderOptions, vars: &[(&str, &str)]) -> ProviderConfigError {
    match model_from_spec_with_env(spec, options, &env(vars)) {
        Ok(model) => panic!("{spec} should fail, built {}", model.id()),
        Err(e) => e,
    }
}

#[test]
fn non_loopback_base_url_is_refused_in_test_mode() {
    // Forced by KEEL_TEST_MODE=1 even though the options do not ask for it.
    let e = err(
        "openai:gpt-4o",
        &ProviderOptions::default(),
        &[("KEEL_TEST_MODE", "1"), ("OPENAI_API_KEY", "k")],
    );
    assert!(
        matches!(e, ProviderConfigError::NonLoopbackRefused { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("https://api.openai.com/v1"), "{e}");
    assert!(e.to_string().contains("loopback"), "{e}");
    // And by the option, for every provider and for explicit and environment URLs.
    let options = ProviderOptions {
        loopback_only: true,
        ..ProviderOptions::default()
    };
    for (spec, var) in [
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_BASE_URL"),
        ("openai:gpt-4o", "OPENAI_BASE_URL"),
        ("openai-responses:gpt-4o", "OPENAI_BASE_URL"),
        ("openrouter:openai/gpt-4o", "OPENROUTER_BASE_URL"),
        ("ollama:llama3.1", "OLLAMA_HOST"),
    ] {
        let keys = [
            ("ANTHROPIC_API_KEY", "k"),
            ("OPENAI_API_KEY", "k"),
            ("OPENROUTER_API_KEY", "k"),
            (var, "http://10.1.2.3:8080"),
        ];
        let e = err(spec, &options, &keys);
        assert!(
            matches!(e, ProviderConfigError::NonLoopbackRefused { .. }),
            "{spec}: {e}"
        );
        let explicit = ProviderOptions {
            base_url: Some("https://example.com".into()),
            ..options.clone()
        };
        assert!(matches!(
            err(spec, &explicit, &keys),
            ProviderConfigError::NonLoopbackRefused { .. }
        ));
    }
    // A host that merely starts with 127.0.0.1 is not loopback.
    let sneaky = ProviderOptions {
        base_url: Some("http://127.0.0.1.nip.io".into()),
        ..options.clone()
    };
    assert!(matches!(
        err("ollama:x", &sneaky, &[]),
        ProviderConfigError::NonLoopbackRefused { .. }
    ));
    // Loopback URLs are accepted.
    for url in [
        "http://127.0.0.1:9",
        "http://localhost:9",
        "http://[::1]:9",
        "127.0.0.1:11434",
    ] {
        let ok = ProviderOptions {
            base_url: Some(url.into()),
            ..options.clone()
        };
        assert!(
            model_from_spec_with_env("ollama:llama3.1", &ok, &env(&[])).is_ok(),
            "{url}"
        );
    }
}

#[test]
fn missing_key_names_the_variable() {
    for (spec, var) in [
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("openai:gpt-4o", "OPENAI_API_KEY"),
        ("openai-responses:gpt-4o", "OPENAI_API_KEY"),
        ("openrouter:openai/gpt-4o", "OPENROUTER_API_KEY"),
    ] {
        let e = err(spec, &ProviderOptions::default(), &[(var, "  ")]);
        assert!(e.to_string().contains(var), "{spec}: {e}");
        assert!(matches!(e, ProviderConfigError::MissingApiKey { .. }));
    }
    // Ollama needs no key.
    assert!(
        model_from_spec_with_env("ollama:llama3.1", &ProviderOptions::default(), &env(&[])).is_ok()
    );
}

#[test]
fn unknown_provider_lists_the_valid_ones() {
    let e = err("gemini:pro", &ProviderOptions::default(), &[]);
    let text = e.to_string();
    for provider in keel_providers::PROVIDERS {
        assert!(text.contains(provider), "{text}");
    }
    let e = err("no-colon", &ProviderOptions::default(), &[]);
    assert!(matches!(e, ProviderConfigError::InvalidSpec { .. }), "{e}");
    assert!(e.to_string().contains("anthropic:claude-sonnet-4-5"));
}

#[test]
fn capabilities_come_from_the_pricing_table() {
    let options = ProviderOptions {
        api_key: Some("k".into()),
        ..ProviderOptions::default()
    };
    let model =
        model_from_spec_with_env("anthropic:claude-sonnet-4-5", &options, &env(&[])).unwrap();
    assert_eq!(model.id(), "anthropic:claude-sonnet-4-5");
    assert_eq!(model.capabilities().context_window, 200_000);
    assert_eq!(model.capabilities().max_output_tokens, 64_000);
    let model = model_from_spec_with_env("openai:gpt-4.1", &options, &env(&[])).unwrap();
    assert_eq!(model.capabilities().context_window, 1_047_576);
}

#[test]
fn openai_family_uses_tiktoken_and_others_the_heuristic() {
    let options = ProviderOptions {
        api_key: Some("k".into()),
        ..ProviderOptions::default()
    };
    let messages = vec![keel_core::Message::user("hello world")];
    let request = ModelRequest::new(&messages);
    let openai = model_from_spec_with_env("openai:gpt-4o", &options, &env(&[])).unwrap();
    assert_eq!(openai.estimate_tokens(&request), 8);
    let anthropic =
        model_from_spec_with_env("anthropic:claude-sonnet-4-5", &options, &env(&[])).unwrap();
    assert_eq!(
        anthropic.estimate_tokens(&request),
        keel_core::model::estimate_request_tokens(&request)
    );
}

#[tokio::test]
async fn base_url_and_keys_come_from_the_environment() {
    let server = MockLlmServer::start(MockScript::new(vec![
        MockTurn::text("a"),
        MockTurn::text("b"),
    ]))
    .await
    .unwrap();
    let base = server.base_url();
    let vars = [
        ("ANTHROPIC_API_KEY", "env-key"),
        ("ANTHROPIC_BASE_URL", base.as_str()),
    ];
    let model = model_from_spec_with_env(
        "anthropic:claude-haiku-4-5",
        &ProviderOptions::default(),
        &env(&vars),
    )
    .unwrap();
    let messages = vec![keel_core::Message::user("hi")];
    complete(model.as_ref(), ModelRequest::new(&messages))
        .await
        .unwrap();
    assert_eq!(server.requests()[0].header("x-api-key"), Some("env-key"));
    // OLLAMA_HOST without a scheme, and no Authorization header without a key.
    let host = server.base_url().trim_start_matches("http://").to_owned();
    let model = model_from_spec_with_env(
        "ollama:llama3.1",
        &ProviderOptions::default(),
        &env(&[("OLLAMA_HOST", &host)]),
    )
    .unwrap();
    complete(model.as_ref(), ModelRequest::new(&messages))
        .await
        .unwrap();
    let r = &server.requests()[1];
    assert_eq!(r.path, "/api/chat");
    assert_eq!(r.header("authorization"), None);
}
