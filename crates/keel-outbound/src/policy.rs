//! The outbound policy: which non-public addresses a client may reach.
//!
//! Public addresses are always reachable. Every other [`AddressClass`] — the host itself,
//! its private networks, link-local and cloud metadata addresses — is reachable only
//! through an [`Allow`] entry: a host the operator wrote in keel.toml as the destination
//! of a tool, MCP server or A2A peer ([`OutboundPolicy::allowing_destination`]), or an
//! entry of `[outbound] allow_private` ([`OutboundPolicy::new`]). Anything else — a
//! redirect target, an A2A card's interface on another host, a public name resolving to a
//! private address, a URL whose host came from a model's arguments — is refused with
//! [`Refused`] (`outbound_refused`), naming the host, the address class and the setting
//! that would allow it.
//!
//! Two checks enforce it: [`OutboundPolicy::check_url`] before each request (the only
//! check for URLs whose host is an IP literal, for which no name is resolved), and the
//! [`PolicyResolver`](crate::PolicyResolver) every client of the policy resolves names
//! through, which checks the addresses the connection will actually use — so a name that
//! answers a public address to a first lookup and a private one to the next (DNS
//! rebinding) is still refused.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use serde_json::{Value, json};

use crate::address::{AddressClass, classify};

/// The keel.toml setting that allows more non-public destinations, as errors name it.
pub const SETTING: &str = "[outbound] allow_private";

/// Name resolution overrides, consulted before the system resolver: the addresses of a
/// name, or `None` to resolve it normally. For tests (no test may depend on real DNS) and
/// for embedders with their own name service.
pub type Lookup = Arc<dyn Fn(&str) -> Option<Vec<IpAddr>> + Send + Sync>;

/// One allowed non-public destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Allow {
    /// A host name (lowercase, without a trailing dot), at any port or at one port. The
    /// name may resolve to any address.
    Host {
        /// The name.
        name: String,
        /// The only port allowed, when set.
        port: Option<u16>,
    },
    /// One address as a URL names it (`http://10.1.2.3:8080/`), at any port or at one
    /// port: a configured destination written as an IP, or an `address:port` entry. A
    /// name that resolves to the address is not allowed by it.
    Address {
        /// The address.
        ip: IpAddr,
        /// The only port allowed, when set.
        port: Option<u16>,
    },
    /// A network or single address (`10.0.0.0/8`, `127.0.0.1`), at any port: URLs naming
    /// an address in it, and names resolving into it.
    Net {
        /// The network.
        net: IpNet,
    },
}

fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Allow {
    /// Parses an `allow_private` entry: `host`, `host:port`, an IP address (`10.1.2.3`,
    /// `::1`, `[::1]`), `address:port` (`10.1.2.3:8080`, `[fd00::1]:8080`) or a network
    /// (`10.0.0.0/8`, `fd00::/8`). The error says what is wrong and how to write it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let entry = text.trim();
        if entry.is_empty() {
            return Err(
                "is empty; write a host (`db.internal`), `host:port` or a network (`10.0.0.0/8`)"
                    .into(),
            );
        }
        if entry.contains("://") {
            return Err(format!(
                "`{entry}` is a URL; write only its host (and port), e.g. `db.internal:8080`"
            ));
        }
        if entry.contains('*') {
            return Err(format!(
                "`{entry}`: wildcards are not supported; list each host, or the network its addresses are in (`10.0.0.0/8`)"
            ));
        }
        if entry.contains('/') {
            return entry
                .parse::<IpNet>()
                .map(|net| Self::Net { net: net.trunc() })
                .map_err(|_| {
                    format!("`{entry}` is not a network; write it as `10.0.0.0/8` or `fd00::/8`")
                });
        }
        if let Ok(ip) = entry
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(Self::Net {
                net: IpNet::from(ip),
            });
        }
        if let Ok(socket) = entry.parse::<SocketAddr>() {
            return Ok(Self::Address {
                ip: socket.ip(),
                port: Some(socket.port()),
            });
        }
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) => {
                let port = port.parse::<u16>().map_err(|_| {
                    format!("`{entry}`: `{port}` is not a port; write `host:port`, e.g. `db.internal:8080`")
                })?;
                (host, Some(port))
            }
            None => (entry, None),
        };
        match url::Host::parse(host) {
            Ok(url::Host::Domain(name)) if !name.is_empty() && !name.contains(':') => {
                Ok(Self::Host {
                    name: normalize_name(&name),
                    port,
                })
            }
            Ok(url::Host::Ipv4(ip)) => Ok(Self::literal(IpAddr::V4(ip), port)),
            Ok(url::Host::Ipv6(ip)) => Ok(Self::literal(IpAddr::V6(ip), port)),
            _ => Err(format!(
                "`{entry}` is not a host name, address or network; write `db.internal`, `db.internal:8080`, `10.1.2.3` or `10.0.0.0/8`"
            )),
        }
    }

    /// An address entry: with a port, for URLs naming it; without, the address as a
    /// network of one.
    fn literal(ip: IpAddr, port: Option<u16>) -> Self {
        match port {
            Some(_) => Self::Address { ip, port },
            None => Self::Net {
                net: IpNet::from(ip),
            },
        }
    }

    fn port_matches(port: Option<u16>, wanted: Option<u16>) -> bool {
        match (port, wanted) {
            (None, _) => true,
            (Some(allowed), Some(wanted)) => allowed == wanted,
            (Some(_), None) => false,
        }
    }

    /// Whether the entry allows `ip`: named by a URL at `port` (`literal`), or resolved
    /// from a name (then only networks apply: the port is the connection's).
    fn allows_ip(&self, ip: IpAddr, port: Option<u16>, literal: bool) -> bool {
        match self {
            Self::Net { net } => net.contains(&ip),
            Self::Address {
                ip: allowed,
                port: allowed_port,
            } => literal && *allowed == ip && Self::port_matches(*allowed_port, port),
            Self::Host { .. } => false,
        }
    }
}

