//! The store: which URL (`--store` flag > `KEEL_STORE` > keel.toml `[store] url` >
//! `sqlite://.keel/keel.db`) and opening it (event log and run queue), retrying briefly
//! because several processes opening a new SQLite file at once race to create its schema.

use std::time::Duration;

use keel_store::OpenedStore;

use crate::error::AppError;

/// The environment variable that overrides keel.toml's `[store] url`.
pub const STORE_ENV: &str = "KEEL_STORE";

/// Where a store URL came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOrigin {
    /// The caller's explicit value (`--store`).
    Flag,
    /// `KEEL_STORE`.
    Env,
    /// keel.toml `[store] url` (or its default).
    Config,
}

/// The store URL: `flag`, else `env_value` (`KEEL_STORE`, when non-empty), else
/// `configured` (keel.toml, whose default is `sqlite://.keel/keel.db`).
pub fn store_url(
    flag: Option<&str>,
    env_value: Option<String>,
    configured: &str,
) -> (String, StoreOrigin) {
    if let Some(flag) = flag.filter(|f| !f.trim().is_empty()) {
        return (flag.to_string(), StoreOrigin::Flag);
    }
    if let Some(env) = env_value.filter(|v| !v.trim().is_empty()) {
        return (env, StoreOrigin::Env);
    }
    (configured.to_string(), StoreOrigin::Config)
}

/// Opens the store at `url` (a failed SQLite open is retried a few times).
pub async fn open_store(url: &str) -> Result<OpenedStore, AppError> {
    let mut attempt = 0u64;
    loop {
        match keel_store::open(url).await {
            Ok(mut opened) => {
                opened.events = crate::crash_point::arm(opened.events);
                return Ok(opened);
            }
            Err(_) if attempt < 4 && !url.starts_with("postgres") => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(e) => {
                return Err(AppError::Store {
                    url: display_url(url),
                    message: e.to_string(),
                });
            }
        }
    }
}

/// A URL for messages: its password and query (where `password=` can travel too)
/// removed; text that is not a URL is returned as it is.
pub fn display_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) if url.has_host() => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            url.set_query(None);
            url.set_fragment(None);
            url.to_string()
        }
        _ => raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_beats_env_beats_config() {
        let config = "sqlite://from-config.db";
        assert_eq!(
            store_url(Some("memory:"), Some("sqlite://env.db".into()), config),
            ("memory:".to_string(), StoreOrigin::Flag)
        );
        assert_eq!(
            store_url(None, Some("sqlite://env.db".into()), config),
            ("sqlite://env.db".to_string(), StoreOrigin::Env)
        );
        assert_eq!(
            store_url(None, Some(" ".into()), config),
            (config.to_string(), StoreOrigin::Config)
        );
        assert_eq!(
            display_url("postgres://u:secret@db.example/keel?password=x"),
            "postgres://u:***@db.example/keel"
        );
        assert_eq!(
            display_url("sqlite://.keel/keel.db"),
            "sqlite://.keel/keel.db"
        );
        assert_eq!(display_url(".keel/keel.db"), ".keel/keel.db");
    }
}
