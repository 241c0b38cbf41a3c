//! What the soak measures about this process: resident memory (`VmRSS` in
//! `/proc/self/status`), open file descriptors (entries of `/proc/self/fd`) and the tokio
//! runtime's live tasks (`RuntimeMetrics::num_alive_tasks`, a stable tokio API). Linux
//! only; read directly because each is one line of `/proc` (no crate needed).

use std::time::Duration;

use tokio::time::Instant;

/// Resident set size in KiB, from `/proc/self/status`.
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// Open file descriptors of this process (the directory handle used to count them is not
/// counted).
pub fn open_fds() -> Option<usize> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(entries.count().saturating_sub(1))
}

/// Tasks alive in the current tokio runtime (0 outside one).
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::try_current()
        .map(|handle| handle.metrics().num_alive_tasks())
        .unwrap_or(0)
}

/// One reading of the three figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// Live tokio tasks.
    pub tasks: usize,
    /// Open file descriptors.
    pub fds: usize,
}

/// Reads the three figures now.
pub fn sample() -> Sample {
    Sample {
        rss_kib: rss_kib().unwrap_or(0),
        tasks: alive_tasks(),
        fds: open_fds().unwrap_or(0),
    }
}

/// Polls in a row that must see the same task count before a sample counts as settled.
const STABLE_POLLS: u32 = 10;

/// Waits until at most `fds` descriptors are open and the number of live tasks has stopped
/// changing (the same over ten polls 20 ms apart) — connections closed by dropped clients,
/// and servers just started, take a moment to wind down or spin up — or until `deadline`
/// passes, then samples. Waiting on the condition, with a generous deadline, keeps the
/// verdict independent of machine speed.
pub async fn settle(fds: usize, deadline: Duration) -> Sample {
    let end = Instant::now() + deadline;
    let mut last = sample();
    let mut same = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = sample();
        same = if now.tasks == last.tasks { same + 1 } else { 0 };
        last = now;
        if (now.fds <= fds && same >= STABLE_POLLS) || Instant::now() >= end {
            return now;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn figures_are_read_and_a_file_is_counted() {
        let before = open_fds().unwrap();
        let file = tempfile::tempfile().unwrap();
        assert_eq!(open_fds().unwrap(), before + 1);
        drop(file);
        assert!(rss_kib().unwrap() > 0);
        let handle = tokio::spawn(std::future::pending::<()>());
        assert!(alive_tasks() >= 1);
        handle.abort();
        let settled = settle(before, Duration::from_secs(10)).await;
        assert_eq!(settled.tasks, 0);
        assert_eq!(settled.fds, before);
    }
}
