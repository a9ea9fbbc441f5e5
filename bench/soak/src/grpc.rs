//! gRPC both ways, with tonic's codec and messages derived by hand (no protoc): the backend the
//! soak runs behind weir (`weir-soak grpc-server`), and the clients that call it through weir over
//! TLS (unary calls, and bidirectional streams that exchange messages then end with OK).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::clients::{Pacer, TIMEOUT, Target, is_stopped, stopped};
use crate::stats::{ConnGuard, Failure, Proto, Recorder};

/// The one message of the soak's gRPC service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    /// Sent text; answers carry the backend's name before it.
    #[prost(string, tag = "1")]
    pub text: String,
    /// A sequence number, echoed.
    #[prost(uint32, tag = "2")]
    pub n: u32,
}

const ECHO: &str = "/soak.Soak/Echo";
const CHAT: &str = "/soak.Soak/Chat";

type MsgStream = Pin<Box<dyn futures_util::Stream<Item = Result<Msg, Status>> + Send>>;

// === the backend ===

/// Serves `/soak.Soak/Echo` (unary: "NAME TEXT", n + 1) and `/soak.Soak/Chat` (bidi: each
/// message answered "NAME TEXT" as it arrives, then OK) over h2c on `listen`, forever.
pub async fn serve(listen: SocketAddr, name: String) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    eprintln!("grpc-server {name} listening on {listen}");
    let name: Arc<str> = name.into();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let name = name.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let name = name.clone();
                async move { Ok::<_, Infallible>(route(req, name).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn route(
    req: http::Request<hyper::body::Incoming>,
    name: Arc<str>,
) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
    match req.uri().path() {
        ECHO => {
            let svc = tower::service_fn(move |r: Request<Msg>| {
                let name = name.clone();
                async move {
                    let m = r.into_inner();
                    Ok::<_, Status>(Response::new(Msg { text: format!("{name} {}", m.text), n: m.n + 1 }))
                }
            });
            grpc.unary(svc, req).await
        }
        CHAT => {
            let svc = tower::service_fn(move |r: Request<Streaming<Msg>>| {
                let name = name.clone();
                async move {
                    let mut incoming = r.into_inner();
                    let (tx, rx) = tokio::sync::mpsc::channel(4);
                    tokio::spawn(async move {
                        loop {
                            let next = match incoming.message().await {
                                Ok(Some(m)) => Ok(Msg { text: format!("{name} {}", m.text), n: m.n }),
                                Ok(None) => return,
                                Err(status) => Err(status),
                            };
                            let failed = next.is_err();
                            if tx.send(next).await.is_err() || failed {
                                return;
                            }
                        }
                    });
                    let out: MsgStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
                    Ok::<_, Status>(Response::new(out))
                }
            });
            grpc.streaming(svc, req).await
        }
        _ => Status::unimplemented("no such method").into_http(),
    }
}

// === the clients ===

/// A connection counted in a protocol's open connections while it lives.
struct Counted<T> {
    io: T,
    _guard: ConnGuard<'static>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A tonic channel to `host` through weir's HTTPS listener (ALPN h2). It connects lazily and
/// reconnects by itself after a failure; every handshake's certificate is recorded.
pub fn channel(
    target: Arc<Target>,
    rec: &'static Recorder,
    proto: Proto,
    host: &'static str,
) -> anyhow::Result<tonic::transport::Channel> {
    let connector = tower::service_fn(move |_: http::Uri| {
        let target = target.clone();
        async move {
            let io =
                target.tls_connect(rec, host, b"h2").await.map_err(|f| std::io::Error::other(f.detail))?;
            Ok::<_, std::io::Error>(TokioIo::new(Counted { io, _guard: rec.conn(proto) }))
        }
    });
    // The authority names the virtual host; the connector decides where and how to connect.
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{host}"))?
        .connect_with_connector_lazy(connector))
}

/// The class of a gRPC status.
fn status_class(status: &Status) -> &'static str {
    match status.code() {
        Code::Unavailable => "grpc_unavailable",
        Code::Internal => "grpc_internal",
        Code::Unknown => "grpc_unknown",
        Code::DeadlineExceeded => "grpc_deadline",
        Code::Cancelled => "grpc_cancelled",
        Code::Unimplemented => "grpc_unimplemented",
        Code::ResourceExhausted => "grpc_resource_exhausted",
        _ => "grpc_other",
    }
}

fn failure(status: &Status) -> Failure {
    Failure::new(status_class(status), format!("{:?}: {}", status.code(), status.message()))
}

/// The backend named at the start of an answer.
fn backend_of(text: &str) -> Option<String> {
    text.split(' ').next().filter(|n| n.starts_with("grpc-")).map(str::to_string)
}

