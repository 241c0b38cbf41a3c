//! The name resolver of every client under an [`OutboundPolicy`]: reqwest asks it for
//! the addresses of each host it connects to, so the addresses checked are the ones the
//! connection uses (a second, different answer to the same name — DNS rebinding — is
//! checked again). Hosts written as IP literals never reach a resolver: they are checked
//! by [`OutboundPolicy::check_url`].

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::policy::OutboundPolicy;

/// Resolves names for reqwest, keeping only the addresses `policy` allows; a name left
/// with none fails the connection with [`Refused`](crate::Refused) as the error's
/// source ([`refusal_of`](crate::refusal_of) finds it).
#[derive(Debug, Clone)]
pub struct PolicyResolver {
    policy: OutboundPolicy,
}

impl PolicyResolver {
    /// The resolver of `policy`.
    pub fn new(policy: OutboundPolicy) -> Self {
        Self { policy }
    }
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let addresses = policy.resolve_checked(name.as_str()).await?;
            let sockets: Addrs = Box::new(
                addresses
                    .into_iter()
                    .map(|address| SocketAddr::new(address, 0)),
            );
            Ok(sockets)
        })
    }
}

impl OutboundPolicy {
    /// A reqwest client builder enforcing this policy: names resolve through a
    /// [`PolicyResolver`], and redirects are not followed by reqwest (callers follow them
    /// hop by hop with [`crate::redirect::next_hop`], checking each target, or set
    /// [`crate::redirect::same_origin_policy`]). Callers add their timeouts.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .dns_resolver(PolicyResolver::new(self.clone()))
            .redirect(reqwest::redirect::Policy::none())
    }
}

/// The client of `policy` with `connect_timeout`, shared by every caller asking for an
/// equal policy ([`OutboundPolicy::cache_key`]) and timeout; built on first use. Building a
/// client loads the system's trusted certificates (milliseconds, and a copy of the store
/// per client) and each client keeps its own connection pool, so clients are shared
/// rather than built per tool or per call. A policy with a [`Lookup`](crate::Lookup) gets
/// a client of its own. Redirects are not followed ([`OutboundPolicy::client_builder`]).
pub fn shared_client(
    policy: &OutboundPolicy,
    connect_timeout: std::time::Duration,
) -> Result<reqwest::Client, String> {
    type Clients = std::sync::Mutex<std::collections::HashMap<String, reqwest::Client>>;
    static CLIENTS: std::sync::LazyLock<Clients> = std::sync::LazyLock::new(Default::default);
    let build = || {
        policy
            .client_builder()
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|error| error.to_string())
    };
    let Some(key) = policy.cache_key() else {
        return build();
    };
    let key = format!("{}ms|{key}", connect_timeout.as_millis());
    let mut clients = match CLIENTS.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(client) = clients.get(&key) {
        return Ok(client.clone());
    }
    let client = build()?;
    clients.insert(key, client.clone());
    Ok(client)
}
