//! `[server]`: how `keel serve` serves (address, embedded workers, body size, timeouts,
//! CORS, which agents clients may run), the per-tenant limits (`[server.limits]` for
//! every tenant, `[server.tenants.<tenant>]` over it) and each tenant's tool credentials
//! (`[server.tenants.<tenant>.credentials]`: a tool's credential name → the environment
//! variable or file holding that tenant's secret — never the secret itself). Only values
//! live here; the server (keel-server) enforces them, and [`ServerConfig::problems`] and
//! [`credential_problems`] are what `keel config check` and `keel serve` report about them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::schema::{BUILTIN_PROVIDERS, KeelConfig};

/// An hour in milliseconds: the longest request timeout and shutdown grace.
const HOUR_MS: u64 = 3_600_000;
/// A day in milliseconds: the longest stream and lease.
const DAY_MS: u64 = 86_400_000;

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
    /// Attempts a queued run gets from the embedded workers before it is dead-lettered
    /// with its last error (transient failures are retried with exponential backoff from
    /// `retry_base_ms`; waiting for another run of the thread uses up no attempt).
    pub max_attempts: u32,
    /// The first retry's delay in milliseconds; each later retry waits twice as long, up
    /// to 10 minutes.
    pub retry_base_ms: u64,
    /// Origins allowed by CORS (`["https://app.example"]`, or `["*"]`); empty: no CORS
    /// headers at all.
    pub cors_origins: Vec<String>,
    /// `[agents.<name>]` names clients may run (empty: every agent of keel.toml).
    pub agents: Vec<String>,
    /// The URL clients reach the server at (`https://agents.example`, no query): the A2A
    /// cards' URLs, and a `Host` the server answers. Unset: `http://<bind address>`, which
    /// only a loopback `bind` may use (see [`ServerConfig::serving_problems`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// More `Host` values the server (and `keel ui`) answers, over the loopback names, the
    /// bind address and `public_url`'s host: `"name"` on any port, `"name:port"` on that
    /// one, `"*"` any Host at all (turns off the DNS-rebinding check).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Tenants whose keys may read `/metrics`: its figures are the whole server's (every
    /// tenant's traffic, the queue, the runs), so no tenant's key reads them unless its
    /// tenant is listed here (e.g. `operators = ["ops"]` and `keel keys create --tenant
    /// ops` for the scraper). Empty (the default): `/metrics` answers `403`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<String>,
    /// `[server.limits]`: every tenant's limits.
    pub limits: TenantLimits,
    /// `[server.tenants.<tenant>]`: one tenant's limits over `[server.limits]`, and its
    /// tools' credentials.
    pub tenants: BTreeMap<String, TenantConfig>,
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
            max_attempts: 20,
            retry_base_ms: 1_000,
            cors_origins: Vec::new(),
            agents: Vec::new(),
            public_url: None,
            allowed_hosts: Vec::new(),
            operators: Vec::new(),
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
    /// Event streams open at once (`/v1` SSE, A2A streams, `/ui` live pages; default 32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_streams: Option<u64>,
    /// Event streams one API key (or `/ui` session's key) has open at once (default 8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_streams_per_key: Option<u64>,
}

/// `[server.tenants.<tenant>]`: the tenant's limits (unset ones from `[server.limits]`)
/// and `credentials`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// Runs queued or in progress at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u64>,
    /// Requests per minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Model tokens (input + output) per UTC day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// Event streams open at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_streams: Option<u64>,
    /// Event streams one API key has open at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_streams_per_key: Option<u64>,
    /// `[server.tenants.<tenant>.credentials]`: credential name (the variable a tool's
    /// `auth` names, e.g. `CRM_TOKEN`) → where this tenant's secret is.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub credentials: BTreeMap<String, CredentialRef>,
}

impl TenantConfig {
    /// The limits part.
    pub fn limits(&self) -> TenantLimits {
        TenantLimits {
            concurrent_runs: self.concurrent_runs,
            requests_per_minute: self.requests_per_minute,
            tokens_per_day: self.tokens_per_day,
            open_streams: self.open_streams,
            open_streams_per_key: self.open_streams_per_key,
        }
    }
}

/// Where one tenant's secret is: `{ env = "VAR" }` (a variable of the server's
/// environment) or `{ file = "/path" }` (a file, read at each call; relative to
/// keel.toml's directory), optionally only for some tools (`tools = ["crm_lookup"]`).
/// A plain string is refused by [`ServerConfig::problems`] — it may be a pasted secret —
/// and is not kept.
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
pub struct CredentialRef {
    /// The environment variable holding the secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The file holding the secret (surrounding whitespace is trimmed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Only these tools get it (empty: every tool that asks for this credential name).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// Written as a plain string (refused; the string itself is dropped when parsed).
    #[serde(skip)]
    pub inline: bool,
}

