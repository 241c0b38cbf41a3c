//! Declarative HTTP tools against a loopback axum server: templating, bodies, headers from
//! the environment, status mapping, Retry-After, timeouts, cancellation and config errors.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use keel_core::{CancellationToken, DynTool, Effect, ToolContext, ToolErrorCode};
use keel_tools::http::{HttpTool, HttpToolConfig, HttpToolError};
use serde_json::{Value, json};

async fn start() -> SocketAddr {
    let app = Router::new()
        .route(
            "/items/{id}",
            get(|Path(id): Path<String>, Query(q): Query<HashMap<String, String>>| async move {
                Json(json!({"id": id, "query": q}))
            }),
        )
        .route(
            "/echo",
            post(|headers: HeaderMap, Json(body): Json<Value>| async move {
                let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                (
                    StatusCode::CREATED,
                    Json(json!({"body": body, "auth": h("authorization"), "idempotency_key": h("idempotency-key")})),
                )
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, Json(json!({"error": {"message": "no such release", "field": "release_id"}}))) }),
        )
        .route("/boom", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "database exploded") }))
        .route(
            "/limited",
            get(|| async { (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")], "slow down").into_response() }),
        )
        .route("/text", get(|| async { "plain words" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn config(toml_text: &str) -> HttpToolConfig {
    toml::from_str(toml_text).unwrap()
}

fn get_tool(addr: SocketAddr, path: &str) -> HttpTool {
    let cfg = config(&format!(
        r#"
        name = "fetch"
        description = "Fetch a thing."
        usage = "fetch — call it with an id."
        method = "GET"
        url = "http://{addr}{path}"
        timeout_ms = 300
        input_schema = {{ type = "object", properties = {{ id = {{ type = "string" }}, verbose = {{ type = "boolean" }} }} }}
        "#
    ));
    HttpTool::with_env(cfg, &|_| None).unwrap()
}

fn ctx() -> ToolContext {
    ToolContext::new("thread-1", "run-1", "call-1", CancellationToken::new())
}

#[tokio::test]
async fn get_fills_the_path_and_sends_other_arguments_as_query() {
    let addr = start().await;
    let tool = get_tool(addr, "/items/{id}");
    assert_eq!(tool.spec().effect, Effect::ReadOnly);
    let out = tool
        .call(json!({"id": "v2.1.0 beta", "verbose": true}), &ctx())
        .await
        .unwrap();
    assert_eq!(out["id"], "v2.1.0 beta");
    assert_eq!(out["query"]["verbose"], "true");
}

#[tokio::test]
async fn a_missing_url_argument_is_invalid_input_naming_it() {
    let addr = start().await;
    let tool = get_tool(addr, "/items/{id}");
    let error = tool.call(json!({}), &ctx()).await.unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput);
    assert!(error.message.contains("`id`"), "{}", error.message);
}

#[tokio::test]
async fn post_sends_a_json_body_env_headers_and_an_idempotency_key() {
    let addr = start().await;
    let cfg = config(
        r#"
        name = "file_report"
        description = "File a report."
        usage = "file_report — send severity and findings."
        method = "POST"
        url = "${BASE_URL:-http://unused}/echo"
        headers = { Authorization = "Bearer ${TOKEN}" }
        input_schema = { type = "object", properties = { severity = { type = "string" }, findings = { type = "array", items = { type = "string" } } }, required = ["severity"] }
        "#,
    );
    let env = move |name: &str| match name {
        "BASE_URL" => Some(format!("http://{addr}")),
        "TOKEN" => Some("s3cret".into()),
        _ => None,
    };
    let tool = HttpTool::with_env(cfg, &env).unwrap();
    assert_eq!(tool.spec().effect, Effect::Mutating);
    assert!(
        !format!("{tool:?}").contains("s3cret"),
        "secrets stay out of Debug"
    );
    let out = tool
        .call(json!({"severity": "high", "findings": ["a", "b"]}), &ctx())
        .await
        .unwrap();
    assert_eq!(
        out["body"],
        json!({"severity": "high", "findings": ["a", "b"]})
    );
    assert_eq!(out["auth"], "Bearer s3cret");
    assert_eq!(out["idempotency_key"], "thread-1:call-1");
}

#[tokio::test]
async fn status_404_is_not_found_with_status_and_body_in_details() {
    let addr = start().await;
    let error = get_tool(addr, "/missing")
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::NotFound);
    assert!(
        error.message.contains("404") && error.message.contains("no such release"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("release_id"),
        "field hint: {}",
        error.message
    );
    let details = error.details.unwrap();
    assert_eq!(details["status"], 404);
    assert!(
        details["body"]
            .as_str()
            .unwrap()
            .contains("no such release")
    );
}

#[tokio::test]
async fn status_500_is_retryable_server() {
    let addr = start().await;
    let error = get_tool(addr, "/boom")
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::RetryableServer);
    assert!(error.code.is_retryable());
    assert_eq!(error.details.unwrap()["body"], "database exploded");
}

#[tokio::test]
async fn status_429_is_rate_limited_with_retry_after() {
    let addr = start().await;
    let error = get_tool(addr, "/limited")
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::RateLimited);
    assert_eq!(error.retry_after_ms, Some(2_000));
}

#[tokio::test]
async fn non_json_responses_come_back_as_text() {
    let addr = start().await;
    let out = get_tool(addr, "/text")
        .call(json!({}), &ctx())
        .await
        .unwrap();
    assert_eq!(out, json!("plain words"));
}

#[tokio::test]
async fn a_slow_service_times_out() {
    let addr = start().await;
    let started = Instant::now();
    let error = get_tool(addr, "/slow")
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout, "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn cancellation_stops_the_request() {
    let addr = start().await;
    let mut cfg = config(&format!(
        r#"
        name = "slow"
        description = "Slow."
        usage = "slow — waits."
        method = "GET"
        url = "http://{addr}/slow"
        "#
    ));
    cfg.timeout_ms = 60_000;
    let tool = HttpTool::with_env(cfg, &|_| None).unwrap();
    let cancel = CancellationToken::new();
    let ctx = ToolContext::new("t", "r", "c", cancel.clone());
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let error = tool.call(json!({}), &ctx).await.unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn connection_refused_is_retryable_and_says_so() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let error = get_tool(addr, "/items/{id}")
        .call(json!({"id": "x"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::RetryableServer);
    assert!(
        error.message.contains("cannot connect"),
        "{}",
        error.message
    );
}

const BASE: &str = r#"
name = "t"
description = "d"
usage = "u"
method = "GET"
"#;

#[test]
fn a_missing_env_var_is_named_at_construction_and_by_missing_env_vars() {
    let cfg = config(&format!(
        "{BASE}url = \"${{SVC_URL}}/x\"\nheaders = {{ X-Key = \"${{SVC_KEY}}\", X-Opt = \"${{OPT:-1}}\" }}\n"
    ));
    let missing = cfg.missing_env_vars_with(&|_| None);
    assert_eq!(
        missing,
        vec![
            ("SVC_URL".to_string(), "url".to_string()),
            ("SVC_KEY".to_string(), "headers.X-Key".to_string())
        ]
    );
    let error = HttpTool::with_env(cfg.clone(), &|_| None).unwrap_err();
    assert!(
        matches!(&error, HttpToolError::MissingEnv { variable, .. } if variable == "SVC_URL"),
        "{error}"
    );
    assert!(error.to_string().contains("`SVC_URL`"), "{error}");
    let error =
        HttpTool::with_env(cfg, &|n| (n == "SVC_URL").then(|| "http://h".to_string())).unwrap_err();
    assert!(
        error.to_string().contains("SVC_KEY") && error.to_string().contains("headers.X-Key"),
        "{error}"
    );
}

#[test]
fn config_errors_name_the_field_and_the_fix() {
    // A placeholder that is not an argument.
    let cfg = config(&format!("{BASE}url = \"http://h/{{release}}\"\n"));
    let error = HttpTool::with_env(cfg, &|_| None).unwrap_err().to_string();
    assert!(
        error.contains("`{release}`") && error.contains("input_schema"),
        "{error}"
    );
    // Not a URL.
    let cfg = config(&format!("{BASE}url = \"not a url\"\n"));
    let error = HttpTool::with_env(cfg, &|_| None).unwrap_err().to_string();
    assert!(error.contains("url:"), "{error}");
    // Bad tool name and zero timeout.
    let cfg = config(
        "name = \"BadName\"\ndescription = \"d\"\nusage = \"u\"\nmethod = \"GET\"\nurl = \"http://h/\"\ntimeout_ms = 0\n",
    );
    let error = HttpTool::with_env(cfg, &|_| None).unwrap_err().to_string();
    assert!(
        error.contains("bad_name") && error.contains("timeout_ms"),
        "{error}"
    );
    // Unknown keys and bad methods are refused by the parser, naming them.
    let error =
        toml::from_str::<HttpToolConfig>(&format!("{BASE}url = \"http://h/\"\ntimeout = 5\n"))
            .unwrap_err();
    assert!(
        error.to_string().contains("unknown field `timeout`"),
        "{error}"
    );
    let error = toml::from_str::<HttpToolConfig>("name = \"t\"\ndescription = \"d\"\nusage = \"u\"\nmethod = \"FETCH\"\nurl = \"http://h/\"\n")
        .unwrap_err();
    assert!(error.to_string().contains("FETCH"), "{error}");
}
