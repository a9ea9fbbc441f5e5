//! Ethernet frames of L2 announcement (pure): parsing ARP requests and IPv6 neighbour
//! solicitations, building ARP replies, gratuitous ARP, and neighbour advertisements.
//!
//! Parsing takes any bytes from the wire: a frame that is short, malformed or not a request
//! for us is `None`, never a panic. Neighbour solicitations are validated as RFC 4861 §7.1.1
//! asks (hop limit 255, code 0, checksum, length, options, target not multicast, a DAD probe
//! only to a solicited-node group and without a source link-layer option).

use std::net::{Ipv4Addr, Ipv6Addr};

/// A MAC address.
pub type Mac = [u8; 6];

/// The Ethernet broadcast address.
pub const BROADCAST: Mac = [0xff; 6];
/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// The smallest Ethernet frame without its FCS; shorter ones are padded.
const MIN_FRAME: usize = 60;
const ICMPV6: u8 = 58;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;
const OPT_SOURCE_LLADDR: u8 = 1;
const OPT_TARGET_LLADDR: u8 = 2;

/// A request this node may have to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// An ARP request (`who-has target tell sender`).
    Arp {
        /// The asker's hardware address.
        sender_mac: Mac,
        /// The asker's address.
        sender_ip: Ipv4Addr,
        /// The address asked for.
        target: Ipv4Addr,
    },
    /// An IPv6 neighbour solicitation.
    Solicit {
        /// Where to send the answer at the Ethernet level (the source link-layer option, else
        /// the frame's source).
        reply_mac: Mac,
        /// The asker's address (unspecified for duplicate address detection).
        source: Ipv6Addr,
        /// The address asked for.
        target: Ipv6Addr,
    },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

/// The request `frame` carries, if it is a well-formed ARP request or neighbour solicitation.
pub fn parse(frame: &[u8]) -> Option<Request> {
    match u16_at(frame, 12)? {
        ETH_P_ARP => parse_arp(frame.get(14..)?),
        ETH_P_IPV6 => parse_solicit(frame),
        _ => None,
    }
}

fn parse_arp(arp: &[u8]) -> Option<Request> {
    // Ethernet / IPv4, 6- and 4-byte addresses, operation 1 (request).
    if u16_at(arp, 0)? != 1 || u16_at(arp, 2)? != 0x0800 || arp.get(4..6)? != [6, 4] || u16_at(arp, 6)? != 1 {
        return None;
    }
    let sender_mac = array::<6>(arp, 8)?;
    let sender_ip = Ipv4Addr::from(array::<4>(arp, 14)?);
    let target = Ipv4Addr::from(array::<4>(arp, 24)?);
    // Another host's gratuitous ARP announces, it does not ask.
    if sender_ip == target {
        return None;
    }
    Some(Request::Arp { sender_mac, sender_ip, target })
}

fn parse_solicit(frame: &[u8]) -> Option<Request> {
    let ip = frame.get(14..)?;
    if ip.first()? >> 4 != 6 || *ip.get(6)? != ICMPV6 || *ip.get(7)? != 255 {
        return None;
    }
    let payload_len = usize::from(u16_at(ip, 4)?);
    let icmp = ip.get(40..40 + payload_len)?;
    let source = Ipv6Addr::from(array::<16>(ip, 8)?);
    let destination = Ipv6Addr::from(array::<16>(ip, 24)?);
    if icmp.len() < 24 || icmp[0] != NEIGHBOR_SOLICITATION || icmp[1] != 0 {
        return None;
    }
    if checksum(&source, &destination, icmp) != 0 {
        return None;
    }
    let target = Ipv6Addr::from(array::<16>(icmp, 8)?);
    if target.is_multicast() {
        return None;
    }
    let mut reply_mac = array::<6>(frame, 6)?;
    let mut has_source_lladdr = false;
    let mut options = &icmp[24..];
    while !options.is_empty() {
        let kind = options[0];
        let len = usize::from(*options.get(1)?) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if kind == OPT_SOURCE_LLADDR && len == 8 {
            reply_mac = array::<6>(options, 2)?;
            has_source_lladdr = true;
        }
        options = &options[len..];
    }
    if source.is_unspecified() && (has_source_lladdr || destination != solicited_node(&target)) {
        return None;
    }
    Some(Request::Solicit { reply_mac, source, target })
}

