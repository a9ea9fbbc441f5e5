//! `weir echo`: a debugging backend that answers every request with JSON describing it.
//!
//! One port serves HTTP/1.0, HTTP/1.1 and h2c (prior knowledge). Every request gets an
//! [`EchoResponse`]; a few `x-echo-*` request headers shape the answer:
//!
//! - `x-echo-status: NNN` answers with that status (200–599), still with the JSON body;
//! - `x-echo-delay-ms: N` waits `N` milliseconds (at most 600 000) before the response head;
//! - `x-echo-body-size: N` answers with an `N`-byte body streamed in chunks instead of the JSON.
//!
//! An invalid control value is answered 400 with a plain-text message. An HTTP/1.1 WebSocket
//! upgrade is accepted and every text or binary message is echoed back unchanged. A gRPC call
//! (HTTP/2, `content-type: application/grpc…`) gets a gRPC answer: one message whose field 1
//! (a protobuf `string`) is the JSON description, then `grpc-status: 0`.
//!
//! The request body is counted while it streams, never buffered whole, so the echo backend can
//! take arbitrarily large uploads.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Request header: answer with this status code (200–599).
pub const STATUS_HEADER: &str = "x-echo-status";
/// Request header: wait this many milliseconds before sending the response head.
pub const DELAY_HEADER: &str = "x-echo-delay-ms";
/// Request header: answer with a body of this many bytes instead of the JSON description.
pub const BODY_SIZE_HEADER: &str = "x-echo-body-size";

/// The longest delay `x-echo-delay-ms` accepts, in milliseconds.
const MAX_DELAY_MS: u64 = 600_000;
/// Size of the chunks of an `x-echo-body-size` body.
const CHUNK_SIZE: usize = 16 * 1024;
/// The bytes every `x-echo-body-size` body is made of.
static CHUNK: [u8; CHUNK_SIZE] = [b'x'; CHUNK_SIZE];

