//! Redaction corpus: 50+ secrets and PII samples must not reach the log file, the trace
//! file or the OTLP payload (captured by a loopback HTTP receiver); ordinary text must be
//! left alone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use keel_core::{EndState, EventKind};
use keel_telemetry::{RedactionConfig, Redactor, TelemetryConfig, TelemetrySink, build_subscriber};

const PEM_RSA: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq98ZkQx3FqLr0mT1vW2yXz4A5bC6dE7fG8hI9jK0lM1nO2\npQ3rS4tU5vW6xY7zA8bC9dE0fG1hI2jK3lM4nO5pQ6rS7tU8vW9xY0zA1bC2dE3\n-----END RSA PRIVATE KEY-----";
const PEM_OPENSSH: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----";
const PEM_EC: &str = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oyQk8b7Vq8bXoAoGCCqGSM49\n-----END EC PRIVATE KEY-----";

/// (text as it appears, the part that must never leak).
fn corpus() -> Vec<(String, &'static str)> {
    let v: Vec<(&str, &'static str)> = vec![
        (
            "OPENAI_API_KEY=sk-proj-4fQz9XbLkP2mN7vR8sT1uW3yA5cE6gH0jK",
            "sk-proj-4fQz9XbLkP2mN7vR8sT1uW3yA5cE6gH0jK",
        ),
        (
            "use sk-ant-api03-Xy7Kd9Lm2Np4Qr6St8Uv0Wx1Yz3Ab5Cd7Ef9Gh-AAAA now",
            "Xy7Kd9Lm2Np4Qr6St8Uv0Wx1Yz3Ab5Cd7Ef9Gh",
        ),
        (
            "legacy key sk-1234567890abcdefghijklmnopqrstuvwxyzABCD",
            "1234567890abcdefghijklmnopqrstuvwxyzABCD",
        ),
        (
            "openrouter sk-or-v1-abcdef0123456789abcdef0123456789",
            "abcdef0123456789abcdef0123456789",
        ),
        (
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ),
        (
            "curl -H 'Authorization: Bearer ya29.a0AfH6SMBx3kLmNoPqRsTuVwXyZ0123456789'",
            "a0AfH6SMBx3kLmNoPqRsTuVwXyZ0123456789",
        ),
        (
            "authorization: bearer opaqueTOKENvalue0987654321",
            "opaqueTOKENvalue0987654321",
        ),
        (
            "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
            "AKIAIOSFODNN7EXAMPLE",
        ),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        (
            "session ASIAY34FZKBOKMUTVV7A temporary",
            "ASIAY34FZKBOKMUTVV7A",
        ),
        (
            PEM_RSA,
            "MIIEowIBAAKCAQEA7bq98ZkQx3FqLr0mT1vW2yXz4A5bC6dE7fG8hI9jK0lM1nO2",
        ),
        (PEM_OPENSSH, "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"),
        (
            PEM_EC,
            "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oyQk8b7Vq8bXoAoGCCqGSM49",
        ),
        (
            "GITHUB_TOKEN=ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "16C7e42F292c6912E7710c838347Ae178B4a",
        ),
        (
            "token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRS",
            "11ABCDEFG0123456789_abcdefghijklmnop",
        ),
        (
            "oauth gho_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        (
            "app ghs_abcdefghijklmnopqrstuvwxyz0123456789",
            "abcdefghijklmnopqrstuvwxyz0123456789",
        ),
        (
            "gitlab glpat-xYz12AbC34dEf56GhI78jK",
            "xYz12AbC34dEf56GhI78jK",
        ),
        (
            "slack xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "AbCdEfGhIjKlMnOpQrStUvWx",
        ),
        (
            "hook https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
            "XXXXXXXXXXXXXXXXXXXXXXXX",
        ),
        (
            "stripe sk_live_51H8xYzAbCdEfGhIjKlMnOpQr",
            "51H8xYzAbCdEfGhIjKlMnOpQr",
        ),
        (
            "stripe test rk_test_4eC39HqLyjWDarjtT1zdp7dc",
            "4eC39HqLyjWDarjtT1zdp7dc",
        ),
        (
            "maps key AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
            "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
        ),
        (
            "hf hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        (
            "npm npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
            "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        ),
        (
            "jwt eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJpc3MiOiJrZWVsIiwic3ViIjoiYWxpY2UifQ.c2lnbmF0dXJlLXZhbHVlLWhlcmU",
            "c2lnbmF0dXJlLXZhbHVlLWhlcmU",
        ),
        (
            "db postgres://admin:S3cr3tP4ssw0rd@db.internal:5432/app",
            "S3cr3tP4ssw0rd",
        ),
        (
            "fetch https://user:hunter2hunter2@example.com/x",
            "hunter2hunter2",
        ),
        ("password=Hunt3r2Secret ok", "Hunt3r2Secret"),
        (
            r#"{"password": "correct horse battery staple"}"#,
            "correct horse battery staple",
        ),
        ("api_key: 9f8e7d6c5b4a39281716", "9f8e7d6c5b4a39281716"),
        ("client_secret='Zx9-Qw8_Er7-Ty6'", "Zx9-Qw8_Er7-Ty6"),
        ("X-Api-Key: 0a1b2c3d4e5f60718293", "0a1b2c3d4e5f60718293"),
        (
            "access_token=ya29A0ARrdaMsecretvalue123",
            "ya29A0ARrdaMsecretvalue123",
        ),
        (
            r#""refresh_token": "1//0gLx-refresh-abc123""#,
            "1//0gLx-refresh-abc123",
        ),
        ("Cookie: sessionid=abc123def456ghi789", "abc123def456ghi789"),
        ("passwd: Tr0ub4dor3xyz", "Tr0ub4dor3xyz"),
        ("SECRET=shhh-dont-tell-42", "shhh-dont-tell-42"),
        ("email john.doe@example.com please", "john.doe@example.com"),
        (
            "Contact: Jane_Smith+test@mail.co.uk",
            "Jane_Smith+test@mail.co.uk",
        ),
        ("cc ops-team@sub.company.io", "ops-team@sub.company.io"),
        ("call +1-202-555-0143 today", "202-555-0143"),
        ("London +44 20 7946 0958", "7946 0958"),
        ("SF office (415) 555-2671", "555-2671"),
        ("fax 212.555.0198", "212.555.0198"),
        ("Berlin +49 (0)30 901820", "901820"),
        ("Paris +33 6 12 34 56 78", "6 12 34 56 78"),
        ("Jenny 555-867-5309", "867-5309"),
        ("visa 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
        ("mc 5555-5555-5555-4444", "5555-5555-5555-4444"),
        ("amex 378282246310005", "378282246310005"),
        ("discover 6011111111111117", "6011111111111117"),
        ("stripe test card 4242424242424242", "4242424242424242"),
        ("ssn 123-45-6789", "123-45-6789"),
        (
            "Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
            "dXNlcjpwYXNzd29yZDEyMw==",
        ),
        ("license ACME-123456 (custom pattern)", "ACME-123456"),
        // A card number running on into its expiry escaped the Luhn check.
        ("card 4111 1111 1111 1111 12/29", "4111 1111 1111 1111"),
        ("card 4111111111111111 12/29", "4111111111111111"),
        ("paid with 5555555555554444 exp 12/29", "5555555555554444"),
        // URL credentials with an empty user name.
        (
            "cache redis://:r3d1sPassw0rd@10.0.0.5:6379/0",
            "r3d1sPassw0rd",
        ),
        // Authorization schemes other than Bearer and Basic.
        (
            "Authorization: Token 9c1f8e2d7b6a5c4f3e2d1a0b",
            "9c1f8e2d7b6a5c4f3e2d1a0b",
        ),
        (
            r#"{"headers": {"Authorization": "ApiKey ak-77f3e9d2c1b0a9"}}"#,
            "ak-77f3e9d2c1b0a9",
        ),
        (
            "Proxy-Authorization: Digest username=bob, response=6629fae49393a05397450978507c4ef1",
            "6629fae49393a05397450978507c4ef1",
        ),
        // A private key cut off before its END line (truncated output).
        (
            "key: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\nMzEfYyjiWA4R4",
            "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
        ),
        // Credentials in query strings and form bodies.
        (
            "GET https://files.example.com/dl?token=tK9x8Y7w6V5u4T3s2R1q&page=2",
            "tK9x8Y7w6V5u4T3s2R1q",
        ),
        (
            "https://cdn.example.com/a.png?exp=1718000000&sig=c2lnLXZhbHVlLTEyMzQ1Ng",
            "c2lnLXZhbHVlLTEyMzQ1Ng",
        ),
        (
            "https://bucket.s3.amazonaws.com/o?X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe",
            "fe5f80f77d5fa3beca038a248ff027d0445342fe",
        ),
        (
            "webhook body: id=42&signature=9d8c7b6a5f4e3d2c1b0a&ts=1",
            "9d8c7b6a5f4e3d2c1b0a",
        ),
        (
            "https://api.example.com/v1/items?access_token=AT-4f9a8b7c6d5e&x=1",
            "AT-4f9a8b7c6d5e",
        ),
        (
            "grant_type=client_credentials&api_key=AK-1a2b3c4d5e6f7a8b",
            "AK-1a2b3c4d5e6f7a8b",
        ),
        (
            "https://maps.example.com/geo?q=paris&key=QK-0f9e8d7c6b5a4938",
            "QK-0f9e8d7c6b5a4938",
        ),
        (r#"{"license_key": "LK-998877-ZZ"}"#, "LK-998877-ZZ"),
    ];
    v.into_iter().map(|(t, s)| (t.to_string(), s)).collect()
}

fn ordinary() -> Vec<&'static str> {
    vec![
        "Release v2.3.1 shipped on 2025-03-01 at 12:30:45 UTC.",
        "The build took 1234567 ms and produced 42 artifacts.",
        "UUID 123e4567-e89b-12d3-a456-426614174000 identifies the run.",
        "fn main() { let x = vec![1, 2, 3]; println!(\"{:?}\", x); }",
        "Windows version 10.0.19045.2965 and kernel 6.1.0-18-amd64",
        "IP 192.168.1.100 and port 8080",
        "Order #1234567890123 totals $1,234.56",
        "trace_id 4bf92f3577b34da6a3ce929d0e0e4736 span 00f067aa0ba902b7",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "Temperature 0.2, max_tokens 1024, top_p 0.95",
        "ISBN 978-3-16-148410-0",
        "The meeting is at 10:30 on 12/05/2024.",
        "Line 42: expected `;` found `}`",
        "tokens: 1534 input, 214 output",
        "The password policy requires 12 characters.",
        "sk-learn is a library; so is scikit-learn",
        "Call get_release with {\"version\": \"v2.3.1\"}",
        "timestamp 1718000000000 and epoch 1718000000",
        "numbers 3.14159 2.71828 1.41421 -273.15",
        "Invoice 4111 1111 1111 1112 fails the Luhn check",
        "semver ^1.2.3 || >=2.0.0-beta.1",
        "x + 1 = 2 and c++17",
        "SELECT id, name FROM users WHERE age > 30 LIMIT 10;",
        "git commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
        "range 100-2000 items, pages 12-345",
        "Our token budget is 200000 tokens",
    ]
}

fn redactor() -> Redactor {
    Redactor::from_config(&redaction_config()).unwrap()
}

fn redaction_config() -> RedactionConfig {
    RedactionConfig {
        patterns: vec!["ACME-[0-9]{6}".into()],
        fields: vec!["license_key".into()],
        ..RedactionConfig::default()
    }
}

#[test]
fn corpus_is_large_enough_and_each_sample_is_redacted() {
    let corpus = corpus();
    assert!(corpus.len() >= 50, "corpus has {}", corpus.len());
    let r = redactor();
    for (text, secret) in &corpus {
        assert!(text.contains(secret), "bad sample: {text}");
        let out = r.redact_str(text);
        assert!(
            !out.contains(secret),
            "leaked {secret:?}: {text:?} -> {out:?}"
        );
        assert!(out.contains("[REDACTED"), "no marker: {out:?}");
    }
}

#[test]
fn ordinary_text_is_left_alone() {
    let r = redactor();
    for text in ordinary() {
        assert_eq!(r.redact_str(text), text);
    }
}

#[test]
fn json_fields_are_redacted_by_name_whatever_their_type() {
    let r = redactor();
    let mut v = serde_json::json!({"user": "bob", "Password": 1234, "nested": [{"api-key": {"x": 1}}], "count": 3});
    r.redact_value(&mut v);
    assert_eq!(
        v,
        serde_json::json!({"user": "bob", "Password": "[REDACTED:secret_field]", "nested": [{"api-key": "[REDACTED:secret_field]"}], "count": 3})
    );
}

#[test]
fn a_bad_configured_pattern_names_its_field() {
    let cfg = RedactionConfig {
        patterns: vec!["ok".into(), "(".into()],
        ..RedactionConfig::default()
    };
    let err = Redactor::from_config(&cfg).unwrap_err();
    assert!(
        err.to_string().contains("telemetry.redaction.patterns[1]"),
        "{err}"
    );
}

/// `TelemetryConfig::validate` (every load, `keel config check`) parses patterns instead of
/// compiling them; it must accept and refuse exactly what building the redactor does.
#[test]
fn checking_a_redaction_section_agrees_with_compiling_it() {
    let patterns = [
        "ok",
        "(",
        "[z-a]",
        r"\p{NoSuchClass}",
        "a{5,2}",
        "(?<n>a)(?<n>b)",
        r"(?i)sk-[a-z0-9]{20,}",
        r"\bkey=\S+",
        "(?x) a # comment",
        "a**",
        r"\",
        "",
    ];
    for pattern in patterns {
        let cfg = RedactionConfig {
            patterns: vec![pattern.into()],
            ..RedactionConfig::default()
        };
        let checked = keel_telemetry::redact::check_config(&cfg);
        let built = Redactor::from_config(&cfg);
        assert_eq!(
            checked.is_ok(),
            built.is_ok(),
            "pattern {pattern:?}: {checked:?}"
        );
        let telemetry = TelemetryConfig {
            redaction: cfg,
            ..TelemetryConfig::default()
        };
        let validated = telemetry.validate();
        assert_eq!(validated.is_ok(), built.is_ok(), "pattern {pattern:?}");
        if let Err(err) = validated {
            assert!(
                err.to_string().contains("telemetry.redaction.patterns[0]"),
                "{err}"
            );
        }
    }
    let empty_field = TelemetryConfig {
        redaction: RedactionConfig {
            fields: vec!["token".into(), "  ".into()],
            ..RedactionConfig::default()
        },
        ..TelemetryConfig::default()
    };
    let err = empty_field.validate().unwrap_err();
    assert!(
        err.to_string().contains("telemetry.redaction.fields[1]"),
        "{err}"
    );
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sample_reaches_logs_trace_files_or_otlp() {
    let dir = tempfile::tempdir().unwrap();
    let (port, bodies) = common::otlp_receiver().await;
    let mut config = TelemetryConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        trace_dir: Some(dir.path().join("traces")),
        capture_content: true,
        redaction: redaction_config(),
        ..TelemetryConfig::default()
    };
    config.log.file = Some(dir.path().join("logs/keel.log"));
    config.log.console = false;
    config.log.rotation = "never".into();
    config.log.level = "debug".into();
    let corpus = corpus();

    // Logs.
    let (subscriber, guard) = build_subscriber(&config).unwrap();
    tracing::subscriber::with_default(subscriber, || {
        for (text, _) in &corpus {
            tracing::info!(target: "keel::test", user_input = %text, "processing {text}");
        }
        for text in ordinary() {
            tracing::info!(target: "keel::test", "{text}");
        }
    });
    drop(guard);

    // A run carrying every sample in every place content can be.
    let mut b = common::RunBuilder::new(42, "detective", "anthropic:claude-sonnet-4", &corpus[0].0);
    // Ordinary texts first, so they are within the captured input messages of every call.
    for text in ordinary() {
        b.user(text);
    }
    for (i, (text, _)) in corpus.iter().enumerate() {
        let id = format!("call_{i}");
        let args = serde_json::json!({ "q": text }).to_string();
        b.user(text);
        b.request(1);
        b.respond(10, text, &[(&id, "lookup", &args)], (100, 10), 0.001);
        b.tool(&id, "lookup", 5, 1, None, text);
        b.push(
            1,
            EventKind::Notice {
                code: "echo".into(),
                message: text.clone(),
                data: Some(serde_json::json!({"text": text})),
            },
        );
    }
    let run = b.end(EndState::Done, Some(&corpus[1].0));
    let sink = TelemetrySink::new(&config).unwrap();
    for e in &run {
        sink.record(e);
    }
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(stats.export_errors, 0, "{:?}", stats.last_error);
    assert!(stats.spans_exported > 100, "{stats:?}");

    let log_dir = dir.path().join("logs");
    let mut log = String::new();
    for entry in std::fs::read_dir(&log_dir).unwrap() {
        log.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let trace = std::fs::read_to_string(
        dir.path()
            .join("traces")
            .join(format!("{}.jsonl", run[0].trace_id)),
    )
    .unwrap();
    let otlp: Vec<u8> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, b)| b.clone())
        .collect();
    assert!(
        log.lines().count() >= corpus.len(),
        "log has {} lines",
        log.lines().count()
    );
    assert!(!otlp.is_empty(), "no OTLP payload received");
    for (name, hay) in [
        ("log file", log.as_bytes()),
        ("trace file", trace.as_bytes()),
        ("OTLP payload", &otlp[..]),
    ] {
        for (text, secret) in &corpus {
            assert!(
                !contains(hay, secret),
                "{name} leaks {secret:?} (from {text:?})"
            );
        }
        assert!(
            contains(hay, "[REDACTED"),
            "{name} shows no redaction marker"
        );
        // Ordinary text survives (checked on samples without JSON-escaped characters).
        for text in ordinary()
            .into_iter()
            .filter(|t| !t.contains('"') && !t.contains('\\'))
        {
            assert!(contains(hay, text), "{name} lost ordinary text {text:?}");
        }
    }
}

/// Negative control: with redaction off, the same searches do find the secrets, so the
/// leak checks above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redaction_off_the_searches_find_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (port, bodies) = common::otlp_receiver().await;
    let config = TelemetryConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        trace_dir: Some(dir.path().to_path_buf()),
        capture_content: true,
        redaction: RedactionConfig {
            enabled: false,
            ..RedactionConfig::default()
        },
        ..TelemetryConfig::default()
    };
    let secret = "sk-proj-4fQz9XbLkP2mN7vR8sT1uW3yA5cE6gH0jK";
    let mut b = common::RunBuilder::new(43, "detective", "anthropic:claude-sonnet-4", "goal");
    b.user(secret);
    b.request(1);
    b.respond(10, "ok", &[], (1, 1), 0.0);
    let run = b.end(EndState::Done, None);
    let sink = TelemetrySink::new(&config).unwrap();
    for e in &run {
        sink.record(e);
    }
    sink.shutdown().await.unwrap();
    let trace =
        std::fs::read_to_string(dir.path().join(format!("{}.jsonl", run[0].trace_id))).unwrap();
    assert!(trace.contains(secret));
    assert!(contains(
        &bodies
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, b)| b.clone())
            .collect::<Vec<u8>>(),
        secret
    ));
}