/// The solicited-node multicast group of `address` (`ff02::1:ffXX:XXXX`).
pub fn solicited_node(address: &Ipv6Addr) -> Ipv6Addr {
    let o = address.octets();
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), u16::from_be_bytes([o[14], o[15]]))
}

/// The Ethernet multicast address of IPv6 group `group` (`33:33` and its last four bytes).
pub fn multicast_mac(group: &Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// The ICMPv6 checksum of `message` between `source` and `destination` (0 when `message`
/// carries a correct checksum).
pub fn checksum(source: &Ipv6Addr, destination: &Ipv6Addr, message: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let word = if pair.len() == 2 {
                u16::from_be_bytes([pair[0], pair[1]])
            } else {
                u16::from(pair[0]) << 8
            };
            sum += u64::from(word);
        }
    };
    add(&source.octets());
    add(&destination.octets());
    add(&u32::try_from(message.len()).unwrap_or(u32::MAX).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(message);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop left at most 16 bits.
    !(sum as u16)
}

fn ethernet(destination: Mac, source: Mac, ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(86);
    f.extend_from_slice(&destination);
    f.extend_from_slice(&source);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn pad(mut frame: Vec<u8>) -> Vec<u8> {
    if frame.len() < MIN_FRAME {
        frame.resize(MIN_FRAME, 0);
    }
    frame
}

fn arp(
    destination: Mac,
    operation: u16,
    mac: Mac,
    ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut f = ethernet(destination, mac, ETH_P_ARP);
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&operation.to_be_bytes());
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&target_mac);
    f.extend_from_slice(&target_ip.octets());
    pad(f)
}

/// The ARP reply `address is-at mac` to the asker of an [`Request::Arp`].
pub fn arp_reply(mac: Mac, address: Ipv4Addr, asker_mac: Mac, asker_ip: Ipv4Addr) -> Vec<u8> {
    arp(asker_mac, 2, mac, address, asker_mac, asker_ip)
}

/// A gratuitous ARP for `address` at `mac` (a broadcast request for its own address, which
/// Linux, among others, uses to update the entry it holds).
pub fn gratuitous_arp(mac: Mac, address: Ipv4Addr) -> Vec<u8> {
    arp(BROADCAST, 1, mac, address, [0; 6], address)
}

/// A neighbour advertisement of `target` at `mac`, from `target` to `destination`
/// (`destination_mac` at the Ethernet level), with the Override flag, the Solicited flag when
/// `solicited`, and the target link-layer option; hop limit 255.
pub fn neighbor_advertisement(
    mac: Mac,
    target: Ipv6Addr,
    destination_mac: Mac,
    destination: Ipv6Addr,
    solicited: bool,
) -> Vec<u8> {
    let mut icmp = vec![NEIGHBOR_ADVERTISEMENT, 0, 0, 0];
    let flags: u8 = if solicited { 0x60 } else { 0x20 };
    icmp.extend_from_slice(&[flags, 0, 0, 0]);
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[OPT_TARGET_LLADDR, 1]);
    icmp.extend_from_slice(&mac);
    let sum = checksum(&target, &destination, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut f = ethernet(destination_mac, mac, ETH_P_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(icmp.len()).unwrap_or(0).to_be_bytes());
    f.extend_from_slice(&[ICMPV6, 255]);
    f.extend_from_slice(&target.octets());
    f.extend_from_slice(&destination.octets());
    f.extend_from_slice(&icmp);
    f
}

/// The answer to `request` for an address announced with `mac`.
pub fn answer(mac: Mac, request: &Request) -> Vec<u8> {
    match *request {
        Request::Arp { sender_mac, sender_ip, target } => arp_reply(mac, target, sender_mac, sender_ip),
        Request::Solicit { reply_mac, source, target } => {
            if source.is_unspecified() {
                // A duplicate address detection probe: answered to all nodes, not solicited.
                let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
                neighbor_advertisement(mac, target, multicast_mac(&all_nodes), all_nodes, false)
            } else {
                neighbor_advertisement(mac, target, reply_mac, source, true)
            }
        }
    }
}

