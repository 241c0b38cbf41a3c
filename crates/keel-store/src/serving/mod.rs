//! What `keel serve` keeps beside the event log, in the same database: API keys and run
//! cancellation requests ([`ServingStore`]).
//!
//! **API keys.** A key is stored as its SHA-256 digest only ([`NewApiKey::key_sha256`],
//! lowercase hex); the key itself is shown once, when created, and never stored. Each key
//! has a public `key_id` (listed, used to revoke) and belongs to one tenant. A revoked key
//! keeps its row, with `revoked_at` set, and is no longer found by
//! [`ServingStore::find_api_key`]. This crate neither generates nor hashes keys: the
//! server does (see `keel-server`'s `keys` module, which also says why a plain SHA-256 is
//! the right digest for high-entropy random keys).
//!
//! **Cancellation requests.** A cancel asked of one server process must reach the worker
//! driving the run, possibly in another process: it is recorded here per run id
//! ([`ServingStore::request_cancel`]) and workers check it ([`ServingStore::cancel_requested`]).
//!
//! Backends: [`MemoryServingStore`], [`crate::SqliteStore`] (writes through the store's
//! writer thread) and [`crate::PostgresStore`]; the tables come from migration
//! `0006_serving`. Times are nanoseconds since the epoch by the writing process's clock.

mod memory;
mod postgres;
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use memory::MemoryServingStore;

/// Longest tenant name, key id or key name, in characters.
pub const MAX_NAME_CHARS: usize = 64;

/// Why a serving-store operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServingStoreError {
    /// A bad argument: `field` names it, `message` says what is allowed.
    #[error("invalid {field}: {message}")]
    InvalidArgument {
        /// The argument (`tenant`, `name`, `key_id`, `key_sha256`, `run_id`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A key with this id or digest exists already.
    #[error("an API key with this {0} exists already")]
    Duplicate(String),
    /// The database failed.
    #[error("serving store backend error: {0}")]
    Backend(String),
}

impl ServingStoreError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::Duplicate(_) => "duplicate",
            Self::Backend(_) => "backend",
        }
    }
}

/// A key to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// Public id (letters, digits, `_`, `-`; 1 to 64 characters).
    pub key_id: String,
    /// The tenant the key acts for (lowercase letters, digits, `_`, `-`; 1 to 64).
    pub tenant: String,
    /// A label for people (printable, at most 64 characters).
    pub name: Option<String>,
    /// SHA-256 of the key, 64 lowercase hex digits.
    pub key_sha256: String,
}

/// A stored key (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyInfo {
    /// Public id.
    pub key_id: String,
    /// Tenant.
    pub tenant: String,
    /// Label.
    pub name: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked (`None`: active).
    pub revoked_at: Option<DateTime<Utc>>,
}

/// API keys and cancellation requests (see the module docs).
#[async_trait]
pub trait ServingStore: Send + Sync {
    /// Stores a new key; a taken `key_id` or digest is [`ServingStoreError::Duplicate`].
    async fn create_api_key(&self, key: NewApiKey) -> Result<ApiKeyInfo, ServingStoreError>;

    /// The active (not revoked) key with this digest.
    async fn find_api_key(&self, key_sha256: &str)
    -> Result<Option<ApiKeyInfo>, ServingStoreError>;

    /// Every key (of `tenant`, when given), revoked ones included, oldest first.
    async fn list_api_keys(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ApiKeyInfo>, ServingStoreError>;

    /// Revokes a key; `false` when no active key has this id.
    async fn revoke_api_key(&self, key_id: &str) -> Result<bool, ServingStoreError>;

    /// Records a cancel request for run `run_id` of `thread_id` (idempotent).
    async fn request_cancel(&self, thread_id: &str, run_id: &str) -> Result<(), ServingStoreError>;

    /// Whether a cancel was requested for run `run_id`.
    async fn cancel_requested(&self, run_id: &str) -> Result<bool, ServingStoreError>;
}

fn invalid(field: &str, message: impl Into<String>) -> ServingStoreError {
    ServingStoreError::InvalidArgument {
        field: field.into(),
        message: message.into(),
    }
}

/// Whether `name` is a valid tenant name: 1 to 64 lowercase ASCII letters, digits, `_` or
/// `-`, starting with a letter or digit. (The server puts it in thread ids, before a `.`.)
pub fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn check_id(field: &str, value: &str) -> Result<(), ServingStoreError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?}: use 1 to 128 ASCII letters, digits, `_`, `-` or `.`"),
        ))
    }
}

pub(crate) fn check_tenant(tenant: &str) -> Result<(), ServingStoreError> {
    if valid_tenant(tenant) {
        Ok(())
    } else {
        Err(invalid(
            "tenant",
            format!(
                "{tenant:?}: use 1 to {MAX_NAME_CHARS} lowercase letters, digits, `_` or `-`, \
                 starting with a letter or digit"
            ),
        ))
    }
}

pub(crate) fn check_new_key(key: &NewApiKey) -> Result<(), ServingStoreError> {
    check_id("key_id", &key.key_id)?;
    check_tenant(&key.tenant)?;
    if let Some(name) = &key.name
        && (name.is_empty()
            || name.chars().count() > MAX_NAME_CHARS
            || name.chars().any(char::is_control))
    {
        return Err(invalid(
            "name",
            format!("use 1 to {MAX_NAME_CHARS} printable characters"),
        ));
    }
    check_digest(&key.key_sha256)
}

pub(crate) fn check_digest(digest: &str) -> Result<(), ServingStoreError> {
    if digest.len() == 64
        && digest
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    {
        Ok(())
    } else {
        Err(invalid("key_sha256", "expected 64 lowercase hex digits"))
    }
}

pub(crate) fn check_run(thread_id: &str, run_id: &str) -> Result<(), ServingStoreError> {
    check_id("run_id", run_id)?;
    if thread_id.is_empty() {
        return Err(invalid("thread_id", "must not be empty"));
    }
    Ok(())
}

pub(crate) fn backend(what: &str, error: impl std::fmt::Display) -> ServingStoreError {
    ServingStoreError::Backend(format!("{what}: {error}"))
}

pub(crate) fn now_ns() -> i64 {
    crate::rows::ts_to_ns_saturating(Utc::now())
}

/// A unique-constraint violation's message, as a [`ServingStoreError::Duplicate`].
pub(crate) fn is_unique_violation(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("unique") || lower.contains("duplicate key")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tenants_and_keys_are_checked() {
        for ok in ["acme", "a", "team-1", "x_y", "0day"] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "Acme", "a.b", "-a", "a b", &"a".repeat(65)] {
            assert!(!valid_tenant(bad), "{bad}");
        }
        let key = NewApiKey {
            key_id: "k1".into(),
            tenant: "acme".into(),
            name: Some("ci".into()),
            key_sha256: "a".repeat(64),
        };
        check_new_key(&key).unwrap();
        let bad = NewApiKey {
            key_sha256: "A".repeat(64),
            ..key.clone()
        };
        assert_eq!(check_new_key(&bad).unwrap_err().code(), "invalid_argument");
        let bad = NewApiKey {
            name: Some("a\nb".into()),
            ..key
        };
        assert!(
            check_new_key(&bad)
                .unwrap_err()
                .to_string()
                .contains("name")
        );
    }
}
