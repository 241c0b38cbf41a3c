//! What kind of address an IP is, for deciding whether an outbound call may reach it.
//!
//! [`classify`] sorts every address into one [`AddressClass`]: the public internet, or one
//! of the ranges a request made on behalf of a model or a tenant must not reach without
//! the operator's say-so (the host itself, its private network, the cloud metadata
//! service, ...). IPv4 addresses embedded in IPv6 ones (`::ffff:a.b.c.d`, the NAT64 prefix
//! `64:ff9b::/96`) are classified by the embedded IPv4 address, since that is what a
//! connection to them reaches. std's `Ipv4Addr`/`Ipv6Addr` predicates are used where they
//! are stable; the other ranges are [`ipnet`] networks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;

/// The class of an address. Everything but [`Public`](Self::Public) is refused unless
/// the operator allows it ([`crate::OutboundPolicy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// A routable internet address.
    Public,
    /// The host itself: 127.0.0.0/8, `::1`.
    Loopback,
    /// A private network: 10/8, 172.16/12, 192.168/16 (RFC 1918), unique local
    /// `fc00::/7`, deprecated site-local `fec0::/10`.
    Private,
    /// Link-local: 169.254/16, `fe80::/10`.
    LinkLocal,
    /// A cloud instance metadata service: 169.254.169.254 (AWS, GCP, Azure, ...),
    /// `fd00:ec2::254` (AWS over IPv6), 100.100.100.200 (Alibaba Cloud).
    Metadata,
    /// Carrier-grade NAT shared space: 100.64/10 (RFC 6598).
    SharedAddressSpace,
    /// "This host": 0.0.0.0/8, `::` (connecting to it reaches the host itself).
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// Multicast: 224/4, `ff00::/8`.
    Multicast,
    /// Documentation and benchmarking ranges: 192.0.2/24, 198.51.100/24, 203.0.113/24,
    /// 198.18/15, `2001:db8::/32`.
    Documentation,
    /// Reserved or special-purpose: 240/4, 192.0.0/24, `100::/64`, `2001::/23`,
    /// IPv4-compatible `::a.b.c.d`.
    Reserved,
}

impl AddressClass {
    /// The class as written in errors and `details` (`loopback`, `cloud metadata`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::Metadata => "cloud metadata",
            Self::SharedAddressSpace => "shared (carrier-grade NAT)",
            Self::Unspecified => "unspecified",
            Self::Broadcast => "broadcast",
            Self::Multicast => "multicast",
            Self::Documentation => "documentation",
            Self::Reserved => "reserved",
        }
    }

    /// Whether the class is the public internet.
    pub fn is_public(self) -> bool {
        self == Self::Public
    }
}

impl std::fmt::Display for AddressClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);
const SHARED_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(100, 64, 0, 0), 10);
const THIS_NETWORK_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(0, 0, 0, 0), 8);
const BENCHMARK_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 15);
const RESERVED_V4: [Ipv4Net; 2] = [
    Ipv4Net::new_assert(Ipv4Addr::new(240, 0, 0, 0), 4),
    Ipv4Net::new_assert(Ipv4Addr::new(192, 0, 0, 0), 24),
];
const NAT64_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
const COMPATIBLE_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::UNSPECIFIED, 96);
const SITE_LOCAL_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10);
const DOCUMENTATION_V6: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0x0db8, 0, 0, 0, 0, 0, 0), 32);
const RESERVED_V6: [Ipv6Net; 2] = [
    // Discard-only.
    Ipv6Net::new_assert(Ipv6Addr::new(0x0100, 0, 0, 0, 0, 0, 0, 0), 64),
    // IETF protocol assignments (Teredo, ORCHID, ...).
    Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23),
];

/// The class of `address` (an IPv4 address embedded in an IPv6 one is classified as
/// itself).
pub fn classify(address: IpAddr) -> AddressClass {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    if METADATA_V4.contains(&ip) {
        AddressClass::Metadata
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_private() {
        AddressClass::Private
    } else if ip.is_link_local() {
        AddressClass::LinkLocal
    } else if SHARED_V4.contains(&ip) {
        AddressClass::SharedAddressSpace
    } else if ip.is_unspecified() || THIS_NETWORK_V4.contains(&ip) {
        AddressClass::Unspecified
    } else if ip.is_broadcast() {
        AddressClass::Broadcast
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if ip.is_documentation() || BENCHMARK_V4.contains(&ip) {
        AddressClass::Documentation
    } else if RESERVED_V4.iter().any(|net| net.contains(&ip)) {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    if NAT64_V6.contains(&ip) {
        let [.., a, b, c, d] = ip.octets();
        return classify_v4(Ipv4Addr::new(a, b, c, d));
    }
    if ip == METADATA_V6 {
        AddressClass::Metadata
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_unspecified() {
        AddressClass::Unspecified
    } else if COMPATIBLE_V6.contains(&ip) {
        AddressClass::Reserved
    } else if ip.is_unique_local() || SITE_LOCAL_V6.contains(&ip) {
        AddressClass::Private
    } else if ip.is_unicast_link_local() {
        AddressClass::LinkLocal
    } else if ip.is_multicast() {
        AddressClass::Multicast
    } else if DOCUMENTATION_V6.contains(&ip) {
        AddressClass::Documentation
    } else if RESERVED_V6.iter().any(|net| net.contains(&ip)) {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn class(text: &str) -> AddressClass {
        classify(text.parse().unwrap())
    }

    #[test]
    fn every_special_range_has_its_class() {
        use AddressClass::*;
        let cases = [
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("::1", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("fd12:3456::1", Private),
            ("fc00::1", Private),
            ("fec0::1", Private),
            ("169.254.1.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("fd00:ec2::254", Metadata),
            ("100.100.100.200", Metadata),
            ("100.64.0.1", SharedAddressSpace),
            ("100.127.255.254", SharedAddressSpace),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("::", Unspecified),
            ("255.255.255.255", Broadcast),
            ("224.0.0.1", Multicast),
            ("ff02::1", Multicast),
            ("192.0.2.1", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.9", Documentation),
            ("198.18.0.1", Documentation),
            ("2001:db8::1", Documentation),
            ("240.0.0.1", Reserved),
            ("192.0.0.8", Reserved),
            ("100::1", Reserved),
            ("::7f00:1", Reserved),
            ("8.8.8.8", Public),
            ("1.1.1.1", Public),
            ("172.32.0.1", Public),
            ("100.128.0.1", Public),
            ("2606:4700:4700::1111", Public),
        ];
        for (text, expected) in cases {
            assert_eq!(class(text), expected, "{text}");
        }
    }

    #[test]
    fn embedded_ipv4_is_classified_as_itself() {
        assert_eq!(class("::ffff:127.0.0.1"), AddressClass::Loopback);
        assert_eq!(class("::ffff:169.254.169.254"), AddressClass::Metadata);
        assert_eq!(class("::ffff:10.0.0.1"), AddressClass::Private);
        assert_eq!(class("::ffff:8.8.8.8"), AddressClass::Public);
        assert_eq!(class("64:ff9b::a9fe:a9fe"), AddressClass::Metadata);
        assert_eq!(class("64:ff9b::7f00:1"), AddressClass::Loopback);
    }
}