impl std::fmt::Display for Allow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host { name, port: None } => f.write_str(name),
            Self::Host {
                name,
                port: Some(port),
            } => write!(f, "{name}:{port}"),
            Self::Address { ip, port: None } => write!(f, "{ip}"),
            Self::Address {
                ip: IpAddr::V6(ip),
                port: Some(port),
            } => write!(f, "[{ip}]:{port}"),
            Self::Address {
                ip,
                port: Some(port),
            } => write!(f, "{ip}:{port}"),
            Self::Net { net } if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())
            }
            Self::Net { net } => write!(f, "{net}"),
        }
    }
}

/// An `allow_private` entry that does not parse: its position and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SETTING}[{index}] {message}")]
pub struct InvalidAllow {
    /// The entry's index in the list.
    pub index: usize,
    /// What is wrong, and how to write it.
    pub message: String,
}

/// A request refused by the policy: `outbound_refused`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    /// The host as the URL names it (a name or an address).
    pub host: String,
    /// The refused address (the host itself when it is an IP literal).
    pub address: IpAddr,
    /// The port of the request, when known.
    pub port: Option<u16>,
    /// The address's class.
    pub class: AddressClass,
}

impl Refused {
    /// The error code, in `details.error` of tool errors.
    pub const CODE: &'static str = "outbound_refused";

    /// The entry that would allow the request, for `allow_private`.
    pub fn allow_entry(&self) -> String {
        self.host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    }

    /// The machine-readable form, for a tool error's `details`.
    pub fn details(&self) -> Value {
        json!({
            "error": Self::CODE,
            "host": self.host,
            "address": self.address.to_string(),
            "address_class": self.class.as_str(),
            "setting": SETTING,
            "allow": self.allow_entry(),
        })
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let literal = self.allow_entry() == self.address.to_string();
        let what = if literal {
            format!("`{}` is a {} address", self.host, self.class)
        } else {
            format!(
                "`{}` resolves to {}, a {} address",
                self.host, self.address, self.class
            )
        };
        write!(
            f,
            "{}: {what}; outbound calls reach only public addresses unless keel.toml names \
             the host (as a tool's, MCP server's or A2A agent's url, or in {SETTING} = [\"{}\"])",
            Self::CODE,
            self.allow_entry()
        )
    }
}

/// Which non-public destinations a client may reach (see the [module](self) docs).
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct OutboundPolicy {
    allow: Arc<Vec<Allow>>,
    lookup: Option<Lookup>,
}

impl std::fmt::Debug for OutboundPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundPolicy")
            .field(
                "allow",
                &self
                    .allow
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            )
            .field("lookup", &self.lookup.is_some())
            .finish()
    }
}