/// Unary calls, one every `period`.
pub async fn unary(
    channel: tonic::transport::Channel,
    rec: &'static Recorder,
    period: Duration,
    stop: watch::Receiver<bool>,
) {
    let proto = Proto::GrpcUnary;
    let mut pacer = Pacer::new(period, stop);
    let mut n = 0u32;
    while pacer.next().await {
        n = n.wrapping_add(1);
        let start = Instant::now();
        let call = async {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.map_err(|e| Failure::new("grpc_connect", e))?;
            let m = Msg { text: format!("call {n}"), n };
            let codec = ProstCodec::<Msg, Msg>::default();
            grpc.unary(Request::new(m), PathAndQuery::from_static(ECHO), codec).await.map_err(|s| failure(&s))
        };
        match tokio::time::timeout(TIMEOUT, call).await {
            Err(_) => rec.error(proto, &Failure::new("timeout", "unary call"), None),
            Ok(Err(f)) => rec.error(proto, &f, None),
            Ok(Ok(reply)) => {
                let reply = reply.into_inner();
                let backend = backend_of(&reply.text);
                if backend.is_some()
                    && reply.text.ends_with(&format!(" call {n}"))
                    && reply.n == n.wrapping_add(1)
                {
                    rec.ok(proto, start.elapsed());
                } else {
                    rec.error(
                        proto,
                        &Failure::new("grpc_mismatch", format!("{reply:?}")),
                        backend.as_deref(),
                    );
                }
            }
        }
    }
}

/// Bidirectional streams: `messages` round trips, one every `period`, then the client ends its
/// side and expects OK. Each round trip counts as one request.
pub async fn streams(
    channel: tonic::transport::Channel,
    rec: &'static Recorder,
    period: Duration,
    messages: u32,
    mut stop: watch::Receiver<bool>,
) {
    let proto = Proto::GrpcStream;
    while !is_stopped(&stop) {
        let mut backend = None;
        let result = {
            let run = chat(&channel, rec, period, messages, stop.clone(), &mut backend);
            tokio::select! {
                () = stopped(&mut stop) => return,
                result = run => result,
            }
        };
        if let Err(f) = result {
            rec.error(proto, &f, backend.as_deref());
            tokio::time::sleep(period).await;
        }
    }
}

async fn chat(
    channel: &tonic::transport::Channel,
    rec: &Recorder,
    period: Duration,
    messages: u32,
    stop: watch::Receiver<bool>,
    backend: &mut Option<String>,
) -> Result<(), Failure> {
    let proto = Proto::GrpcStream;
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    tokio::time::timeout(TIMEOUT, grpc.ready())
        .await
        .map_err(|_| Failure::new("timeout", "channel ready"))?
        .map_err(|e| Failure::new("grpc_connect", e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
    let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
    let codec = ProstCodec::<Msg, Msg>::default();
    let first = Msg { text: "m0".into(), n: 0 };
    let mut start = Instant::now();
    tx.send(first).await.map_err(|_| Failure::new("grpc_send", "stream closed"))?;
    let response = tokio::time::timeout(
        TIMEOUT,
        grpc.streaming(Request::new(outbound), PathAndQuery::from_static(CHAT), codec),
    )
    .await
    .map_err(|_| Failure::new("timeout", "stream open"))?
    .map_err(|s| failure(&s))?;
    let mut inbound = response.into_inner();
    let mut pacer = Pacer::new(period, stop);
    for n in 0..messages {
        if n > 0 {
            if !pacer.next().await {
                return Ok(());
            }
            start = Instant::now();
            tx.send(Msg { text: format!("m{n}"), n })
                .await
                .map_err(|_| Failure::new("grpc_send", "stream closed"))?;
        }
        let reply = tokio::time::timeout(TIMEOUT, inbound.message())
            .await
            .map_err(|_| Failure::new("timeout", "stream reply"))?
            .map_err(|s| failure(&s))?
            .ok_or_else(|| Failure::new("grpc_stream_ended", format!("after {n} replies")))?;
        *backend = backend_of(&reply.text);
        if backend.is_none() || !reply.text.ends_with(&format!(" m{n}")) || reply.n != n {
            return Err(Failure::new("grpc_mismatch", format!("{reply:?}")));
        }
        rec.ok(proto, start.elapsed());
    }
    drop(tx);
    match tokio::time::timeout(TIMEOUT, inbound.message()).await {
        Err(_) => Err(Failure::new("timeout", "stream end")),
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(extra))) => Err(Failure::new("grpc_mismatch", format!("unexpected {extra:?}"))),
        Ok(Err(s)) => Err(failure(&s)),
    }
}
