//! The L2 announcer's frame parser (`weir::node::lb::frame::parse`) on arbitrary Ethernet
//! frames, as an `AF_PACKET` socket hands them over. No panic; every request it accepts gets
//! an answer that is itself a well-formed frame: an ARP reply, or a neighbour advertisement
//! whose ICMPv6 checksum verifies and whose hop limit is 255, never parsed back as a request.
#![no_main]

use std::net::Ipv6Addr;

use libfuzzer_sys::fuzz_target;
use weir::node::lb::frame::{self, Request};

const MAC: frame::Mac = [0x02, 0, 0, 0, 0, 1];

fuzz_target!(|data: &[u8]| {
    let Some(request) = frame::parse(data) else { return };
    let answer = frame::answer(MAC, &request);
    assert_eq!(&answer[6..12], &MAC);
    assert!(frame::parse(&answer).is_none(), "an answer parsed as a request: {request:?}");
    match request {
        Request::Arp { .. } => assert_eq!(&answer[12..14], &[0x08, 0x06]),
        Request::Solicit { .. } => {
            assert_eq!(answer[14 + 7], 255);
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&answer[22..38]).unwrap());
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&answer[38..54]).unwrap());
            assert_eq!(frame::checksum(&src, &dst, &answer[54..]), 0);
        }
    }
});
