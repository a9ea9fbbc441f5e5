//! weir's own HTTP/1.1 upstream client: one exchange at a time on a pooled connection, driven
//! by the request's own task. No task per connection, no channel: the request's future writes
//! the request and reads the response head; the response body ([`Body`]) owns the connection
//! while it streams and hands it back to its pool at its end.
//!
//! - A connection ([`Conn`]) is its stream (TCP or TLS, behind [`SendTimed`]'s write-progress
//!   timeout), a read buffer kept across requests and a write buffer for request heads.
//! - Request: the head is encoded into the write buffer: request line (origin-form), the
//!   headers as given (the proxy set `Host` and removed hop-by-hop headers), the proxy's
//!   `X-Forwarded-*` and `X-Real-IP` when given (in place of the client's: see
//!   [`crate::proxy::headers`]), and the framing
//!   hyper's client chooses: an empty body sends no body (no framing header added); a
//!   `Content-Length` given is kept; a body of exact size gets `Content-Length`; else
//!   `Transfer-Encoding: chunked`, except on GET, HEAD and CONNECT, which then send no body.
//!   The head and a body known whole go out in one vectored write; other bodies are streamed
//!   frame by frame. Request trailers go out on chunked bodies when the request's `Trailer`
//!   header names them (as hyper does).
//! - Response: the head is parsed with `httparse` (at most [`MAX_HEAD`] bytes and
//!   [`MAX_HEADERS`] headers, else an error the proxy answers 502); 1xx interim responses other
//!   than 101 are skipped. The body's length follows RFC 9112 §6.3: none for HEAD requests and
//!   1xx/204/304; chunked when `Transfer-Encoding`'s last coding is; else `Content-Length`
//!   (invalid or conflicting values are an error); else until the connection closes. Body
//!   frames are split off the read buffer, not copied; chunk extensions are ignored; trailers
//!   after the last chunk come as a trailers frame.
//! - An answer that comes while the request body is still being sent is returned at once: the
//!   rest of the body is not sent and the connection is not reused.
//! - Reuse: a connection goes back to its pool when its response was read to its end, its
//!   request was sent whole, neither side said `Connection: close`, the response is HTTP/1.1
//!   (or HTTP/1.0 with `keep-alive`), and nothing more than the response was received.
//! - A pooled connection is checked without blocking when taken out of the pool (and by the
//!   idle sweep): one the upstream closed, or that has bytes to read although no request is
//!   outstanding, is dropped ([`Conn::is_quiet`]).
//! - Retries: a request none of whose head could be written is handed back
//!   ([`Failed::Unsent`]): on a reused connection it goes on the next one, as hyper's
//!   `take_message` allowed. Once any byte went out, a failure — including the connection
//!   closing before any byte of the response — is [`Failed::Sent`]: the upstream may have
//!   processed the request, so only the proxy's retry policy may send it again.
//! - A `101 Switching Protocols` leaves the connection (and any bytes read past the head) to
//!   the caller ([`Body::take_upgrade`]).
//! - Idle connections wait in an [`Http1Pool`]: a plain endpoint's own (in its balancer slot,
//!   found without a lookup), or one of the clients' pools by name ([`PoolRef`]).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{
    CONNECTION, CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue, TRAILER, TRANSFER_ENCODING,
};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::body::UpstreamBody;
use super::conn::{BoxError, ConnMeta, SendTimed, lock};
use crate::proxy::headers::{Forwarded, is_forwarded};
use crate::state::balance::EndpointState;

