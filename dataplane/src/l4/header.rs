//! The PROXY protocol header weir sends to an L4 upstream (the second `:PROXY` of an entry):
//! v1 (text, what nginx's `proxy_protocol on` sends, so what ingress-nginx users' backends
//! expect) or v2 (binary, `stream-proxy-protocol-version: v2`).

use std::net::{IpAddr, SocketAddr};

/// The v2 signature.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The header announcing a connection from `client` to `local` (weir's listening address).
/// Addresses of mixed families are both written as IPv6 (v4-mapped); v4-mapped addresses of
/// both ends are written as IPv4.
pub fn encode(client: SocketAddr, local: SocketAddr, v2: bool) -> Vec<u8> {
    let (src, dst) = match (client.ip().to_canonical(), local.ip().to_canonical()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
        (s, d) => (IpAddr::V6(v6(s)), IpAddr::V6(v6(d))),
    };
    let (sport, dport) = (client.port(), local.port());
    if !v2 {
        let family = if src.is_ipv4() { "TCP4" } else { "TCP6" };
        return format!("PROXY {family} {src} {dst} {sport} {dport}\r\n").into_bytes();
    }
    let mut out = Vec::with_capacity(16 + 36);
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21); // version 2, PROXY command
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.push(0x11); // AF_INET, STREAM
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            out.push(0x21); // AF_INET6, STREAM
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&sport.to_be_bytes());
    out.extend_from_slice(&dport.to_be_bytes());
    out
}

fn v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proxy::proxy_protocol::read_header;

    #[test]
    fn v1_is_nginx_text() {
        let h = encode("10.1.2.3:5555".parse().unwrap(), "[::ffff:10.0.0.1]:9000".parse().unwrap(), false);
        assert_eq!(h, b"PROXY TCP4 10.1.2.3 10.0.0.1 5555 9000\r\n");
        let h = encode("[2001:db8::1]:5555".parse().unwrap(), "10.0.0.1:9000".parse().unwrap(), false);
        assert_eq!(h, b"PROXY TCP6 2001:db8::1 ::ffff:10.0.0.1 5555 9000\r\n");
    }

    /// What weir sends, weir's own decoder (the one its listeners use) reads back.
    #[tokio::test]
    async fn both_versions_round_trip_through_the_decoder() {
        for client in ["10.1.2.3:5555", "[2001:db8::7]:1"] {
            let client: SocketAddr = client.parse().unwrap();
            for v2 in [false, true] {
                let mut bytes = encode(client, "127.0.0.1:9000".parse().unwrap(), v2);
                bytes.extend_from_slice(b"rest");
                let mut reader = &bytes[..];
                let got = read_header(&mut reader).await.unwrap();
                assert_eq!(got, Some(client), "v2={v2}");
                assert_eq!(reader, b"rest", "nothing past the header is consumed");
            }
        }
    }
}
