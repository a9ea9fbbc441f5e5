//! The HTTP and WebSocket clients: each worker keeps its kind of traffic going at a fixed pace
//! until told to stop, checks every answer (status 200 and a replica of the expected Service),
//! and records successes with their latency and failures by class.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::stats::{Failure, Proto, Recorder};

/// The longest any one exchange may take before it counts as a `timeout`.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Where the clients connect and how they verify weir's certificate.
pub struct Target {
    /// weir's plain HTTP listener.
    pub http: SocketAddr,
    /// weir's HTTPS listener.
    pub https: SocketAddr,
    /// TLS client settings trusting the soak's CA (no session resumption, so every handshake
    /// shows the certificate served at that moment).
    pub tls: Arc<rustls::ClientConfig>,
}

impl Target {
    /// A TLS connection to the HTTPS listener for `sni`, offering `alpn`; the leaf is recorded.
    pub async fn tls_connect(
        &self,
        rec: &Recorder,
        sni: &'static str,
        alpn: &[u8],
    ) -> Result<TlsStream<TcpStream>, Failure> {
        let tcp = tcp_connect(self.https).await?;
        let mut config = (*self.tls).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        let name =
            rustls_pki_types::ServerName::try_from(sni).map_err(|e| Failure::new("tls_handshake", e))?;
        let tls = tokio::time::timeout(TIMEOUT, TlsConnector::from(Arc::new(config)).connect(name, tcp))
            .await
            .map_err(|_| Failure::new("timeout", "TLS handshake"))?
            .map_err(|e| Failure::new("tls_handshake", e))?;
        if let Some(leaf) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
            rec.cert_seen(leaf);
        }
        Ok(tls)
    }
}

/// A TCP connection to `addr`, with Nagle off.
pub async fn tcp_connect(addr: SocketAddr) -> Result<TcpStream, Failure> {
    let tcp = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| Failure::new("timeout", "connect"))?
        .map_err(|e| Failure::new("connect", e))?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// Resolves once the run is over (`stop` turned true or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Whether the run is over.
pub fn is_stopped(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow()
}

/// A tick every `period` until `stop` turns true.
pub struct Pacer {
    ticks: tokio::time::Interval,
    stop: watch::Receiver<bool>,
}

impl Pacer {
    /// Ticks every `period`, the first one now.
    pub fn new(period: Duration, stop: watch::Receiver<bool>) -> Self {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Pacer { ticks, stop }
    }

    /// Waits for the next tick: false once the run is over.
    pub async fn next(&mut self) -> bool {
        if is_stopped(&self.stop) {
            return false;
        }
        tokio::select! {
            () = stopped(&mut self.stop) => false,
            _ = self.ticks.tick() => true,
        }
    }
}

/// The class of a non-200 status.
fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        404 => "http_404",
        429 => "http_429",
        502 => "http_502",
        503 => "http_503",
        504 => "http_504",
        400..=499 => "http_4xx",
        500..=599 => "http_5xx",
        _ => "http_other",
    }
}

/// The class of a hyper client error.
fn hyper_class(error: &hyper::Error) -> &'static str {
    if error.is_incomplete_message() {
        "closed_before_response"
    } else if error.is_canceled() {
        "canceled"
    } else if error.is_timeout() {
        "timeout"
    } else if error.is_parse() {
        "bad_response"
    } else {
        "io"
    }
}

/// The `"name"` of weir echo's JSON answer: which replica served it.
fn echo_name(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("\"name\":\"")? + 8;
    let len = text[start..].find('"')?;
    Some(text[start..start + len].to_string())
}

/// Sends `req`, reads the whole answer and checks it: 200, from a replica of `service`.
/// Returns the replica's name.
async fn exchange<F>(send: F, service: &str) -> Result<String, (Failure, Option<String>)>
where
    F: Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
{
    let work = async {
        let response = send.await.map_err(|e| (Failure::new(hyper_class(&e), &e), None))?;
        let status = response.status();
        let body =
            response.into_body().collect().await.map_err(|e| (Failure::new("body", &e), None))?.to_bytes();
        let name = echo_name(&body);
        if status != StatusCode::OK {
            let detail = format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]));
            return Err((Failure::new(status_class(status), detail), name));
        }
        match name {
            Some(name) if name.starts_with(service) && name[service.len()..].starts_with('-') => Ok(name),
            other => Err((
                Failure::new("wrong_backend", format!("expected a {service} replica, got {other:?}")),
                other,
            )),
        }
    };
    tokio::time::timeout(TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err((Failure::new("timeout", "request"), None)))
}

