//! TLS passthrough: the SNI of a ClientHello read ahead of the handshake, and the raw splice of
//! a connection to a backend that terminates TLS itself.
//!
//! The HTTPS listener reads the first TLS record into a buffer (bounded in size and time by the
//! handshake limits), looks its SNI up in the table's passthrough hosts, then either replays the
//! buffer to the backend and copies bytes both ways, or hands a [`Prefixed`] stream (buffer
//! first, then the socket) to the TLS acceptor. Other hosts on the same port keep terminating.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The TLS record type of handshake messages.
pub const HANDSHAKE_RECORD: u8 = 0x16;
/// The largest TLS plaintext record (2^14) plus its 5-byte header.
const MAX_RECORD: usize = 16384 + 5;

/// Reads the first TLS record (or, for anything that is not TLS, whatever the first read gave)
/// into a buffer, consuming it from `stream`.
pub async fn read_first_record<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(1024);
    while buf.len() < 5 {
        if stream.read_buf(&mut buf).await? == 0 {
            return Ok(buf);
        }
        if buf[0] != HANDSHAKE_RECORD {
            return Ok(buf);
        }
    }
    let want = (5 + usize::from(u16::from_be_bytes([buf[3], buf[4]]))).min(MAX_RECORD);
    while buf.len() < want {
        if stream.read_buf(&mut buf).await? == 0 {
            break;
        }
    }
    Ok(buf)
}

/// The SNI host name of a ClientHello at the start of `record`, if it has one (lower case).
/// Anything malformed or truncated gives `None`: the acceptor reports it properly.
pub fn client_hello_sni(record: &[u8]) -> Option<String> {
    let mut r = Reader(record);
    if r.u8()? != HANDSHAKE_RECORD {
        return None;
    }
    r.skip(2)?; // legacy record version
    let len = usize::from(r.u16()?);
    let mut r = Reader(r.take(len)?);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut hello = Reader(r.take(len)?);
    hello.skip(2 + 32)?; // version, random
    let n = usize::from(hello.u8()?);
    hello.skip(n)?; // session id
    let n = usize::from(hello.u16()?);
    hello.skip(n)?; // cipher suites
    let n = usize::from(hello.u8()?);
    hello.skip(n)?; // compression methods
    let n = usize::from(hello.u16()?);
    let mut exts = Reader(hello.take(n)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let n = usize::from(exts.u16()?);
        let mut ext = Reader(exts.take(n)?);
        if kind != 0 {
            continue;
        }
        let n = usize::from(ext.u16()?);
        let mut names = Reader(ext.take(n)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let n = usize::from(names.u16()?);
            let name = names.take(n)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(name.trim_end_matches('.').to_ascii_lowercase());
            }
        }
        return None;
    }
    None
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

// === impl Prefixed ===

/// A stream that yields `prefix` before reading from `inner`; writes go to `inner`.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: BytesMut,
    inner: S,
}

impl<S> Prefixed<S> {
    /// `prefix`, then `inner`.
    pub fn new(prefix: BytesMut, inner: S) -> Self {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A real ClientHello from rustls's client for `sni`.
    fn client_hello(sni: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[tokio::test]
    async fn sni_of_a_real_client_hello() {
        let hello = client_hello("Pass.Example.com");
        let mut reader = &hello[..];
        let record = read_first_record(&mut reader).await.unwrap();
        assert_eq!(record.len(), hello.len());
        assert_eq!(client_hello_sni(&record).as_deref(), Some("pass.example.com"));
        // Truncated or not TLS: no SNI, no panic.
        for n in [0, 1, 5, 40, hello.len() - 1] {
            assert_eq!(client_hello_sni(&hello[..n]), None, "{n}");
        }
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn prefixed_replays_then_reads_on() {
        let mut s = Prefixed::new(BytesMut::from(&b"abc"[..]), &b"def"[..]);
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "abcdef");
    }
}
