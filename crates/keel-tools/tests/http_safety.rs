//! Safety of declarative HTTP tools against loopback servers: redirects (same origin only
//! by default; configured headers never reach another origin), path arguments that cannot
//! change the path, undeclared arguments refused, error bodies capped, and secrets kept
//! out of error texts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use keel_core::{CancellationToken, DynTool, ToolContext, ToolError, ToolErrorCode};
use keel_tools::http::{HttpTool, HttpToolConfig};
use serde_json::{Value, json};

/// What a server saw: one entry per request, with its path, query and headers.
type Seen = Arc<Mutex<Vec<Value>>>;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn header(headers: &HeaderMap, name: &str) -> Value {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map_or(Value::Null, |v| json!(v))
}

/// A server answering every request with what it saw, and recording it.
async fn echo_server() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new().fallback(any(
        move |method: axum::http::Method, uri: Uri, headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let entry = json!({
                    "method": method.as_str(),
                    "path": uri.path(),
                    "query": uri.query(),
                    "api_key": header(&headers, "x-api-key"),
                    "authorization": header(&headers, "authorization"),
                    "content_type": header(&headers, "content-type"),
                    "body": body,
                });
                record.lock().unwrap().push(entry.clone());
                Json(entry)
            }
        },
    ));
    (serve(app).await, seen)
}

/// A server redirecting `/hop` to `target` with `status`, and `/same` to its own `/landing`.
async fn redirecting_server(target: String, status: StatusCode) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = Router::new()
        .route(
            "/hop",
            any(move || {
                let target = target.clone();
                async move { (status, [("location", target)]).into_response() }
            }),
        )
        .route(
            "/same",
            any(|| async {
                (StatusCode::TEMPORARY_REDIRECT, [("location", "/landing")]).into_response()
            }),
        )
        .route(
            "/landing",
            any(
                move |method: axum::http::Method, headers: HeaderMap, body: String| {
                    let record = record.clone();
                    async move {
                        let entry = json!({
                            "method": method.as_str(),
                            "api_key": header(&headers, "x-api-key"),
                            "authorization": header(&headers, "authorization"),
                            "body": body,
                        });
                        record.lock().unwrap().push(entry.clone());
                        Json(entry)
                    }
                },
            ),
        );
    (serve(app).await, seen)
}

fn tool(toml_text: &str, env: &[(&str, String)]) -> HttpTool {
    let config: HttpToolConfig = toml::from_str(toml_text).unwrap();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    HttpTool::with_env(config, &move |name| {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
    .unwrap()
}

fn ctx() -> ToolContext {
    ToolContext::new("thread-1", "run-1", "call-1", CancellationToken::new())
}

const SECRET_HEADERS: &str =
    r#"headers = { X-Api-Key = "${API_KEY}", Authorization = "Bearer ${TOKEN}" }"#;

fn secret_env() -> Vec<(&'static str, String)> {
    vec![
        ("API_KEY", "key-s3cret-1".to_string()),
        ("TOKEN", "tok-s3cret-2".to_string()),
    ]
}

fn redirect_tool(url: &str, redirects: Option<&str>) -> HttpTool {
    let redirects = redirects.map_or(String::new(), |r| format!("redirects = \"{r}\""));
    tool(
        &format!(
            r#"
            name = "fetch"
            description = "Fetch."
            usage = "fetch — no arguments."
            method = "GET"
            url = "{url}"
            timeout_ms = 10000
            {SECRET_HEADERS}
            {redirects}
            "#
        ),
        &secret_env(),
    )
}

fn error_text(error: &ToolError) -> String {
    serde_json::to_string(error).unwrap()
}

#[tokio::test]
async fn a_redirect_to_another_origin_is_refused_by_default() {
    let (other, other_seen) = echo_server().await;
    let (first, _) = redirecting_server(format!("http://{other}/landing"), StatusCode::FOUND).await;
    let error = redirect_tool(&format!("http://{first}/hop"), None)
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::ToolBug, "{error:?}");
    assert!(
        error.message.contains("another origin")
            && error.message.contains(&other.to_string())
            && error.message.contains("redirects = \"any\""),
        "{}",
        error.message
    );
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "the other origin got a request"
    );
    assert!(!error_text(&error).contains("s3cret"));
}