/// Largest response head (hyper's default read buffer limit).
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Most headers in a response head (hyper's default).
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest trailer section of a chunked response (hyper's default).
const MAX_TRAILERS: usize = 16 * 1024;
/// Longest chunk-size line (with extensions).
const MAX_CHUNK_LINE: usize = 4096;
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// An upstream connection's transport.
pub(crate) enum Io {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// An HTTP/1.1 upstream connection.
pub(crate) struct Conn {
    io: SendTimed<Io>,
    /// What was read and not yet consumed.
    rbuf: BytesMut,
    /// Request heads are encoded here (kept for its capacity).
    wbuf: BytesMut,
    /// What the pool knows of it.
    pub(crate) meta: Arc<ConnMeta>,
}

/// The client's errors (the upstream's I/O errors, with [`super::conn::SendTimedOut`] among
/// their causes when a write timed out, come as [`Error::Io`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Reading or writing failed.
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The response is not valid HTTP/1.1.
    #[error("invalid upstream response: {0}")]
    Parse(&'static str),
    /// The connection closed before the response (head or body) was complete.
    #[error("the upstream closed the connection before the response was complete")]
    Incomplete,
    /// The request body did not match its `Content-Length`.
    #[error("the request body does not match its content-length")]
    BodyLength,
}

impl Error {
    /// Whether the upstream sent something that is not a valid response.
    pub(crate) fn is_parse(&self) -> bool {
        matches!(self, Error::Parse(_))
    }
}

/// A failed exchange.
pub(crate) enum Failed {
    /// Nothing of the request was written: here it is back, body unread.
    Unsent(Box<Request<UpstreamBody>>, Error),
    /// The request was (at least partly) sent.
    Sent(BoxError),
}

/// How a response body is delimited, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decode {
    /// `Content-Length`: this many bytes left.
    Length(u64),
    Chunked(Chunk),
    /// Until the connection closes.
    Close,
    /// Read to its end (or none).
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of chunk data left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// The trailer section after the last chunk.
    Trailers,
}

/// One step of decoding a body.
enum Step {
    Frame(Frame<Bytes>),
    /// More bytes are needed.
    More,
    End,
}

/// How the request body is framed on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body is sent.
    Empty,
    /// This many bytes.
    Length(u64),
    Chunked,
}

// === impl Conn ===

impl Conn {
    pub(crate) fn new(io: Io, meta: Arc<ConnMeta>) -> Self {
        Conn { io: SendTimed::new(io, meta.clone()), rbuf: BytesMut::new(), wbuf: BytesMut::new(), meta }
    }

    /// Whether an idle connection can take a request: still open, and nothing arrived
    /// unasked. Never waits, and reserves no read buffer: anything read here (bytes no request
    /// asked for, the end of the stream, an error) means the connection is not quiet and will
    /// be dropped, so a few bytes on the stack are enough to tell.
    pub(crate) fn is_quiet(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut probe = [MaybeUninit::<u8>::uninit(); 8];
        let mut probe = ReadBuf::uninit(&mut probe);
        Pin::new(&mut self.io).poll_read(&mut cx, &mut probe).is_pending()
    }

    /// Gives back the buffers' memory of a connection that waits in a pool: its next request
    /// allocates them again. An idle connection then costs its socket (and TLS state) only.
    /// Whether there was anything to give back.
    fn release_buffers(&mut self) -> bool {
        let held = self.rbuf.capacity() + self.wbuf.capacity();
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        }
        self.wbuf = BytesMut::new();
        held > self.rbuf.capacity()
    }

    /// Reads what is there into the read buffer; `Ok(0)` at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < 1024 {
            self.rbuf.reserve(READ_CHUNK);
        }
        // `read_buf`'s future keeps no state of its own: one per poll is the same as one kept.
        let read = self.io.read_buf(&mut self.rbuf);
        std::pin::pin!(read).poll(cx)
    }

    /// Reads until a final response head is parsed (1xx other than 101 are skipped).
    fn poll_head(&mut self, cx: &mut Context<'_>, head_request: bool) -> Poll<Result<Head, Error>> {
        loop {
            if !self.rbuf.is_empty() {
                if let Some(head) = parse_head(&mut self.rbuf, head_request)? {
                    if head.interim {
                        continue;
                    }
                    return Poll::Ready(Ok(head));
                }
                if self.rbuf.len() >= MAX_HEAD {
                    return Poll::Ready(Err(Error::Parse("response head too large")));
                }
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(Error::Incomplete));
            }
        }
    }

    /// Writes the encoded head, then `whole` (from `*at` on: how much went out so far).
    fn poll_write_head(
        &mut self,
        cx: &mut Context<'_>,
        whole: &[u8],
        at: &mut usize,
    ) -> Poll<io::Result<()>> {
        loop {
            let head_len = self.wbuf.len();
            let (head, body) =
                if *at < head_len { (&self.wbuf[*at..], whole) } else { (&[][..], &whole[*at - head_len..]) };
            if head.is_empty() && body.is_empty() {
                return Pin::new(&mut self.io).poll_flush(cx);
            }
            let slices = [io::IoSlice::new(head), io::IoSlice::new(body)];
            let n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
    }
}

/// A parsed response head.
struct Head {
    response: Response<()>,
    /// A 1xx other than 101 (skipped).
    interim: bool,
    decode: Decode,
    /// The upstream allows another request on the connection.
    keep_alive: bool,
}