/// What the echo backend saw of a request: the JSON body of every answer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EchoResponse {
    /// The name the backend was started with (which replica answered).
    pub name: String,
    /// The request method.
    pub method: String,
    /// The request path, without the query.
    pub path: String,
    /// The query string, without the `?`.
    pub query: Option<String>,
    /// The `Host` header, or the `:authority` for HTTP/2.
    pub host: Option<String>,
    /// Request headers by lower-case name; repeated values are joined with `", "`.
    pub headers: BTreeMap<String, String>,
    /// The peer address of the connection (the proxy, when behind one).
    pub remote_addr: String,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2.0`.
    pub protocol: String,
    /// Length of the request body, counted while streaming.
    pub body_bytes: u64,
}

/// The response body type of the echo backend.
type EchoBody = BoxBody<Bytes, Infallible>;

/// Serves the echo backend on `listener` until `shutdown` completes.
///
/// HTTP/1 and h2c share the port; each connection runs on its own task. On shutdown the
/// listener stops accepting and open connections are closed gracefully in the background
/// (in-flight requests finish; upgraded WebSocket connections are left alone).
pub async fn serve(
    listener: TcpListener,
    name: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let name: Arc<str> = name.into();
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Per-connection errors (reset before accept, fd exhaustion) must not stop
                // the server; back off briefly so a persistent error does not spin.
                Err(error) => {
                    tracing::debug!(%error, "echo: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, %remote, "echo: set_nodelay failed");
        }
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let name = name.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, name.clone(), remote));
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(conn).await {
                tracing::debug!(%error, %remote, "echo: connection ended with an error");
            }
        });
    }
    tokio::spawn(graceful.shutdown());
    Ok(())
}

// === request handling ===

/// The control headers of one request, parsed.
#[derive(Debug, Default)]
struct Controls {
    status: Option<StatusCode>,
    delay: Option<Duration>,
    body_size: Option<u64>,
}

impl Controls {
    /// Parses the `x-echo-*` headers; the error is the message of the 400 answer.
    fn parse(headers: &HeaderMap) -> Result<Self, String> {
        let status = control(headers, STATUS_HEADER, |v| {
            v.parse::<u16>()
                .ok()
                .filter(|code| (200..=599).contains(code))
                .and_then(|code| StatusCode::from_u16(code).ok())
                .ok_or("expected a status code from 200 to 599")
        })?;
        let delay = control(headers, DELAY_HEADER, |v| {
            v.parse::<u64>()
                .ok()
                .filter(|ms| *ms <= MAX_DELAY_MS)
                .map(Duration::from_millis)
                .ok_or("expected milliseconds from 0 to 600000")
        })?;
        let body_size = control(headers, BODY_SIZE_HEADER, |v| {
            v.parse::<u64>().map_err(|_| "expected a number of bytes")
        })?;
        Ok(Controls { status, delay, body_size })
    }
}

/// Parses the control header `name`, if present, with `parse`.
fn control<T>(
    headers: &HeaderMap,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, &'static str>,
) -> Result<Option<T>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("{name}: expected one value, got several"));
    }
    let text = value.to_str().map_err(|_| format!("{name}: value is not visible ASCII"))?;
    parse(text.trim()).map(Some).map_err(|reason| format!("{name}: invalid value {text:?}: {reason}"))
}

async fn handle(
    req: Request<Incoming>,
    name: Arc<str>,
    remote: SocketAddr,
) -> Result<Response<EchoBody>, Infallible> {
    let controls = match Controls::parse(req.headers()) {
        Ok(controls) => controls,
        Err(message) => return Ok(text(StatusCode::BAD_REQUEST, message)),
    };
    if wants_websocket(&req) {
        return Ok(websocket(req, name));
    }

    let (parts, mut body) = req.into_parts();
    let mut body_bytes = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    body_bytes += data.len() as u64;
                }
            }
            Err(error) => {
                return Ok(text(StatusCode::BAD_REQUEST, format!("error reading the request body: {error}")));
            }
        }
    }

    if let Some(delay) = controls.delay {
        tokio::time::sleep(delay).await;
    }
    let status = controls.status.unwrap_or(StatusCode::OK);

    if let Some(size) = controls.body_size {
        let mut response = Response::new(SizedBody { remaining: size }.boxed());
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        return Ok(response);
    }

    let echo = EchoResponse {
        name: name.to_string(),
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        host: parts
            .headers
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .or_else(|| parts.uri.authority().map(|a| a.to_string())),
        headers: header_map(&parts.headers),
        remote_addr: remote.to_string(),
        protocol: protocol(parts.version).to_owned(),
        body_bytes,
    };
    let json = match serde_json::to_vec(&echo) {
        Ok(json) => json,
        Err(error) => {
            return Ok(text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the echo response: {error}"),
            ));
        }
    };
    if is_grpc(parts.version, &parts.headers) {
        return Ok(grpc_answer(&json));
    }
    let mut response = Response::new(Full::new(Bytes::from(json)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

// === gRPC ===

/// Whether a request is a gRPC call: HTTP/2 with a `content-type` of `application/grpc` (or
/// `application/grpc+…`, `application/grpc;…`).
fn is_grpc(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_2
        && headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
            v.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// A gRPC answer carrying `json`: status 200, one length-prefixed message (uncompressed) whose
/// field 1 is `json` as a protobuf `string`, and the trailer `grpc-status: 0`.
fn grpc_answer(json: &[u8]) -> Response<EchoBody> {
    let message = grpc_message(json);
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    // A message longer than 4 GiB cannot be framed; the description is a few KB.
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = Full::new(Bytes::from(frame)).with_trailers(async move { Some(Ok(trailers)) });
    let mut response = Response::new(body.boxed());
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A protobuf message with `text` as field 1 (`string`, wire type 2).
fn grpc_message(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 11);
    out.push(0x0a);
    let mut len = text.len() as u64;
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(text);
    out
}

/// Headers by lower-case name, repeated values joined with `", "`.
fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map = BTreeMap::<String, String>::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        map.entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    map
}

fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "unknown",
    }
}

/// A plain-text answer.
fn text(status: StatusCode, message: String) -> Response<EchoBody> {
    let mut response = Response::new(Full::new(Bytes::from(message + "\n")).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

// === WebSocket ===

/// Whether `req` asks for an HTTP/1.1 WebSocket upgrade.
fn wants_websocket(req: &Request<Incoming>) -> bool {
    req.version() == Version::HTTP_11
        && has_token(req.headers(), header::CONNECTION, "upgrade")
        && has_token(req.headers(), header::UPGRADE, "websocket")
}

/// Whether the comma-separated header `name` holds `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| v.split(',').any(|part| part.trim().eq_ignore_ascii_case(token)))
    })
}

