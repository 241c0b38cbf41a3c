//! What a stdio MCP server gets from Keel, and what it leaves behind: no inherited secrets,
//! bounded stderr, and no orphaned grandchildren after shutdown or a restart.
#![cfg(unix)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ctx, everything_js};
use keel_mcp::{McpManager, McpServerConfig, McpServerState};
use serde_json::json;

/// Generous bound for events the tests wait on (never a fixed sleep).
const DEADLINE: Duration = Duration::from_secs(60);

/// Marks the re-executed copy of this test binary that runs with secrets in its
/// environment.
const CHILD_MARKER: &str = "KEEL_MCP_TEST_ENV_CHILD";
const SECRET: &str = "sk-keel-test-must-not-leak";

/// The environment check runs in a copy of this test binary started with
/// `OPENAI_API_KEY` set (a test cannot safely set variables in its own process), so the
/// parent's environment really holds the secret when the server is spawned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_servers_do_not_inherit_keels_environment() {
    const NAME: &str = "stdio_servers_do_not_inherit_keels_environment";
    if std::env::var_os(CHILD_MARKER).is_none() {
        let output = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &test_path(NAME),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_MARKER, "1")
            .env("OPENAI_API_KEY", SECRET)
            .env("KEEL_TEST_PASSTHROUGH", "passed through")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "child run failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains("environment check ran"),
            "the check did not run in the child:\n{stdout}\n{stderr}"
        );
        return;
    }

    assert_eq!(std::env::var("OPENAI_API_KEY").unwrap(), SECRET);
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env.txt");
    // A "server" that writes its environment to a file and exits (failing the handshake).
    let config = McpServerConfig::stdio("envdump", "sh", ["-c", "env > \"$DUMP_TO\"; exit 3"])
        .with_env("DUMP_TO", dump.display().to_string())
        .with_env("FROM_TABLE", "${OPENAI_API_KEY}x")
        .with_env_passthrough("KEEL_TEST_PASSTHROUGH")
        .with_startup_timeout(Duration::from_secs(30));
    let manager = McpManager::connect_all([config]).await;
    assert_eq!(manager.statuses()[0].state, McpServerState::Failed);
    let env = std::fs::read_to_string(&dump).unwrap();
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(
        !env.lines().any(|l| l.starts_with("OPENAI_API_KEY=")),
        "{env}"
    );
    assert!(!names.contains(&CHILD_MARKER), "{env}");
    assert!(names.contains(&"PATH"), "{env}");
    assert!(
        env.lines()
            .any(|l| l == "KEEL_TEST_PASSTHROUGH=passed through"),
        "{env}"
    );
    // Naming a variable in the `env` table is the explicit way to hand it over.
    assert!(
        env.lines().any(|l| l == format!("FROM_TABLE={SECRET}x")),
        "{env}"
    );
    manager.shutdown().await;
    println!("environment check ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stderr_line_is_bounded() {
    let script = "head -c 3000000 /dev/zero | tr '\\000' x >&2; echo >&2; \
                  echo last words >&2; exit 3";
    let config = McpServerConfig::stdio("noisy", "sh", ["-c", script])
        .with_startup_timeout(Duration::from_secs(30));
    let manager = McpManager::connect_all([config]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Failed);
    let error = status.error.as_deref().unwrap();
    assert!(
        error.contains("last words"),
        "{}",
        &error[..500.min(error.len())]
    );
    assert!(
        error.contains("[stderr line truncated: "),
        "{}",
        &error[..500.min(error.len())]
    );
    assert!(error.len() < 20_000, "error is {} bytes", error.len());
    manager.shutdown().await;
}

/// Whether process `pid` still runs (a zombie waiting for a reaper does not count: this
/// container's init may never reap it).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) if Path::new("/proc/self/stat").exists() => false,
        Err(_) => std::process::Command::new("kill")
            .args(["-0", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success()),
    }
}