/// Parses a response head off the front of `buf`: `None` while incomplete.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, Error> {
    let mut raw = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    // Where each header's name and value lie in `buf`.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let (len, code, version, count) = {
        let mut parsed = httparse::Response::new(&mut []);
        let status = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut parsed, buf, &mut raw)
            .map_err(|e| {
                Error::Parse(match e {
                    httparse::Error::TooManyHeaders => "too many headers",
                    httparse::Error::Status => "invalid status",
                    httparse::Error::Version => "invalid version",
                    httparse::Error::HeaderName => "invalid header name",
                    httparse::Error::HeaderValue => "invalid header value",
                    _ => "invalid response head",
                })
            })?;
        let httparse::Status::Complete(len) = status else { return Ok(None) };
        if len > MAX_HEAD {
            return Err(Error::Parse("response head too large"));
        }
        let base = buf.as_ptr() as usize;
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
            let name = offset(h.name.as_bytes());
            let value = offset(h.value);
            *span = (name, name + h.name.len() as u32, value, value + h.value.len() as u32);
        }
        (len, parsed.code.unwrap_or(0), parsed.version.unwrap_or(1), parsed.headers.len())
    };
    let head = buf.split_to(len).freeze();
    let status = StatusCode::from_u16(code).map_err(|_| Error::Parse("invalid status"))?;
    let interim = status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS;
    // Room to spare: hyper's server keeps a response's map for the next request's headers, to
    // which the proxy adds up to 8 (`forward_route` reserves them); a growth rehashes them all.
    let mut headers = HeaderMap::with_capacity(count + 8);
    let (mut close, mut keep_alive_token, mut chunked) = (false, false, false);
    let mut length: Option<u64> = None;
    let (mut bad_length, mut has_te) = (false, false);
    for &(ns, ne, vs, ve) in &spans[..count] {
        let raw = &head[ns as usize..ne as usize];
        let name = match common_name(raw) {
            Some(name) => name,
            None => HeaderName::from_bytes(raw).map_err(|_| Error::Parse("invalid header name"))?,
        };
        let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..ve as usize))
            .map_err(|_| Error::Parse("invalid header value"))?;
        if name == CONTENT_LENGTH {
            for part in value.as_bytes().split(|&b| b == b',') {
                match parse_decimal(part.trim_ascii()) {
                    Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                    _ => bad_length = true,
                }
            }
        } else if name == TRANSFER_ENCODING {
            has_te = true;
            // Only the last coding counts: chunked must be it.
            for coding in value.as_bytes().split(|&b| b == b',') {
                let coding = coding.trim_ascii();
                if coding.is_empty() {
                    continue;
                }
                chunked = coding.eq_ignore_ascii_case(b"chunked");
            }
        } else if name == CONNECTION {
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        headers.append(name, value);
    }
    let version = if version == 0 { Version::HTTP_10 } else { Version::HTTP_11 };
    let mut keep_alive = !close && (version == Version::HTTP_11 || keep_alive_token);
    let decode = if interim
        || head_request
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status == StatusCode::SWITCHING_PROTOCOLS
    {
        Decode::Done
    } else if has_te {
        // Transfer-Encoding wins over Content-Length, which is dropped (RFC 9112 §6.3); such a
        // response may be an attempt at smuggling: its connection is not reused.
        if length.is_some() || bad_length {
            headers.remove(CONTENT_LENGTH);
            keep_alive = false;
        }
        if chunked {
            Decode::Chunked(Chunk::Size)
        } else {
            keep_alive = false;
            Decode::Close
        }
    } else if bad_length {
        return Err(Error::Parse("invalid content-length"));
    } else if let Some(n) = length {
        if n == 0 { Decode::Done } else { Decode::Length(n) }
    } else {
        keep_alive = false;
        Decode::Close
    };
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    Ok(Some(Head { response, interim, decode, keep_alive }))
}

/// The response headers upstreams send most, spelled as they usually spell them (servers write
/// their own headers with a fixed case): an exact match skips `HeaderName::from_bytes`, which
/// lowercases every name through a table and then looks it up among all standard names. Any
/// other spelling takes that general path and ends up as the same name.
fn common_name(raw: &[u8]) -> Option<HeaderName> {
    use http::header::{
        ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, DATE, ETAG, EXPIRES, LAST_MODIFIED,
        LOCATION, SERVER, SET_COOKIE, VARY,
    };
    Some(match raw {
        b"Content-Length" | b"content-length" => CONTENT_LENGTH,
        b"Content-Type" | b"content-type" => CONTENT_TYPE,
        b"Date" | b"date" => DATE,
        b"Server" | b"server" => SERVER,
        b"Connection" | b"connection" => CONNECTION,
        b"Transfer-Encoding" | b"transfer-encoding" => TRANSFER_ENCODING,
        b"Cache-Control" | b"cache-control" => CACHE_CONTROL,
        b"Last-Modified" | b"last-modified" => LAST_MODIFIED,
        b"ETag" | b"Etag" | b"etag" => ETAG,
        b"Accept-Ranges" | b"accept-ranges" => ACCEPT_RANGES,
        b"Content-Encoding" | b"content-encoding" => CONTENT_ENCODING,
        b"Vary" | b"vary" => VARY,
        b"Set-Cookie" | b"set-cookie" => SET_COOKIE,
        b"Location" | b"location" => LOCATION,
        b"Expires" | b"expires" => EXPIRES,
        _ => return None,
    })
}