fn get(host: &str, uri: &str, close: bool) -> Request<Empty<Bytes>> {
    let mut builder = Request::get(uri).header(header::HOST, host);
    if close {
        builder = builder.header(header::CONNECTION, "close");
    }
    builder.body(Empty::new()).unwrap_or_default()
}

/// An HTTP/1.1 client connection over `io`.
async fn h1_handshake<T>(io: T) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>, Failure>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Failure::new("handshake", e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// HTTP/1.1 requests for `host` on one keep-alive connection at a time, over TLS when `tls`;
/// the connection is replaced after `reuse` requests (a new handshake), or when weir closed it
/// between requests (not an error: `Connection: close` or an idle timeout).
pub async fn h1_keepalive(
    target: Arc<Target>,
    rec: &'static Recorder,
    proto: Proto,
    host: &'static str,
    period: Duration,
    reuse: u32,
    stop: watch::Receiver<bool>,
) {
    let tls = proto == Proto::H1Tls;
    let mut conn = None;
    let mut used = 0u32;
    let mut pacer = Pacer::new(period, stop);
    while pacer.next().await {
        if used >= reuse {
            conn = None;
        }
        if conn.as_ref().is_some_and(|(s, _): &(hyper::client::conn::http1::SendRequest<_>, _)| s.is_closed())
        {
            conn = None;
        }
        let start = Instant::now();
        if conn.is_none() {
            let made = if tls {
                match target.tls_connect(rec, host, b"http/1.1").await {
                    Ok(io) => h1_handshake(io).await,
                    Err(f) => Err(f),
                }
            } else {
                match tcp_connect(target.http).await {
                    Ok(io) => h1_handshake(io).await,
                    Err(f) => Err(f),
                }
            };
            match made {
                Ok(sender) => {
                    conn = Some((sender, rec.conn(proto)));
                    used = 0;
                }
                Err(f) => {
                    rec.error(proto, &f, None);
                    continue;
                }
            }
        }
        let Some((sender, _)) = conn.as_mut() else { continue };
        if tokio::time::timeout(TIMEOUT, sender.ready()).await.map_or(true, |r| r.is_err()) {
            // Closed by weir before this request was sent: reconnect on the next tick.
            conn = None;
            continue;
        }
        used += 1;
        match exchange(sender.send_request(get(host, "/", false)), proto.service()).await {
            Ok(_) => rec.ok(proto, start.elapsed()),
            Err((f, backend)) => {
                if !f.class.starts_with("http_") && f.class != "wrong_backend" {
                    conn = None;
                }
                rec.error(proto, &f, backend.as_deref());
            }
        }
    }
}

/// HTTP/1.1 requests for `host`, each on a new plain connection (`Connection: close`).
pub async fn h1_new_connections(
    target: Arc<Target>,
    rec: &'static Recorder,
    host: &'static str,
    period: Duration,
    stop: watch::Receiver<bool>,
) {
    let proto = Proto::H1New;
    let mut pacer = Pacer::new(period, stop);
    while pacer.next().await {
        let start = Instant::now();
        let made = match tcp_connect(target.http).await {
            Ok(io) => h1_handshake(io).await,
            Err(f) => Err(f),
        };
        let mut sender = match made {
            Ok(sender) => sender,
            Err(f) => {
                rec.error(proto, &f, None);
                continue;
            }
        };
        let _conn = rec.conn(proto);
        match exchange(sender.send_request(get(host, "/", true)), proto.service()).await {
            Ok(_) => rec.ok(proto, start.elapsed()),
            Err((f, backend)) => rec.error(proto, &f, backend.as_deref()),
        }
    }
}

/// HTTP/2 over TLS for `host`: every tick, `streams` requests at once on one connection,
/// replaced after `reuse` ticks.
pub async fn h2_tls(
    target: Arc<Target>,
    rec: &'static Recorder,
    host: &'static str,
    period: Duration,
    streams: usize,
    reuse: u32,
    stop: watch::Receiver<bool>,
) {
    let proto = Proto::H2Tls;
    let uri = format!("https://{host}/");
    let mut conn = None;
    let mut used = 0u32;
    let mut pacer = Pacer::new(period, stop);
    while pacer.next().await {
        if used >= reuse
            || conn
                .as_ref()
                .is_some_and(|(s, _): &(hyper::client::conn::http2::SendRequest<_>, _)| s.is_closed())
        {
            conn = None;
        }
        if conn.is_none() {
            let made = match target.tls_connect(rec, host, b"h2").await {
                Ok(io) => hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                    .await
                    .map_err(|e| Failure::new("handshake", e)),
                Err(f) => Err(f),
            };
            match made {
                Ok((sender, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    conn = Some((sender, rec.conn(proto)));
                    used = 0;
                }
                Err(f) => {
                    rec.error(proto, &f, None);
                    continue;
                }
            }
        }
        let Some((sender, _)) = conn.as_mut() else { continue };
        used += 1;
        let requests = (0..streams).map(|_| {
            let mut sender = sender.clone();
            let uri = uri.clone();
            async move {
                let start = Instant::now();
                let request = Request::get(uri.as_str()).body(Empty::<Bytes>::new()).unwrap_or_default();
                match exchange(sender.send_request(request), proto.service()).await {
                    Ok(_) => {
                        rec.ok(proto, start.elapsed());
                        true
                    }
                    Err((f, backend)) => {
                        let fatal = !f.class.starts_with("http_") && f.class != "wrong_backend";
                        rec.error(proto, &f, backend.as_deref());
                        !fatal
                    }
                }
            }
        });
        let results = futures_util::future::join_all(requests).await;
        if results.contains(&false) {
            conn = None;
        }
    }
}

/// WebSocket sessions to `host` `/ws`: connect, `messages` echoes one every `period`, close.
pub async fn websocket(
    target: Arc<Target>,
    rec: &'static Recorder,
    host: &'static str,
    period: Duration,
    messages: u32,
    worker: usize,
    mut stop: watch::Receiver<bool>,
) {
    let proto = Proto::Ws;
    let mut session = 0u64;
    while !is_stopped(&stop) {
        session += 1;
        let run = ws_session(&target, rec, host, period, messages, worker, session);
        tokio::select! {
            () = stopped(&mut stop) => return,
            result = run => if let Err(f) = result {
                rec.error(proto, &f, None);
                // Do not hammer a failing path: wait one period before the next session.
                tokio::time::sleep(period).await;
            },
        }
    }
}

async fn ws_session(
    target: &Target,
    rec: &Recorder,
    host: &str,
    period: Duration,
    messages: u32,
    worker: usize,
    session: u64,
) -> Result<(), Failure> {
    let proto = Proto::Ws;
    let tcp = tcp_connect(target.http).await?;
    let handshake = tokio_tungstenite::client_async(format!("ws://{host}/ws"), tcp);
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, handshake)
        .await
        .map_err(|_| Failure::new("timeout", "WebSocket handshake"))?
        .map_err(|e| match &e {
            tungstenite::Error::Http(response) => Failure::new(status_class(response.status()), &e),
            _ => Failure::new("ws_handshake", &e),
        })?;
    let _conn = rec.conn(proto);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for n in 0..messages {
        ticks.tick().await;
        let text = format!("worker {worker} session {session} message {n:06} {:x<40}", "");
        let start = Instant::now();
        ws.send(Message::text(text.clone())).await.map_err(|e| Failure::new("ws_send", e))?;
        let reply =
            tokio::time::timeout(TIMEOUT, ws.next()).await.map_err(|_| Failure::new("timeout", "echo"))?;
        match reply {
            Some(Ok(Message::Text(got))) if got.as_str() == text => rec.ok(proto, start.elapsed()),
            Some(Ok(other)) => {
                return Err(Failure::new("ws_mismatch", format!("sent {text:?}, got {other:?}")));
            }
            Some(Err(e)) => return Err(Failure::new("ws_closed", e)),
            None => return Err(Failure::new("ws_closed", "connection ended")),
        }
    }
    ws.close(None).await.map_err(|e| Failure::new("ws_close", e))?;
    // The echo's close frame, then the end of the stream.
    let drained = tokio::time::timeout(TIMEOUT, async {
        while let Some(frame) = ws.next().await {
            match frame {
                Ok(_) => {}
                Err(tungstenite::Error::ConnectionClosed) => break,
                Err(e) => return Err(Failure::new("ws_close", e)),
            }
        }
        Ok(())
    })
    .await;
    drained.map_err(|_| Failure::new("timeout", "close handshake"))?
}
