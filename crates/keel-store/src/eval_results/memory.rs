//! [`MemoryEvalResultStore`]: eval runs and baselines in one process's memory (tests,
//! `memory:` stores).

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    BaselineInfo, EvalResultStore, EvalRunId, EvalRunInfo, EvalStoreError, NewEvalRun,
    StoredEvalRun, check_baseline_name, check_new_run,
};

#[derive(Debug)]
struct Baseline {
    run: EvalRunId,
    updated_at: DateTime<Utc>,
}

#[derive(Debug, Default)]
struct Inner {
    last_id: i64,
    runs: BTreeMap<EvalRunId, StoredEvalRun>,
    baselines: BTreeMap<String, Baseline>,
}

impl Inner {
    /// Runs matching `keep`, newest first, without their reports.
    fn newest_first(&self, keep: impl Fn(&EvalRunInfo) -> bool) -> Vec<EvalRunInfo> {
        let mut runs: Vec<EvalRunInfo> = self
            .runs
            .values()
            .map(|run| &run.info)
            .filter(|info| keep(info))
            .cloned()
            .collect();
        runs.sort_by_key(|info| Reverse((info.created_at, info.id)));
        runs
    }
}

/// An [`EvalResultStore`] in memory.
#[derive(Debug, Default)]
pub struct MemoryEvalResultStore {
    inner: Mutex<Inner>,
}

impl MemoryEvalResultStore {
    /// An empty store.
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

#[async_trait]
impl EvalResultStore for MemoryEvalResultStore {
    async fn save_run(&self, run: NewEvalRun) -> Result<EvalRunId, EvalStoreError> {
        check_new_run(&run)?;
        let mut inner = self.lock();
        inner.last_id = inner.last_id.saturating_add(1);
        let id = EvalRunId(inner.last_id);
        let info = EvalRunInfo {
            id,
            suite: run.suite,
            model: run.model,
            pass_rate: run.pass_rate,
            total_scenarios: run.total_scenarios,
            created_at: Utc::now(),
            threads: run.threads,
        };
        inner.runs.insert(
            id,
            StoredEvalRun {
                info,
                report: run.report,
            },
        );
        Ok(id)
    }

    async fn run(&self, id: &EvalRunId) -> Result<Option<StoredEvalRun>, EvalStoreError> {
        Ok(self.lock().runs.get(id).cloned())
    }

    async fn list_runs(
        &self,
        suite: Option<&str>,
        limit: usize,
    ) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
        let mut runs = self
            .lock()
            .newest_first(|info| suite.is_none_or(|s| info.suite == s));
        runs.truncate(limit);
        Ok(runs)
    }

    async fn runs_for_thread(&self, thread_id: &str) -> Result<Vec<EvalRunInfo>, EvalStoreError> {
        Ok(self
            .lock()
            .newest_first(|info| info.threads.iter().any(|t| t.thread_id == thread_id)))
    }

    async fn save_baseline(&self, name: &str, run: &EvalRunId) -> Result<(), EvalStoreError> {
        check_baseline_name(name)?;
        let mut inner = self.lock();
        if !inner.runs.contains_key(run) {
            return Err(EvalStoreError::NotFound(*run));
        }
        inner.baselines.insert(
            name.to_string(),
            Baseline {
                run: *run,
                updated_at: Utc::now(),
            },
        );
        Ok(())
    }

    async fn baseline(&self, name: &str) -> Result<Option<StoredEvalRun>, EvalStoreError> {
        check_baseline_name(name)?;
        let inner = self.lock();
        Ok(inner
            .baselines
            .get(name)
            .and_then(|baseline| inner.runs.get(&baseline.run))
            .cloned())
    }

    async fn baselines(&self) -> Result<Vec<BaselineInfo>, EvalStoreError> {
        let inner = self.lock();
        Ok(inner
            .baselines
            .iter()
            .filter_map(|(name, baseline)| {
                let info = &inner.runs.get(&baseline.run)?.info;
                Some(BaselineInfo {
                    name: name.clone(),
                    run_id: info.id,
                    suite: info.suite.clone(),
                    model: info.model.clone(),
                    pass_rate: info.pass_rate,
                    total_scenarios: info.total_scenarios,
                    run_created_at: info.created_at,
                    updated_at: baseline.updated_at,
                })
            })
            .collect())
    }

    async fn delete_baseline(&self, name: &str) -> Result<bool, EvalStoreError> {
        check_baseline_name(name)?;
        Ok(self.lock().baselines.remove(name).is_some())
    }
}
