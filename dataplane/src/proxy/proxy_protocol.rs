//! The PROXY protocol (HAProxy, v1 text and v2 binary): an L4 load balancer in front of weir
//! announces the real client address before the connection's own bytes.
//!
//! A listener that expects it reads exactly the header, nothing more, so the bytes after it
//! (a ClientHello, an HTTP request) are untouched. A connection without a valid header is
//! refused: a listener behind a PROXY-speaking balancer must not trust anything else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The longest v1 line, CRLF included (spec: 107 bytes).
const V1_MAX: usize = 107;
/// The largest v2 address block weir accepts (addresses plus TLVs).
const V2_MAX_LEN: usize = 2048;

/// Why a PROXY protocol header was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the header failed or the connection closed.
    #[error("reading the PROXY protocol header failed: {0}")]
    Io(#[from] std::io::Error),
    /// The connection does not start with a PROXY protocol header.
    #[error("no PROXY protocol header (the listener requires one)")]
    Missing,
    /// A header that does not follow the specification.
    #[error("invalid PROXY protocol header: {0}")]
    Invalid(&'static str),
}

/// Reads a PROXY protocol header from `stream`; returns the client address it announces, or
/// `None` for `LOCAL`/`UNKNOWN` (the balancer's own connection: the socket peer applies).
pub async fn read_header<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<SocketAddr>, Error> {
    let mut start = [0u8; 8];
    stream.read_exact(&mut start).await?;
    if &start[..6] == b"PROXY " {
        return read_v1(stream, &start).await;
    }
    if start == V2_SIGNATURE[..8] {
        return read_v2(stream).await;
    }
    Err(Error::Missing)
}

async fn read_v1<S: AsyncRead + Unpin>(stream: &mut S, start: &[u8; 8]) -> Result<Option<SocketAddr>, Error> {
    let mut line = start.to_vec();
    // Byte by byte, so as not to read past the line: v1 is short and legacy.
    while !line.ends_with(b"\r\n") {
        if line.len() >= V1_MAX {
            return Err(Error::Invalid("v1 line longer than 107 bytes"));
        }
        line.push(stream.read_u8().await?);
    }
    let text =
        std::str::from_utf8(&line[..line.len() - 2]).map_err(|_| Error::Invalid("v1 line is not text"))?;
    parse_v1(text)
}

/// Parses a v1 line without its CRLF: `PROXY TCP4 src dst sport dport` or `PROXY UNKNOWN ...`.
fn parse_v1(text: &str) -> Result<Option<SocketAddr>, Error> {
    let mut parts = text.split(' ');
    let (_, family) = (parts.next(), parts.next());
    let ip = |s: Option<&str>| -> Result<IpAddr, Error> {
        s.and_then(|s| s.parse().ok()).ok_or(Error::Invalid("v1 address"))
    };
    let port = |s: Option<&str>| -> Result<u16, Error> {
        s.filter(|s| !s.starts_with('0') || *s == "0")
            .and_then(|s| s.parse().ok())
            .ok_or(Error::Invalid("v1 port"))
    };
    match family {
        Some("UNKNOWN") => Ok(None),
        Some(fam @ ("TCP4" | "TCP6")) => {
            let src = ip(parts.next())?;
            let _dst = ip(parts.next())?;
            let sport = port(parts.next())?;
            let _dport = port(parts.next())?;
            if parts.next().is_some() {
                return Err(Error::Invalid("v1 trailing fields"));
            }
            if (fam == "TCP4") != src.is_ipv4() {
                return Err(Error::Invalid("v1 address family mismatch"));
            }
            Ok(Some(SocketAddr::new(src, sport)))
        }
        _ => Err(Error::Invalid("v1 protocol must be TCP4, TCP6 or UNKNOWN")),
    }
}

async fn read_v2<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<SocketAddr>, Error> {
    let mut rest = [0u8; 8];
    stream.read_exact(&mut rest).await?;
    if rest[..4] != V2_SIGNATURE[8..] {
        return Err(Error::Missing);
    }
    let (ver_cmd, family) = (rest[4], rest[5]);
    let len = usize::from(u16::from_be_bytes([rest[6], rest[7]]));
    if ver_cmd >> 4 != 2 {
        return Err(Error::Invalid("v2 version must be 2"));
    }
    if len > V2_MAX_LEN {
        return Err(Error::Invalid("v2 address block too long"));
    }
    let mut block = vec![0u8; len];
    stream.read_exact(&mut block).await?;
    match ver_cmd & 0x0f {
        0 => return Ok(None), // LOCAL: health checks of the balancer itself
        1 => {}
        _ => return Err(Error::Invalid("v2 command must be LOCAL or PROXY")),
    }
    match family >> 4 {
        // AF_INET
        1 if block.len() >= 12 => {
            let ip = Ipv4Addr::new(block[0], block[1], block[2], block[3]);
            Ok(Some(SocketAddr::new(ip.into(), u16::from_be_bytes([block[8], block[9]]))))
        }
        // AF_INET6
        2 if block.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&block[..16]);
            Ok(Some(SocketAddr::new(
                Ipv6Addr::from(octets).into(),
                u16::from_be_bytes([block[32], block[33]]),
            )))
        }
        1 | 2 => Err(Error::Invalid("v2 address block too short")),
        // AF_UNSPEC, AF_UNIX: nothing usable, keep the socket peer
        _ => Ok(None),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> (Result<Option<SocketAddr>, Error>, Vec<u8>) {
        let mut reader = bytes;
        let result = read_header(&mut reader).await;
        (result, reader.to_vec())
    }

    #[tokio::test]
    async fn v1_reads_the_line_and_nothing_more() {
        let (r, rest) = parse(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 80\r\nGET /").await;
        assert_eq!(r.unwrap(), Some("203.0.113.7:51234".parse().unwrap()));
        assert_eq!(rest, b"GET /");
        let (r, _) = parse(b"PROXY TCP6 2001:db8::1 ::1 1 443\r\n").await;
        assert_eq!(r.unwrap(), Some("[2001:db8::1]:1".parse().unwrap()));
        let (r, rest) = parse(b"PROXY UNKNOWN\r\nx").await;
        assert_eq!((r.unwrap(), rest.as_slice()), (None, &b"x"[..]));
    }

    #[tokio::test]
    async fn v1_rejects_malformed_lines() {
        for bad in [
            &b"PROXY TCP4 203.0.113.7 10.0.0.1 51234\r\n"[..],
            b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 070 80\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
        ] {
            assert!(
                matches!(parse(bad).await.0, Err(Error::Invalid(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(200));
        assert!(matches!(parse(long.as_bytes()).await.0, Err(Error::Invalid(_))));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n\r\n").await.0, Err(Error::Missing)));
        assert!(matches!(parse(b"PROX").await.0, Err(Error::Io(_))));
    }

    fn v2(cmd: u8, family: u8, block: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.extend([0x20 | cmd, family]);
        out.extend(u16::try_from(block.len()).unwrap().to_be_bytes());
        out.extend(block);
        out
    }

    #[tokio::test]
    async fn v2_reads_ipv4_ipv6_local_and_tlvs() {
        let mut block = vec![198, 51, 100, 9, 10, 0, 0, 1, 0x1f, 0x90, 0, 80];
        block.extend([0x04, 0, 1, 0xff]); // a NOOP TLV is skipped with the block
        let mut bytes = v2(1, 0x11, &block);
        bytes.extend(b"\x16\x03\x01");
        let (r, rest) = parse(&bytes).await;
        assert_eq!(r.unwrap(), Some("198.51.100.9:8080".parse().unwrap()));
        assert_eq!(rest, b"\x16\x03\x01");

        let mut block = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        block.extend([0u8; 16]);
        block.extend([0x01, 0xbb, 0, 80]);
        assert_eq!(parse(&v2(1, 0x21, &block)).await.0.unwrap(), Some("[2001:db8::7]:443".parse().unwrap()));
        assert_eq!(parse(&v2(0, 0x00, &[])).await.0.unwrap(), None, "LOCAL");
        assert!(matches!(parse(&v2(1, 0x11, &[1, 2, 3])).await.0, Err(Error::Invalid(_))));
        let mut wrong_version = v2(1, 0x11, &[0; 12]);
        wrong_version[12] = 0x11;
        assert!(matches!(parse(&wrong_version).await.0, Err(Error::Invalid(_))));
    }
}