impl OutboundPolicy {
    /// The policy of `[outbound] allow_private` (public addresses plus these entries).
    pub fn new(
        allow_private: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<Self, InvalidAllow> {
        let mut allow = Vec::new();
        for (index, entry) in allow_private.into_iter().enumerate() {
            let parsed =
                Allow::parse(entry.as_ref()).map_err(|message| InvalidAllow { index, message })?;
            if !allow.contains(&parsed) {
                allow.push(parsed);
            }
        }
        Ok(Self {
            allow: Arc::new(allow),
            lookup: None,
        })
    }

    /// This policy and `entry`.
    #[must_use]
    pub fn allowing(&self, entry: Allow) -> Self {
        let mut allow = (*self.allow).clone();
        if !allow.contains(&entry) {
            allow.push(entry);
        }
        Self {
            allow: Arc::new(allow),
            lookup: self.lookup.clone(),
        }
    }

    /// This policy and the host of `url`, a destination the operator configured (a tool's,
    /// MCP server's or A2A agent's `url`): the host is allowed at any port — a name
    /// whatever it resolves to, an address as URLs name it (not names resolving to it). A
    /// URL that does not parse, or whose host is a `{placeholder}` filled at call time,
    /// adds nothing.
    #[must_use]
    pub fn allowing_destination(&self, url: &str) -> Self {
        let Some(host) = destination_host(url) else {
            return self.clone();
        };
        let entry = match host {
            url::Host::Domain(name) => Allow::Host {
                name: normalize_name(&name),
                port: None,
            },
            url::Host::Ipv4(ip) => Allow::Address {
                ip: IpAddr::V4(ip),
                port: None,
            },
            url::Host::Ipv6(ip) => Allow::Address {
                ip: IpAddr::V6(ip),
                port: None,
            },
        };
        self.allowing(entry)
    }

    /// Resolves names through `lookup` first (see [`Lookup`]).
    #[must_use]
    pub fn with_lookup(mut self, lookup: Lookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// The allowed non-public destinations.
    pub fn allowed(&self) -> &[Allow] {
        &self.allow
    }

    /// A key equal for policies that decide alike (`None` with a [`Lookup`], which cannot
    /// be compared): clients may be shared between policies with the same key.
    pub fn cache_key(&self) -> Option<String> {
        if self.lookup.is_some() {
            return None;
        }
        let mut entries: Vec<String> = self.allow.iter().map(|e| format!("{e:?}")).collect();
        entries.sort();
        Some(entries.join(","))
    }

    /// Whether `name` is allowed by name (at some port): its addresses are then not
    /// checked by the resolver.
    pub(crate) fn allows_name(&self, name: &str) -> bool {
        let name = normalize_name(name);
        self.allow
            .iter()
            .any(|entry| matches!(entry, Allow::Host { name: allowed, .. } if *allowed == name))
    }

    /// Whether `name` is allowed at `port` (`None` for "at some port").
    fn allows_name_at(&self, name: &str, port: Option<u16>) -> bool {
        let name = normalize_name(name);
        self.allow.iter().any(|entry| {
            matches!(entry, Allow::Host { name: allowed, port: allowed_port }
                if *allowed == name && Allow::port_matches(*allowed_port, port))
        })
    }

    /// Checks one address `host` stands for: the host itself when `literal` (an IP in
    /// the URL, at `port`), else an address `host` resolved to.
    pub fn check_address(
        &self,
        host: &str,
        address: IpAddr,
        port: Option<u16>,
        literal: bool,
    ) -> Result<(), Refused> {
        let class = classify(address);
        if class.is_public()
            || self
                .allow
                .iter()
                .any(|e| e.allows_ip(address, port, literal))
        {
            return Ok(());
        }
        Err(Refused {
            host: host.to_string(),
            address,
            port,
            class,
        })
    }

    /// Checks a URL before a request is sent to it: an IP-literal host is checked here
    /// (no name is resolved for it); a name allowed only at other ports must resolve to
    /// public addresses. Other names are checked when they are resolved
    /// ([`PolicyResolver`](crate::PolicyResolver)).
    pub async fn check_url(&self, url: &url::Url) -> Result<(), Refused> {
        let port = url.port_or_known_default();
        match url.host() {
            None => Ok(()),
            Some(url::Host::Ipv4(ip)) => {
                self.check_address(&ip.to_string(), IpAddr::V4(ip), port, true)
            }
            Some(url::Host::Ipv6(ip)) => {
                self.check_address(&format!("[{ip}]"), IpAddr::V6(ip), port, true)
            }
            Some(url::Host::Domain(name)) => {
                if !self.allows_name(name) || self.allows_name_at(name, port) {
                    return Ok(());
                }
                // Allowed at another port only: at this one it is an ordinary name. The
                // connection's own resolution lets the name through (it cannot see the
                // port), so its addresses are checked here; a rebinding window remains only
                // for a name the operator listed, whose DNS they trust.
                for address in self.resolve(name).await.unwrap_or_default() {
                    self.check_address(name, address, port, false)?;
                }
                Ok(())
            }
        }
    }

    /// [`check_url`](Self::check_url), and for a name not allowed by name, its
    /// resolution too: refused when none of its addresses is allowed. For a clear error
    /// before a client whose errors lose their cause (the connection's own resolution,
    /// [`PolicyResolver`](crate::PolicyResolver), remains the check that counts).
    pub async fn check_resolved(&self, url: &url::Url) -> Result<(), Refused> {
        self.check_url(url).await?;
        if let Some(url::Host::Domain(name)) = url.host()
            && !self.allows_name(name)
            && let Err(error) = self.resolve_checked(name).await
            && let Some(refused) = error.downcast_ref::<Refused>()
        {
            return Err(Refused {
                port: url.port_or_known_default(),
                ..refused.clone()
            });
        }
        Ok(())
    }

    /// The addresses of `name`: the [`Lookup`]'s, else the system resolver's.
    pub(crate) async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        if let Some(addresses) = self.lookup.as_ref().and_then(|lookup| lookup(name)) {
            return Ok(addresses);
        }
        let found = tokio::net::lookup_host((name, 0)).await?;
        Ok(found.map(|socket| socket.ip()).collect())
    }

    /// The addresses of `name` the policy lets a connection use: all of them for a name
    /// allowed by name, else those that are public or allowed; [`Refused`] (naming the
    /// first refused address) when none is left.
    pub(crate) async fn resolve_checked(
        &self,
        name: &str,
    ) -> Result<Vec<IpAddr>, Box<dyn std::error::Error + Send + Sync>> {
        let addresses = self.resolve(name).await?;
        if self.allows_name(name) {
            return Ok(addresses);
        }
        let mut refused = None;
        let mut kept = Vec::new();
        for address in addresses {
            match self.check_address(name, address, None, false) {
                Ok(()) => kept.push(address),
                Err(error) => {
                    refused.get_or_insert(error);
                }
            }
        }
        match (kept.is_empty(), refused) {
            (true, Some(refused)) => Err(Box::new(refused)),
            _ => Ok(kept),
        }
    }
}

/// The host of a configured destination, unless it is missing or a placeholder.
fn destination_host(url: &str) -> Option<url::Host<String>> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = authority.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('{') {
        return None;
    }
    url::Url::parse(url)
        .ok()
        .and_then(|parsed| parsed.host().map(|host| host.to_owned()))
}

