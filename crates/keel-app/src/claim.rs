//! Driving a thread outside the queue: `keel run`, `resume`, `approve`, `deny` and `reply`
//! take the same lease a worker takes ([`keel_store::RunQueue::claim`]), so two drivers —
//! two terminals, a terminal and a worker — never drive one thread. A claim is renewed by
//! a [`LeaseKeeper`] while the command runs, every append goes through a [`FencedStore`]
//! (refused once the lease is lost), and it is completed when the command ends.
//!
//! The holder is named for the person who meets it: the command, its process id and
//! start time, the host, and since when (`keel resume (pid 4242 on build-1, since
//! 2026-12-02T01:50:00Z)`). A claim whose process is gone from this machine (it crashed or
//! was killed) is taken over at once instead of after its TTL: its pid no longer exists,
//! or exists with another start time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use keel_core::{CancellationToken, EventStore};
use keel_store::{QueueError, RunQueue};
use tokio_util::task::AbortOnDropHandle;

use crate::error::AppError;
use crate::worker::{FencedStore, LeaseKeeper};

/// The lease a command driving a thread holds, renewed every third of it.
pub const CLAIM_TTL: Duration = Duration::from_secs(30);

/// A command's lease on a thread (see the module docs). Dropping it stops renewing; the
/// lease then expires (or is taken over at once by a command of this machine, which sees
/// that this process is gone).
pub struct ThreadClaim {
    queue: Arc<dyn RunQueue>,
    keeper: Arc<LeaseKeeper>,
    _keeping: AbortOnDropHandle<()>,
    store: Arc<dyn EventStore>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for ThreadClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadClaim")
            .field("lease", &self.keeper.lease())
            .finish_non_exhaustive()
    }
}

impl ThreadClaim {
    /// Claims `thread_id` for `command` (e.g. `keel resume`), or fails with the holder
    /// named when another driver holds the thread or a worker will drive it.
    pub async fn take(
        events: Arc<dyn EventStore>,
        queue: Arc<dyn RunQueue>,
        thread_id: &str,
        command: &str,
    ) -> Result<Self, AppError> {
        let holder = holder_name(command);
        let sent = Instant::now();
        let lease = match queue.claim(thread_id, &holder, CLAIM_TTL, None).await {
            Err(QueueError::Held {
                holder: Some(other),
                ..
            }) if holder_is_gone(&other) => {
                queue
                    .claim(thread_id, &holder, CLAIM_TTL, Some(&other))
                    .await
            }
            other => other,
        }
        .map_err(|error| match error {
            QueueError::Held { message, .. } => AppError::Invalid(message),
            other => AppError::Invalid(format!(
                "cannot take the lease of thread {thread_id}: {other}"
            )),
        })?;
        let cancel = CancellationToken::new();
        let keeper = Arc::new(LeaseKeeper::new(
            queue.clone(),
            lease,
            CLAIM_TTL,
            sent,
            cancel.clone(),
        ));
        let keeping = AbortOnDropHandle::new(tokio::spawn(keeper.clone().keep()));
        let store: Arc<dyn EventStore> = Arc::new(FencedStore::new(events, keeper.clone()));
        Ok(Self {
            queue,
            keeper,
            _keeping: keeping,
            store,
            cancel,
        })
    }

    /// The event store to drive the thread through: appends are refused once the lease is
    /// lost.
    pub fn store(&self) -> Arc<dyn EventStore> {
        self.store.clone()
    }

    /// Cancelled when the lease is lost (the run should stop).
    pub fn cancelled_on_loss(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Ends the claim: the thread is free for the next driver (or its next queued job).
    pub async fn release(self) {
        // A lease already lost needs no completing; nothing else can be done about it.
        let _ = self.queue.complete(&self.keeper.lease()).await;
    }
}

/// `command (pid P started S on HOST, since TIME)`: everything needed to tell who holds a
/// thread, and — on this machine — whether that process still exists.
fn holder_name(command: &str) -> String {
    let pid = std::process::id();
    let started = process_start(pid).unwrap_or_default();
    format!(
        "{command} (pid {pid} started {started} on {}, since {})",
        host_name(),
        chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
    )
}

/// Whether `holder` names a process of this machine that no longer exists (the pid is
/// gone, or now belongs to a process started at another time).
fn holder_is_gone(holder: &str) -> bool {
    let Some(rest) = holder.split(" (pid ").nth(1) else {
        return false;
    };
    let mut words = rest.split(' ');
    let (Some(pid), Some("started"), Some(started), Some("on"), Some(host)) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) else {
        return false;
    };
    let host = host.trim_end_matches(',');
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if host != host_name() || started.is_empty() {
        return false;
    }
    process_start(pid).is_none_or(|now| now != started)
}

/// This machine's name (Linux: the kernel's hostname), or `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty() && !name.contains(char::is_whitespace))
        .unwrap_or_else(|| "localhost".into())
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22), `None`
/// when no such process exists (or the platform has no `/proc`).
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = stat.rsplit_once(')')?.1;
    after_name.split_whitespace().nth(19).map(str::to_string)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn this_process_is_alive_and_a_vanished_one_is_gone() {
        let me = holder_name("keel resume");
        assert!(me.starts_with("keel resume (pid "), "{me}");
        assert!(!holder_is_gone(&me), "{me}");
        // A pid that cannot exist (above the kernel's maximum).
        let gone = me.replacen(&format!("pid {}", std::process::id()), "pid 4294967290", 1);
        assert!(holder_is_gone(&gone), "{gone}");
        // Another machine's process is never judged from here.
        let elsewhere = gone.replacen(&format!(" on {}", host_name()), " on some-other-host", 1);
        assert!(!holder_is_gone(&elsewhere), "{elsewhere}");
        // A worker id is not a claim holder this code can judge.
        assert!(!holder_is_gone("worker-7"));
    }
}
