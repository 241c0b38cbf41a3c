//! [`MemoryServingStore`]: API keys and cancel requests in one process's memory (tests,
//! `memory:` stores).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::Utc;

use super::{
    ApiKeyInfo, NewApiKey, ServingStore, ServingStoreError, check_digest, check_new_key, check_run,
};

#[derive(Debug, Default)]
struct Inner {
    /// key id → (digest, info), in creation order by a counter.
    keys: BTreeMap<String, (String, ApiKeyInfo, u64)>,
    next: u64,
    cancels: BTreeSet<String>,
}

/// API keys and cancel requests in memory.
#[derive(Debug, Default)]
pub struct MemoryServingStore {
    inner: Mutex<Inner>,
}

impl MemoryServingStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

#[async_trait]
impl ServingStore for MemoryServingStore {
    async fn create_api_key(&self, key: NewApiKey) -> Result<ApiKeyInfo, ServingStoreError> {
        check_new_key(&key)?;
        let mut inner = self.lock();
        if inner.keys.contains_key(&key.key_id) {
            return Err(ServingStoreError::Duplicate("key_id".into()));
        }
        if inner.keys.values().any(|(d, _, _)| *d == key.key_sha256) {
            return Err(ServingStoreError::Duplicate("key_sha256".into()));
        }
        let info = ApiKeyInfo {
            key_id: key.key_id.clone(),
            tenant: key.tenant,
            name: key.name,
            created_at: Utc::now(),
            revoked_at: None,
        };
        let order = inner.next;
        inner.next += 1;
        inner
            .keys
            .insert(key.key_id, (key.key_sha256, info.clone(), order));
        Ok(info)
    }

    async fn find_api_key(
        &self,
        key_sha256: &str,
    ) -> Result<Option<ApiKeyInfo>, ServingStoreError> {
        check_digest(key_sha256)?;
        Ok(self
            .lock()
            .keys
            .values()
            .find(|(d, info, _)| d == key_sha256 && info.revoked_at.is_none())
            .map(|(_, info, _)| info.clone()))
    }

    async fn list_api_keys(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ApiKeyInfo>, ServingStoreError> {
        let inner = self.lock();
        let mut keys: Vec<&(String, ApiKeyInfo, u64)> = inner
            .keys
            .values()
            .filter(|(_, info, _)| tenant.is_none_or(|t| info.tenant == t))
            .collect();
        keys.sort_by_key(|(_, _, order)| *order);
        Ok(keys.into_iter().map(|(_, info, _)| info.clone()).collect())
    }

    async fn revoke_api_key(&self, key_id: &str) -> Result<bool, ServingStoreError> {
        let mut inner = self.lock();
        match inner.keys.get_mut(key_id) {
            Some((_, info, _)) if info.revoked_at.is_none() => {
                info.revoked_at = Some(Utc::now());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn request_cancel(&self, thread_id: &str, run_id: &str) -> Result<(), ServingStoreError> {
        check_run(thread_id, run_id)?;
        self.lock().cancels.insert(run_id.to_string());
        Ok(())
    }

    async fn cancel_requested(&self, run_id: &str) -> Result<bool, ServingStoreError> {
        Ok(self.lock().cancels.contains(run_id))
    }
}
