//! Helpers shared by the CLI's integration tests: seeded randomness, running a child with
//! a deadline or killing it at a chosen moment, and `keel mock-llm` as a child process.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace root (examples and agent files are found relative to it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Runs `command` to completion like `Command::output`, but never longer than `deadline`:
/// a child still running then is killed and the test fails with what it printed so far.
/// The deadline is a hang detector, generous enough for a machine whose cores are busy.
pub fn output_within(command: &mut Command, deadline: Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Both pipes are drained while the child runs, so it never blocks on a full pipe.
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not finish within {deadline:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.join().unwrap()),
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// xorshift64*: a tiny seeded generator so kill times are reproducible.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Spawns a command and SIGKILLs it after `after`; returns whether it was killed before it
/// exited on its own.
pub fn run_and_kill(mut command: Command, after: Duration) -> bool {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_after(child, after)
}

/// Like [`run_and_kill`], but the child's stderr goes to the file `stderr_log`, so what it
/// reported before the kill (e.g. `keel run`'s live tool lines, printed only after the
/// event is appended) can be read afterwards.
pub fn run_and_kill_logged(mut command: Command, after: Duration, stderr_log: &Path) -> bool {
    let log = std::fs::File::create(stderr_log).unwrap();
    let child = command.stdout(Stdio::null()).stderr(log).spawn().unwrap();
    kill_after(child, after)
}

/// SIGKILLs `child` once `after` has passed since now, unless it exits first; returns
/// whether it was killed.
fn kill_after(mut child: Child, after: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < after {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    true
}

/// A serving `keel` subcommand (`detective serve --port 0`, `mock-llm --port 0`) as a child
/// process, its URL read from the first line it prints; killed when dropped.
pub struct KeelServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    // Kept open: a server logging to a closed pipe would die.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for KeelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl KeelServer {
    /// Starts `keel ARGS` in `cwd` and waits for its banner.
    pub fn start(args: &[&str], cwd: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(args)
            .current_dir(cwd)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let url = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "banner: {line:?}");
        Self {
            child,
            url,
            _stdout: stdout,
        }
    }
}

/// `keel mock-llm` running as a child process; killed when dropped.
pub struct MockLlm {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MockLlm {
    /// Starts `keel mock-llm --script SCRIPT --port 0` in `dir` and waits for its banner.
    pub fn start(dir: &Path, script: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["mock-llm", "--script", script, "--port", "0"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let base_url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|url| url.starts_with("http://127.0.0.1:"))
            .unwrap_or_else(|| panic!("unexpected mock-llm banner: {line:?}"))
            .to_string();
        Self { child, base_url }
    }
}

/// Asserts that no mutating `test_append` call (`KEEL_TEST_TOOLS=1`) ran more than once:
/// each line of the tool's log starts with the call's idempotency key.
pub fn check_appends(root: &Path) {
    let log = std::fs::read_to_string(root.join("appends.log")).unwrap_or_default();
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for line in log.lines() {
        *seen.entry(line.split('\t').next().unwrap()).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "mutating calls executed more than once: {twice:?}"
    );
}
