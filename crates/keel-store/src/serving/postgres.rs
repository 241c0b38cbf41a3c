//! API keys and cancel requests on Postgres, through the store's pool.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{
    ApiKeyInfo, NewApiKey, ServingStore, ServingStoreError, backend, check_digest, check_new_key,
    check_run, is_unique_violation, now_ns,
};
use crate::PostgresStore;
use crate::rows::ns_to_ts;

fn info(row: &PgRow) -> Result<ApiKeyInfo, ServingStoreError> {
    let decode = |e: sqlx::Error| backend("postgres decode api key", e);
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
impl ServingStore for PostgresStore {
    async fn create_api_key(&self, key: NewApiKey) -> Result<ApiKeyInfo, ServingStoreError> {
        check_new_key(&key)?;
        let now = now_ns();
        sqlx::query(
            "INSERT INTO api_keys (key_id, tenant, name, key_sha256, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&key.key_id)
        .bind(&key.tenant)
        .bind(&key.name)
        .bind(&key.key_sha256)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(|e| {
            let message = e.to_string();
            if is_unique_violation(&message) {
                ServingStoreError::Duplicate(if message.contains("key_sha256") {
                    "key_sha256".into()
                } else {
                    "key_id".into()
                })
            } else {
                backend("postgres insert api key", e)
            }
        })?;
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
            "SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys WHERE key_sha256 = $1 AND revoked_at IS NULL",
        )
        .bind(key_sha256)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| backend("postgres find api key", e))?;
        row.as_ref().map(info).transpose()
    }

    async fn list_api_keys(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<ApiKeyInfo>, ServingStoreError> {
        let query = match tenant {
            Some(tenant) => sqlx::query(
                "SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys WHERE tenant = $1 \
                 ORDER BY created_at, key_id",
            )
            .bind(tenant.to_string()),
            None => sqlx::query("SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys ORDER BY created_at, key_id"),
        };
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| backend("postgres list api keys", e))?;
        rows.iter().map(info).collect()
    }

    async fn revoke_api_key(&self, key_id: &str) -> Result<bool, ServingStoreError> {
        let result = sqlx::query(
            "UPDATE api_keys SET revoked_at = $2 WHERE key_id = $1 AND revoked_at IS NULL",
        )
        .bind(key_id)
        .bind(now_ns())
        .execute(&self.pool)
        .await
        .map_err(|e| backend("postgres revoke api key", e))?;
        Ok(result.rows_affected() > 0)
    }

    async fn request_cancel(&self, thread_id: &str, run_id: &str) -> Result<(), ServingStoreError> {
        check_run(thread_id, run_id)?;
        sqlx::query(
            "INSERT INTO run_cancellations (run_id, thread_id, requested_at) \
             VALUES ($1, $2, $3) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(run_id)
        .bind(thread_id)
        .bind(now_ns())
        .execute(&self.pool)
        .await
        .map_err(|e| backend("postgres request cancel", e))?;
        Ok(())
    }

    async fn cancel_requested(&self, run_id: &str) -> Result<bool, ServingStoreError> {
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM run_cancellations WHERE run_id = $1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| backend("postgres read cancel request", e))?;
        Ok(found.is_some())
    }
}
