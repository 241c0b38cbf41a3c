//! keel-mcp against real MCP servers from npm and PyPI (installed by
//! `./scripts/install-mcp-peers`): server-everything, server-filesystem, mcp-server-time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ctx, everything, filesystem_js, time_bin};
use keel_core::{ApprovalMode, DynTool, Effect, ToolErrorCode, ToolRegistry};
use keel_mcp::{McpManager, McpNotice, McpServerConfig, McpServerState};
use serde_json::json;

fn tool(manager: &McpManager, name: &str) -> Arc<dyn DynTool> {
    manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("no tool `{name}`; statuses: {:#?}", manager.statuses()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_lists_tools_and_calls_echo_and_get_sum() {
    let manager = McpManager::connect_all([everything()]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    // server-everything (TypeScript SDK) has no `server/discover`: initialize handshake.
    assert_eq!(
        status.protocol_version.as_deref(),
        Some("2025-11-25"),
        "{status:#?}"
    );
    for name in [
        "everything__echo",
        "everything__get_sum",
        "everything__trigger_long_running_operation",
    ] {
        assert!(
            status.tools.iter().any(|t| t == name),
            "missing {name}: {:?}",
            status.tools
        );
    }

    // Every tool passes Keel's registration rules (names, schemas, usage guidance).
    let mut registry = ToolRegistry::new();
    let refused = manager.register_tools(&mut registry);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(registry.len(), status.tools.len());

    let echo = tool(&manager, "everything__echo");
    assert_eq!(echo.spec().effect, Effect::ReadOnly);
    assert!(echo.spec().input_schema.get("$schema").is_none());
    assert!(!echo.spec().usage.trim().is_empty());
    let out = echo
        .call(json!({"message": "hello keel"}), &ctx("c1"))
        .await
        .unwrap();
    assert_eq!(out["content"][0]["type"], "text");
    assert!(
        out["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("hello keel"),
        "{out}"
    );

    let sum = tool(&manager, "everything__get_sum");
    let out = sum
        .call(json!({"a": 2, "b": 40}), &ctx("c2"))
        .await
        .unwrap();
    assert!(
        out["content"][0]["text"].as_str().unwrap().contains("42"),
        "{out}"
    );

    // Bad arguments are an error as data, classified invalid_input.
    let error = sum
        .call(json!({"a": "two", "b": 40}), &ctx("c3"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error:?}");

    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_forwarded_and_cancellation_stops_the_call() {
    let manager = McpManager::connect_all([everything()]).await;
    let mut notices = manager.subscribe();
    let long = tool(&manager, "everything__trigger_long_running_operation");
    let out = long
        .call(json!({"duration": 0.6, "steps": 3}), &ctx("call_progress"))
        .await
        .unwrap();
    assert!(
        out["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{out}"
    );
    // Notifications are handled on their own task, so the last one may arrive after the
    // response: wait for it (generous deadline) instead of reading only what is there.
    let mut progress = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while progress.len() < 3 {
        let Ok(Ok(notice)) = tokio::time::timeout_at(deadline, notices.recv()).await else {
            break;
        };
        if let McpNotice::Progress {
            tool,
            call_id,
            progress: p,
            total,
            ..
        } = notice
        {
            assert_eq!(tool, "everything__trigger_long_running_operation");
            assert_eq!(call_id, "call_progress");
            assert_eq!(total, Some(3.0));
            progress.push(p);
        }
    }
    assert_eq!(progress, vec![1.0, 2.0, 3.0]);

    // Cancelling the context ends the call promptly as `cancelled`.
    let context = ctx("call_cancel");
    let cancel = context.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let error = long
        .call(json!({"duration": 20, "steps": 2}), &context)
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Cancelled, "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The connection is still healthy afterwards.
    let echo = tool(&manager, "everything__echo");
    echo.call(json!({"message": "still here"}), &ctx("c4"))
        .await
        .unwrap();
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_call_timeout_is_a_timeout_error() {
    let config = everything().with_call_timeout(Duration::from_millis(400));
    let manager = McpManager::connect_all([config]).await;
    let long = tool(&manager, "everything__trigger_long_running_operation");
    assert_eq!(long.spec().timeout_ms, 400);
    let error = long
        .call(json!({"duration": 10, "steps": 2}), &ctx("t1"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Timeout, "{error:?}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_reads_inside_and_refuses_outside_the_allowed_directory() {
    let allowed = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let inside_file = allowed.path().join("notes.txt");
    std::fs::write(&inside_file, "keel was here\n").unwrap();
    let outside_file = outside.path().join("secret.txt");
    std::fs::write(&outside_file, "top secret\n").unwrap();
    let allowed_dir = allowed.path().canonicalize().unwrap().display().to_string();

    let config = McpServerConfig::stdio("fs", "node", [filesystem_js(), allowed_dir]);
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");

    let read = tool(&manager, "fs__read_text_file");
    assert_eq!(read.spec().effect, Effect::ReadOnly);
    assert!(read.spec().output_schema.is_some());
    let write = tool(&manager, "fs__write_file");
    assert_eq!(
        (write.spec().effect, write.spec().approval),
        (Effect::Mutating, ApprovalMode::Always)
    );

    let path = inside_file.canonicalize().unwrap().display().to_string();
    let out = read.call(json!({"path": path}), &ctx("r1")).await.unwrap();
    assert_eq!(out, json!({"content": "keel was here\n"}));

    let path = outside_file.canonicalize().unwrap().display().to_string();
    let error = read
        .call(json!({"path": path}), &ctx("r2"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Forbidden, "{error:?}");
    assert!(error.message.to_lowercase().contains("denied"), "{error:?}");

    let missing = allowed
        .path()
        .canonicalize()
        .unwrap()
        .join("missing.txt")
        .display()
        .to_string();
    let error = read
        .call(json!({"path": missing}), &ctx("r3"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::NotFound, "{error:?}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_server_returns_structured_content() {
    let config = McpServerConfig::stdio("time", time_bin(), ["--local-timezone", "UTC"]);
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    // mcp-server-time (Python SDK 2.x) serves both eras: the discovery-based one wins.
    assert_eq!(
        status.protocol_version.as_deref(),
        Some("2026-07-28"),
        "{status:#?}"
    );

    let now = tool(&manager, "time__get_current_time");
    assert!(now.spec().output_schema.is_some(), "{:?}", now.spec());
    let out = now
        .call(json!({"timezone": "Europe/London"}), &ctx("t1"))
        .await
        .unwrap();
    assert_eq!(out["timezone"], "Europe/London", "{out}");
    assert!(out["datetime"].as_str().unwrap().len() >= 19, "{out}");
    assert!(out.get("is_dst").is_some(), "{out}");

    let error = now
        .call(json!({"timezone": "Mars/Olympus_Mons"}), &ctx("t2"))
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::InvalidInput, "{error:?}");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_stdio_server_fails_the_call_as_data_and_restarts() {
    let manager = McpManager::connect_all([everything()]).await;
    let mut notices = manager.subscribe();
    let echo = tool(&manager, "everything__echo");
    let long = tool(&manager, "everything__trigger_long_running_operation");
    echo.call(json!({"message": "before"}), &ctx("k1"))
        .await
        .unwrap();
    let pid = manager.statuses()[0].pid.expect("stdio server pid");

    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = std::process::Command::new("kill")
            .arg("-9")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    });
    let error = long
        .call(json!({"duration": 10, "steps": 2}), &ctx("k2"))
        .await
        .unwrap_err();
    killer.await.unwrap();
    assert_eq!(error.code, ToolErrorCode::RetryableServer, "{error:?}");

    let out = echo
        .call(json!({"message": "after"}), &ctx("k3"))
        .await
        .unwrap();
    assert!(
        out["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("after"),
        "{out}"
    );
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected);
    assert_eq!(status.restarts, 1, "{status:#?}");
    assert_ne!(status.pid, Some(pid));

    let mut saw = (false, false);
    while let Ok(notice) = notices.try_recv() {
        match notice {
            McpNotice::Disconnected { .. } => saw.0 = true,
            McpNotice::Reconnected { restarts, .. } => saw.1 = restarts == 1,
            _ => {}
        }
    }
    assert_eq!(saw, (true, true));
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_servers_are_reported_and_skipped() {
    let started = Instant::now();
    let manager = McpManager::connect_all([
        McpServerConfig::stdio(
            "missing",
            "/nonexistent/keel-mcp-server",
            Vec::<String>::new(),
        ),
        McpServerConfig::stdio("exits", "sh", ["-c", "echo broken >&2; exit 3"]),
        McpServerConfig::stdio("silent", "sleep", ["30"])
            .with_startup_timeout(Duration::from_millis(800)),
        everything(),
        McpServerConfig::stdio("everything", "node", ["unused.js"]),
    ])
    .await;
    assert!(started.elapsed() < Duration::from_secs(25));
    let statuses = manager.statuses();
    let by_name = |name: &str, index: usize| {
        let matching: Vec<_> = statuses.iter().filter(|s| s.name == name).collect();
        matching[index].clone()
    };
    let missing = by_name("missing", 0);
    assert_eq!(missing.state, McpServerState::Failed);
    assert!(
        missing.error.as_deref().unwrap().contains("cannot start"),
        "{missing:#?}"
    );
    let exits = by_name("exits", 0);
    assert_eq!(exits.state, McpServerState::Failed);
    assert!(
        exits.error.as_deref().unwrap().contains("broken"),
        "{exits:#?}"
    );
    let silent = by_name("silent", 0);
    assert_eq!(silent.state, McpServerState::Failed);
    assert!(
        silent
            .error
            .as_deref()
            .unwrap()
            .contains("startup_timeout_ms"),
        "{silent:#?}"
    );
    assert_eq!(by_name("everything", 0).state, McpServerState::Connected);
    let duplicate = by_name("everything", 1);
    assert_eq!(duplicate.state, McpServerState::Failed);
    assert!(
        duplicate.error.as_deref().unwrap().contains("unique"),
        "{duplicate:#?}"
    );
    assert!(
        manager
            .tools()
            .iter()
            .all(|t| t.spec().name.starts_with("everything__"))
    );
    manager.shutdown().await;
}
