//! The client address behind trusted proxies: nginx's realip module with `real_ip_recursive on`,
//! as ingress-nginx configures it for `use-forwarded-headers` and `enable-real-ip`.
//!
//! When the connection's peer is inside the trusted networks (`proxy-real-ip-cidr`), the
//! client-address header (`forwarded-for-header`, `X-Forwarded-For` by default) is read from the
//! right: each trusted address is skipped, and the first untrusted one is the client (the
//! leftmost when all are trusted). A value that is not an address stops the walk at the last
//! good one. An untrusted peer is the client whatever it sends.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName};

use crate::model::{Forwarded, IpNet, canonical_ip};

/// Compiled [`Forwarded`] settings.
#[derive(Clone, Debug)]
pub struct RealIp {
    header: HeaderName,
    trusted: Vec<IpNet>,
    /// Believe the client's `X-Forwarded-Proto`, `-Host` and `-Port` (`use-forwarded-headers`).
    pub trust_headers: bool,
    /// Send the incoming `X-Forwarded-For` with the peer appended (`compute-full-forwarded-for`).
    pub full_chain: bool,
}

impl RealIp {
    /// Compiles the settings; fails when the header name is not a valid HTTP header name.
    pub fn new(settings: &Forwarded) -> Result<RealIp, http::header::InvalidHeaderName> {
        Ok(RealIp {
            header: HeaderName::from_bytes(settings.client_header.as_bytes())?,
            trusted: settings.trusted.clone(),
            trust_headers: settings.trust_headers,
            full_chain: settings.full_chain,
        })
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical_ip(ip);
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The client address of a request from `peer` carrying `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = canonical_ip(peer);
        if !self.is_trusted(client) {
            return client;
        }
        // Later header lines continue the list of earlier ones: walk them last first.
        for value in headers.get_all(&self.header).iter().rev() {
            for element in value.as_bytes().rsplit(|b| *b == b',') {
                let Some(ip) = parse_element(element) else { return client };
                client = ip;
                if !self.is_trusted(ip) {
                    return client;
                }
            }
        }
        client
    }
}

/// One list element: an IP address, optionally with a port (`1.2.3.4:5`, `[2001:db8::1]:5`).
fn parse_element(element: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(element).ok()?.trim_matches([' ', '\t']);
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(canonical_ip(ip));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(canonical_ip(addr.ip()));
    }
    let bracketed = text.strip_prefix('[')?.strip_suffix(']')?;
    bracketed.parse::<std::net::Ipv6Addr>().ok().map(|ip| canonical_ip(IpAddr::V6(ip)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn real_ip(header: &str, trusted: &[&str]) -> RealIp {
        RealIp::new(&Forwarded {
            trust_headers: true,
            client_header: header.into(),
            trusted: trusted.iter().map(|n| n.parse().unwrap()).collect(),
            full_chain: false,
        })
        .unwrap()
    }

    fn client(r: &RealIp, peer: &str, values: &[&str]) -> String {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(r.header.clone(), v.parse().unwrap());
        }
        r.client(peer.parse().unwrap(), &headers).to_string()
    }

    #[test]
    fn an_untrusted_peer_is_the_client() {
        let r = real_ip("x-forwarded-for", &["10.0.0.0/8"]);
        assert_eq!(client(&r, "192.0.2.1", &["203.0.113.7"]), "192.0.2.1");
    }

    #[test]
    fn trusted_addresses_are_skipped_from_the_right() {
        let r = real_ip("x-forwarded-for", &["10.0.0.0/8", "127.0.0.1"]);
        assert_eq!(client(&r, "127.0.0.1", &["203.0.113.7, 198.51.100.2, 10.1.1.1"]), "198.51.100.2");
        // All trusted: the leftmost.
        assert_eq!(client(&r, "127.0.0.1", &["10.0.0.1, 10.0.0.2"]), "10.0.0.1");
        // Several header lines are one list.
        assert_eq!(client(&r, "127.0.0.1", &["203.0.113.7", "10.0.0.9"]), "203.0.113.7");
        // No header: the peer.
        assert_eq!(client(&r, "127.0.0.1", &[]), "127.0.0.1");
    }

    #[test]
    fn garbage_stops_the_walk_at_the_last_good_address() {
        let r = real_ip("x-forwarded-for", &["10.0.0.0/8", "127.0.0.1"]);
        assert_eq!(client(&r, "127.0.0.1", &["unknown"]), "127.0.0.1");
        assert_eq!(client(&r, "127.0.0.1", &["203.0.113.7, nope, 10.0.0.3"]), "10.0.0.3");
    }

    #[test]
    fn ports_brackets_and_mapped_addresses_are_understood() {
        let r = real_ip("cf-connecting-ip", &["0.0.0.0/0"]);
        assert_eq!(client(&r, "::ffff:127.0.0.1", &["203.0.113.7:4711"]), "203.0.113.7");
        let r = real_ip("x-forwarded-for", &["::/0"]);
        assert_eq!(client(&r, "::1", &["[2001:db8::7]:443"]), "2001:db8::7");
        assert_eq!(client(&r, "::1", &["2001:db8::8"]), "2001:db8::8");
        // ingress-nginx's default 0.0.0.0/0 does not trust IPv6 peers.
        let r = real_ip("x-forwarded-for", &["0.0.0.0/0"]);
        assert_eq!(client(&r, "::1", &["203.0.113.7"]), "::1");
    }
}