impl std::fmt::Debug for CredentialRef {
    /// An `env` that is no variable name may be a pasted secret: it is not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env = self.env.as_deref().map(|var| {
            if valid_env_name(var) {
                var
            } else {
                "[not a variable name]"
            }
        });
        f.debug_struct("CredentialRef")
            .field("env", &env)
            .field("file", &self.file)
            .field("tools", &self.tools)
            .field("inline", &self.inline)
            .finish()
    }
}

impl CredentialRef {
    /// Whether `tool` may receive this credential.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools.is_empty() || self.tools.iter().any(|t| t == tool)
    }
}

impl<'de> Deserialize<'de> for CredentialRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            env: Option<String>,
            file: Option<String>,
            #[serde(default)]
            tools: Vec<String>,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = CredentialRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table `{ env = \"VAR\" }` or `{ file = \"/path\" }`")
            }
            fn visit_str<E: serde::de::Error>(self, _text: &str) -> Result<CredentialRef, E> {
                // The text may be the secret: only the fact that it was a string is kept.
                Ok(CredentialRef {
                    inline: true,
                    ..CredentialRef::default()
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<CredentialRef, A::Error> {
                let table = Table::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(CredentialRef {
                    env: table.env,
                    file: table.file,
                    tools: table.tools,
                    inline: false,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
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
    /// Event streams open at once.
    pub open_streams: u64,
    /// Event streams one key has open at once.
    pub open_streams_per_key: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            concurrent_runs: 16,
            requests_per_minute: 600,
            tokens_per_day: 0,
            open_streams: 32,
            open_streams_per_key: 8,
        }
    }
}

impl ServerConfig {
    /// `tenant`'s limits: `[server.tenants.<tenant>]` > `[server.limits]` > the defaults.
    pub fn limits_for(&self, tenant: &str) -> Limits {
        let base = Limits::default();
        let all = &self.limits;
        let own = self.tenants.get(tenant).map(TenantConfig::limits);
        let own = own.as_ref();
        let pick = |get: fn(&TenantLimits) -> Option<u64>, default: u64| {
            own.and_then(get).or_else(|| get(all)).unwrap_or(default)
        };
        Limits {
            concurrent_runs: pick(|l| l.concurrent_runs, base.concurrent_runs),
            requests_per_minute: pick(|l| l.requests_per_minute, base.requests_per_minute),
            tokens_per_day: pick(|l| l.tokens_per_day, base.tokens_per_day),
            open_streams: pick(|l| l.open_streams, base.open_streams),
            open_streams_per_key: pick(|l| l.open_streams_per_key, base.open_streams_per_key),
        }
    }

    /// Whether clients may run agent `name` (`agents` empty: any agent of keel.toml).
    pub fn allows_agent(&self, name: &str) -> bool {
        self.agents.is_empty() || self.agents.iter().any(|a| a == name)
    }

    /// Every invalid value as (key path under `server`, message naming the fix and, for a
    /// number, its range).
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
        // Each duration is bounded on both sides where it becomes one: a deadline never
        // overflows, and the lease leaves a third of itself above the 0.5 s a cancelled tool
        // is given to answer (keel_app::worker::MIN_LEASE_TTL).
        for (name, value, min, max) in [
            ("max_body_bytes", self.max_body_bytes as u64, 1024, 1 << 30),
            ("request_timeout_ms", self.request_timeout_ms, 100, HOUR_MS),
            ("stream_timeout_ms", self.stream_timeout_ms, 1000, DAY_MS),
            ("shutdown_grace_ms", self.shutdown_grace_ms, 0, HOUR_MS),
            ("lease_ttl_ms", self.lease_ttl_ms, 2000, DAY_MS),
            ("max_attempts", u64::from(self.max_attempts), 1, 1000),
            ("retry_base_ms", self.retry_base_ms, 1, HOUR_MS),
        ] {
            if value < min || value > max {
                out.push((
                    key(&["server", name]),
                    format!("`server.{name}` must be within [{min}, {max}], not {value}"),
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
        if let Some(url) = &self.public_url
            && let Err(problem) = parse_public_url(url)
        {
            out.push((
                key(&["server", "public_url"]),
                format!(
                    "`server.public_url` = {url:?} {problem}: use the URL clients reach the \
                     server at, scheme://host[:port][/path], e.g. https://agents.example"
                ),
            ));
        }
        for host in &self.allowed_hosts {
            if host != "*" && parse_host(host).is_none() {
                out.push((
                    key(&["server", "allowed_hosts"]),
                    format!(
                        "`server.allowed_hosts`: {host:?} is not a host name: write a `Host` \
                         header value, `name` or `name:port` (no scheme, no path), e.g. \
                         \"agents.example\", or \"*\" for any"
                    ),
                ));
            }
        }
        for (tenant, settings) in &self.tenants {
            if !valid_tenant(tenant) {
                out.push((
                    key(&["server", "tenants", tenant]),
                    format!(
                        "`server.tenants.{tenant}`: a tenant name is 1 to 64 lowercase letters, \
                         digits, `_` or `-`, starting with a letter or digit"
                    ),
                ));
            }
            for (name, entry) in &settings.credentials {
                out.extend(credential_shape_problems(tenant, name, entry));
            }
        }
        out
    }
}

impl ServerConfig {
    /// What keeps a server listening on `bound` from serving (`keel serve` checks it at
    /// start-up; keel.toml itself may name any address): without `public_url`, only a
    /// loopback address may serve, because the A2A cards' URLs would otherwise have to
    /// come from requests' `Host` headers, which a client chooses.
    pub fn serving_problems(&self, bound: SocketAddr) -> Vec<String> {
        if self.public_url.is_none() && !bound.ip().is_loopback() {
            return vec![format!(
                "serving on {bound}, which is not a loopback address, needs `[server] \
                 public_url` in keel.toml: the URL clients reach the server at (e.g. \
                 public_url = \"https://agents.example\"), which the A2A cards name and the \
                 Host check accepts"
            )];
        }
        Vec::new()
    }

    /// The base URL the server names itself by (A2A cards): `public_url` without its
    /// trailing `/`, else `http://<bound>`.
    pub fn base_url(&self, bound: SocketAddr) -> String {
        match &self.public_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => format!("http://{bound}"),
        }
    }

    /// `public_url`'s host and port (the scheme's default port when none is written), as
    /// a `Host` header names them (lowercase; an IPv6 address in brackets).
    pub fn public_host(&self) -> Option<(String, u16)> {
        self.public_url
            .as_deref()
            .and_then(|url| parse_public_url(url).ok())
    }
}

/// `scheme://host[:port][/path]` of `http` or `https`, without user info, query or
/// fragment: its host (lowercase) and port.
fn parse_public_url(url: &str) -> Result<(String, u16), &'static str> {
    let (rest, default_port) = if let Some(rest) = url.strip_prefix("https://") {
        (rest, 443)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (rest, 80)
    } else {
        return Err("does not start with http:// or https://");
    };
    if url.contains(['?', '#']) {
        return Err("has a query or fragment");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err("has user info");
    }
    let (host, port) = parse_host(authority).ok_or("has no valid host[:port]")?;
    Ok((host, port.unwrap_or(default_port)))
}

/// A `Host` header value (`name`, `name:port`, `1.2.3.4:port`, `[::1]:port`) as its host
/// (lowercase) and port; `None` when it is not one.
pub fn parse_host(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            other => Some(other.strip_prefix(':')?.parse::<u16>().ok()?),
        };
        (format!("[{inside}]"), port)
    } else {
        let (host, port) = match value.rsplit_once(':') {
            Some((host, port)) => (host, Some(port.parse::<u16>().ok()?)),
            None => (value, None),
        };
        let label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if host.is_empty() || host.len() > 253 || !host.split('.').all(label) {
            return None;
        }
        (host.to_string(), port)
    };
    Some((host.to_ascii_lowercase(), port))
}

/// What is wrong with `[server.tenants.<tenant>.credentials] <name> = entry` on its own.
/// Values are never echoed: a misplaced one may be a secret.
fn credential_shape_problems(
    tenant: &str,
    name: &str,
    entry: &CredentialRef,
) -> Vec<(Vec<String>, String)> {
    let shown = format!("server.tenants.{tenant}.credentials.{name}");
    let at = |extra: &[&str]| {
        let mut path: Vec<String> = ["server", "tenants", tenant, "credentials", name]
            .iter()
            .map(|p| (*p).to_string())
            .collect();
        path.extend(extra.iter().map(|p| (*p).to_string()));
        path
    };
    let mut out = Vec::new();
    if !valid_env_name(name) {
        out.push((
            at(&[]),
            format!(
                "`{shown}`: a credential name is the variable name a tool's `auth` uses \
                 (letters, digits and `_`, not starting with a digit), e.g. `CRM_TOKEN`"
            ),
        ));
    }
    let example = format!(
        "`{name} = {{ env = \"{}_{name}\" }}` naming the variable that holds {tenant}'s secret, \
         or `{name} = {{ file = \"/run/secrets/{tenant}/{}\" }}`",
        tenant.to_ascii_uppercase().replace('-', "_"),
        name.to_ascii_lowercase()
    );
    if entry.inline {
        out.push((
            at(&[]),
            format!("`{shown}` is a string; secrets never go in keel.toml: write {example}"),
        ));
        return out;
    }
    match (&entry.env, &entry.file) {
        (None, None) => out.push((
            at(&[]),
            format!("`{shown}` needs `env` or `file`: write {example}"),
        )),
        (Some(_), Some(_)) => out.push((
            at(&[]),
            format!("`{shown}` has both `env` and `file`; keep one"),
        )),
        (Some(var), None) if !valid_env_name(var) => out.push((
            at(&["env"]),
            format!(
                "`{shown}.env` is not an environment variable name: name the variable holding \
                 {tenant}'s secret (letters, digits and `_`, e.g. \"{}_{name}\"), never the \
                 secret itself",
                tenant.to_ascii_uppercase().replace('-', "_")
            ),
        )),
        (None, Some(file)) if file.trim().is_empty() => out.push((
            at(&["file"]),
            format!("`{shown}.file` is empty: give the path of the file holding {tenant}'s secret"),
        )),
        _ => {}
    }
    for tool in &entry.tools {
        if !keel_core::tool::is_snake_case_name(tool) {
            out.push((
                at(&["tools"]),
                format!(
                    "`{shown}.tools`: {tool:?} is not a tool name (lowercase_snake_case, e.g. \
                     \"crm_lookup\")"
                ),
            ));
        }
    }
    out
}

/// Every `[server.tenants.<tenant>.credentials]` entry naming a variable that holds one of
/// the server's own secrets — a model provider's API key (`OPENAI_API_KEY`,
/// `ANTHROPIC_API_KEY`, `OPENROUTER_API_KEY`, any `providers.<name>.api_key_env`) or the
/// store URL (`KEEL_STORE`) — as (key path, message): a tool must never receive those.
pub fn credential_problems(config: &KeelConfig) -> Vec<(Vec<String>, String)> {
    let reserved = server_secret_vars(config);
    let mut out = Vec::new();
    for (tenant, settings) in &config.server.tenants {
        for (name, entry) in &settings.credentials {
            let Some(var) = &entry.env else { continue };
            if let Some((_, what)) = reserved.iter().find(|(v, _)| v == var) {
                out.push((
                    ["server", "tenants", tenant, "credentials", name, "env"]
                        .iter()
                        .map(|p| (*p).to_string())
                        .collect(),
                    format!(
                        "`server.tenants.{tenant}.credentials.{name}.env` = \"{var}\" is {what}, \
                         the server's own secret: a tool must never receive it. Put {tenant}'s \
                         own secret in another variable (e.g. \"{}_{name}\") and name that",
                        tenant.to_ascii_uppercase().replace('-', "_")
                    ),
                ));
            }
        }
    }
    out
}

/// The variables holding the server's own secrets, with what each is: the API-key
/// variables of the built-in providers and of every `[providers.<name>]`, and `KEEL_STORE`.
pub fn server_secret_vars(config: &KeelConfig) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let providers = BUILTIN_PROVIDERS
        .iter()
        .map(|p| (*p).to_string())
        .chain(config.providers.keys().cloned());
    for provider in providers {
        if let Some(var) = config.api_key_env(&provider)
            && !out.iter().any(|(v, _)| *v == var)
        {
            out.push((var, format!("the API key of model provider `{provider}`")));
        }
    }
    out.push((
        "KEEL_STORE".into(),
        "the store URL (with its password)".into(),
    ));
    out
}

fn valid_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
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
                tokens_per_day: 0,
                open_streams: 32,
                open_streams_per_key: 8,
            }
        );
        assert_eq!(config.limits_for("other").concurrent_runs, 16);
        assert!(config.problems().is_empty());
        assert!(config.allows_agent("anything"));
    }

    #[test]
    fn tenant_credentials_name_where_the_secret_is_never_the_secret() {
        let config: ServerConfig = toml::from_str(
            "[tenants.acme]\nconcurrent_runs = 2\n[tenants.acme.credentials]\n\
             CRM_TOKEN = { env = \"ACME_CRM_TOKEN\" }\n\
             CRM_KEY = { file = \"/run/secrets/acme/crm\", tools = [\"crm_lookup\"] }\n",
        )
        .unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        assert_eq!(config.limits_for("acme").concurrent_runs, 2);
        let acme = &config.tenants["acme"].credentials;
        assert_eq!(acme["CRM_TOKEN"].env.as_deref(), Some("ACME_CRM_TOKEN"));
        assert!(acme["CRM_TOKEN"].allows("anything"));
        assert!(acme["CRM_KEY"].allows("crm_lookup") && !acme["CRM_KEY"].allows("other"));

        let config: ServerConfig = toml::from_str(
            "[tenants.acme.credentials]\nPASTED = \"sk-live-123456789\"\n\
             BAD_ENV = { env = \"sk-live 123456789\" }\nNEITHER = {}\n\
             BOTH = { env = \"A\", file = \"b\" }\n\"bad name\" = { env = \"A\" }\n\
             TOOLS = { env = \"A\", tools = [\"Bad Tool\"] }\n",
        )
        .unwrap();
        let problems = config.problems();
        let keys: Vec<String> = problems.iter().map(|(k, _)| k.join(".")).collect();
        assert_eq!(
            keys,
            [
                "server.tenants.acme.credentials.BAD_ENV.env",
                "server.tenants.acme.credentials.BOTH",
                "server.tenants.acme.credentials.NEITHER",
                "server.tenants.acme.credentials.PASTED",
                "server.tenants.acme.credentials.TOOLS.tools",
                "server.tenants.acme.credentials.bad name",
            ]
        );
        let text = format!("{problems:?} {config:?}");
        assert!(!text.contains("sk-live"), "{text}");
        assert!(
            toml::from_str::<ServerConfig>("[tenants.a.credentials]\nX = { envv = \"A\" }\n")
                .is_err()
        );
    }

    #[test]
    fn public_url_and_allowed_hosts_are_checked_and_parsed() {
        let config: ServerConfig = toml::from_str(
            "public_url = \"https://Agents.Example/keel/\"\nallowed_hosts = [\"a.example\", \
             \"b.example:8443\", \"[::1]:9\", \"*\"]\n",
        )
        .unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        assert_eq!(config.public_host(), Some(("agents.example".into(), 443)));
        let bound: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(config.base_url(bound), "https://Agents.Example/keel");
        assert!(config.serving_problems(bound).is_empty());
        assert_eq!(
            parse_host("B.example:8443"),
            Some(("b.example".into(), Some(8443)))
        );
        assert_eq!(parse_host("[::1]"), Some(("[::1]".into(), None)));
        for bad in ["", "a b", "x:y", "[zz]:1", "a/b", "http://a"] {
            assert_eq!(parse_host(bad), None, "{bad}");
        }

        let config: ServerConfig = toml::from_str(
            "public_url = \"agents.example\"\nallowed_hosts = [\"https://a.example/\"]\n",
        )
        .unwrap();
        let keys: Vec<String> = config.problems().iter().map(|(k, _)| k.join(".")).collect();
        assert_eq!(keys, ["server.public_url", "server.allowed_hosts"]);
        for url in ["http://user@a.example", "https://a.example/?q", "https://"] {
            let config = ServerConfig {
                public_url: Some(url.into()),
                ..ServerConfig::default()
            };
            assert_eq!(config.problems().len(), 1, "{url}");
        }

        let config = ServerConfig::default();
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert!(config.serving_problems(local).is_empty());
        assert_eq!(config.base_url(local), "http://127.0.0.1:4000");
        let refused = config.serving_problems(bound);
        assert!(refused[0].contains("[server] public_url"), "{refused:?}");
    }

    #[test]
    fn bad_values_are_named() {
        let config = ServerConfig {
            bind: "localhost".into(),
            cors_origins: vec!["https://a.example/path".into()],
            tenants: BTreeMap::from([("Acme".into(), TenantConfig::default())]),
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

    #[test]
    fn durations_that_would_overflow_a_deadline_are_refused_with_their_range() {
        let config = ServerConfig {
            shutdown_grace_ms: u64::MAX,
            stream_timeout_ms: u64::MAX,
            request_timeout_ms: u64::MAX,
            lease_ttl_ms: 1_500,
            ..ServerConfig::default()
        };
        let problems = config.problems();
        let messages: Vec<(String, String)> = problems
            .iter()
            .map(|(key, message)| (key.join("."), message.clone()))
            .collect();
        for (key, range) in [
            ("server.request_timeout_ms", "[100, 3600000]"),
            ("server.stream_timeout_ms", "[1000, 86400000]"),
            ("server.shutdown_grace_ms", "[0, 3600000]"),
            ("server.lease_ttl_ms", "[2000, 86400000]"),
        ] {
            assert!(
                messages
                    .iter()
                    .any(|(k, message)| k == key && message.contains(range)),
                "{key} {range}: {messages:?}"
            );
        }
    }
}
