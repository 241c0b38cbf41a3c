//! [`MemoryRunQueue`]: the run queue in one process's memory (tests, `memory:` stores).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{
    JobId, JobInfo, JobState, Lease, QueueCounts, QueueError, RunQueue, check_worker, ttl_ns,
};

#[derive(Debug)]
struct Job {
    thread_id: String,
    payload: Value,
    state: JobState,
    rerun: bool,
    worker_id: Option<String>,
    token: u64,
    expires_at: Option<DateTime<Utc>>,
    attempts: u32,
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
        if thread_id.is_empty() {
            return Err(QueueError::InvalidArgument(
                "thread_id must not be empty".into(),
            ));
        }
        let mut inner = self.lock();
        if let Some((id, job)) = inner
            .jobs
            .iter_mut()
            .find(|(_, job)| job.thread_id == thread_id && job.state != JobState::Done)
        {
            job.payload = payload.clone();
            job.rerun = job.state == JobState::Leased;
            return Ok(*id);
        }
        inner.next_id += 1;
        let id = inner.next_id;
        inner.jobs.insert(
            id,
            Job {
                thread_id: thread_id.to_string(),
                payload: payload.clone(),
                state: JobState::Queued,
                rerun: false,
                worker_id: None,
                token: 0,
                expires_at: None,
                attempts: 0,
            },
        );
        Ok(id)
    }

    async fn acquire(&self, worker_id: &str, ttl: Duration) -> Result<Option<Lease>, QueueError> {
        check_worker(worker_id)?;
        let expires_at = expiry(ttl)?;
        let now = Utc::now();
        let mut inner = self.lock();
        let ready = inner.jobs.iter_mut().find(|(_, job)| {
            job.state == JobState::Queued
                || (job.state == JobState::Leased && job.expires_at.is_none_or(|at| at <= now))
        });
        Ok(ready.map(|(id, job)| {
            job.state = JobState::Leased;
            job.worker_id = Some(worker_id.to_string());
            job.token += 1;
            job.expires_at = Some(expires_at);
            job.attempts += 1;
            Lease {
                job_id: *id,
                thread_id: job.thread_id.clone(),
                payload: job.payload.clone(),
                worker_id: worker_id.to_string(),
                token: job.token,
                expires_at,
                attempts: job.attempts,
            }
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
        let mut inner = self.lock();
        let job = held(&mut inner, lease)?;
        job.state = if job.rerun {
            JobState::Queued
        } else {
            JobState::Done
        };
        job.rerun = false;
        job.expires_at = None;
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<(), QueueError> {
        let mut inner = self.lock();
        let job = held(&mut inner, lease)?;
        job.state = JobState::Queued;
        job.rerun = false;
        job.expires_at = None;
        Ok(())
    }

    async fn job(&self, job_id: JobId) -> Result<Option<JobInfo>, QueueError> {
        Ok(self.lock().jobs.get(&job_id).map(|job| JobInfo {
            job_id,
            thread_id: job.thread_id.clone(),
            state: job.state,
            worker_id: job.worker_id.clone(),
            token: job.token,
            attempts: job.attempts,
        }))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let mut counts = QueueCounts::default();
        for job in self.lock().jobs.values() {
            match job.state {
                JobState::Queued => counts.queued += 1,
                JobState::Leased => counts.leased += 1,
                JobState::Done => counts.done += 1,
            }
        }
        Ok(counts)
    }
}
