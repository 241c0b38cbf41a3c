//! Phoenix integration: a scripted tool-using run exported over OTLP (HTTP/protobuf and
//! gRPC) to a real Arize Phoenix started on loopback, read back from Phoenix's REST API.
//! Needs the venv made by `./scripts/install-phoenix` (or `KEEL_PHOENIX_VENV`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::EndState;
use keel_telemetry::{OtlpProtocol, TelemetryConfig, TelemetrySink};
use serde_json::Value;

struct Phoenix {
    child: Child,
    http_port: u16,
    grpc_port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn phoenix_bin() -> PathBuf {
    let venv = std::env::var_os("KEEL_PHOENIX_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/phoenix-venv")
        });
    let bin = venv.join("bin/phoenix");
    if !bin.is_file() {
        panic!(
            "Arize Phoenix is not installed at {}: run ./scripts/install-phoenix",
            venv.display()
        );
    }
    bin
}

async fn start_phoenix() -> Phoenix {
    let bin = phoenix_bin();
    let dir = tempfile::tempdir().unwrap();
    let (http_port, grpc_port) = (free_port(), free_port());
    let log = dir.path().join("phoenix.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .arg("serve")
        .env("PHOENIX_HOST", "127.0.0.1")
        .env("PHOENIX_PORT", http_port.to_string())
        .env("PHOENIX_GRPC_PORT", grpc_port.to_string())
        .env("PHOENIX_WORKING_DIR", dir.path())
        .env("PHOENIX_TELEMETRY_ENABLED", "false")
        .env("DO_NOT_TRACK", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let phoenix = Phoenix {
        child,
        http_port,
        grpc_port,
        log,
        _dir: dir,
    };
    keel_telemetry::ensure_crypto_provider();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let url = format!("http://127.0.0.1:{http_port}/healthz");
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_secs(2), client.get(&url).send()).await
            && r.status().is_success()
        {
            return phoenix;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&phoenix.log).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(3000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            panic!("Phoenix did not become ready within 240 s; log tail:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Phoenix may return attributes nested (`{"gen_ai": {"usage": {...}}}`) or flat.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

async fn fetch_spans(port: u16, project: &str, trace_id: &str, want: usize) -> Vec<Value> {
    keel_telemetry::ensure_crypto_provider();
    let client = reqwest::Client::new();
    let url = format!(
        "http://127.0.0.1:{port}/v1/projects/{project}/spans?trace_id={trace_id}&limit=100"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_secs(5), client.get(&url).send()).await
            && r.status().is_success()
        {
            let body: Value = r.json().await.unwrap();
            let spans = body["data"].as_array().cloned().unwrap_or_default();
            if spans.len() >= want {
                return spans;
            }
        }
        if Instant::now() > deadline {
            panic!("Phoenix did not report {want} spans for trace {trace_id} within 60 s ({url})");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn export_run(
    protocol: OtlpProtocol,
    endpoint: String,
    project: &str,
    run: &[keel_core::Event],
    traces: &std::path::Path,
) {
    let mut config = TelemetryConfig {
        endpoint: Some(endpoint),
        protocol,
        trace_dir: Some(traces.to_path_buf()),
        capture_content: true,
        metrics: false, // Phoenix takes traces only
        ..TelemetryConfig::default()
    };
    config
        .resource_attributes
        .insert("openinference.project.name".into(), project.into());
    let sink = TelemetrySink::new(&config).unwrap();
    for e in run {
        sink.record(e);
    }
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(
        stats.export_errors, 0,
        "export failed: {:?}",
        stats.last_error
    );
    assert_eq!(stats.spans, 4, "{stats:?}");
    assert_eq!(stats.spans_exported, 4, "{stats:?}");
}

fn check_structure(spans: &[Value], trace_id: &str, n: u64) {
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let by_name =
        |name: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == name).collect() };
    let root = by_name("invoke_agent detective");
    assert_eq!(root.len(), 1, "one invoke_agent span: {spans:#?}");
    let root = root[0];
    assert!(root["parent_id"].is_null(), "invoke_agent is the root");
    assert_eq!(root["context"]["trace_id"], trace_id);
    let root_id = root["context"]["span_id"].as_str().unwrap();
    let chats = by_name("chat claude-sonnet-4");
    assert_eq!(chats.len(), 2);
    let tools = by_name("execute_tool get_release");
    assert_eq!(tools.len(), 1);
    for child in chats.iter().chain(tools.iter()) {
        assert_eq!(
            child["parent_id"], root_id,
            "{} must be a child of invoke_agent",
            child["name"]
        );
        assert_eq!(child["context"]["trace_id"], trace_id);
    }
    let attrs = |s: &Value| {
        let mut m = BTreeMap::new();
        flatten("", &s["attributes"], &mut m);
        m
    };
    let root_attrs = attrs(root);
    assert_eq!(root_attrs["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(root_attrs["gen_ai.agent.name"], "detective");
    assert_eq!(root_attrs["keel.end_state"], "done");
    // Chat spans, in time order.
    let mut chats: Vec<&Value> = chats;
    chats.sort_by_key(|s| s["start_time"].as_str().unwrap().to_string());
    let first = attrs(chats[0]);
    for (key, want) in [
        ("gen_ai.operation.name", Value::from("chat")),
        ("gen_ai.provider.name", Value::from("anthropic")),
        ("gen_ai.request.model", Value::from("claude-sonnet-4")),
        ("gen_ai.request.temperature", Value::from(0.2)),
        ("gen_ai.request.max_tokens", Value::from(1024)),
        (
            "gen_ai.response.id",
            Value::from(format!("msg_run_{n:04}_1")),
        ),
        ("gen_ai.usage.input_tokens", Value::from(1534)),
        ("gen_ai.usage.output_tokens", Value::from(214)),
        ("gen_ai.conversation.id", Value::from(format!("thr_{n:04}"))),
    ] {
        assert_eq!(
            first.get(key),
            Some(&want),
            "chat attribute {key}: {first:#?}"
        );
    }
    assert_eq!(
        first["gen_ai.response.finish_reasons"],
        serde_json::json!(["tool_calls"])
    );
    assert!(
        first.contains_key("gen_ai.output.messages"),
        "content captured when opted in"
    );
    let second = attrs(chats[1]);
    assert_eq!(
        second["gen_ai.response.finish_reasons"],
        serde_json::json!(["stop"])
    );
    let tool = attrs(tools[0]);
    for (key, want) in [
        ("gen_ai.operation.name", Value::from("execute_tool")),
        ("gen_ai.tool.name", Value::from("get_release")),
        ("gen_ai.tool.call.id", Value::from("call_1")),
        ("keel.tool.outcome", Value::from("ok")),
        ("keel.tool.attempts", Value::from(1)),
    ] {
        assert_eq!(
            tool.get(key),
            Some(&want),
            "tool attribute {key}: {tool:#?}"
        );
    }
    assert_eq!(
        tool["gen_ai.tool.call.arguments"],
        r#"{"version":"v2.3.1"}"#
    );
    // Explicit times: the chat span lasts as long as the model call (1.2 s).
    let t =
        |s: &Value, k: &str| chrono::DateTime::parse_from_rfc3339(s[k].as_str().unwrap()).unwrap();
    let ms = (t(chats[0], "end_time") - t(chats[0], "start_time")).num_milliseconds();
    assert_eq!(ms, 1200, "chat span duration");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_a_tool_using_run_arrive_in_phoenix_over_http_and_grpc() {
    let phoenix = start_phoenix().await;
    let traces = tempfile::tempdir().unwrap();
    let project = format!("keel-test-{}", std::process::id());

    let http_run = common::tool_using_run(1).end(EndState::Done, Some("Risk: low."));
    export_run(
        OtlpProtocol::Http,
        format!("http://127.0.0.1:{}", phoenix.http_port),
        &project,
        &http_run,
        traces.path(),
    )
    .await;
    let trace_id = &http_run[0].trace_id;
    let spans = fetch_spans(phoenix.http_port, &project, trace_id, 4).await;
    check_structure(&spans, trace_id, 1);

    let grpc_run = common::tool_using_run(2).end(EndState::Done, Some("Risk: low."));
    export_run(
        OtlpProtocol::Grpc,
        format!("http://127.0.0.1:{}", phoenix.grpc_port),
        &project,
        &grpc_run,
        traces.path(),
    )
    .await;
    let grpc_trace = grpc_run[0].trace_id.clone();
    let spans = fetch_spans(phoenix.http_port, &project, &grpc_trace, 4).await;
    check_structure(&spans, &grpc_trace, 2);
    drop(phoenix);
}

/// Feeds a live run's events to the sink, as the CLI does.
struct SinkObserver(Arc<TelemetrySink>);

impl keel_runtime::RunObserver for SinkObserver {
    fn on_event(&self, event: &keel_core::Event) {
        self.0.record(event);
    }
}

/// A real run — `ToolAgent::run` with a scripted model and the real calculator tool — exported
/// to Phoenix while it happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_scripted_run_is_exported_to_phoenix() {
    use keel_core::{Message, ToolRegistry};
    use keel_runtime::{RunContext, Thread, ToolAgent};
    use keel_testkit::{ScriptStep, ScriptedModel};

    let phoenix = start_phoenix().await;
    let traces = tempfile::tempdir().unwrap();
    let project = format!("keel-live-{}", std::process::id());
    let mut config = TelemetryConfig {
        endpoint: Some(format!("http://127.0.0.1:{}", phoenix.http_port)),
        protocol: OtlpProtocol::Http,
        trace_dir: Some(traces.path().to_path_buf()),
        metrics: false,
        ..TelemetryConfig::default()
    };
    config
        .resource_attributes
        .insert("openinference.project.name".into(), project.clone());
    let sink = Arc::new(TelemetrySink::new(&config).unwrap());

    let model = Arc::new(ScriptedModel::new(vec![
        ScriptStep::tool_call("calculator", serde_json::json!({"expression": "17*23"})),
        ScriptStep::text("17*23 = 391"),
    ]));
    let mut tools = ToolRegistry::new();
    tools.register_typed(keel_tools::Calculator).unwrap();
    let agent = ToolAgent::builder("calc", model).tools(tools).build();
    let ctx = RunContext::default().with_observer(Arc::new(SinkObserver(sink.clone())));
    let mut thread = Thread::new();
    let outcome = agent
        .run(vec![Message::user("17*23?")], &mut thread, &ctx)
        .await
        .unwrap();
    assert_eq!(outcome.end_state(), Some(EndState::Done));
    drop(ctx);
    let sink = Arc::try_unwrap(sink).unwrap_or_else(|_| panic!("sink still shared"));
    let stats = sink.shutdown().await.unwrap();
    assert_eq!(stats.export_errors, 0, "{:?}", stats.last_error);

    let spans = fetch_spans(phoenix.http_port, &project, &outcome.trace_id, 4).await;
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let root = spans
        .iter()
        .find(|s| s["name"] == "invoke_agent calc")
        .unwrap_or_else(|| panic!("{names:?}"));
    assert!(root["parent_id"].is_null());
    let root_id = root["context"]["span_id"].as_str().unwrap();
    let children: Vec<&Value> = spans.iter().filter(|s| s["parent_id"] == root_id).collect();
    assert_eq!(
        children
            .iter()
            .filter(|s| s["name"].as_str().unwrap().starts_with("chat "))
            .count(),
        2,
        "{names:?}"
    );
    let tool = children
        .iter()
        .find(|s| s["name"] == "execute_tool calculator")
        .unwrap_or_else(|| panic!("{names:?}"));
    let mut attrs = BTreeMap::new();
    flatten("", &tool["attributes"], &mut attrs);
    assert_eq!(attrs["gen_ai.tool.name"], "calculator");
    assert_eq!(attrs["keel.tool.outcome"], "ok");
    let chat = children
        .iter()
        .find(|s| s["name"].as_str().unwrap().starts_with("chat "))
        .unwrap();
    let mut attrs = BTreeMap::new();
    flatten("", &chat["attributes"], &mut attrs);
    assert_eq!(attrs["gen_ai.operation.name"], "chat");
    assert_eq!(attrs["gen_ai.conversation.id"], Value::from(thread.id()));
    assert!(attrs.contains_key("gen_ai.usage.input_tokens"));
    // The per-run trace file exists and holds the run's events.
    let file = traces.path().join(format!("{}.jsonl", outcome.trace_id));
    assert!(file.is_file(), "trace file {}", file.display());
    drop(phoenix);
}
