//! [`MemoryRunQueue`]: the run queue in one process's memory (tests, `memory:` stores).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{
    Holding, JobId, JobInfo, JobState, Lease, QueueCounts, QueueError, RunQueue, capped_error,
    check_claim, check_worker, claim_payload, delay_ns, ttl_ns,
};

#[derive(Debug)]
struct Job {
    thread_id: String,
    payload: Value,
    state: JobState,
    worker_id: Option<String>,
    token: u64,
    expires_at: Option<DateTime<Utc>>,
    ready_at: Option<DateTime<Utc>>,
    attempts: u32,
    error: Option<String>,
    /// A continuation ([`RunQueue::enqueue_continuation`]).
    continuation: bool,
}

impl Job {
    fn active(&self) -> bool {
        matches!(self.state, JobState::Queued | JobState::Leased)
    }

    fn ready(&self, now: DateTime<Utc>) -> bool {
        match self.state {
            JobState::Queued => self.ready_at.is_none_or(|at| at <= now),
            JobState::Leased => self.expires_at.is_none_or(|at| at <= now),
            JobState::Done | JobState::Failed | JobState::Dead | JobState::Cancelled => false,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: JobId,
    jobs: BTreeMap<JobId, Job>,
}

/// A [`RunQueue`] in memory.
#[derive(Debug, Default)]
pub struct MemoryRunQueue {
    inner: Mutex<Inner>,
}

impl MemoryRunQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Moves a held job to `state` (ready again after `ready_in` when queued; with
    /// `uncount`, this acquisition is not counted as an attempt).
    fn finish(
        &self,
        lease: &Lease,
        state: JobState,
        ready_in: Option<Duration>,
        error: Option<&str>,
        uncount: bool,
    ) -> Result<(), QueueError> {
        let mut inner = self.lock();
        let job = held(&mut inner, lease)?;
        if uncount {
            job.attempts = job.attempts.saturating_sub(1);
        }
        job.state = state;
        job.expires_at = None;
        job.ready_at =
            ready_in.map(|delay| Utc::now() + chrono::Duration::nanoseconds(delay_ns(delay)));
        job.error = error.map(capped_error);
        Ok(())
    }
}

impl MemoryRunQueue {
    fn insert(
        &self,
        thread_id: &str,
        payload: &Value,
        continuation: bool,
    ) -> Result<JobId, QueueError> {
        if thread_id.is_empty() {
            return Err(QueueError::InvalidArgument(
                "thread_id must not be empty".into(),
            ));
        }
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.jobs.insert(
            id,
            Job {
                thread_id: thread_id.to_string(),
                payload: payload.clone(),
                state: JobState::Queued,
                worker_id: None,
                token: 0,
                expires_at: None,
                ready_at: None,
                attempts: 0,
                error: None,
                continuation,
            },
        );
        Ok(id)
    }
}

fn expiry(ttl: Duration) -> Result<DateTime<Utc>, QueueError> {
    let ns = ttl_ns(ttl)?;
    Ok(Utc::now() + chrono::Duration::nanoseconds(ns))
}

fn held<'a>(inner: &'a mut Inner, lease: &Lease) -> Result<&'a mut Job, QueueError> {
    let now = Utc::now();
    inner
        .jobs
        .get_mut(&lease.job_id)
        .filter(|job| {
            job.state == JobState::Leased
                && job.token == lease.token
                && job.expires_at.is_some_and(|at| at > now)
        })
        .ok_or(QueueError::LeaseLost {
            job_id: lease.job_id,
            token: lease.token,
        })
}

#[async_trait]
impl RunQueue for MemoryRunQueue {
    async fn enqueue(&self, thread_id: &str, payload: &Value) -> Result<JobId, QueueError> {
        self.insert(thread_id, payload, false)
    }