/// The [`Refused`] behind an error, if the policy caused it (a reqwest error carries the
/// resolver's refusal as its source).
pub fn refusal_of(error: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused.clone());
        }
        current = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn entries_parse_as_hosts_addresses_and_networks() {
        let shown = |text: &str| Allow::parse(text).unwrap().to_string();
        assert_eq!(shown("DB.Internal."), "db.internal");
        assert_eq!(shown("db.internal:8080"), "db.internal:8080");
        assert_eq!(shown("10.0.0.0/8"), "10.0.0.0/8");
        assert_eq!(shown("10.1.2.3/8"), "10.0.0.0/8");
        assert_eq!(shown("127.0.0.1"), "127.0.0.1");
        assert_eq!(shown("127.0.0.1:9000"), "127.0.0.1:9000");
        assert_eq!(shown("[::1]"), "::1");
        assert!(matches!(
            Allow::parse("127.0.0.1:9000"),
            Ok(Allow::Address { .. })
        ));
        assert!(matches!(Allow::parse("127.0.0.1"), Ok(Allow::Net { .. })));
        assert_eq!(shown("[fd00::1]:8080"), "[fd00::1]:8080");
        assert_eq!(shown("fd00::/8"), "fd00::/8");
        for bad in [
            "",
            "http://db.internal",
            "*.internal",
            "db:port",
            "10.0.0.0/99",
            "a b",
        ] {
            assert!(Allow::parse(bad).is_err(), "{bad:?}");
        }
        let error = OutboundPolicy::new(["ok.internal", "http://x"]).unwrap_err();
        assert_eq!(error.index, 1);
        assert!(
            error
                .to_string()
                .starts_with("[outbound] allow_private[1] ")
        );
    }

    #[tokio::test]
    async fn literal_addresses_need_an_entry_matching_address_and_port() {
        let policy = OutboundPolicy::new(["10.0.0.0/8", "127.0.0.1:9000"]).unwrap();
        let check = |text: &str| {
            let url = url::Url::parse(text).unwrap();
            let policy = policy.clone();
            async move { policy.check_url(&url).await }
        };
        assert!(check("http://10.9.8.7:1234/x").await.is_ok());
        assert!(check("http://127.0.0.1:9000/x").await.is_ok());
        assert!(check("https://93.184.215.14/").await.is_ok());
        let refused = check("http://127.0.0.1:9001/x").await.unwrap_err();
        assert_eq!(refused.class, AddressClass::Loopback);
        let metadata = check("http://169.254.169.254/latest/meta-data/")
            .await
            .unwrap_err();
        assert_eq!(metadata.class, AddressClass::Metadata);
        assert!(metadata.to_string().contains("[outbound] allow_private"));
        assert_eq!(metadata.details()["error"], "outbound_refused");
        let mapped = check("http://[::ffff:169.254.169.254]/").await.unwrap_err();
        assert_eq!(mapped.class, AddressClass::Metadata);
        // WHATWG host parsing: these are all 127.0.0.1.
        for text in ["http://2130706433/", "http://0x7f.1/", "http://127.1/"] {
            assert_eq!(
                check(text).await.unwrap_err().class,
                AddressClass::Loopback,
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn names_resolve_through_the_policy() {
        let lookup: Lookup = Arc::new(|name: &str| match name {
            "rebind.example" => Some(vec!["127.0.0.1".parse().unwrap()]),
            "mixed.example" => Some(vec![
                "10.0.0.5".parse().unwrap(),
                "93.184.215.14".parse().unwrap(),
            ]),
            "db.internal" => Some(vec!["10.0.0.7".parse().unwrap()]),
            _ => Some(Vec::new()),
        });
        let policy = OutboundPolicy::default()
            .with_lookup(lookup)
            .allowing(Allow::parse("db.internal:5432").unwrap());
        let error = policy.resolve_checked("rebind.example").await.unwrap_err();
        let refused = error.downcast_ref::<Refused>().unwrap();
        assert_eq!(refused.class, AddressClass::Loopback);
        assert_eq!(refused.host, "rebind.example");
        assert!(refused.to_string().contains("resolves to 127.0.0.1"));
        assert_eq!(
            policy.resolve_checked("mixed.example").await.unwrap(),
            vec!["93.184.215.14".parse::<IpAddr>().unwrap()]
        );
        assert!(policy.resolve_checked("db.internal").await.is_ok());
        let at = |text: &str| url::Url::parse(text).unwrap();
        assert!(
            policy
                .check_url(&at("postgres://db.internal:5432/"))
                .await
                .is_ok()
        );
        assert!(
            policy
                .check_url(&at("http://db.internal:6379/"))
                .await
                .is_err()
        );
    }

    #[test]
    fn configured_destinations_are_allowed_by_host_unless_templated() {
        let policy = OutboundPolicy::default()
            .allowing_destination("http://127.0.0.1:8787/releases/{id}")
            .allowing_destination("http://{host}/x")
            .allowing_destination("https://Agents.Local./a2a");
        let shown: Vec<String> = policy.allowed().iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["127.0.0.1", "agents.local"]);
        assert!(policy.allows_name("agents.local"));
        // The configured address is allowed as URLs name it, not for names resolving to it.
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(
            policy
                .check_address("127.0.0.1", loopback, Some(1), true)
                .is_ok()
        );
        assert!(
            policy
                .check_address("x.example", loopback, None, false)
                .is_err()
        );
        let listed = OutboundPolicy::new(["127.0.0.1"]).unwrap();
        assert!(
            listed
                .check_address("x.example", loopback, None, false)
                .is_ok()
        );
        assert_ne!(
            policy.cache_key(),
            OutboundPolicy::new(["127.0.0.1", "agents.local"])
                .unwrap()
                .cache_key()
        );
    }
}
