//! The worker API end to end over the in-memory store and queue: jobs submitted, leased,
//! driven with a scripted model, and reported; refused jobs; shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_core::{CancellationToken, Event, EventKind, EventStore, MemoryStore};
use keel_runtime::{Agent, RunContext, Thread, ToolAgent};
use keel_store::{JobState, MemoryRunQueue, RunQueue};
use keel_testkit::{ScriptStep, ScriptedModel};
use serde::{Deserialize, Serialize};

use super::*;

/// A recipe: the one answer the scripted model gives.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Spec {
    reply: String,
    /// The new run's model answers after this many milliseconds (a resumed run's at once).
    #[serde(default)]
    slow_ms: Option<u64>,
    base_url: Option<String>,
    submission: Option<String>,
}

impl JobSpec for Spec {
    fn base_url(&self) -> Option<&str> {
        self.base_url.as_deref()
    }
    fn agent_file(&self) -> Option<&Path> {
        None
    }
    fn submission(&self) -> Option<&str> {
        self.submission.as_deref()
    }
    fn set_submission(&mut self, submission: Option<String>) {
        self.submission = submission;
    }
}

struct Scripted;

#[async_trait]
impl JobAgents for Scripted {
    type Spec = Spec;

    fn recorded(&self, run_events: &[std::sync::Arc<Event>]) -> Result<Option<Spec>, String> {
        let recipe = run_events.iter().find_map(|event| match &event.kind {
            EventKind::RunStarted {
                definition: Some(definition),
                ..
            } => Some(definition.recipe.clone()),
            _ => None,
        });
        recipe
            .map(|recipe| serde_json::from_value(recipe).map_err(|e| e.to_string()))
            .transpose()
    }

    async fn build(
        &self,
        spec: &Spec,
        _thread_id: &str,
        start: JobStart<'_>,
        store: Arc<dyn EventStore>,
        cancel: CancellationToken,
    ) -> Result<(Box<dyn Agent>, RunContext), BuildError> {
        let mut step = ScriptStep::text(&spec.reply);
        if matches!(start, JobStart::New) {
            step.delay_ms = spec.slow_ms;
        }
        let model = Arc::new(ScriptedModel::new(vec![step]));
        let mut agent =
            ToolAgent::builder("scripted", model).recipe(serde_json::to_value(spec).unwrap());
        if spec.slow_ms.is_some() {
            // A slow run is watched from the store while its model call hangs: its start
            // must be written before that call (under the default it would ride with the
            // answer, which never comes).
            agent = agent.durability(keel_core::RunDurability::Steps);
        }
        let agent = agent.build();
        Ok((Box::new(agent), RunContext::new(store).with_cancel(cancel)))
    }
}

/// Builds like [`Scripted`] once its build failed `fails` times with `error`.
struct Flaky {
    fails: std::sync::atomic::AtomicU32,
    error: BuildError,
}

impl Flaky {
    fn new(fails: u32, error: BuildError) -> Self {
        Self {
            fails: std::sync::atomic::AtomicU32::new(fails),
            error,
        }
    }
}

#[async_trait]
impl JobAgents for Flaky {
    type Spec = Spec;

    fn recorded(&self, run_events: &[std::sync::Arc<Event>]) -> Result<Option<Spec>, String> {
        Scripted.recorded(run_events)
    }

    async fn build(
        &self,
        spec: &Spec,
        thread_id: &str,
        start: JobStart<'_>,
        store: Arc<dyn EventStore>,
        cancel: CancellationToken,
    ) -> Result<(Box<dyn Agent>, RunContext), BuildError> {
        let failed = self
            .fails
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if failed {
            return Err(self.error.clone());
        }
        Scripted.build(spec, thread_id, start, store, cancel).await
    }
}

