//! Open event streams, bounded: every stream (`/v1` SSE, A2A `message/stream` and
//! `tasks/resubscribe`, `/ui` live pages) takes a [`StreamPermit`] of its tenant and key
//! before it starts — `open_streams` per tenant and `open_streams_per_key` per key
//! (`[server.limits]`), 429 `too_many_streams` with `Retry-After` beyond — and gives it back
//! when it ends, however it ends. While open, a stream asks [`key_still_active`] every
//! [`KEY_CHECK`] and ends when its key was revoked: a key taken away stops receiving.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use keel_config::server::Limits;

use crate::error::ApiError;
use crate::state::Shared;

/// How often an open stream checks that its key is still active.
pub const KEY_CHECK: Duration = Duration::from_secs(2);

/// How long a client turned away should wait: streams last minutes, not seconds.
const RETRY_AFTER_SECS: u64 = 5;

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Open streams by tenant and by key id (entries at zero are removed, so the maps hold
/// only what is open).
#[derive(Debug, Default)]
pub struct OpenStreams {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    by_tenant: HashMap<String, u64>,
    by_key: HashMap<String, u64>,
}

impl OpenStreams {
    /// A stream slot of `tenant` and its key `key_id` under `limits` (`0`: unlimited).
    pub fn open(
        self: &Arc<Self>,
        tenant: &str,
        key_id: &str,
        limits: &Limits,
    ) -> Result<StreamPermit, ApiError> {
        let mut counts = locked(&self.counts);
        let of_tenant = counts.by_tenant.get(tenant).copied().unwrap_or(0);
        let of_key = counts.by_key.get(key_id).copied().unwrap_or(0);
        if limits.open_streams != 0 && of_tenant >= limits.open_streams {
            return Err(refusal(format!(
                "tenant {tenant} has {of_tenant} event streams open, its limit \
                 ([server.limits] open_streams in keel.toml): close one, or retry after \
                 the Retry-After seconds"
            )));
        }
        if limits.open_streams_per_key != 0 && of_key >= limits.open_streams_per_key {
            return Err(refusal(format!(
                "this API key has {of_key} event streams open, its limit ([server.limits] \
                 open_streams_per_key in keel.toml): close one, or retry after the \
                 Retry-After seconds"
            )));
        }
        *counts.by_tenant.entry(tenant.to_string()).or_default() += 1;
        *counts.by_key.entry(key_id.to_string()).or_default() += 1;
        Ok(StreamPermit {
            streams: Arc::clone(self),
            tenant: tenant.to_string(),
            key_id: key_id.to_string(),
        })
    }

    /// Streams `tenant` has open.
    pub fn of_tenant(&self, tenant: &str) -> u64 {
        locked(&self.counts)
            .by_tenant
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

fn refusal(message: String) -> ApiError {
    ApiError::too_many("too_many_streams", message, RETRY_AFTER_SECS)
}

/// One open stream's slot; given back when dropped.
#[derive(Debug)]
pub struct StreamPermit {
    streams: Arc<OpenStreams>,
    tenant: String,
    key_id: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut counts = locked(&self.streams.counts);
        let Counts { by_tenant, by_key } = &mut *counts;
        for (map, name) in [(by_tenant, &self.tenant), (by_key, &self.key_id)] {
            if let Some(count) = map.get_mut(name.as_str()) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    map.remove(name.as_str());
                }
            }
        }
    }
}

/// Whether the key whose SHA-256 is `key_sha256` is still an active key of `tenant` with
/// id `key_id`. A store that does not answer in time (or fails) is taken as "still active":
/// a blip of the key store must not cut every stream; the next check decides.
pub async fn key_still_active(
    state: &Shared,
    tenant: &str,
    key_id: &str,
    key_sha256: &str,
) -> bool {
    match tokio::time::timeout(
        state.request_timeout(),
        state.serving.find_api_key(key_sha256),
    )
    .await
    {
        Ok(Ok(Some(info))) => info.key_id == key_id && info.tenant == tenant,
        Ok(Ok(None)) => false,
        Ok(Err(_)) | Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn permits_are_counted_per_tenant_and_key_and_given_back() {
        let streams = Arc::new(OpenStreams::default());
        let limits = Limits {
            open_streams: 3,
            open_streams_per_key: 2,
            ..Limits::default()
        };
        let a1 = streams.open("acme", "k1", &limits).unwrap();
        let a2 = streams.open("acme", "k1", &limits).unwrap();
        let refused = streams.open("acme", "k1", &limits).unwrap_err();
        assert_eq!(refused.code, "too_many_streams");
        assert!(
            refused.message.contains("open_streams_per_key"),
            "{}",
            refused.message
        );
        let a3 = streams.open("acme", "k2", &limits).unwrap();
        let refused = streams.open("acme", "k3", &limits).unwrap_err();
        assert!(
            refused.message.contains("open_streams in"),
            "{}",
            refused.message
        );
        assert!(streams.open("other", "k9", &limits).is_ok());
        drop((a1, a2, a3));
        assert_eq!(streams.of_tenant("acme"), 0);
        let counts = locked(&streams.counts);
        assert!(counts.by_tenant.is_empty() && counts.by_key.is_empty());
    }
}
