//! The Python A2A peers of the tests (the official `a2a-sdk` from PyPI, installed by
//! `./scripts/install-a2a-peers` into `.peers/a2a/venv`): where they are, and
//! [`PythonPeer`], the SDK's server (`tests/peers/a2a_peer.py`) started on 127.0.0.1 with
//! its stdout lines as events. keel-a2a's, keel-app's and keel-server's tests share it; a
//! missing install is an error saying how to install it (tests fail, never skip).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// The install root of the peers: `$KEEL_A2A_PEERS`, else `<workspace>/.peers/a2a`.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os("KEEL_A2A_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.peers/a2a"),
    }
}

/// The venv's Python, with a2a-sdk installed; an error naming the fix when it is not.
pub fn python() -> Result<PathBuf, String> {
    let path = peers_dir().join("venv/bin/python");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "the Python A2A peer (a2a-sdk from PyPI) is not installed at {}: run \
             ./scripts/install-a2a-peers",
            path.display()
        ))
    }
}

/// A script of keel-a2a's `tests/peers/` (`a2a_peer.py`, `a2a_client.py`,
/// `keel_serve_client.py`).
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(name)
}

/// A running `a2a_peer.py` (killed when dropped).
pub struct PythonPeer {
    child: tokio::process::Child,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    lines: mpsc::UnboundedReceiver<String>,
    deadline: Duration,
}

impl std::fmt::Debug for PythonPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PythonPeer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl PythonPeer {
    /// Starts the peer with `args` and `env`, waiting at most `deadline` for its `READY`
    /// line (also the deadline of [`line`](Self::line)).
    pub async fn start(
        args: &[&str],
        env: &[(&str, &str)],
        deadline: Duration,
    ) -> Result<Self, String> {
        let mut command = tokio::process::Command::new(python()?);
        command
            .arg(script("a2a_peer.py"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start a2a_peer.py: {e}"))?;
        let (sender, mut lines) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let (err_sender, mut err_lines) = mpsc::unbounded_channel::<String>();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(async move {
                let mut reader = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    eprintln!("a2a_peer: {line}");
                    let _ = err_sender.send(line);
                }
            });
        }
        match tokio::time::timeout(deadline, lines.recv()).await {
            Ok(Some(line)) if line.starts_with("READY ") => Ok(Self {
                child,
                url: line.trim_start_matches("READY ").to_string(),
                lines,
                deadline,
            }),
            other => {
                let mut stderr = Vec::new();
                while let Ok(line) = err_lines.try_recv() {
                    stderr.push(line);
                }
                Err(format!(
                    "a2a_peer.py did not start ({other:?}); stderr:\n{}\n(is the peer \
                     installed? run ./scripts/install-a2a-peers)",
                    stderr.join("\n")
                ))
            }
        }
    }

    /// The next stdout line starting with `prefix` (e.g. `SLOW `), without the prefix.
    pub async fn line(&mut self, prefix: &str) -> Result<String, String> {
        loop {
            let line = tokio::time::timeout(self.deadline, self.lines.recv())
                .await
                .map_err(|_| format!("the peer printed no `{prefix}` line in time"))?
                .ok_or_else(|| format!("the peer exited before a `{prefix}` line"))?;
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest.to_string());
            }
        }
    }
}

impl Drop for PythonPeer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