    async fn enqueue_continuation(
        &self,
        thread_id: &str,
        payload: &Value,
    ) -> Result<JobId, QueueError> {
        self.insert(thread_id, payload, true)
    }

    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
        check_worker(worker_id)?;
        let expires_at = expiry(ttl)?;
        let now = Utc::now();
        let mut inner = self.lock();
        // Each thread's holder (its leased job) or head (its first continuation, else its
        // oldest job); the oldest of those that is ready goes.
        let mut heads: HashMap<&str, (JobId, &Job)> = HashMap::new();
        for (id, job) in inner.jobs.iter().filter(|(_, job)| job.active()) {
            let head = heads.entry(job.thread_id.as_str()).or_insert((*id, job));
            let holder = head.1.state == JobState::Leased;
            if !holder
                && (job.state == JobState::Leased || (job.continuation && !head.1.continuation))
            {
                *head = (*id, job);
            }
        }
        let chosen = heads
            .values()
            .filter(|(_, job)| job.ready(now))
            .map(|(id, _)| *id)
            .min();
        let Some(id) = chosen else { return Ok(None) };
        let Some(job) = inner.jobs.get_mut(&id) else {
            return Ok(None);
        };
        job.state = JobState::Leased;
        job.worker_id = Some(worker_id.to_string());
        job.token += 1;
        job.expires_at = Some(expires_at);
        job.ready_at = None;
        job.attempts += 1;
        Ok(Some(Lease {
            job_id: id,
            thread_id: job.thread_id.clone(),
            payload: job.payload.clone(),
            worker_id: worker_id.to_string(),
            token: job.token,
            expires_at,
            attempts: job.attempts,
        }))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, QueueError> {
        let expires_at = expiry(ttl)?;
        let mut inner = self.lock();
        let job = held(&mut inner, lease)?;
        job.expires_at = Some(expires_at);
        Ok(Lease {
            expires_at,
            ..lease.clone()
        })
    }

    async fn complete(&self, lease: &Lease) -> Result<(), QueueError> {
        self.finish(lease, JobState::Done, None, None, false)
    }

    async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
        self.finish(lease, JobState::Queued, None, None, false)
    }

    async fn retry_later(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        self.finish(lease, JobState::Queued, Some(delay), None, false)
    }

    async fn snooze(&self, lease: &Lease, delay: Duration) -> Result<(), QueueError> {
        self.finish(lease, JobState::Queued, Some(delay), None, true)
    }

    async fn fail(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        self.finish(lease, JobState::Failed, None, Some(error), false)
    }

    async fn dead_letter(&self, lease: &Lease, error: &str) -> Result<(), QueueError> {
        self.finish(lease, JobState::Dead, None, Some(error), false)
    }

    async fn cancel_queued(&self, job_id: JobId, reason: &str) -> Result<bool, QueueError> {
        let mut inner = self.lock();
        match inner.jobs.get_mut(&job_id) {
            Some(job) if job.state == JobState::Queued => {
                job.state = JobState::Cancelled;
                job.ready_at = None;
                job.error = Some(capped_error(reason));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
        Ok(self.lock().jobs.get(&job_id).map(|job| JobInfo {
            job_id,
            thread_id: job.thread_id.clone(),
            state: job.state,
            worker_id: job.worker_id.clone(),
            token: job.token,
            attempts: job.attempts,
            error: job.error.clone(),
        }))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let mut counts = QueueCounts::default();
        for job in self.lock().jobs.values() {
            counts.add(job.state, 1);
        }
        Ok(counts)
    }

    async fn claim(
        &self,
        thread_id: &str,
        holder: &str,
        ttl: Duration,
        dead_holder: Option<&str>,
    ) -> Result<Lease, QueueError> {
        check_claim(thread_id, holder)?;
        let expires_at = expiry(ttl)?;
        let now = Utc::now();
        let mut inner = self.lock();
        // The thread's leased job, else its head.
        let active = || {
            inner
                .jobs
                .iter()
                .filter(|(_, job)| job.active() && job.thread_id == thread_id)
        };
        let holding = active()
            .find(|(_, job)| job.state == JobState::Leased)
            .or_else(|| active().find(|(_, job)| job.continuation))
            .or_else(|| active().next())
            .map(|(id, job)| Holding {
                job_id: *id,
                state: job.state,
                worker_id: job.worker_id.clone(),
                expired: job.expires_at.is_some_and(|at| at <= now),
                payload: job.payload.clone(),
            });
        let id = match holding {
            Some(holding) if holding.taken_over_by_claim(dead_holder) => holding.job_id,
            Some(holding) => return Err(holding.refusal(thread_id)),
            None => {
                inner.next_id += 1;
                let id = inner.next_id;
                inner.jobs.insert(
                    id,
                    Job {
                        thread_id: thread_id.to_string(),
                        payload: Value::Null,
                        state: JobState::Leased,
                        worker_id: None,
                        token: 0,
                        expires_at: None,
                        ready_at: None,
                        attempts: 0,
                        error: None,
                        continuation: false,
                    },
                );
                id
            }
        };
        let Some(job) = inner.jobs.get_mut(&id) else {
            return Err(QueueError::Backend(format!("claimed job {id} vanished")));
        };
        job.payload = claim_payload(holder);
        job.state = JobState::Leased;
        job.worker_id = Some(holder.to_string());
        job.token += 1;
        job.expires_at = Some(expires_at);
        job.attempts += 1;
        Ok(Lease {
            job_id: id,
            thread_id: thread_id.to_string(),
            payload: job.payload.clone(),
            worker_id: holder.to_string(),
            token: job.token,
            expires_at,
            attempts: job.attempts,
        })
    }
}
