//! The Host check against DNS rebinding: a page on `attacker.example` whose name the
//! attacker re-points at 127.0.0.1 reaches a loopback server with `Host:
//! attacker.example`, and the browser treats the answers as that page's own. A server
//! guarded by [`guard_hosts`] answers only the `Host` values it expects — the loopback
//! names, its own address, keel.toml `[server] public_url`'s host and `[server]
//! allowed_hosts` ([`AllowedHosts`]) — and every other request gets `421 Misdirected
//! Request` with `{"error": {"code": "misdirected_host", "message"}}` before any handler
//! runs. `keel ui` and `keel serve` (keel-server) both use it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use keel_config::ServerConfig;
use keel_config::server::parse_host;

/// Names that always mean this machine, on any port (a browser sends them only for pages
/// it loaded from this machine).
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The ports an allowed host name may come with in a `Host` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ports {
    /// Any port, or none.
    Any,
    /// Exactly this one (`None`: the header names no port).
    Only(Option<u16>),
}

/// The `Host` values a server answers (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    /// `"*"` was allowed: every Host is.
    any: bool,
    /// (host as a `Host` header writes it, lowercase; the ports it may come with).
    names: Vec<(String, Ports)>,
    /// Paths answered whatever the Host (health checks, which show no data).
    exempt: Vec<String>,
}

impl AllowedHosts {
    /// The loopback names (`localhost`, `127.0.0.1`, `[::1]`), with or without a port.
    pub fn loopback() -> Self {
        Self {
            names: LOOPBACK_NAMES
                .iter()
                .map(|name| ((*name).to_string(), Ports::Any))
                .collect(),
            ..Self::default()
        }
    }

    /// The loopback names, the addresses the server listens on, `[server] public_url`'s
    /// host and `[server] allowed_hosts`.
    pub fn for_server(config: &ServerConfig, bound: &[SocketAddr]) -> Self {
        let mut hosts = Self::loopback();
        for address in bound {
            hosts = hosts.with_address(*address);
        }
        if let Some((host, port)) = config.public_host() {
            hosts.names.push((host.clone(), Ports::Only(Some(port))));
            // A client may leave out the scheme's default port.
            if port == 80 || port == 443 {
                hosts.names.push((host, Ports::Only(None)));
            }
        }
        for entry in &config.allowed_hosts {
            hosts = hosts.with_name(entry);
        }
        hosts
    }

    /// `address`'s IP, bare or with its port (not an unspecified address such as
    /// `0.0.0.0`: no client names a server by it).
    pub fn with_address(mut self, address: SocketAddr) -> Self {
        if !address.ip().is_unspecified() {
            let host = match address.ip() {
                IpAddr::V4(ip) => ip.to_string(),
                IpAddr::V6(ip) => format!("[{ip}]"),
            };
            self.names
                .push((host.clone(), Ports::Only(Some(address.port()))));
            self.names.push((host, Ports::Only(None)));
        }
        self
    }

    /// One `[server] allowed_hosts` entry: `name` (any port), `name:port`, or `*` (any Host
    /// at all). An entry that is none of these allows nothing (`keel config check` names
    /// it).
    pub fn with_name(mut self, entry: &str) -> Self {
        if entry.trim() == "*" {
            self.any = true;
        } else if let Some((host, port)) = parse_host(entry) {
            let ports = match port {
                Some(port) => Ports::Only(Some(port)),
                None => Ports::Any,
            };
            self.names.push((host, ports));
        }
        self
    }

    /// Answers requests for `path` whatever their Host (e.g. `/healthz`).
    pub fn exempt(mut self, path: &str) -> Self {
        self.exempt.push(path.to_string());
        self
    }

    /// Whether a request with this `Host` header value is answered.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Some((name, port)) = parse_host(host) else {
            return false;
        };
        let ip = ip_of(&name);
        self.names.iter().any(|(allowed, only)| {
            let same = match (ip, ip_of(allowed)) {
                (Some(a), Some(b)) => a == b,
                _ => *allowed == name,
            };
            same && match only {
                Ports::Any => true,
                Ports::Only(only) => *only == port,
            }
        })
    }
}

/// The IP a host names literally (`127.0.0.1`, `[::1]`).
fn ip_of(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

/// `router` behind the Host check of `hosts` (the outermost layer: nothing behind it runs
/// for a refused request).
pub fn guard_hosts<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    hosts: AllowedHosts,
) -> Router<S> {
    router.layer(from_fn_with_state(Arc::new(hosts), check))
}

async fn check(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    if hosts.exempt.iter().any(|p| p == request.uri().path()) {
        return next.run(request).await;
    }
    // HTTP/1.1 requests carry `Host`; an absolute-form target carries its authority.
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_string()));
    match host {
        Some(host) if hosts.allows(&host) => next.run(request).await,
        other => misdirected(other.as_deref()),
    }
}

/// The 421 answer to a request for `host`.
pub fn misdirected(host: Option<&str>) -> Response {
    let shown: String = host
        .unwrap_or("(none)")
        .chars()
        .take(100)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let message = format!(
        "this server does not answer to Host {shown:?} (a guard against DNS rebinding): if \
         clients reach it by that name, add it to `[server] allowed_hosts` in keel.toml (or \
         set `[server] public_url` to the URL they use)"
    );
    let body = serde_json::json!({ "error": { "code": "misdirected_host", "message": message } });
    (
        StatusCode::MISDIRECTED_REQUEST,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn loopback_names_the_bind_address_and_configured_names_are_allowed() {
        let config = ServerConfig {
            public_url: Some("https://agents.example".into()),
            allowed_hosts: vec!["ops.example:9000".into(), "Intra".into()],
            ..ServerConfig::default()
        };
        let hosts = AllowedHosts::for_server(&config, &["10.0.0.5:8080".parse().unwrap()]);
        for ok in [
            "localhost",
            "localhost:8091",
            "127.0.0.1:8080",
            "[::1]:1",
            "[0:0:0:0:0:0:0:1]",
            "10.0.0.5",
            "10.0.0.5:8080",
            "agents.example",
            "agents.example:443",
            "AGENTS.example",
            "ops.example:9000",
            "intra:1234",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:8091",
            "10.0.0.5:8081",
            "agents.example:8443",
            "ops.example",
            "localhost.attacker.example",
            "",
            "a b",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
        assert!(AllowedHosts::loopback().with_name("*").allows("anything"));
        assert!(
            !AllowedHosts::loopback()
                .with_address("0.0.0.0:80".parse().unwrap())
                .allows("0.0.0.0")
        );
    }
}
