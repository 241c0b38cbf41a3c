//! `[server]`: how `keel serve` serves (address, embedded workers, body size, timeouts,
//! CORS, which agents clients may run) and the per-tenant limits (`[server.limits]` for
//! every tenant, `[server.tenants.<tenant>]` over it). Only values live here; the server
//! (keel-server) enforces them, and [`ServerConfig::problems`] is what `keel config
//! check` and `keel serve` report about them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The default address of `keel serve`.
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on (`--bind`).
    pub bind: String,
    /// Embedded workers driving queued runs in the server process (`--workers`; 0: none,
    /// separate `keel worker` processes drive them).
    pub workers: usize,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Longest a non-streaming request is served, in milliseconds (a chat whose run is
    /// still going then answers 202 with the thread and run to follow).
    pub request_timeout_ms: u64,
    /// Longest one event stream stays open, in milliseconds (clients reconnect with
    /// `Last-Event-ID`).
    pub stream_timeout_ms: u64,
    /// On SIGTERM / Ctrl-C: how long runs in progress may take to finish before the rest
    /// are left to the queue, in milliseconds.
    pub shutdown_grace_ms: u64,
    /// Lease of the embedded workers' jobs, in milliseconds (a run left at shutdown is
    /// taken over by another worker once it expires).
    pub lease_ttl_ms: u64,
    /// Origins allowed by CORS (`["https://app.example"]`, or `["*"]`); empty: no CORS
    /// headers at all.
    pub cors_origins: Vec<String>,
    /// `[agents.<name>]` names clients may run (empty: every agent of keel.toml).
    pub agents: Vec<String>,
    /// `[server.limits]`: every tenant's limits.
    pub limits: TenantLimits,
    /// `[server.tenants.<tenant>]`: one tenant's limits over `[server.limits]`.
    pub tenants: BTreeMap<String, TenantLimits>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: DEFAULT_BIND.into(),
            workers: 2,
            max_body_bytes: 1024 * 1024,
            request_timeout_ms: 120_000,
            stream_timeout_ms: 600_000,
            shutdown_grace_ms: 30_000,
            lease_ttl_ms: 30_000,
            cors_origins: Vec::new(),
            agents: Vec::new(),
            limits: TenantLimits::default(),
            tenants: BTreeMap::new(),
        }
    }
}

/// Limits of a tenant; unset values come from `[server.limits]`, then the defaults. `0`
/// means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimits {
    /// Runs queued or in progress at once (default 16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u64>,
    /// Requests per minute (default 600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Model tokens (input + output) per UTC day (default 0: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
}

/// A tenant's limits, resolved (`0`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Runs queued or in progress at once.
    pub concurrent_runs: u64,
    /// Requests per minute.
    pub requests_per_minute: u64,
    /// Model tokens per UTC day.
    pub tokens_per_day: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            concurrent_runs: 16,
            requests_per_minute: 600,
            tokens_per_day: 0,
        }
    }
}

impl ServerConfig {
    /// `tenant`'s limits: `[server.tenants.<tenant>]` > `[server.limits]` > the defaults.
    pub fn limits_for(&self, tenant: &str) -> Limits {
        let base = Limits::default();
        let all = &self.limits;
        let own = self.tenants.get(tenant);
        let pick = |get: fn(&TenantLimits) -> Option<u64>, default: u64| {
            own.and_then(get).or_else(|| get(all)).unwrap_or(default)
        };
        Limits {
            concurrent_runs: pick(|l| l.concurrent_runs, base.concurrent_runs),
            requests_per_minute: pick(|l| l.requests_per_minute, base.requests_per_minute),
            tokens_per_day: pick(|l| l.tokens_per_day, base.tokens_per_day),
        }
    }

    /// Whether clients may run agent `name` (`agents` empty: any agent of keel.toml).
    pub fn allows_agent(&self, name: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|a| a == name)
    }

    /// Every invalid value as (key path under `server`, message naming the fix).
    pub fn problems(&self) -> Vec<(Vec<String>, String)> {
        let mut out = Vec::new();
        let key = |parts: &[&str]| parts.iter().map(|p| (*p).to_string()).collect::<Vec<_>>();
        if self.bind.parse::<SocketAddr>().is_err() {
            out.push((
                key(&["server", "bind"]),
                format!(
                    "`server.bind` = {:?} is not an address: use IP:PORT, e.g. {DEFAULT_BIND} \
                     (0.0.0.0:8080 for every interface)",
                    self.bind
                ),
            ));
        }
        for (name, value, min) in [
            ("max_body_bytes", self.max_body_bytes as u64, 1024),
            ("request_timeout_ms", self.request_timeout_ms, 100),
            ("stream_timeout_ms", self.stream_timeout_ms, 1000),
            ("lease_ttl_ms", self.lease_ttl_ms, 300),
        ] {
            if value < min {
                out.push((
                    key(&["server", name]),
                    format!("`server.{name}` must be at least {min}, not {value}"),
                ));
            }
        }
        for (index, origin) in self.cors_origins.iter().enumerate() {
            let ok = origin == "*"
                || ((origin.starts_with("http://") || origin.starts_with("https://"))
                    && !origin.trim_end_matches('/').contains(['?', '#'])
                    && origin.matches('/').count() == 2);
            if !ok {
                out.push((
                    vec!["server".into(), "cors_origins".into(), index.to_string()],
                    format!(
                        "`server.cors_origins[{index}]` = {origin:?} is not an origin: use \
                         scheme://host[:port] with no path, e.g. https://app.example, or \"*\""
                    ),
                ));
            }
        }
        for tenant in self.tenants.keys() {
            if !valid_tenant(tenant) {
                out.push((
                    key(&["server", "tenants", tenant]),
                    format!(
                        "`server.tenants.{tenant}`: a tenant name is 1 to 64 lowercase letters, \
                         digits, `_` or `-`, starting with a letter or digit"
                    ),
                ));
            }
        }
        out
    }
}

/// A valid tenant name (the rule of `keel_store::valid_tenant`, which keel-config does not
/// depend on): 1 to 64 lowercase ASCII letters, digits, `_` or `-`, not starting with
/// `_` or `-`.
fn valid_tenant(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn tenant_limits_override_the_shared_ones_and_the_defaults() {
        let config: ServerConfig = toml::from_str(
            "[limits]\nrequests_per_minute = 60\n[tenants.acme]\nconcurrent_runs = 1\n",
        )
        .unwrap();
        assert_eq!(
            config.limits_for("acme"),
            Limits {
                concurrent_runs: 1,
                requests_per_minute: 60,
                tokens_per_day: 0
            }
        );
        assert_eq!(config.limits_for("other").concurrent_runs, 16);
        assert!(config.problems().is_empty());
        assert!(config.allows_agent("anything"));
    }

    #[test]
    fn bad_values_are_named() {
        let config = ServerConfig {
            bind: "localhost".into(),
            cors_origins: vec!["https://a.example/path".into()],
            tenants: BTreeMap::from([("Acme".into(), TenantLimits::default())]),
            lease_ttl_ms: 1,
            ..ServerConfig::default()
        };
        let problems = config.problems();
        let keys: Vec<String> = problems.iter().map(|(k, _)| k.join(".")).collect();
        assert_eq!(
            keys,
            [
                "server.bind",
                "server.lease_ttl_ms",
                "server.cors_origins.0",
                "server.tenants.Acme"
            ]
        );
    }
}