/// Answers a WebSocket upgrade with 101 and echoes messages on the upgraded connection.
fn websocket(req: Request<Incoming>, name: Arc<str>) -> Response<EchoBody> {
    if req.method() != Method::GET {
        return text(StatusCode::BAD_REQUEST, "websocket: the upgrade request must be a GET".to_owned());
    }
    let version_ok = req.headers().get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v.as_bytes() == b"13");
    if !version_ok {
        let mut response =
            text(StatusCode::UPGRADE_REQUIRED, "websocket: sec-websocket-version must be 13".to_owned());
        response.headers_mut().insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return response;
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return text(StatusCode::BAD_REQUEST, "websocket: missing sec-websocket-key".to_owned());
    };
    let accept = derive_accept_key(key.as_bytes());
    let Ok(accept) = HeaderValue::from_str(&accept) else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "websocket: cannot encode sec-websocket-accept".to_owned(),
        );
    };

    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => echo_messages(upgraded, &name).await,
            Err(error) => tracing::debug!(%error, "echo: websocket upgrade failed"),
        }
    });

    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    response
}

/// Echoes text and binary messages until the peer closes. Pings are answered and a close is
/// completed by tungstenite itself; flushing after each message sends those replies promptly.
async fn echo_messages(upgraded: hyper::upgrade::Upgraded, name: &str) {
    let io = TokioIo::new(upgraded);
    let mut ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
    while let Some(message) = ws.next().await {
        let result = match message {
            Ok(message @ (Message::Text(_) | Message::Binary(_))) => ws.send(message).await,
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_)) => {
                ws.flush().await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            tracing::debug!(%error, backend = name, "echo: websocket ended with an error");
            return;
        }
    }
}

// === SizedBody ===

/// A body of `remaining` bytes, produced in [`CHUNK_SIZE`] chunks without allocating.
#[derive(Debug)]
struct SizedBody {
    remaining: u64,
}

impl Body for SizedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = usize::try_from(self.remaining).map_or(CHUNK_SIZE, |r| r.min(CHUNK_SIZE));
        self.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK[..n])))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC answer's message is a protobuf `string` field 1: tag 0x0a, a varint length, the
    /// bytes (lengths past 127 take several varint bytes).
    #[test]
    fn grpc_message_is_field_one_with_a_varint_length() {
        assert_eq!(grpc_message(b"hi"), [0x0a, 2, b'h', b'i']);
        let long = vec![b'x'; 300];
        let encoded = grpc_message(&long);
        assert_eq!(&encoded[..3], &[0x0a, 0xac, 0x02]);
        assert_eq!(&encoded[3..], &long[..]);
    }

    /// Only HTTP/2 requests with a gRPC content type are gRPC calls.
    #[test]
    fn grpc_calls_are_told_by_version_and_content_type() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
        assert!(is_grpc(Version::HTTP_2, &headers));
        assert!(!is_grpc(Version::HTTP_11, &headers));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc-web"));
        assert!(!is_grpc(Version::HTTP_2, &headers));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        assert!(is_grpc(Version::HTTP_2, &headers));
    }
}
