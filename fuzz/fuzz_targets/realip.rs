//! The client address behind trusted proxies (`weir_dataplane::route::realip::RealIp`): the
//! `X-Forwarded-For`-style header (any name) on arbitrary values, from trusted or untrusted
//! peers. No panic; an untrusted peer is always the client; the client is the peer or an
//! address written in the header.
#![no_main]

use std::net::IpAddr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir_dataplane::model::{Forwarded, IpNet, canonical_ip};
use weir_dataplane::route::realip::RealIp;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    header: &'a str,
    trusted: Vec<&'a str>,
    peer: IpAddr,
    values: Vec<&'a [u8]>,
}

fuzz_target!(|input: Input<'_>| {
    let settings = Forwarded {
        trust_headers: true,
        client_header: input.header.to_ascii_lowercase(),
        trusted: input.trusted.iter().filter_map(|t| t.parse::<IpNet>().ok()).collect(),
        full_chain: false,
    };
    let Ok(realip) = RealIp::new(&settings) else { return };
    let headers = weir_fuzz::headers(input.values.iter().map(|v| (settings.client_header.as_str(), *v)));
    let client = realip.client(input.peer, &headers);
    let peer = canonical_ip(input.peer);
    if !realip.is_trusted(peer) {
        assert_eq!(client, peer);
    }
    if client != peer {
        let written = headers
            .get_all(settings.client_header.as_str())
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .any(|e| names(e, client));
        assert!(written, "{client} is neither the peer nor in the header");
    }
});

/// Whether the list element `e` is `ip` in one of the forms an address is written in.
fn names(e: &[u8], ip: IpAddr) -> bool {
    let e = String::from_utf8_lossy(e);
    let e = e.trim_matches([' ', '\t']);
    let host = match e.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip(),
        Err(_) => match e.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => return false,
        },
    };
    canonical_ip(host) == ip
}