#[tokio::test]
async fn with_redirects_any_the_other_origin_never_sees_configured_headers() {
    let (other, other_seen) = echo_server().await;
    for status in [StatusCode::FOUND, StatusCode::TEMPORARY_REDIRECT] {
        let (first, _) = redirecting_server(format!("http://{other}/landing?x=1"), status).await;
        let out = redirect_tool(&format!("http://{first}/hop"), Some("any"))
            .call(json!({}), &ctx())
            .await
            .unwrap();
        assert_eq!(out["path"], "/landing", "{out}");
        assert_eq!(out["api_key"], Value::Null, "{status}: {out}");
        assert_eq!(out["authorization"], Value::Null, "{status}: {out}");
    }
    assert_eq!(other_seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn same_origin_redirects_keep_headers_method_and_body() {
    let (first, seen) = redirecting_server(String::new(), StatusCode::FOUND).await;
    let post = tool(
        &format!(
            r#"
            name = "file"
            description = "File."
            usage = "file — send a note."
            method = "POST"
            url = "http://{first}/same"
            {SECRET_HEADERS}
            input_schema = {{ type = "object", properties = {{ note = {{ type = "string" }} }} }}
            "#
        ),
        &secret_env(),
    );
    let out = post.call(json!({"note": "hi"}), &ctx()).await.unwrap();
    assert_eq!(out["method"], "POST", "307 keeps the method: {out}");
    assert_eq!(out["body"], r#"{"note":"hi"}"#);
    assert_eq!(out["api_key"], "key-s3cret-1");
    assert_eq!(out["authorization"], "Bearer tok-s3cret-2");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn redirects_none_follows_nothing() {
    let (first, seen) = redirecting_server(String::new(), StatusCode::FOUND).await;
    let error = redirect_tool(&format!("http://{first}/same"), Some("none"))
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::ToolBug);
    assert!(
        error.message.contains("redirects = \"none\""),
        "{}",
        error.message
    );
    assert!(seen.lock().unwrap().is_empty());
}

fn release_tool(addr: SocketAddr, extra: &str) -> HttpTool {
    tool(
        &format!(
            r#"
            name = "get_release_summary"
            description = "Fetch a release summary."
            usage = "get_release_summary — give release_id."
            method = "GET"
            url = "http://{addr}/releases/{{release_id}}/summary"
            input_schema = {{ type = "object", properties = {{ release_id = {{ type = "string" }}, verbose = {{ type = "boolean" }} }}, required = ["release_id"] {extra} }}
            "#
        ),
        &[],
    )
}

#[tokio::test]
async fn dot_segments_in_path_arguments_never_change_the_path() {
    let (addr, seen) = echo_server().await;
    let tool = release_tool(addr, "");
    for dots in ["..", "."] {
        let error = tool
            .call(json!({"release_id": dots}), &ctx())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidInput, "{dots}: {error:?}");
        assert!(error.message.contains("`release_id`"), "{}", error.message);
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    let out = tool
        .call(json!({"release_id": "../admin"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out["path"], "/releases/..%2Fadmin/summary");
    let out = tool
        .call(json!({"release_id": "a?b=1#c%2e"}), &ctx())
        .await
        .unwrap();
    assert_eq!(out["path"], "/releases/a%3Fb%3D1%23c%252e/summary");
    assert_eq!(out["query"], Value::Null);
}

#[tokio::test]
async fn undeclared_arguments_are_refused_naming_them() {
    let (addr, seen) = echo_server().await;
    let error = release_tool(addr, "")
        .call(json!({"release_id": "v1", "admin": true}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput);
    assert!(
        error.message.contains("`admin`") && error.message.contains("release_id, verbose"),
        "{}",
        error.message
    );
    assert_eq!(error.details.unwrap()["field"], "admin");
    assert!(seen.lock().unwrap().is_empty());
    // Declared ones still travel; a schema that allows more forwards the rest.
    let out = release_tool(addr, ", additionalProperties = true")
        .call(
            json!({"release_id": "v1", "verbose": true, "page": 2}),
            &ctx(),
        )
        .await
        .unwrap();
    // The order of query fields follows the arguments object's key order, which depends on
    // serde_json features: compare them as a set.
    let mut fields: Vec<&str> = out["query"].as_str().unwrap().split('&').collect();
    fields.sort_unstable();
    assert_eq!(fields, ["page=2", "verbose=true"]);
}

#[tokio::test]
async fn error_bodies_are_capped_with_a_notice() {
    let long = "x".repeat(100_000);
    let json_body = json!({"error": {"message": long}});
    let app = Router::new()
        .route(
            "/json",
            get(move || {
                let body = json_body.clone();
                async move { (StatusCode::INTERNAL_SERVER_ERROR, Json(body)) }
            }),
        )
        .route(
            "/text",
            get(|| async { (StatusCode::BAD_REQUEST, "y".repeat(1_000_000)) }),
        );
    let addr = serve(app).await;
    for path in ["json", "text"] {
        let error = redirect_tool(&format!("http://{addr}/{path}"), None)
            .call(json!({}), &ctx())
            .await
            .unwrap_err();
        let text = error_text(&error);
        assert!(
            text.len() < 2_000,
            "{path}: {} bytes in the error",
            text.len()
        );
        assert!(
            error.message.contains("more bytes not shown]"),
            "{path}: {}",
            error.message
        );
        let body = error.details.as_ref().unwrap()["body"].as_str().unwrap();
        assert!(body.contains("more bytes not shown]"), "{path}: {body}");
        assert!(error.details.as_ref().unwrap().get("body_json").is_none());
    }
}

#[tokio::test]
async fn failed_requests_keep_query_values_userinfo_and_headers_out_of_the_error() {
    // Nothing listens on this port: the request fails to connect.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let config = |addr: SocketAddr| {
        format!(
            r#"
            name = "search"
            description = "Search."
            usage = "search — give q."
            method = "GET"
            url = "http://bob:pw-s3cret-3@{addr}/search?api_key=${{QUERY_KEY}}"
            {SECRET_HEADERS}
            input_schema = {{ type = "object", properties = {{ q = {{ type = "string" }} }} }}
            "#
        )
    };
    let mut env = secret_env();
    env.push(("QUERY_KEY", "qk-s3cret-4".to_string()));
    let error = tool(&config(closed), &env)
        .call(json!({"q": "arg-s3cret-5"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::RetryableServer);
    assert!(
        error.message.contains("cannot connect") && error.message.contains("/search"),
        "{}",
        error.message
    );
    let text = error_text(&error);
    assert!(!text.contains("s3cret"), "{text}");

    // A service echoing the credentials in its error body.
    let app = Router::new().fallback(any(|headers: HeaderMap, uri: Uri| async move {
        let echoed = format!(
            "bad credentials {} {} for {}",
            header(&headers, "x-api-key"),
            header(&headers, "authorization"),
            uri
        );
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"message": echoed}})),
        )
    }));
    let addr = serve(app).await;
    let error = tool(&config(addr), &env)
        .call(json!({"q": "x"}), &ctx())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Unauthorized);
    assert!(
        error.message.contains("bad credentials"),
        "{}",
        error.message
    );
    let text = error_text(&error);
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn json_bodies_are_sent_as_application_json() {
    let (addr, seen) = echo_server().await;
    let post = tool(
        &format!(
            r#"
            name = "file"
            description = "File."
            usage = "file — send a note."
            method = "POST"
            url = "http://{addr}/notes"
            input_schema = {{ type = "object", properties = {{ note = {{ type = "string" }} }} }}
            "#
        ),
        &[],
    );
    let out = post.call(json!({"note": "hi"}), &ctx()).await.unwrap();
    assert_eq!(out["content_type"], "application/json");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// A tool whose `auth` names `TOKEN` and `API_KEY`, reading them from `env` when the
/// call's credential source leaves them to it.
fn auth_tool(url: &str, redirects: &str) -> HttpTool {
    let env: keel_tools::http::CallEnv = Arc::new(|name: &str| match name {
        "TOKEN" => Some("env-token-0000".to_string()),
        "API_KEY" => Some("env-key-0000".to_string()),
        _ => None,
    });
    tool(
        &format!(
            r#"
            name = "fetch"
            description = "Fetch."
            usage = "fetch — no arguments."
            method = "GET"
            url = "{url}"
            timeout_ms = 10000
            redirects = "{redirects}"
            auth = {{ bearer_env = "TOKEN", headers = {{ X-Api-Key = "API_KEY" }} }}
            "#
        ),
        &[],
    )
    .with_call_env(env)
}

fn ctx_with(credentials: &[(&str, &str)]) -> ToolContext {
    let mut ctx = ctx();
    ctx.credentials = Arc::new(keel_core::tool::StaticCredentials(
        credentials
            .iter()
            .map(|(k, v)| (("fetch".to_string(), (*k).to_string()), (*v).to_string()))
            .collect(),
    ));
    ctx
}

#[tokio::test]
async fn auth_credentials_come_from_the_call_and_never_leave_the_tools_origin() {
    // From the call's source (not the environment), echoed back only as `[redacted]`.
    let (echo, seen) = echo_server().await;
    let fetch = auth_tool(&format!("http://{echo}/x"), "same_origin");
    let source = [("TOKEN", "src-token-1111"), ("API_KEY", "src-key-1111")];
    let out = fetch.call(json!({}), &ctx_with(&source)).await.unwrap();
    let got = seen.lock().unwrap().pop().unwrap();
    assert_eq!(got["authorization"], "Bearer src-token-1111");
    assert_eq!(got["api_key"], "src-key-1111");
    assert_eq!(out["authorization"], "[redacted]", "{out}");
    assert_eq!(out["api_key"], "[redacted]", "{out}");
    // Without a source: the environment, at the call.
    fetch.call(json!({}), &ctx()).await.unwrap();
    let got = seen.lock().unwrap().pop().unwrap();
    assert_eq!(got["authorization"], "Bearer env-token-0000");

    // A redirect to another origin (followed: `any`) carries none of them.
    let (other, other_seen) = echo_server().await;
    let (first, _) = redirecting_server(format!("http://{other}/landing"), StatusCode::FOUND).await;
    let fetch = auth_tool(&format!("http://{first}/hop"), "any");
    let out = fetch.call(json!({}), &ctx_with(&source)).await.unwrap();
    assert_eq!(out["path"], "/landing", "{out}");
    let got = other_seen.lock().unwrap().pop().unwrap();
    assert_eq!(got["authorization"], Value::Null, "{got}");
    assert_eq!(got["api_key"], Value::Null, "{got}");
}

// ---- The outbound policy (issue 46): addresses a tool may reach, error bodies. ----

/// The `details` of an error refused by the outbound policy, or a panic naming the error.
fn refused_details(error: &ToolError) -> Value {
    let details = error.details.clone().unwrap_or(Value::Null);
    assert_eq!(
        (error.code, details["error"].as_str()),
        (ToolErrorCode::Forbidden, Some("outbound_refused")),
        "{}",
        error_text(error)
    );
    assert!(
        error.message.contains("[outbound] allow_private"),
        "{}",
        error.message
    );
    details
}

#[tokio::test]
async fn outbound_a_redirect_to_the_metadata_address_is_refused_before_connecting() {
    let (first, _) = redirecting_server(
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/".into(),
        StatusCode::FOUND,
    )
    .await;
    let error = redirect_tool(&format!("http://{first}/hop"), Some("any"))
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    let details = refused_details(&error);
    assert_eq!(details["host"], "169.254.169.254");
    assert_eq!(details["address_class"], "cloud metadata");
    assert!(!error_text(&error).contains("s3cret"));
}

#[tokio::test]
async fn outbound_a_templated_host_must_be_public() {
    let (addr, seen) = echo_server().await;
    let tool = tool(
        &format!(
            r#"
            name = "fetch_host"
            description = "Fetch from a host."
            usage = "fetch_host — host: where."
            method = "GET"
            url = "http://{{host}}:{port}/x"
            input_schema = {{ type = "object", properties = {{ host = {{ type = "string" }} }}, required = ["host"] }}
            timeout_ms = 10000
            "#,
            port = addr.port()
        ),
        &[],
    );
    let error = tool
        .call(json!({"host": "127.0.0.1"}), &ctx())
        .await
        .unwrap_err();
    let details = refused_details(&error);
    assert_eq!(details["address_class"], "loopback");
    assert!(seen.lock().unwrap().is_empty(), "the request was sent");
}

#[tokio::test]
async fn outbound_a_redirect_to_a_name_resolving_to_loopback_is_refused() {
    use keel_tools::http::OutboundPolicy;
    let (target, seen) = echo_server().await;
    let (first, _) = redirecting_server(
        format!(
            "http://api.public-looking.example:{}/landing",
            target.port()
        ),
        StatusCode::FOUND,
    )
    .await;
    let url = format!("http://{first}/hop");
    // Tests never depend on real DNS: the name resolves through the policy's lookup.
    let lookup: keel_outbound::Lookup = Arc::new(|name: &str| {
        (name == "api.public-looking.example").then(|| vec!["127.0.0.1".parse().unwrap()])
    });
    let policy = OutboundPolicy::default()
        .with_lookup(lookup)
        .allowing_destination(&url);
    let error = redirect_tool(&url, Some("any"))
        .with_outbound(policy)
        .unwrap()
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    let details = refused_details(&error);
    assert_eq!(details["host"], "api.public-looking.example");
    assert_eq!(details["address"], "127.0.0.1");
    assert_eq!(details["address_class"], "loopback");
    assert!(seen.lock().unwrap().is_empty(), "the request was sent");
}

#[tokio::test]
async fn outbound_error_bodies_reach_the_model_capped_and_redacted() {
    let mut body = String::from("upstream failed; debug: api_key=sk-live-AbCdEf0123456789XyZ ");
    body.push_str(
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0ZW5hbnQifQ.c2lnbmF0dXJl ",
    );
    body.push_str(&"z".repeat(2_000 - body.len()));
    let app = Router::new().fallback(any(move || {
        let body = body.clone();
        async move { (StatusCode::BAD_GATEWAY, body) }
    }));
    let addr = serve(app).await;
    let error = redirect_tool(&format!("http://{addr}/x"), None)
        .call(json!({}), &ctx())
        .await
        .unwrap_err();
    let text = error_text(&error);
    assert!(!text.contains("sk-live-AbCdEf"), "{text}");
    assert!(!text.contains("eyJzdWIiOiJ0ZW5hbnQifQ"), "{text}");
    let excerpt = error.details.as_ref().unwrap()["body"].as_str().unwrap();
    assert!(
        excerpt.len() <= 512 + 40,
        "{} bytes: {excerpt}",
        excerpt.len()
    );
    assert!(excerpt.contains("more bytes not shown"), "{excerpt}");
    assert!(error.message.len() <= 512 + 200, "{}", error.message);
}
