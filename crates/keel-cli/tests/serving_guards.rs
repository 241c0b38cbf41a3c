//! What the `keel` binary's local serving surfaces refuse, driven over their real
//! transports: `keel ui` answers only expected `Host` values (DNS rebinding: a foreign
//! Host gets 421 and no data) and `keel mcp serve` applies keel.toml's `[approvals]` to
//! the calls it serves (deny → `forbidden`; ask → refused, no approver over MCP).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `keel ui --bind 127.0.0.1:0` in `dir`; answers the process and its `IP:PORT`.
fn start_ui(dir: &Path) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["ui", "--bind", "127.0.0.1:0"])
        .current_dir(dir)
        .env("KEEL_TEST_MODE", "1")
        .env_remove("KEEL_STORE")
        .env_remove("KEEL_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("keel ui: serving http://") {
                let _ = tx.send(rest.split('/').next().unwrap_or_default().to_string());
            }
        }
    });
    let child = Killed(child);
    let addr = rx
        .recv_timeout(DEADLINE)
        .expect("keel ui did not say where it serves");
    (child, addr)
}

/// `GET path` to `addr` with this `Host`: the status and the whole body.
fn get(addr: &str, path: &str, host: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn keel_ui_answers_a_foreign_host_with_421_and_no_data() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[server]\nallowed_hosts = [\"keel.internal\"]\n",
    )
    .unwrap();
    let (_ui, addr) = start_ui(dir.path());
    let port = addr.rsplit(':').next().unwrap();
    for path in [
        "/runs",
        "/",
        "/dashboard",
        "/assets/ui.js",
        "/runs/thr_x/live",
    ] {
        for host in [
            format!("attacker.example:{port}"),
            "attacker.example".to_string(),
            format!("127.0.0.1.attacker.example:{port}"),
        ] {
            let (status, body) = get(&addr, path, &host);
            assert_eq!(status, 421, "GET {path} with Host {host}: {body}");
            assert!(body.contains("\"misdirected_host\""), "{body}");
            assert!(body.contains("[server] allowed_hosts"), "{body}");
            assert!(!body.contains("<html"), "{body}");
        }
    }
    for host in [
        addr.clone(),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
        format!("keel.internal:{port}"),
    ] {
        let (status, body) = get(&addr, "/runs", &host);
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(body.contains("<html"), "{body}");
    }
}

/// `keel mcp serve` in `dir`, spoken to in JSON-RPC lines over stdio.
struct McpServe {
    child: Killed,
    lines: mpsc::Receiver<String>,
}

impl McpServe {
    fn start(dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["mcp", "serve"])
            .current_dir(dir)
            .env_remove("KEEL_STORE")
            .env_remove("KEEL_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self {
            child: Killed(child),
            lines,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// The response to request `id` (notifications and other responses skipped).
    fn response(&self, id: u64) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(DEADLINE)
                .unwrap_or_else(|_| panic!("no response to request {id}"));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    fn call(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        self.send(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }));
        self.response(id)
    }
}

#[test]
fn keel_mcp_serve_applies_the_approvals_of_keel_toml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[approvals.tools]\ncalculator = \"deny\"\nping_pong = \"ask\"\n",
    )
    .unwrap();
    let mut mcp = McpServe::start(dir.path());
    mcp.send(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }));
    let init = mcp.response(1);
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    let denied = mcp.call(2, "calculator", json!({"expression": "6*7"}));
    let result = &denied["result"];
    assert_eq!(result["isError"], true, "{denied}");
    assert_eq!(
        result["structuredContent"]["error"]["code"], "forbidden",
        "{denied}"
    );
    assert!(!denied.to_string().contains("42"), "the call ran: {denied}");
    let message = result["structuredContent"]["error"]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("[approvals"), "{message}");

    let asked = mcp.call(3, "ping_pong", json!({"message": "hello"}));
    let result = &asked["result"];
    assert_eq!(result["isError"], true, "{asked}");
    assert_eq!(
        result["structuredContent"]["error"]["code"], "forbidden",
        "{asked}"
    );
    let message = result["structuredContent"]["error"]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("no approver is configured for an MCP-served tool"),
        "{message}"
    );

    // A tool `[approvals]` leaves alone still runs.
    let ran = mcp.call(4, "delay", json!({"ms": 1}));
    assert_ne!(ran["result"]["isError"], true, "{ran}");

    // tools/list says which calls are refused.
    mcp.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}));
    let list = mcp.response(5);
    let tools = list["result"]["tools"].as_array().unwrap();
    let description = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .and_then(|t| t["description"].as_str())
            .unwrap_or_else(|| panic!("no {name} in {list}"))
            .to_string()
    };
    assert!(description("calculator").contains("refused"), "{list}");
    assert!(description("ping_pong").contains("refused"), "{list}");
    assert!(!description("delay").contains("refused"), "{list}");
}
