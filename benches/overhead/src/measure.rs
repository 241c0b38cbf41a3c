//! Process measurements: CPU time (user + system) and peak RSS from `getrusage` of the
//! calling process, and the current RSS from `/proc/self/status`.

use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeValLike;

/// A snapshot of the process's resource usage.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// User plus system CPU time, in microseconds.
    pub cpu_us: i64,
    /// Peak resident set size so far (`ru_maxrss`), in KiB.
    pub max_rss_kib: i64,
}

/// The calling process's usage now.
pub fn usage() -> anyhow::Result<Usage> {
    let usage = getrusage(UsageWho::RUSAGE_SELF)
        .map_err(|e| anyhow::anyhow!("getrusage(RUSAGE_SELF) failed: {e}"))?;
    Ok(Usage {
        cpu_us: usage.user_time().num_microseconds() + usage.system_time().num_microseconds(),
        max_rss_kib: usage.max_rss(),
    })
}

/// The current resident set size (`VmRSS`) in KiB, if `/proc` has it.
pub fn current_rss_kib() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// The median of `values` (the mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => sorted.get(mid).copied(),
        _ => Some((sorted.get(mid - 1)? + sorted.get(mid)?) / 2.0),
    }
}
