//! The processes of the benchmark: the release `keel` binary (built on demand), `keel
//! mock-llm` and `keel serve` started as children that are killed when dropped, `keel keys
//! create`, and what Linux says about a process in `/proc` (peak and current resident
//! memory, CPU time) and about the machine (load average).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a child may take to print its "listening" line.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The target directory (`CARGO_TARGET_DIR`, else `<root>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds the release `keel` binary (`cargo build --release -p keel-cli`) and returns its
/// path.
pub async fn build_keel() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("bench-serve: building the release keel binary (cargo build --release -p keel-cli)");
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "keel-cli"])
        .current_dir(workspace_root())
        .status()
        .await
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p keel-cli failed ({status})");
    }
    Ok(target_dir().join("release").join("keel"))
}

/// A child process killed on drop, its stderr kept in a file for diagnostics.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Where its stderr goes.
    pub stderr_path: PathBuf,
    /// The address it printed (`127.0.0.1:PORT`).
    pub addr: String,
}

impl Proc {
    /// Starts `command` (stdout piped, stderr to `stderr_path`) and waits for the stdout
    /// line starting with `prefix` followed by `http://ADDR`; the rest of stdout is drained
    /// in the background.
    pub async fn start(
        mut command: Command,
        prefix: &str,
        stderr_path: PathBuf,
    ) -> anyhow::Result<Self> {
        let stderr = std::fs::File::create(&stderr_path)
            .with_context(|| format!("creating {}", stderr_path.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        let mut child = command.spawn().context("starting a keel process")?;
        let pid = child.id().context("the child has no pid")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let wanted = format!("{prefix} http://");
        let addr = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix(&wanted) {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    return Ok::<_, std::io::Error>(Some(addr.to_string()));
                }
            }
            Ok(None)
        })
        .await;
        let addr = match addr {
            Ok(Ok(Some(addr))) if !addr.is_empty() => addr,
            other => {
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                bail!(
                    "the process did not print `{wanted}…` ({other:?}); its stderr:\n{}",
                    tail(&log, 40)
                );
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            pid,
            stderr_path,
            addr,
        })
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its stderr.
    pub fn stderr_tail(&self, lines: usize) -> String {
        tail(
            &std::fs::read_to_string(&self.stderr_path).unwrap_or_default(),
            lines,
        )
    }

    /// Sends SIGTERM and waits up to `grace` for the exit, then kills it.
    pub async fn stop(mut self, grace: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all.get(all.len().saturating_sub(lines)..)
        .unwrap_or_default()
        .join("\n")
}

/// Runs `keel keys create --tenant TENANT --output json` and returns the key.
pub async fn create_key(
    keel: &Path,
    dir: &Path,
    store_url: &str,
    tenant: &str,
) -> anyhow::Result<String> {
    let output = Command::new(keel)
        .args([
            "keys",
            "create",
            "--tenant",
            tenant,
            "--name",
            "bench-serve",
        ])
        .args(["--store", store_url, "--output", "json"])
        .current_dir(dir)
        .output()
        .await
        .context("running keel keys create")?;
    if !output.status.success() {
        bail!(
            "keel keys create failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let value: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("keel keys create printed no JSON")?;
    value
        .get("key")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .context("keel keys create printed no `key`")
}

/// A `/proc/<pid>/status` figure in KiB (`VmHWM`, `VmRSS`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// User + system CPU time of `pid` so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start with the state (3rd).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks();
    Some(Duration::from_secs_f64(
        utime.saturating_add(stime) as f64 / ticks as f64,
    ))
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux this runs on).
fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The 1-, 5- and 15-minute load averages.
pub fn load_average() -> Option<(f64, f64, f64)> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut parts = text.split_whitespace().map(|p| p.parse::<f64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Logical CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn this_process_is_read_from_proc() {
        let pid = std::process::id();
        // Resident memory first: it may grow between the two reads, the peak never falls.
        let now = status_kib(pid, "VmRSS").unwrap();
        let peak = status_kib(pid, "VmHWM").unwrap();
        assert!(peak >= now && now > 0);
        assert!(cpu_time(pid).is_some());
        assert!(load_average().is_some());
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
    }
}