/// One job on a fresh memory store and queue, driven until idle by `agents` with at most
/// `max_attempts` attempts (retries 1 ms apart, doubling): the report, the job, the log.
async fn drive_one<A: JobAgents<Spec = Spec>>(
    agents: A,
    max_attempts: u32,
) -> (WorkerReport, keel_store::JobInfo, String) {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let job = submit(
        events.as_ref(),
        queue.as_ref(),
        None,
        spec("built", None),
        "hi".into(),
    )
    .await
    .unwrap();
    let (lines, log) = collect();
    let options = WorkerOptions {
        max_attempts,
        retry_base: Duration::from_millis(1),
        ..options()
    };
    let worker = Worker::new(events.clone(), queue.clone(), agents, options)
        .unwrap()
        .with_log(log);
    let report = tokio::time::timeout(DEADLINE, worker.run()).await.unwrap();
    let info = queue.job(job.job_id).await.unwrap().unwrap();
    let lines = lines.lock().unwrap().join("\n");
    (report, info, lines)
}

#[tokio::test]
async fn a_transient_build_error_retries_the_job_until_it_runs() {
    let agents = Flaky::new(2, BuildError::Transient("store unreachable".into()));
    let (report, info, lines) = drive_one(agents, 5).await;
    assert_eq!(
        (report.retried, report.completed),
        (2, 1),
        "{report:?} {lines}"
    );
    assert_eq!((info.state, info.attempts), (JobState::Done, 3), "{info:?}");
    assert!(lines.contains("attempt 1 of 5"), "{lines}");
}

#[tokio::test]
async fn a_job_failing_on_every_attempt_is_dead_lettered_with_its_last_error() {
    let agents = Flaky::new(u32::MAX, BuildError::Transient("store unreachable".into()));
    let (report, info, lines) = drive_one(agents, 3).await;
    assert_eq!((report.retried, report.dead), (2, 1), "{report:?} {lines}");
    assert_eq!((info.state, info.attempts), (JobState::Dead, 3), "{info:?}");
    let error = info.error.unwrap();
    assert!(error.contains("store unreachable"), "{error}");
    assert!(error.contains("attempt 3 of 3"), "{error}");
}

#[tokio::test]
async fn a_permanent_build_error_fails_the_job_at_once_with_its_message() {
    let agents = Flaky::new(
        u32::MAX,
        BuildError::Permanent("agent `ghost` is neither an [agents.<name>] entry".into()),
    );
    let (report, info, lines) = drive_one(agents, 5).await;
    assert_eq!(
        (report.failed, report.retried),
        (1, 0),
        "{report:?} {lines}"
    );
    assert_eq!(
        (info.state, info.attempts),
        (JobState::Failed, 1),
        "{info:?}"
    );
    assert!(info.error.unwrap().contains("agent `ghost`"));
}

#[test]
fn retries_back_off_exponentially_up_to_a_cap() {
    let base = Duration::from_secs(1);
    let delays: Vec<u64> = (1..=12).map(|a| retry_delay(base, a).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
    assert_eq!(retry_delay(base, u32::MAX), MAX_RETRY_DELAY);
    assert_eq!(retry_delay(base, 0), base);
}

fn spec(reply: &str, base_url: Option<&str>) -> Spec {
    Spec {
        reply: reply.into(),
        slow_ms: None,
        base_url: base_url.map(str::to_string),
        submission: None,
    }
}

fn options() -> WorkerOptions {
    WorkerOptions {
        worker_id: "w1".into(),
        poll: Duration::from_millis(1),
        exit_when_idle: true,
        ..WorkerOptions::default()
    }
}

type Lines = Arc<Mutex<Vec<String>>>;

fn collect() -> (Lines, WorkerLog) {
    let lines: Lines = Arc::default();
    let sink = lines.clone();
    let log: WorkerLog = Arc::new(move |line: &str| sink.lock().unwrap().push(line.into()));
    (lines, log)
}

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn drives_the_jobs_of_a_thread_in_order_until_idle() {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let first = submit(
        events.as_ref(),
        queue.as_ref(),
        None,
        spec("one", None),
        "first".into(),
    )
    .await
    .unwrap();
    assert!(!first.run_in_progress);
    let second = submit(
        events.as_ref(),
        queue.as_ref(),
        Some(first.thread_id.clone()),
        spec("two", None),
        "second".into(),
    )
    .await
    .unwrap();
    assert_eq!(second.thread_id, first.thread_id);
    let (lines, log) = collect();
    let worker = Worker::new(events.clone(), queue.clone(), Scripted, options())
        .unwrap()
        .with_log(log);
    assert_eq!(worker.worker_id(), "w1");
    let report = tokio::time::timeout(DEADLINE, worker.run()).await.unwrap();
    assert_eq!(
        report,
        WorkerReport {
            completed: 2,
            ..WorkerReport::default()
        }
    );
    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l.ends_with("ended done")), "{lines:?}");
    let thread = Thread::load(events.as_ref(), &first.thread_id)
        .await
        .unwrap();
    let texts: Vec<String> = thread
        .state()
        .messages()
        .iter()
        .map(|m| format!("{:?}", m.parts))
        .collect();
    let joined = texts.join("|");
    let order: Vec<usize> = ["first", "one", "second", "two"]
        .iter()
        .map(|word| joined.find(word).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{joined}");
    for job in [first.job_id, second.job_id] {
        assert_eq!(queue.job(job).await.unwrap().unwrap().state, JobState::Done);
    }
}

