//! The child process of a stdio MCP server: its process group and its stderr.
//!
//! A server is spawned as the leader of its own process group (unix), so stopping it stops
//! everything it started — `npx` and `uvx` launch the real server as a grandchild, which a
//! plain kill of the child would orphan. [`ProcessGroup`] signals the whole group.
//!
//! Its stderr is drained until end of file in lines of at most [`MAX_STDERR_LINE_BYTES`]
//! ([`read_bounded_lines`]), so a server printing an endless line cannot exhaust memory,
//! and forwarded to the log at a bounded rate ([`LogBudget`]).

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Longest stderr line kept; the rest of a longer line is dropped and counted.
pub(crate) const MAX_STDERR_LINE_BYTES: usize = 2048;
/// Most stderr lines written to the log per [`STDERR_LOG_WINDOW`]; the others are counted
/// and reported as one line when the window ends.
const STDERR_LOG_LINES_PER_WINDOW: u32 = 50;
/// The window of [`STDERR_LOG_LINES_PER_WINDOW`].
const STDERR_LOG_WINDOW: Duration = Duration::from_secs(1);
/// How often [`ProcessGroup::terminate`] looks whether the group has exited.
#[cfg(unix)]
const GROUP_POLL: Duration = Duration::from_millis(50);

/// The process group led by a stdio server (a no-op where process groups do not exist).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcessGroup {
    #[cfg(unix)]
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    /// The group whose leader (and id) is the process `pid`, spawned with
    /// `ProcessGroup::leader()`.
    pub(crate) fn led_by(pid: Option<u32>) -> Self {
        #[cfg(unix)]
        {
            let pgid = pid
                .and_then(|pid| i32::try_from(pid).ok())
                .filter(|pid| *pid > 1)
                .map(nix::unistd::Pid::from_raw);
            Self { pgid }
        }
        #[cfg(not(unix))]
        {
            let _ = pid;
            Self {}
        }
    }

    /// Sends SIGKILL to every process of the group. A group that no longer exists is fine.
    pub(crate) fn kill(&self) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Asks every process of the group to exit (SIGTERM), waits up to `grace` for the group
    /// to be gone, then kills what is left (SIGKILL).
    pub(crate) async fn terminate(&self, grace: Duration) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid {
            use nix::sys::signal::{Signal, killpg};
            if killpg(pgid, Signal::SIGTERM).is_err() {
                return; // No such group any more.
            }
            let deadline = tokio::time::Instant::now() + grace;
            // `killpg(pgid, None)` fails once no process of the group exists.
            while killpg(pgid, None).is_ok() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(GROUP_POLL).await;
            }
            self.kill();
        }
        #[cfg(not(unix))]
        let _ = grace;
    }
}

/// Reads `reader` to its end, calling `on_line` with each line (lossy UTF-8, without the
/// line break). A line longer than `max_line_bytes` keeps its first `max_line_bytes` bytes
/// and ends with a note of how many bytes were dropped. Stops at end of file or on a read
/// error.
///
/// Hand-written rather than `tokio_util::codec::LinesCodec::new_with_max_length` because
/// that codec drops an over-long line entirely and fails on invalid UTF-8, and a stderr
/// reader must keep draining the pipe whatever the server prints (a full pipe blocks the
/// server).
pub(crate) async fn read_bounded_lines<R: AsyncRead + Unpin>(
    reader: R,
    max_line_bytes: usize,
    mut on_line: impl FnMut(String),
) {
    let mut reader = BufReader::new(reader);
    let mut line: Vec<u8> = Vec::new();
    let mut dropped: usize = 0;
    while let Ok(buf) = reader.fill_buf().await {
        if buf.is_empty() {
            break;
        }
        let newline = buf.iter().position(|&byte| byte == b'\n');
        let chunk = match newline {
            Some(end) => buf.get(..end).unwrap_or_default(),
            None => buf,
        };
        let take = max_line_bytes.saturating_sub(line.len()).min(chunk.len());
        line.extend_from_slice(chunk.get(..take).unwrap_or_default());
        dropped = dropped.saturating_add(chunk.len() - take);
        let consumed = chunk.len() + usize::from(newline.is_some());
        reader.consume(consumed);
        if newline.is_some() {
            on_line(finish_line(&line, dropped));
            line.clear();
            dropped = 0;
        }
    }
    if !line.is_empty() || dropped > 0 {
        on_line(finish_line(&line, dropped));
    }
}

fn finish_line(line: &[u8], dropped: usize) -> String {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches('\r');
    if dropped == 0 {
        text.to_string()
    } else {
        format!("{text} [stderr line truncated: {dropped} more bytes]")
    }
}

/// What [`LogBudget::admit`] says about one line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Log it; `suppressed_before` lines of the previous window were not logged.
    Log { suppressed_before: u64 },
    /// Do not log it (counted).
    Suppress,
}

/// A fixed-window rate limit for forwarding stderr lines to the log.
#[derive(Debug)]
pub(crate) struct LogBudget {
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            logged: 0,
            suppressed: 0,
        }
    }

    /// Whether the line arriving at `now` may be logged.
    pub(crate) fn admit(&mut self, now: Instant) -> Admission {
        let mut suppressed_before = 0;
        if now.saturating_duration_since(self.window_start) >= STDERR_LOG_WINDOW {
            suppressed_before = std::mem::take(&mut self.suppressed);
            self.window_start = now;
            self.logged = 0;
        }
        if self.logged < STDERR_LOG_LINES_PER_WINDOW {
            self.logged += 1;
            Admission::Log { suppressed_before }
        } else {
            self.suppressed = self.suppressed.saturating_add(1);
            Admission::Suppress
        }
    }

    /// Lines suppressed in the current window (to report at end of file).
    pub(crate) fn pending(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: Vec<u8>, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        read_bounded_lines(&input[..], max, |line| out.push(line)).await;
        out
    }

    #[tokio::test]
    async fn long_lines_are_cut_and_reading_continues() {
        let mut input = vec![b'x'; 5_000_000];
        input.extend_from_slice(b"\nshort\r\n\xff\xfebad utf8\nno newline at end");
        let lines = lines_of(input, 16).await;
        assert_eq!(
            lines,
            [
                "xxxxxxxxxxxxxxxx [stderr line truncated: 4999984 more bytes]",
                "short",
                "\u{fffd}\u{fffd}bad utf8",
                "no newline at en [stderr line truncated: 1 more bytes]",
            ]
        );
    }

    #[tokio::test]
    async fn empty_input_gives_no_lines() {
        assert!(lines_of(Vec::new(), 8).await.is_empty());
        assert_eq!(lines_of(b"\n".to_vec(), 8).await, [""]);
    }

    #[test]
    fn log_budget_limits_lines_per_window_and_reports_the_rest() {
        let start = Instant::now();
        let mut budget = LogBudget::new(start);
        for _ in 0..STDERR_LOG_LINES_PER_WINDOW {
            assert_eq!(
                budget.admit(start),
                Admission::Log {
                    suppressed_before: 0
                }
            );
        }
        for _ in 0..7 {
            assert_eq!(budget.admit(start), Admission::Suppress);
        }
        assert_eq!(budget.pending(), 7);
        assert_eq!(
            budget.admit(start + STDERR_LOG_WINDOW),
            Admission::Log {
                suppressed_before: 7
            }
        );
        assert_eq!(budget.pending(), 0);
    }
}
