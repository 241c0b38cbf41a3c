//! API keys: creating (`keel keys create`), listing, revoking, and resolving a request's
//! `Authorization: Bearer` key to its tenant.
//!
//! A key is `keel_<key id>_<secret>`: a public 12-hex-digit id (shown by `keel keys list`,
//! used to revoke) and 256 bits from the operating system's CSPRNG. Only SHA-256 of the
//! whole key is stored. A plain, fast hash is the right tool here, unlike for passwords:
//! slow, salted hashes (Argon2, bcrypt) exist to make guessing *low-entropy* secrets
//! expensive, but a 256-bit random secret cannot be guessed whatever the hash costs, so a
//! leaked table of digests reveals nothing usable. A fast unsalted digest also lets a
//! request's key be found with one indexed lookup (no per-key salt to try).

use std::fmt::Write as _;
use std::sync::Arc;

use keel_store::{ApiKeyInfo, NewApiKey, ServingStore, ServingStoreError, valid_tenant};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// The prefix of every key (lets secret scanners recognise them).
pub const KEY_PREFIX: &str = "keel_";

/// A key just created: the secret is shown once and never stored.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    /// The key to give to the client (`Authorization: Bearer <key>`).
    pub key: String,
    /// What is stored about it.
    pub info: ApiKeyInfo,
}

/// Why a key operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KeyError {
    /// A bad tenant or name (the message names it and the rule).
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error("{0}")]
    Store(String),
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// SHA-256 of `key`, lowercase hex: what the store keeps.
pub fn digest(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// Creates a key for `tenant` (see the module docs for the format).
pub async fn create(
    store: &dyn ServingStore,
    tenant: &str,
    name: Option<String>,
) -> Result<CreatedKey, KeyError> {
    if !valid_tenant(tenant) {
        return Err(KeyError::Invalid(format!(
            "--tenant {tenant:?}: a tenant is 1 to 64 lowercase letters, digits, `_` or `-`, \
             starting with a letter or digit"
        )));
    }
    let mut rng = rand::rng();
    let mut id = [0u8; 6];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let key_id = hex(&id);
    let key = format!("{KEY_PREFIX}{key_id}_{}", hex(&secret));
    let info = store
        .create_api_key(NewApiKey {
            key_id,
            tenant: tenant.to_string(),
            name,
            key_sha256: digest(&key),
        })
        .await
        .map_err(|e| match e {
            ServingStoreError::InvalidArgument { field, message } => {
                KeyError::Invalid(format!("--{field}: {message}"))
            }
            other => KeyError::Store(format!("cannot store the key: {other}")),
        })?;
    Ok(CreatedKey { key, info })
}

/// Every key (of `tenant`), revoked ones included.
pub async fn list(
    store: &dyn ServingStore,
    tenant: Option<&str>,
) -> Result<Vec<ApiKeyInfo>, KeyError> {
    store
        .list_api_keys(tenant)
        .await
        .map_err(|e| KeyError::Store(format!("cannot list keys: {e}")))
}

/// Revokes key `key_id`; `false` when no active key has that id.
pub async fn revoke(store: &dyn ServingStore, key_id: &str) -> Result<bool, KeyError> {
    store
        .revoke_api_key(key_id)
        .await
        .map_err(|e| KeyError::Store(format!("cannot revoke key {key_id}: {e}")))
}

/// The active key `presented` (a bearer token), if it is one.
pub async fn resolve(
    store: &Arc<dyn ServingStore>,
    presented: &str,
) -> Result<Option<ApiKeyInfo>, KeyError> {
    if !presented.starts_with(KEY_PREFIX) || presented.len() > 200 {
        return Ok(None);
    }
    store
        .find_api_key(&digest(presented))
        .await
        .map_err(|e| KeyError::Store(format!("cannot check the API key: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use keel_store::MemoryServingStore;

    #[tokio::test]
    async fn keys_resolve_until_revoked() {
        let store: Arc<dyn ServingStore> = Arc::new(MemoryServingStore::new());
        let created = create(store.as_ref(), "acme", Some("ci".into()))
            .await
            .unwrap();
        assert!(created.key.starts_with("keel_"));
        assert_eq!(created.key.len(), 5 + 12 + 1 + 64);
        let found = resolve(&store, &created.key).await.unwrap().unwrap();
        assert_eq!(found.tenant, "acme");
        assert!(resolve(&store, "keel_nope").await.unwrap().is_none());
        assert!(resolve(&store, "Bearer x").await.unwrap().is_none());
        assert!(revoke(store.as_ref(), &created.info.key_id).await.unwrap());
        assert!(resolve(&store, &created.key).await.unwrap().is_none());
        assert!(!revoke(store.as_ref(), &created.info.key_id).await.unwrap());
        let listed = list(store.as_ref(), Some("acme")).await.unwrap();
        assert!(listed[0].revoked_at.is_some());
        assert!(matches!(
            create(store.as_ref(), "Bad.Tenant", None).await,
            Err(KeyError::Invalid(_))
        ));
    }
}
