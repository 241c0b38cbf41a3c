//! Outbound calls that cannot be turned against the host: one policy for every HTTP
//! request Keel makes on behalf of a model or a tenant — the A2A client, declarative HTTP
//! tools and MCP over HTTP.
//!
//! - [`address`]: the class of an IP address (public, loopback, private, link-local,
//!   cloud metadata, ...), IPv4 embedded in IPv6 classified as itself.
//! - [`policy`]: [`OutboundPolicy`] — public addresses always, other classes only for the
//!   hosts keel.toml names (a configured destination, or `[outbound] allow_private`); a
//!   refusal is [`Refused`] (`outbound_refused`).
//! - [`resolve`]: [`PolicyResolver`], the reqwest resolver enforcing the policy on the
//!   addresses a connection actually uses (DNS rebinding included), and
//!   [`OutboundPolicy::client_builder`].
//! - [`redirect`]: which redirects are followed (same origin by default) and the next hop;
//!   configured secret headers never travel to another origin.
//! - [`excerpt`]: error bodies capped ([`excerpt::ERROR_BODY_CAP`] bytes) and redacted
//!   (configured secrets and anything that looks like a credential) before a model or a
//!   tenant sees them.

pub mod address;
pub mod excerpt;
pub mod policy;
pub mod redirect;
pub mod resolve;

pub use address::{AddressClass, classify};
pub use policy::{Allow, InvalidAllow, Lookup, OutboundPolicy, Refused, SETTING, refusal_of};
pub use redirect::RedirectPolicy;
pub use resolve::PolicyResolver;
