//! `/metrics`: the server's counters in the Prometheus text format (no tenant labels, so
//! any tenant's key may read them): requests by route, method and status; runs queued;
//! limit refusals; open streams; and, read at scrape time, the run queue's counts and the
//! runs this process drives.

use keel_store::QueueCounts;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    /// Runs queued (chat, reply, approvals and cancels that continue a run).
    pub runs_queued: AtomicU64,
    /// Requests refused by a limit.
    pub limited: AtomicU64,
    /// Requests refused for a missing, unknown or revoked key.
    pub unauthorized: AtomicU64,
    /// Event streams open now.
    pub streams_open: AtomicI64,
}

impl Metrics {
    fn requests(&self) -> MutexGuard<'_, BTreeMap<(String, String, u16), u64>> {
        match self.requests.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Counts one request.
    pub fn request(&self, route: &str, method: &str, status: u16) {
        *self
            .requests()
            .entry((route.to_string(), method.to_string(), status))
            .or_default() += 1;
    }

    /// The text exposition, with the gauges read at scrape time.
    pub fn render(&self, queue: Option<QueueCounts>, running_here: usize) -> String {
        let mut out = String::new();
        out.push_str("# HELP keel_server_requests_total HTTP requests served.\n");
        out.push_str("# TYPE keel_server_requests_total counter\n");
        for ((route, method, status), count) in self.requests().iter() {
            let _ = writeln!(
                out,
                "keel_server_requests_total{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {count}",
                escape(route),
                escape(method)
            );
        }
        for (name, help, value) in [
            (
                "keel_server_runs_queued_total",
                "Runs queued by the server.",
                self.runs_queued.load(Ordering::Relaxed),
            ),
            (
                "keel_server_limited_total",
                "Requests refused with 429 by a per-tenant limit.",
                self.limited.load(Ordering::Relaxed),
            ),
            (
                "keel_server_unauthorized_total",
                "Requests refused with 401.",
                self.unauthorized.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP keel_server_streams_open Event streams open.\n# TYPE keel_server_streams_open gauge\nkeel_server_streams_open {}",
            self.streams_open.load(Ordering::Relaxed).max(0)
        );
        let _ = writeln!(
            out,
            "# HELP keel_server_runs_driving Runs driven by this process's workers now.\n# TYPE keel_server_runs_driving gauge\nkeel_server_runs_driving {running_here}"
        );
        if let Some(counts) = queue {
            out.push_str(
                "# HELP keel_queue_jobs Jobs of the run queue by state.\n# TYPE keel_queue_jobs gauge\n",
            );
            for (state, n) in [
                ("queued", counts.queued),
                ("leased", counts.leased),
                ("failed", counts.failed),
                ("dead", counts.dead),
                ("cancelled", counts.cancelled),
            ] {
                let _ = writeln!(out, "keel_queue_jobs{{state=\"{state}\"}} {n}");
            }
        }
        out
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
