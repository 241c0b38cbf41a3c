//! One `reqwest::Client` per distinct client configuration, shared by every model of this
//! process that uses it. A client holds the connection pool and the TLS configuration
//! (whose root store is read from the OS on build, hundreds of files): building one per
//! agent — which `keel serve` and workers do for every run — cost ~40% of a server's CPU
//! under load and opened a new connection (a new TLS handshake with a hosted provider) for
//! every run. The cache holds clients weakly: a client, its pool and its idle connections
//! live while some model holds it, and are closed when the last one is dropped (nothing
//! outlives the agents — the soak test checks that tasks and descriptors return to their
//! level). Keys are `(connect timeout, idle timeout, proxy use)`; dead entries are pruned
//! on each build. Tested in `tests/connections.rs`.
//!
//! Proxy settings (`HTTPS_PROXY`, …) are read when a configuration's client is built.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// What a provider client is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientSettings {
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response.
    pub idle_timeout: Duration,
    /// Loopback only: never through a proxy.
    pub no_proxy: bool,
}

static CLIENTS: OnceLock<Mutex<HashMap<ClientSettings, Weak<reqwest::Client>>>> = OnceLock::new();

/// The shared client of `settings`: the one some model already holds, else a new one.
pub(crate) fn client(settings: ClientSettings) -> Result<Arc<reqwest::Client>, reqwest::Error> {
    let cache = CLIENTS.get_or_init(|| Mutex::new(HashMap::new()));
    if let Ok(clients) = cache.lock()
        && let Some(client) = clients.get(&settings).and_then(Weak::upgrade)
    {
        return Ok(client);
    }
    // Built outside the lock (it reads the certificate store); two first uses at once
    // build twice and keep one.
    let built = Arc::new(build(settings)?);
    match cache.lock() {
        Ok(mut clients) => {
            clients.retain(|_, client| client.strong_count() > 0);
            if let Some(existing) = clients.get(&settings).and_then(Weak::upgrade) {
                return Ok(existing);
            }
            clients.insert(settings, Arc::downgrade(&built));
            Ok(built)
        }
        // A panic elsewhere while holding the lock: serve unshared rather than fail.
        Err(_) => Ok(built),
    }
}

fn build(settings: ClientSettings) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(settings.connect_timeout)
        .read_timeout(settings.idle_timeout)
        .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")));
    if settings.no_proxy {
        builder = builder.no_proxy();
    }
    builder.build()
}
