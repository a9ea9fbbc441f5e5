//! The PROXY protocol v1/v2 decoder (`weir_dataplane::proxy::proxy_protocol::read_header`) on
//! arbitrary connection bytes: no panic, never a hang on in-memory input, and it consumes
//! exactly its header (what follows is the TLS or HTTP stream and must be left untouched).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_dataplane::proxy::proxy_protocol::read_header;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let Some(result) = weir_fuzz::ready(read_header(&mut rest)) else {
        panic!("read_header did not finish on in-memory input");
    };
    let consumed = data.len() - rest.len();
    let Ok(addr) = result else { return };
    if data.starts_with(b"PROXY ") {
        // v1: the line up to and including the first CRLF, at most 107 bytes.
        let end = data.windows(2).position(|w| w == b"\r\n").map(|i| i + 2);
        assert_eq!(Some(consumed), end, "v1 consumed {consumed} bytes");
        assert!(consumed <= 107);
    } else {
        // v2: 16 bytes of fixed header and the announced address block.
        let len = usize::from(u16::from_be_bytes([data[14], data[15]]));
        assert_eq!(consumed, 16 + len, "v2 consumed {consumed} bytes");
        if let Some(addr) = addr {
            let family = data[13] >> 4;
            assert!(
                matches!((family, addr.is_ipv4()), (1, true) | (2, false)),
                "{addr} from family {family}"
            );
        }
    }
});