/// A non-empty run of ASCII digits, without overflow.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

// === sending ===

/// The response to a request sent on `conn`, its head read; the body is read from `conn` by a
/// [`Body`] built with [`Sent::into_response`].
pub(crate) struct Sent {
    response: Response<()>,
    decode: Decode,
    /// The connection may carry another request after this response.
    reusable: bool,
}

/// Sends `req` on `conn` and reads the response head.
pub(crate) async fn send(
    conn: &mut Conn,
    req: Request<UpstreamBody>,
    forwarded: Option<&Forwarded<'_>>,
) -> Result<Sent, Failed> {
    let head_request = req.method() == Method::HEAD;
    let Encoded { framing, close: close_asked, trailers } = encode_head(&req, forwarded, &mut conn.wbuf);
    let whole = match framing {
        Framing::Empty => Bytes::new(),
        _ => req.body().whole().cloned().unwrap_or_default(),
    };
    let mut at = 0;
    if let Err(e) = poll_fn(|cx| conn.poll_write_head(cx, &whole, &mut at)).await {
        conn.wbuf.clear();
        return Err(if at == 0 { Failed::Unsent(Box::new(req), Error::Io(e)) } else { sent(Error::Io(e)) });
    }
    conn.wbuf.clear();
    let mut body = req.into_body();
    let streamed = match framing {
        Framing::Empty => false,
        _ if !whole.is_empty() => {
            body.take_whole();
            false
        }
        _ => true,
    };
    if streamed {
        let mut out = Out::default();
        let mut remaining = match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        let mut finished = false;
        let early = poll_fn(|cx| {
            // An answer before the request is all sent ends the sending.
            if let Poll::Ready(head) = conn.poll_head(cx, head_request) {
                return Poll::Ready(head.map(Some).map_err(|e| Box::new(e) as BoxError));
            }
            let sending =
                poll_body(&mut conn.io, cx, &mut body, &mut out, &mut remaining, &mut finished, &trailers);
            sending.map(|r| r.map(|()| None))
        })
        .await
        .map_err(Failed::Sent)?;
        if let Some(head) = early {
            return Ok(Sent::of(head, false));
        }
    }
    drop(body);
    let head = poll_fn(|cx| conn.poll_head(cx, head_request)).await.map_err(sent)?;
    Ok(Sent::of(head, !close_asked))
}

fn sent(e: Error) -> Failed {
    Failed::Sent(Box::new(e))
}

/// What encoding a request head found out.
struct Encoded {
    framing: Framing,
    /// The request says `Connection: close`.
    close: bool,
    /// Its `Trailer` header (the trailers it may send).
    trailers: Option<HeaderValue>,
}