async fn wait_until_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while running(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read_pid(path: &Path) -> u32 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills leftover processes when a test fails half-way (only then: after a passing test
/// they are gone, and their pids may belong to someone else by now).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for pid in self.0.iter().filter(|pid| running(**pid)) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

/// server-everything started the way `npx` starts servers: a wrapper that leaves a
/// grandchild (here `sleep`) running next to the real server.
fn server_with_grandchild(pid_file: &Path) -> McpServerConfig {
    let script = "sleep 1000 >/dev/null 2>&1 </dev/null & echo $! > \"$PID_FILE\"; \
                  exec node \"$0\" stdio";
    McpServerConfig::stdio("wrapped", "sh", ["-c", script, &everything_js()])
        .with_env("PID_FILE", pid_file.display().to_string())
        .with_startup_timeout(Duration::from_secs(30))
        .with_call_timeout(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_servers_grandchildren() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    let manager = McpManager::connect_all([server_with_grandchild(&pid_file)]).await;
    let status = &manager.statuses()[0];
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    let grandchild = read_pid(&pid_file).await;
    let _cleanup = KillOnDrop(vec![grandchild]);
    assert!(running(grandchild));

    manager.shutdown().await;
    wait_until_gone(grandchild, "the server's grandchild after shutdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_stops_the_crashed_servers_grandchildren() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    let manager = McpManager::connect_all([server_with_grandchild(&pid_file)]).await;
    let status = manager.statuses()[0].clone();
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    let grandchild = read_pid(&pid_file).await;
    std::fs::remove_file(&pid_file).unwrap();
    let server = status.pid.unwrap();
    let mut cleanup = KillOnDrop(vec![grandchild]);

    // The server crashes; its grandchild would live on as an orphan.
    let killed = std::process::Command::new("kill")
        .args(["-9", &server.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_until_gone(server, "the killed server").await;

    // The next call restarts the server (a call racing the crash may fail as data first).
    let echo = manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "wrapped__echo")
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        match echo.call(json!({"message": "again"}), &ctx("r1")).await {
            Ok(_) => break,
            Err(error) => assert!(Instant::now() < deadline, "no restart: {error:?}"),
        }
    }
    cleanup.0.push(read_pid(&pid_file).await);
    wait_until_gone(
        grandchild,
        "the crashed server's grandchild after the restart",
    )
    .await;
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_call_in_flight_stops_the_server_for_good() {
    let manager = McpManager::connect_all([common::everything()]).await;
    let status = manager.statuses()[0].clone();
    assert_eq!(status.state, McpServerState::Connected, "{status:#?}");
    let server = status.pid.unwrap();
    let _cleanup = KillOnDrop(vec![server]);
    let mut notices = manager.subscribe();
    let long = manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "everything__trigger_long_running_operation")
        .unwrap();
    let call = tokio::spawn(async move {
        long.call(json!({"duration": 30, "steps": 30}), &ctx("inflight"))
            .await
    });
    // Wait until the call is running on the server (its first progress notice).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, notices.recv()).await {
            Ok(Ok(keel_mcp::McpNotice::Progress { .. })) => break,
            Ok(_) => {}
            Err(_) => panic!("no progress from the long-running call"),
        }
    }

    manager.shutdown().await;
    wait_until_gone(server, "the server after shutdown").await;
    let result = tokio::time::timeout(DEADLINE, call).await.unwrap().unwrap();
    assert!(result.is_err(), "{result:?}");
    // The lost call must not have started the server again.
    let echo = manager
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "everything__echo")
        .unwrap();
    let error = echo
        .call(json!({"message": "after shutdown"}), &ctx("late"))
        .await
        .unwrap_err();
    assert!(error.message.contains("shut down"), "{error:?}");
    assert_eq!(manager.statuses()[0].restarts, 0);
}

/// The full libtest name of test `name` of this module (`module::name`), to run it alone
/// in a copy of this test binary.
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
