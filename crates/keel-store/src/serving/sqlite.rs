//! API keys and cancel requests on SQLite: writes are jobs of the store's writer thread,
//! reads use the read pool.

use async_trait::async_trait;
use keel_core::store::AppendDurability;
use rusqlite::{Connection, params};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{
    ApiKeyInfo, NewApiKey, ServingStore, ServingStoreError, backend, check_digest, check_new_key,
    check_run, is_unique_violation, now_ns,
};
use crate::SqliteStore;
use crate::rows::ns_to_ts;
use crate::sqlite_writer::WriterFailure;

impl From<WriterFailure> for ServingStoreError {
    fn from(failure: WriterFailure) -> Self {
        ServingStoreError::Backend(failure.0)
    }
}

fn info(row: &SqliteRow) -> Result<ApiKeyInfo, ServingStoreError> {
    let decode = |e: sqlx::Error| backend("sqlite decode api key", e);
    let created_at: i64 = row.try_get("created_at").map_err(decode)?;
    let revoked_at: Option<i64> = row.try_get("revoked_at").map_err(decode)?;
    Ok(ApiKeyInfo {
        key_id: row.try_get("key_id").map_err(decode)?,
        tenant: row.try_get("tenant").map_err(decode)?,
        name: row.try_get("name").map_err(decode)?,
        created_at: ns_to_ts(created_at),
        revoked_at: revoked_at.map(ns_to_ts),
    })
}

#[async_trait]
impl ServingStore for SqliteStore {
    async fn create_api_key(&self, key: NewApiKey) -> Result<ApiKeyInfo, ServingStoreError> {
        check_new_key(&key)?;
        let now = now_ns();
        let row = key.clone();
        self.writer
            .call(AppendDurability::Sync, move |conn: &Connection| {
                conn.prepare_cached(
                    "INSERT INTO api_keys (key_id, tenant, name, key_sha256, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        row.key_id,
                        row.tenant,
                        row.name,
                        row.key_sha256,
                        now
                    ])
                })
                .map_err(|e| {
                    let message = e.to_string();
                    if is_unique_violation(&message) {
                        ServingStoreError::Duplicate(if message.contains("key_sha256") {
                            "key_sha256".into()
                        } else {
                            "key_id".into()
                        })
                    } else {
                        backend("sqlite insert api key", e)
                    }
                })
            })
            .await?;
        Ok(ApiKeyInfo {
            key_id: key.key_id,
            tenant: key.tenant,
            name: key.name,
            created_at: ns_to_ts(now),
            revoked_at: None,
        })
    }

    async fn find_api_key(
        &self,
        key_sha256: &str,
    ) -> Result<Option<ApiKeyInfo>, ServingStoreError> {
        check_digest(key_sha256)?;
        let row = sqlx::query(
            "SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys WHERE key_sha256 = ?1 AND revoked_at IS NULL",
        )
        .bind(key_sha256)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("sqlite find api key", e))?;
        row.as_ref().map(info).transpose()
    }

    async fn list_api_keys(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ApiKeyInfo>, ServingStoreError> {
        let query = match tenant {
            Some(tenant) => sqlx::query(
                "SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys WHERE tenant = ?1 \
                 ORDER BY created_at, key_id",
            )
            .bind(tenant.to_string()),
            None => sqlx::query("SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys ORDER BY created_at, key_id"),
        };
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| backend("sqlite list api keys", e))?;
        rows.iter().map(info).collect()
    }

    async fn revoke_api_key(&self, key_id: &str) -> Result<bool, ServingStoreError> {
        let (key_id, now) = (key_id.to_string(), now_ns());
        let changed = self
            .writer
            .call(AppendDurability::Sync, move |conn: &Connection| {
                conn.prepare_cached(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE key_id = ?1 AND revoked_at IS NULL",
                )
                .and_then(|mut stmt| stmt.execute(params![key_id, now]))
                .map_err(|e| backend("sqlite revoke api key", e))
            })
            .await?;
        Ok(changed > 0)
    }

    async fn request_cancel(&self, thread_id: &str, run_id: &str) -> Result<(), ServingStoreError> {
        check_run(thread_id, run_id)?;
        let (thread_id, run_id, now) = (thread_id.to_string(), run_id.to_string(), now_ns());
        self.writer
            .call(AppendDurability::Default, move |conn: &Connection| {
                conn.prepare_cached(
                    "INSERT INTO run_cancellations (run_id, thread_id, requested_at) \
                     VALUES (?1, ?2, ?3) ON CONFLICT (run_id) DO NOTHING",
                )
                .and_then(|mut stmt| stmt.execute(params![run_id, thread_id, now]))
                .map_err(|e| backend("sqlite request cancel", e))
            })
            .await?;
        Ok(())
    }

    async fn cancel_requested(&self, run_id: &str) -> Result<bool, ServingStoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM run_cancellations WHERE run_id = ?1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("sqlite read cancel request", e))?;
        Ok(found.is_some())
    }
}