/// Encodes `req`'s head into `dst` in one pass over its headers; the framing header comes last.
fn encode_head(
    req: &Request<UpstreamBody>,
    forwarded: Option<&Forwarded<'_>>,
    dst: &mut BytesMut,
) -> Encoded {
    use http_body::Body as _;
    let headers = req.headers();
    dst.reserve(256 + headers.len() * 32);
    dst.extend_from_slice(req.method().as_str().as_bytes());
    dst.extend_from_slice(b" ");
    let target = match req.uri().path_and_query() {
        Some(pq) => pq.as_str(),
        None => req.uri().authority().map_or("/", |a| a.as_str()),
    };
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(if req.version() == Version::HTTP_10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    let (mut declared, mut chunked, mut close, mut trailers) = (None, false, false, None);
    for (name, value) in headers {
        if name == CONTENT_LENGTH {
            declared = declared.or(Some(value));
            continue;
        }
        if name == TRANSFER_ENCODING {
            chunked = true;
            continue;
        }
        if forwarded.is_some() && is_forwarded(name) {
            continue; // the proxy's own follow
        }
        if name == CONNECTION {
            close |=
                value.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        } else if name == TRAILER {
            trailers = Some(value.clone());
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    if let Some(forwarded) = forwarded {
        forwarded.write(dst);
    }
    // As hyper frames it: no body when empty; a `Transfer-Encoding` given means chunked; a
    // `Content-Length` given is kept; else the body's exact size, else chunked.
    let body = req.body();
    let framing = if body.is_end_stream() {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = declared.and_then(|v| parse_decimal(v.as_bytes())) {
        Framing::Length(n)
    } else if let Some(n) = body.size_hint().exact() {
        Framing::Length(n)
    } else if matches!(*req.method(), Method::GET | Method::HEAD | Method::CONNECT) {
        // These methods almost never have a body: a chunked one would surprise (hyper).
        Framing::Empty
    } else {
        Framing::Chunked
    };
    match (framing, declared) {
        (Framing::Chunked, _) => dst.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        (_, Some(value)) => {
            dst.extend_from_slice(b"content-length: ");
            dst.extend_from_slice(value.as_bytes());
            dst.extend_from_slice(b"\r\n");
        }
        (Framing::Length(n), None) => {
            dst.extend_from_slice(b"content-length: ");
            dst.extend_from_slice(itoa(n, &mut [0; 20]));
            dst.extend_from_slice(b"\r\n");
        }
        (Framing::Empty, None) => {}
    }
    dst.extend_from_slice(b"\r\n");
    Encoded { framing, close, trailers }
}

/// `n` in decimal, written into `buf`.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Bytes waiting to be written: up to three pieces, written in order.
#[derive(Default)]
struct Out {
    pieces: [Bytes; 3],
}

impl Out {
    fn is_empty(&self) -> bool {
        self.pieces.iter().all(Bytes::is_empty)
    }

    fn poll_write(&mut self, io: &mut SendTimed<Io>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            let [a, b, c] = &self.pieces;
            let slices = [io::IoSlice::new(a), io::IoSlice::new(b), io::IoSlice::new(c)];
            let mut n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            for piece in &mut self.pieces {
                let k = n.min(piece.len());
                piece.advance(k);
                n -= k;
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Streams `body` with its framing: `Ready(Ok)` once it is all written and flushed.
fn poll_body(
    io: &mut SendTimed<Io>,
    cx: &mut Context<'_>,
    body: &mut UpstreamBody,
    out: &mut Out,
    remaining: &mut Option<u64>,
    finished: &mut bool,
    trailer_names: &Option<HeaderValue>,
) -> Poll<Result<(), BoxError>> {
    use http_body::Body as _;
    loop {
        ready!(out.poll_write(io, cx))?;
        if *finished {
            return Pin::new(&mut *io).poll_flush(cx).map_err(Into::into);
        }
        let frame = match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // What was written must reach the upstream while the body waits.
                ready!(Pin::new(&mut *io).poll_flush(cx))?;
                return Poll::Pending;
            }
        };
        match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => match remaining {
                    Some(left) => {
                        *left = left.checked_sub(data.len() as u64).ok_or(Error::BodyLength)?;
                        out.pieces[1] = data;
                    }
                    None => {
                        let mut size = BytesMut::with_capacity(18);
                        size.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                        out.pieces = [size.freeze(), data, Bytes::from_static(b"\r\n")];
                    }
                },
                Err(frame) => {
                    if let (None, Ok(trailers)) = (*remaining, frame.into_trailers()) {
                        out.pieces[0] = encode_trailers(&trailers, trailer_names.as_ref());
                        *finished = true;
                    }
                }
            },
            Some(Err(e)) => return Poll::Ready(Err(e)),
            None => {
                match remaining {
                    Some(0) => {}
                    Some(_) => return Poll::Ready(Err(Error::BodyLength.into())),
                    None => out.pieces[0] = Bytes::from_static(b"0\r\n\r\n"),
                }
                *finished = true;
            }
        }
    }
}

/// The last chunk with the trailers the request's `Trailer` header names (hyper sends no
/// others).
fn encode_trailers(trailers: &HeaderMap, names: Option<&HeaderValue>) -> Bytes {
    let mut dst = BytesMut::from(&b"0\r\n"[..]);
    let named = |name: &HeaderName| {
        names.is_some_and(|v| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(name.as_str().as_bytes()))
        })
    };
    for (name, value) in trailers {
        let framing = name == TRANSFER_ENCODING || name == CONTENT_LENGTH || name == TRAILER;
        if framing || !named(name) {
            continue;
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
    dst.freeze()
}

impl Sent {
    fn of(head: Head, request_complete: bool) -> Self {
        let reusable = head.keep_alive && request_complete && head.decode != Decode::Close;
        Sent { response: head.response, decode: head.decode, reusable }
    }

    /// The response, its body reading from `conn`, which goes `home` at the body's end when
    /// the exchange allows it (`home` is `None` when the connection is not to be reused).
    pub(crate) fn into_response(self, conn: Box<Conn>, home: Option<Home>) -> Response<Body> {
        let upgrade = self.response.status() == StatusCode::SWITCHING_PROTOCOLS;
        let home = home.filter(|_| self.reusable && !upgrade);
        let mut body = Body { decode: self.decode, conn: Some(conn), home, upgrade };
        if body.decode == Decode::Done && !upgrade {
            // No body to wait for (it may never be polled).
            body.finish();
        }
        self.response.map(|()| body)
    }
}

// === impl Body ===

/// A response body read off its connection.
pub(crate) struct Body {
    decode: Decode,
    /// Held while the body streams (and after a 101, for the upgrade).
    conn: Option<Box<Conn>>,
    /// Where the connection goes at the end, if it may be reused.
    home: Option<Home>,
    upgrade: bool,
}

/// An upgraded upstream connection (after `101 Switching Protocols`): its stream and what was
/// read past the response head.
pub(crate) struct Upgraded {
    pub(crate) io: SendTimed<Io>,
    pub(crate) read: Bytes,
}

impl Body {
    /// The connection of a `101 Switching Protocols` response.
    pub(crate) fn take_upgrade(&mut self) -> Option<Upgraded> {
        if !self.upgrade {
            return None;
        }
        let conn = *self.conn.take()?;
        Some(Upgraded { io: conn.io, read: conn.rbuf.freeze() })
    }

    /// The body ended: the connection goes home, if it may.
    fn finish(&mut self) {
        self.decode = Decode::Done;
        if let (Some(conn), Some(home)) = (self.conn.take(), self.home.take())
            && conn.rbuf.is_empty()
        {
            home.put(conn);
        }
    }

    fn fail(&mut self, error: Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.decode = Decode::Done;
        self.conn = None;
        Poll::Ready(Some(Err(Box::new(error))))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.decode == Decode::Done {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match step(&mut this.decode, &mut conn.rbuf) {
                Ok(Step::Frame(frame)) => {
                    if this.decode == Decode::Done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(e) => return this.fail(e),
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if this.decode == Decode::Close => {
                    this.home = None;
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(0) => return this.fail(Error::Incomplete),
                Ok(_) => {}
                Err(e) => return this.fail(Error::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decode == Decode::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.decode {
            Decode::Length(n) => SizeHint::with_exact(n),
            Decode::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// Decodes what `buf` holds of the body: a frame, or the need for more bytes, or the end.
fn step(decode: &mut Decode, buf: &mut BytesMut) -> Result<Step, Error> {
    loop {
        match decode {
            Decode::Done => return Ok(Step::End),
            Decode::Close if buf.is_empty() => return Ok(Step::More),
            Decode::Close => return Ok(Step::Frame(Frame::data(buf.split().freeze()))),
            Decode::Length(_) if buf.is_empty() => return Ok(Step::More),
            Decode::Length(left) => {
                let n = (*left).min(buf.len() as u64);
                *left -= n;
                if *left == 0 {
                    *decode = Decode::Done;
                }
                return Ok(Step::Frame(Frame::data(buf.split_to(n as usize).freeze())));
            }
            Decode::Chunked(Chunk::Size) => {
                let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
                    if buf.len() > MAX_CHUNK_LINE {
                        return Err(Error::Parse("chunk size line too long"));
                    }
                    return Ok(Step::More);
                };
                let size = chunk_size(&buf[..eol])?;
                buf.advance(eol + 1);
                *decode = Decode::Chunked(if size == 0 { Chunk::Trailers } else { Chunk::Data(size) });
            }
            Decode::Chunked(Chunk::Data(_)) if buf.is_empty() => return Ok(Step::More),
            Decode::Chunked(Chunk::Data(left)) => {
                let n = (*left).min(buf.len() as u64);
                *left -= n;
                if *left == 0 {
                    *decode = Decode::Chunked(Chunk::DataEnd);
                }
                return Ok(Step::Frame(Frame::data(buf.split_to(n as usize).freeze())));
            }
            Decode::Chunked(Chunk::DataEnd) => {
                if buf.len() < 2 {
                    return Ok(Step::More);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(Error::Parse("chunk data not followed by CRLF"));
                }
                buf.advance(2);
                *decode = Decode::Chunked(Chunk::Size);
            }
            Decode::Chunked(Chunk::Trailers) => {
                if buf.len() < 2 {
                    return Ok(Step::More);
                }
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                    *decode = Decode::Done;
                    return Ok(Step::End);
                }
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    if buf.len() > MAX_TRAILERS {
                        return Err(Error::Parse("trailers too large"));
                    }
                    return Ok(Step::More);
                };
                let section = buf.split_to(end + 4).freeze();
                *decode = Decode::Done;
                return Ok(Step::Frame(Frame::trailers(parse_trailers(&section)?)));
            }
        }
    }
}

/// The size of a chunk-size line (without its LF); extensions are ignored.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let invalid = Error::Parse("invalid chunk size");
    let line = line.strip_suffix(b"\r").ok_or(Error::Parse("invalid chunk size"))?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(invalid);
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(invalid);
    }
    line[..digits]
        .iter()
        .try_fold(0u64, |n, &b| {
            let d = (b as char).to_digit(16).unwrap_or(0) as u64;
            n.checked_mul(16).map(|n| n + d)
        })
        .ok_or(invalid)
}

/// A trailer section (ending with its empty line).
fn parse_trailers(section: &Bytes) -> Result<HeaderMap, Error> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = match httparse::parse_headers(section, &mut raw) {
        Ok(httparse::Status::Complete((_, headers))) => headers,
        _ => return Err(Error::Parse("invalid trailers")),
    };
    let mut trailers = HeaderMap::with_capacity(parsed.len());
    for h in parsed {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| Error::Parse("invalid trailers"))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| Error::Parse("invalid trailers"))?;
        trailers.append(name, value);
    }
    Ok(trailers)
}

// === impl Http1Pool ===

/// Idle HTTP/1.1 connections to one upstream, the most recently used on top: busy connections
/// stay warm and the surplus ages out at the bottom, where [`Clients::sweep`](super::client::Clients::sweep)
/// closes it.
#[derive(Default)]
pub(crate) struct Http1Pool(Mutex<VecDeque<Idle>>);

/// A connection ready for its next request, and since when.
struct Idle {
    since: Instant,
    conn: Box<Conn>,
}

impl std::fmt::Debug for Http1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Pool").field("idle", &lock(&self.0).len()).finish()
    }
}

impl Http1Pool {
    /// The most recently returned connection that is still open (and younger than
    /// `max_lifetime`).
    pub(crate) fn checkout(&self, max_lifetime: Option<Duration>, now: Instant) -> Option<Box<Conn>> {
        let mut idle = lock(&self.0);
        while let Some(Idle { mut conn, .. }) = idle.pop_back() {
            // One the upstream has closed since it came back (or that has bytes to read, which
            // no request asked for) is dropped here, as is one past its lifetime.
            if conn.meta.young(max_lifetime, now) && conn.is_quiet() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps an idle connection, unless `max` are kept already (then it is closed).
    pub(crate) fn checkin(&self, conn: Box<Conn>, max: usize) {
        let since = Instant::now();
        let mut idle = lock(&self.0);
        if idle.len() < max {
            idle.push_back(Idle { since, conn });
        }
    }

    /// Closes the connections the upstream closed and, with `expiry`, those idle since before it;
    /// with `stale`, the buffers of those idle since before it are given back (counted in
    /// `released`). Returns how many stay.
    pub(crate) fn sweep(&self, expiry: Option<Instant>, stale: Option<Instant>, released: &mut u64) -> usize {
        let mut idle = lock(&self.0);
        idle.retain_mut(|c| {
            let keep = expiry.is_none_or(|t| c.since > t) && c.conn.is_quiet();
            if keep && stale.is_some_and(|t| c.since <= t) && c.conn.release_buffers() {
                *released += 1;
            }
            keep
        });
        idle.len()
    }
}

/// Where a connection goes back to.
#[derive(Clone)]
pub(crate) enum PoolRef {
    /// A plain HTTP/1.1 endpoint's own pool.
    Endpoint(Arc<EndpointState<Http1Pool>>),
    /// A pool of [`Clients`](super::client::Clients)' maps.
    Keyed(Arc<Http1Pool>),
}

impl PoolRef {
    /// The pool itself.
    pub(crate) fn get(&self) -> &Http1Pool {
        match self {
            PoolRef::Endpoint(endpoint) => endpoint.slot(),
            PoolRef::Keyed(pool) => pool,
        }
    }
}

/// Where a connection goes back to once its response has been read, and how many idle ones
/// that pool keeps.
pub(crate) struct Home {
    /// The pool.
    pub(crate) pool: PoolRef,
    /// Idle connections it keeps at most.
    pub(crate) max: usize,
}

impl Home {
    /// Back to the pool (closed if the pool is full).
    pub(crate) fn put(self, conn: Box<Conn>) {
        self.pool.get().checkin(conn, self.max);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn decode_all(decode: Decode, input: &[u8]) -> (Vec<u8>, Option<HeaderMap>, Decode) {
        let mut decode = decode;
        let mut buf = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), None);
        // Byte by byte: every boundary is an awkward one.
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Step::Frame(f) = step(&mut decode, &mut buf).unwrap() {
                match f.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                }
            }
        }
        (data, trailers, decode)
    }

    #[test]
    fn chunked_bodies_decode_at_any_boundary() {
        let input = b"5;ext=1\r\nhello\r\n1 ; x\r\n!\r\n0\r\nx-sum: 6\r\n\r\n";
        let (data, trailers, decode) = decode_all(Decode::Chunked(Chunk::Size), input);
        assert_eq!(data, b"hello!");
        assert_eq!(trailers.unwrap()["x-sum"], "6");
        assert_eq!(decode, Decode::Done);
        let (data, trailers, decode) = decode_all(Decode::Chunked(Chunk::Size), b"3\r\nabc\r\n0\r\n\r\n");
        assert_eq!((data.as_slice(), trailers.is_none(), decode), (&b"abc"[..], true, Decode::Done));
    }

    #[test]
    fn bad_chunk_sizes_are_errors() {
        for line in [&b"\r"[..], b"zz\r", b"5 x\r", b"11111111111111111\r", b"5"] {
            assert!(chunk_size(line).is_err(), "{:?}", String::from_utf8_lossy(line));
        }
        assert_eq!(chunk_size(b"fF\r").unwrap(), 255);
    }

    #[test]
    fn response_heads_give_their_framing() {
        let parse = |s: &str, head: bool| parse_head(&mut BytesMut::from(s), head);
        let h = parse("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", false).unwrap().unwrap();
        assert_eq!((h.decode, h.keep_alive), (Decode::Length(5), true));
        let h = parse("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true).unwrap().unwrap();
        assert_eq!(h.decode, Decode::Done);
        let h = parse("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(h.decode, Decode::Done);
        let h =
            parse("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: gzip, chunked\r\n\r\n", false)
                .unwrap()
                .unwrap();
        assert_eq!((h.decode, h.keep_alive), (Decode::Chunked(Chunk::Size), false));
        assert!(!h.response.headers().contains_key(CONTENT_LENGTH));
        let h = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n", false).unwrap().unwrap();
        assert_eq!((h.decode, h.keep_alive), (Decode::Close, false));
        let h = parse("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", false).unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = parse("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let h = parse("HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(h.decode, Decode::Length(2));
        assert!(parse("HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\n", false).is_err());
        assert!(parse("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", false).is_err());
        assert!(parse("HTTP/1.1 200 OK\r\ncontent-len", false).unwrap().is_none());
        assert!(parse("HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n", false).unwrap().unwrap().interim);
    }

    #[test]
    fn common_names_are_the_names_the_general_parse_gives() {
        let spellings = [
            "Content-Length",
            "content-length",
            "Content-Type",
            "content-type",
            "Date",
            "date",
            "Server",
            "server",
            "Connection",
            "connection",
            "Transfer-Encoding",
            "transfer-encoding",
            "Cache-Control",
            "cache-control",
            "Last-Modified",
            "last-modified",
            "ETag",
            "Etag",
            "etag",
            "Accept-Ranges",
            "accept-ranges",
            "Content-Encoding",
            "content-encoding",
            "Vary",
            "vary",
            "Set-Cookie",
            "set-cookie",
            "Location",
            "location",
            "Expires",
            "expires",
        ];
        for raw in spellings {
            let fast = common_name(raw.as_bytes()).unwrap_or_else(|| panic!("{raw} has no fast path"));
            assert_eq!(fast, HeaderName::from_bytes(raw.as_bytes()).unwrap(), "{raw}");
        }
        // Other spellings and names take the general path, to the same result.
        for raw in ["CONTENT-LENGTH", "X-Custom", "Content-Lengthx", ""] {
            assert!(common_name(raw.as_bytes()).is_none(), "{raw}");
        }
        // The framing reads the names from either path.
        for head in
            ["HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", "HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 4\r\n\r\n"]
        {
            let h = parse_head(&mut BytesMut::from(head), false).unwrap().unwrap();
            assert_eq!(h.decode, Decode::Length(4), "{head:?}");
            assert_eq!(h.response.headers()[CONTENT_LENGTH], "4");
        }
        let h = parse_head(
            &mut BytesMut::from("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n"),
            false,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive, "Connection: close read through the fast path");
    }

    #[test]
    fn request_heads_are_framed_as_hyper_frames_them() {
        let encode = |req: Request<UpstreamBody>| {
            let mut dst = BytesMut::new();
            let framing = encode_head(&req, None, &mut dst).framing;
            (String::from_utf8(dst.to_vec()).unwrap(), framing)
        };
        let req = Request::get("/a?b").header("host", "x").body(UpstreamBody::empty()).unwrap();
        let (head, framing) = encode(req);
        assert_eq!(head, "GET /a?b HTTP/1.1\r\nhost: x\r\n\r\n");
        assert!(framing == Framing::Empty);
        let req = Request::post("/").body(UpstreamBody::buffered(Bytes::from_static(b"abc"))).unwrap();
        let (head, framing) = encode(req);
        assert_eq!(head, "POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n");
        assert!(framing == Framing::Length(3));
        let req = Request::post("/")
            .header("content-length", "3")
            .body(UpstreamBody::buffered(Bytes::from_static(b"abc")))
            .unwrap();
        assert_eq!(encode(req).0, "POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\n");
        assert_eq!(itoa(0, &mut [0; 20]), b"0");
        assert_eq!(itoa(1234567890, &mut [0; 20]), b"1234567890");
    }
}
