//! The ClientHello SNI peek of ssl-passthrough (`weir_dataplane::tls::l4`): `read_first_record`
//! and `client_hello_sni` on arbitrary bytes, and, built around an arbitrary host name, a
//! well-formed ClientHello whose SNI must come back (lower case, no trailing dot).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir_dataplane::tls::l4::{client_hello_sni, read_first_record};

#[derive(Arbitrary, Debug)]
enum Input<'a> {
    /// Whatever a client sends first.
    Raw(&'a [u8]),
    /// A ClientHello with these extensions before the server_name one.
    Hello { name: &'a str, session_id: &'a [u8], before: Vec<(u16, &'a [u8])> },
}

fn u16be(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

/// A ClientHello record naming `name`, or `None` when the pieces do not fit the length fields.
fn hello(name: &str, session_id: &[u8], before: &[(u16, &[u8])]) -> Option<Vec<u8>> {
    if session_id.len() > 32 || name.len() > 1000 {
        return None;
    }
    let mut exts = Vec::new();
    for (kind, body) in before {
        if *kind == 0 || body.len() > 1000 {
            return None;
        }
        exts.extend_from_slice(&kind.to_be_bytes());
        exts.extend_from_slice(&u16be(body.len()));
        exts.extend_from_slice(body);
    }
    let mut sni = vec![0u8];
    sni.extend_from_slice(&u16be(name.len()));
    sni.extend_from_slice(name.as_bytes());
    exts.extend_from_slice(&[0, 0]);
    exts.extend_from_slice(&u16be(sni.len() + 2));
    exts.extend_from_slice(&u16be(sni.len()));
    exts.extend_from_slice(&sni);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(session_id.len() as u8);
    body.extend_from_slice(session_id);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);
    let mut handshake = vec![1];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    if handshake.len() > 16384 {
        return None;
    }
    let mut record = vec![0x16, 3, 1];
    record.extend_from_slice(&u16be(handshake.len()));
    record.extend_from_slice(&handshake);
    Some(record)
}

fuzz_target!(|input: Input<'_>| match input {
    Input::Raw(data) => {
        let mut rest = data;
        let Some(Ok(record)) = weir_fuzz::ready(read_first_record(&mut rest)) else {
            panic!("read_first_record did not finish on in-memory input");
        };
        assert!(data.starts_with(&record), "the record is not the start of the stream");
        assert_eq!(record.len() + rest.len(), data.len());
        if let Some(name) = client_hello_sni(&record) {
            assert_eq!(name, name.to_ascii_lowercase());
            assert!(!name.ends_with('.'));
        }
    }
    Input::Hello { name, session_id, before } => {
        let Some(record) = hello(name, session_id, &before) else { return };
        let want = name.trim_end_matches('.').to_ascii_lowercase();
        assert_eq!(client_hello_sni(&record), Some(want));
    }
});
