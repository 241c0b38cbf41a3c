//! Tenant isolation without changing the stores' schemas: the server keeps a tenant's
//! threads under store ids `<tenant>.<client id>`. Clients only ever name and see their
//! client ids; every store read and write goes through [`Tenant::store_id`], so a key of
//! tenant B asking for tenant A's thread `t` reads `b.t`, which does not exist: 404, the
//! same answer as for an id nobody uses. Listings keep the ids under the tenant's prefix.
//!
//! Tenant names are lowercase letters, digits, `_` and `-` (no `.`), and client ids are
//! letters, digits, `_` and `-` (no `.` either), so `<tenant>.<client id>` splits one way
//! only and no client id can reach another tenant's prefix. Runs, calls and events are
//! found through their thread, so they inherit its isolation.

use keel_core::{Event, new_id};
use serde_json::Value;

/// Longest client thread id, in characters.
pub const MAX_CLIENT_ID_CHARS: usize = 128;

/// The tenant an API key acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant's name.
    pub name: String,
    /// The key's public id (recorded as who approved a call).
    pub key_id: String,
    /// SHA-256 of the key (hex), as the key store indexes it: an open stream looks it up
    /// again to end when the key is revoked. Empty for a tenant acting without a key.
    pub key_sha256: String,
}

impl Tenant {
    /// The store id of client thread `client_id` (checked first: the error names the
    /// field and the rule).
    pub fn store_id(&self, client_id: &str) -> Result<String, String> {
        check_client_id(client_id)?;
        Ok(format!("{}.{client_id}", self.name))
    }

    /// The prefix of every store id of this tenant (`<tenant>.`), for store queries.
    pub fn prefix(&self) -> String {
        format!("{}.", self.name)
    }

    /// A new client thread id and its store id.
    pub fn new_thread(&self) -> (String, String) {
        let client = new_id("thr");
        let store = format!("{}.{client}", self.name);
        (client, store)
    }

    /// The client id of store id `store_id`, when it is this tenant's.
    pub fn client_id<'a>(&self, store_id: &'a str) -> Option<&'a str> {
        store_id
            .strip_prefix(self.name.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
            .filter(|client| check_client_id(client).is_ok())
    }

    /// `event` as JSON with its thread id shown as the client's.
    pub fn event_json(&self, event: &Event, client_id: &str) -> Value {
        let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
        if let Some(map) = value.as_object_mut() {
            map.insert("thread_id".into(), Value::String(client_id.to_string()));
        }
        value
    }
}

/// The tenant of store thread id `store_id` (`<tenant>.<client id>`), if it has one.
pub fn tenant_of(store_id: &str) -> Option<&str> {
    store_id
        .split_once('.')
        .map(|(tenant, _)| tenant)
        .filter(|tenant| !tenant.is_empty())
}

/// A client thread id: 1 to 128 ASCII letters, digits, `_` or `-`.
pub fn check_client_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_CLIENT_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "thread_id {id:?} is not valid: use 1 to {MAX_CLIENT_ID_CHARS} ASCII letters, \
             digits, `_` or `-` (or leave it out to start a new thread)"
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_map_one_way_and_never_cross_tenants() {
        let a = Tenant {
            name: "a".into(),
            key_id: "k".into(),
            key_sha256: String::new(),
        };
        let b = Tenant {
            name: "ab".into(),
            key_id: "k".into(),
            key_sha256: String::new(),
        };
        assert_eq!(a.store_id("thr_1").unwrap(), "a.thr_1");
        assert_eq!(a.client_id("a.thr_1"), Some("thr_1"));
        assert_eq!(a.client_id("ab.thr_1"), None);
        assert_eq!(b.client_id("a.thr_1"), None);
        assert_eq!(a.client_id("a.b.thr_1"), None);
        for bad in ["", "b.x", "../x", "x y", &"x".repeat(129)] {
            assert!(a.store_id(bad).is_err(), "{bad:?}");
        }
        let (client, store) = a.new_thread();
        assert_eq!(a.client_id(&store), Some(client.as_str()));
    }
}