#[tokio::test]
async fn a_base_url_the_policy_refuses_fails_the_job_before_any_run() {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let job = submit(
        events.as_ref(),
        queue.as_ref(),
        None,
        spec("never", Some("https://user:pw@evil.example/v1")),
        "hi".into(),
    )
    .await
    .unwrap();
    let (lines, log) = collect();
    let worker = Worker::new(events.clone(), queue.clone(), Scripted, options())
        .unwrap()
        .with_log(log);
    let report = tokio::time::timeout(DEADLINE, worker.run()).await.unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    let info = queue.job(job.job_id).await.unwrap().unwrap();
    assert_eq!(info.state, JobState::Failed);
    let line = lines.lock().unwrap().join("\n");
    assert!(line.contains("--allow-base-url"), "{line}");
    assert!(!line.contains("pw"), "{line}");
    assert!(events.load(&job.thread_id).await.unwrap().is_empty());
}

#[tokio::test]
async fn shutdown_stops_a_waiting_worker() {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        events,
        queue,
        Scripted,
        WorkerOptions {
            exit_when_idle: false,
            poll: Duration::from_secs(3600),
            concurrency: 3,
            ..options()
        },
    )
    .unwrap()
    .with_shutdown(shutdown.clone());
    let running = tokio::spawn(worker.run());
    shutdown.cancel();
    let report = tokio::time::timeout(DEADLINE, running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report, WorkerReport::default());
}

#[test]
fn options_out_of_range_are_refused() {
    let worker = |options: WorkerOptions| {
        let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
        let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
        Worker::new(events, queue, Scripted, options)
    };
    for options in [
        WorkerOptions {
            lease_ttl: Duration::from_millis(100),
            ..options()
        },
        // A third of 1.5 s does not outlast the tool's cancel grace with room to spare.
        WorkerOptions {
            lease_ttl: Duration::from_millis(1_500),
            ..options()
        },
        WorkerOptions {
            lease_ttl: Duration::from_secs(86_401),
            ..options()
        },
        WorkerOptions {
            concurrency: 0,
            ..options()
        },
        WorkerOptions {
            max_attempts: 0,
            ..options()
        },
    ] {
        let error = worker(options).unwrap_err();
        assert_eq!(error.code(), "invalid", "{error}");
    }
    let error = worker(WorkerOptions {
        lease_ttl: Duration::from_millis(300),
        ..options()
    })
    .unwrap_err();
    assert!(
        error.to_string().contains("[2 s, 24 h]") && error.to_string().contains("500 ms"),
        "the minimum and the reason are named: {error}"
    );
    worker(WorkerOptions {
        lease_ttl: MIN_LEASE_TTL,
        ..options()
    })
    .unwrap();
}