/// An unsolicited neighbour advertisement of `target` at `mac`, to all nodes.
pub fn unsolicited_advertisement(mac: Mac, target: Ipv6Addr) -> Vec<u8> {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    neighbor_advertisement(mac, target, multicast_mac(&all_nodes), all_nodes, false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ME: Mac = [0x02, 0, 0, 0, 0, 0x0a];
    const THEM: Mac = [0x02, 0, 0, 0, 0, 0x0b];

    /// A neighbour solicitation as a client sends it (built here independently of the NA code).
    fn solicitation(
        source: Ipv6Addr,
        destination: Ipv6Addr,
        target: Ipv6Addr,
        lladdr: Option<Mac>,
    ) -> Vec<u8> {
        let mut icmp = vec![NEIGHBOR_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&target.octets());
        if let Some(mac) = lladdr {
            icmp.extend_from_slice(&[1, 1]);
            icmp.extend_from_slice(&mac);
        }
        let sum = checksum(&source, &destination, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut f = ethernet(multicast_mac(&destination), THEM, ETH_P_IPV6);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&[ICMPV6, 255]);
        f.extend_from_slice(&source.octets());
        f.extend_from_slice(&destination.octets());
        f.extend_from_slice(&icmp);
        f
    }

    #[test]
    fn an_arp_request_is_parsed_and_answered() {
        let asker = Ipv4Addr::new(192, 0, 2, 2);
        let wanted = Ipv4Addr::new(203, 0, 113, 10);
        // A request is a gratuitous ARP with other addresses: build it with arp().
        let request = arp(BROADCAST, 1, THEM, asker, [0; 6], wanted);
        let parsed = parse(&request).unwrap();
        assert_eq!(parsed, Request::Arp { sender_mac: THEM, sender_ip: asker, target: wanted });
        let reply = answer(ME, &parsed);
        assert_eq!(reply.len(), 60);
        assert_eq!(&reply[0..6], &THEM);
        assert_eq!(&reply[6..12], &ME);
        assert_eq!(&reply[12..14], &[0x08, 0x06]);
        assert_eq!(&reply[20..22], &[0, 2], "operation: reply");
        assert_eq!(&reply[22..28], &ME);
        assert_eq!(&reply[28..32], &wanted.octets());
        assert_eq!(&reply[32..38], &THEM);
        assert_eq!(&reply[38..42], &asker.octets());
        // Replies and gratuitous ARPs (ours or others') ask nothing.
        assert_eq!(parse(&reply), None);
        assert_eq!(parse(&gratuitous_arp(ME, wanted)), None);
    }

    #[test]
    fn a_solicitation_is_parsed_and_answered_with_a_valid_advertisement() {
        let asker: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let wanted: Ipv6Addr = "2001:db8:1::10".parse().unwrap();
        let group = solicited_node(&wanted);
        assert_eq!(group, "ff02::1:ff00:10".parse::<Ipv6Addr>().unwrap());
        let frame = solicitation(asker, group, wanted, Some(THEM));
        let parsed = parse(&frame).unwrap();
        assert_eq!(parsed, Request::Solicit { reply_mac: THEM, source: asker, target: wanted });
        let na = answer(ME, &parsed);
        assert_eq!(&na[0..6], &THEM);
        assert_eq!(&na[12..14], &[0x86, 0xdd]);
        let ip = &na[14..];
        assert_eq!(ip[7], 255, "hop limit");
        assert_eq!(&ip[24..40], &asker.octets());
        let icmp = &ip[40..];
        assert_eq!(icmp[0], 136);
        assert_eq!(icmp[4], 0x60, "solicited and override");
        assert_eq!(&icmp[8..24], &wanted.octets());
        assert_eq!(&icmp[24..32], &[2, 1, 2, 0, 0, 0, 0, 0x0a]);
        let source = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
        assert_eq!(checksum(&source, &asker, icmp), 0, "the checksum verifies");
        // An advertisement is no solicitation.
        assert_eq!(parse(&na), None);

        let unsolicited = unsolicited_advertisement(ME, wanted);
        assert_eq!(&unsolicited[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(unsolicited[14 + 40 + 4], 0x20, "override only");
    }

    #[test]
    fn invalid_solicitations_are_ignored() {
        let asker: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let wanted: Ipv6Addr = "2001:db8:1::10".parse().unwrap();
        let good = solicitation(asker, solicited_node(&wanted), wanted, None);
        assert!(parse(&good).is_some());
        // Bad checksum.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(parse(&bad), None);
        // Hop limit not 255 (routed from elsewhere).
        let mut bad = good.clone();
        bad[21] = 64;
        assert_eq!(parse(&bad), None);
        // A DAD probe with a source link-layer option; without, it is answered to all nodes.
        let dad = solicitation(Ipv6Addr::UNSPECIFIED, solicited_node(&wanted), wanted, Some(THEM));
        assert_eq!(parse(&dad), None);
        let dad = solicitation(Ipv6Addr::UNSPECIFIED, solicited_node(&wanted), wanted, None);
        let na = answer(ME, &parse(&dad).unwrap());
        assert_eq!(&na[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        // A zero-length option.
        let mut icmp = vec![NEIGHBOR_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&wanted.octets());
        icmp.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        let sum = checksum(&asker, &solicited_node(&wanted), &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut f = good[..14 + 40].to_vec();
        f[18..20].copy_from_slice(&(icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&icmp);
        assert_eq!(parse(&f), None);
        // Every truncation of a good frame parses to something or nothing, never panics.
        for len in 0..good.len() {
            let _ = parse(&good[..len]);
        }
    }

    /// The property `fuzz/fuzz_targets/l2_frame.rs` checks, over mutations of valid frames
    /// (a fixed seed, so a failure repeats).
    #[test]
    fn mutated_frames_never_panic_and_answers_are_well_formed() {
        use rand::{Rng as _, SeedableRng as _};
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let asker: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let wanted: Ipv6Addr = "2001:db8:1::10".parse().unwrap();
        let seeds = [
            arp(BROADCAST, 1, THEM, Ipv4Addr::new(192, 0, 2, 2), [0; 6], Ipv4Addr::new(203, 0, 113, 10)),
            solicitation(asker, solicited_node(&wanted), wanted, Some(THEM)),
            solicitation(Ipv6Addr::UNSPECIFIED, solicited_node(&wanted), wanted, None),
        ];
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut frame = seeds[rng.random_range(0..seeds.len())].clone();
            for _ in 0..rng.random_range(1..4) {
                match rng.random_range(0..3) {
                    0 if !frame.is_empty() => {
                        let i = rng.random_range(0..frame.len());
                        frame[i] = rng.random();
                    }
                    1 => frame.truncate(rng.random_range(0..=frame.len())),
                    _ => frame.extend((0..rng.random_range(1..16)).map(|_| rng.random::<u8>())),
                }
            }
            let Some(request) = parse(&frame) else { continue };
            accepted += 1;
            let answer = answer(ME, &request);
            assert_eq!(parse(&answer), None, "{request:?}");
            if let Request::Solicit { .. } = request {
                let source = Ipv6Addr::from(<[u8; 16]>::try_from(&answer[22..38]).unwrap());
                let destination = Ipv6Addr::from(<[u8; 16]>::try_from(&answer[38..54]).unwrap());
                assert_eq!(checksum(&source, &destination, &answer[54..]), 0);
                assert_eq!(answer[21], 255);
            }
        }
        // Mutations that keep a frame valid (a changed asker, trailing bytes) are answered.
        assert!(accepted > 100, "{accepted}");
    }

    #[test]
    fn the_checksum_matches_a_known_value() {
        // RFC 1071's example words, in an ICMPv6 frame of our own: sum of pseudo-header and
        // message computed by hand.
        let src = Ipv6Addr::UNSPECIFIED;
        let dst = Ipv6Addr::UNSPECIFIED;
        // Length 4, next header 58: 0x0004 + 0x003a = 0x003e; message 0x0001 0xf203: sum 0xf242.
        assert_eq!(checksum(&src, &dst, &[0x00, 0x01, 0xf2, 0x03]), !0xf242);
        // An odd length is padded with a zero byte.
        assert_eq!(checksum(&src, &dst, &[0x01]), !(0x0001 + 0x003a + 0x0100));
    }
}