/// With a shutdown grace, a run still going when it passes is interrupted without an end
/// event and its job released at once (not left to the lease's expiry): the next worker
/// resumes the same run, which then ends exactly once.
#[tokio::test]
async fn shutdown_grace_interrupts_the_run_and_releases_its_job() {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let slow = Spec {
        slow_ms: Some(3_600_000),
        ..spec("finally", None)
    };
    let job = submit(events.as_ref(), queue.as_ref(), None, slow, "go".into())
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let (lines, log) = collect();
    let worker = Worker::new(
        events.clone(),
        queue.clone(),
        Scripted,
        WorkerOptions {
            exit_when_idle: false,
            // Far longer than the test: only a release gives the job back in time.
            lease_ttl: Duration::from_secs(3600),
            ..options()
        },
    )
    .unwrap()
    .with_log(log)
    .with_shutdown(shutdown.clone())
    .with_shutdown_grace(Duration::from_millis(20));
    let running = tokio::spawn(worker.run());
    // Wait until the run is in progress (its model call hangs).
    tokio::time::timeout(DEADLINE, async {
        loop {
            let thread = Thread::load(events.as_ref(), &job.thread_id).await.unwrap();
            if thread.state().run_in_progress() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    shutdown.cancel();
    let report = tokio::time::timeout(DEADLINE, running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        report,
        WorkerReport {
            released: 1,
            ..WorkerReport::default()
        }
    );
    let line = lines.lock().unwrap().join("\n");
    assert!(line.contains("released to the queue"), "{line}");
    assert_eq!(
        queue.job(job.job_id).await.unwrap().unwrap().state,
        JobState::Queued
    );
    let before = events.load(&job.thread_id).await.unwrap();
    assert!(
        !before
            .iter()
            .any(|e| matches!(e.kind, EventKind::RunEnded { .. })),
        "an interrupted run writes no end: {before:?}"
    );

    // Another worker continues the same run; it ends once.
    let (lines, log) = collect();
    let next = Worker::new(events.clone(), queue.clone(), Scripted, options())
        .unwrap()
        .with_log(log);
    let report = tokio::time::timeout(DEADLINE, next.run()).await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    let line = lines.lock().unwrap().join("\n");
    assert!(
        line.contains("ended done (resumed an interrupted run)"),
        "{line}"
    );
    let after = events.load(&job.thread_id).await.unwrap();
    for (i, event) in after.iter().enumerate() {
        assert_eq!(event.seq, i as u64);
    }
    let starts = after
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunStarted { .. }))
        .count();
    let ends = after
        .iter()
        .filter(|e| matches!(e.kind, EventKind::RunEnded { .. }))
        .count();
    assert_eq!((starts, ends), (1, 1));
}

/// Dropping a worker's future (a stopped worker, an aborted server task) stops renewing
/// the leases of its jobs: the keeper is a guard of the job it renews, not a task of its
/// own. Then the lease expires and another worker takes the job over and finishes it.
#[tokio::test]
async fn a_dropped_worker_stops_renewing_and_its_job_is_taken_over() {
    let events: Arc<dyn EventStore> = Arc::new(MemoryStore::new());
    let queue: Arc<dyn RunQueue> = Arc::new(MemoryRunQueue::default());
    let slow = Spec {
        slow_ms: Some(3_600_000),
        ..spec("finally", None)
    };
    let job = submit(events.as_ref(), queue.as_ref(), None, slow, "go".into())
        .await
        .unwrap();
    let first = Worker::new(
        events.clone(),
        queue.clone(),
        Scripted,
        WorkerOptions {
            exit_when_idle: false,
            lease_ttl: MIN_LEASE_TTL,
            ..options()
        },
    )
    .unwrap();
    let running = tokio::spawn(first.run());
    tokio::time::timeout(DEADLINE, async {
        loop {
            let thread = Thread::load(events.as_ref(), &job.thread_id).await.unwrap();
            if thread.state().run_in_progress() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());

    // Another worker gets the job once the lease has expired (a keeper still renewing it
    // would keep it away forever) and finishes the same run. Each pass exits when nothing
    // is ready.
    let (lines, log) = collect();
    let taken_over = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let next = Worker::new(
                events.clone(),
                queue.clone(),
                Scripted,
                WorkerOptions {
                    worker_id: "w2".into(),
                    lease_ttl: MIN_LEASE_TTL,
                    ..options()
                },
            )
            .unwrap()
            .with_log(log.clone());
            if next.run().await.completed == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        taken_over.is_ok(),
        "the job was never taken over: its lease is still renewed"
    );
    assert_eq!(
        queue.job(job.job_id).await.unwrap().unwrap().state,
        JobState::Done
    );
    let line = lines.lock().unwrap().join("\n");
    assert!(line.contains("ended done"), "{line}");
}
