//! gRPC end to end through the proxy with tonic on both sides: a tonic client over TLS (ALPN h2)
//! or h2c to weir, weir to a tonic-codec server over h2c (`backend-protocol: GRPC`). Unary and
//! bidirectional streaming calls, trailers (status and metadata after the messages), and the
//! proxy's own errors as gRPC statuses. Messages are derived by hand: no protoc needed.
#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::tls::*;
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;
use weir_dataplane::model::{RouteTable, UpstreamProtocol};

/// The one message type of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    n: u32,
}

fn msg(text: &str, n: u32) -> Msg {
    Msg { text: text.to_string(), n }
}

type MsgStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

// === the backend: tonic's server codec on a plain h2c server ===

/// `/t.Test/Echo` (unary: "echo: TEXT"), `/t.Test/Fail` (unary: RESOURCE_EXHAUSTED with
/// metadata), `/t.Test/Chat` (bidi: each message upper-cased as it arrives, then ABORTED in the
/// trailers with a `x-count` metadata, so trailers after messages are seen).
async fn grpc_backend() -> SocketAddr {
    grpc_backend_on(None).await
}

/// [`grpc_backend`] over TLS (`backend-protocol: GRPCS`) with `leaf`, ALPN h2.
async fn grpc_backend_tls(leaf: &Leaf) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    let key = weir_dataplane::tls::certified_key(&leaf.cert).unwrap();
    let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.cert.key_pem.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(weir_dataplane::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(key.cert.clone(), der)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    grpc_backend_on(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
}

async fn grpc_backend_on(tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let tls = tls.clone();
            tokio::spawn(async move {
                let stream: Box<dyn IoStream> = match tls {
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(s) => Box::new(s),
                        Err(_) => return,
                    },
                    None => Box::new(stream),
                };
                let service =
                    hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        Ok::<_, Infallible>(route(req).await)
                    });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http2_only();
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

async fn route(req: http::Request<hyper::body::Incoming>) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
    match req.uri().path() {
        "/t.Test/Echo" => {
            let svc = tower::service_fn(|r: Request<Msg>| async move {
                let m = r.into_inner();
                Ok::<_, Status>(Response::new(msg(&format!("echo: {}", m.text), m.n + 1)))
            });
            grpc.unary(svc, req).await
        }
        "/t.Test/Fail" => {
            let svc = tower::service_fn(|_: Request<Msg>| async move {
                let mut status = Status::resource_exhausted("backend says no");
                status.metadata_mut().insert("x-detail", "from-backend".parse().unwrap());
                Err::<Response<Msg>, _>(status)
            });
            grpc.unary(svc, req).await
        }
        "/t.Test/Chat" => {
            let svc = tower::service_fn(|r: Request<Streaming<Msg>>| async move {
                let mut incoming = r.into_inner();
                let out = async_stream(move |tx| async move {
                    let mut count = 0u32;
                    while let Some(m) = incoming.message().await.transpose() {
                        let m = m.unwrap();
                        count += 1;
                        if tx.send(Ok(msg(&m.text.to_uppercase(), m.n))).await.is_err() {
                            return;
                        }
                    }
                    let mut status = Status::aborted("chat over");
                    status.metadata_mut().insert("x-count", count.to_string().parse().unwrap());
                    let _ = tx.send(Err(status)).await;
                });
                Ok::<_, Status>(Response::new(out))
            });
            grpc.streaming(svc, req).await
        }
        _ => Status::unimplemented("no such method").into_http(),
    }
}

/// A stream fed by a task.
fn async_stream<F, Fut>(f: F) -> MsgStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Msg, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

// === the client: tonic's channel over our own TLS or TCP connector ===

async fn channel(addr: SocketAddr, tls_sni: Option<&'static str>) -> tonic::transport::Channel {
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let io: Box<dyn IoStream> = match tls_sni {
            Some(sni) => Box::new(tls_connect(addr, sni, &[b"h2"]).await?),
            None => Box::new(TcpStream::connect(addr).await?),
        };
        Ok::<_, std::io::Error>(TokioIo::new(io))
    });
    // The authority names the virtual host; the connector decides where and how to connect.
    tonic::transport::Endpoint::from_static("http://grpc.test")
        .connect_with_connector(connector)
        .await
        .unwrap()
}

trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> IoStream for T {}

fn codec() -> ProstCodec<Msg, Msg> {
    ProstCodec::default()
}

async fn unary(ch: &tonic::transport::Channel, path: &'static str, m: Msg) -> Result<Response<Msg>, Status> {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    grpc.unary(Request::new(m), PathAndQuery::from_static(path), codec()).await
}

async fn grpc_table(backend: SocketAddr) -> RouteTable {
    let mut be = backend_named("grpc", backend);
    be.backend.protocol = UpstreamProtocol::H2c;
    let dead = dead_addr().await;
    let mut dead_be = backend_named("dead", dead);
    dead_be.backend.protocol = UpstreamProtocol::H2c;
    let mut empty_be = support::backend("empty", &[]);
    empty_be.backend.protocol = UpstreamProtocol::H2c;
    table()
        .host("grpc.test")
        .prefix("/t.Test", &be)
        .prefix("/t.Dead", &dead_be)
        .prefix("/t.Empty", &empty_be)
        .build()
}

fn backend_named(name: &str, addr: SocketAddr) -> Be {
    support::backend(name, &[addr])
}

#[tokio::test]
async fn unary_and_bidi_streaming_over_tls_and_h2c() {
    let backend = grpc_backend().await;
    let ca = Ca::new();
    let p =
        tls_proxy(with_cert(grpc_table(backend).await, "g", &["grpc.test"], &ca.leaf(&["grpc.test"]))).await;
    for (what, ch) in
        [("tls", channel(p.https, Some("grpc.test")).await), ("h2c", channel(p.http, None).await)]
    {
        let r = unary(&ch, "/t.Test/Echo", msg("hi", 41)).await.unwrap();
        assert_eq!(r.get_ref(), &msg("echo: hi", 42), "{what}");

        // An error status from the backend, with its metadata, reaches the client.
        let err = unary(&ch, "/t.Test/Fail", msg("x", 0)).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::ResourceExhausted, "backend says no"), "{what}");
        assert_eq!(err.metadata().get("x-detail").unwrap(), "from-backend", "{what}");

        // Bidi: each reply arrives before the next request is sent (nothing is buffered), then
        // the trailers carry the final status and metadata.
        let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        grpc.ready().await.unwrap();
        tx.send(msg("one", 1)).await.unwrap();
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let resp = grpc
            .streaming(Request::new(outbound), PathAndQuery::from_static("/t.Test/Chat"), codec())
            .await
            .unwrap();
        let mut inbound = resp.into_inner();
        assert_eq!(inbound.message().await.unwrap().unwrap(), msg("ONE", 1), "{what}");
        for i in 2..=5 {
            tx.send(msg(&format!("m{i}"), i)).await.unwrap();
            assert_eq!(inbound.message().await.unwrap().unwrap(), msg(&format!("M{i}"), i), "{what}");
        }
        drop(tx);
        let end = inbound.message().await.unwrap_err();
        assert_eq!((end.code(), end.message()), (Code::Aborted, "chat over"), "{what}");
        assert_eq!(end.metadata().get("x-count").unwrap(), "5", "{what}");
    }
}

#[tokio::test]
async fn proxy_errors_are_grpc_statuses() {
    let backend = grpc_backend().await;
    let ca = Ca::new();
    let p =
        tls_proxy(with_cert(grpc_table(backend).await, "g", &["grpc.test"], &ca.leaf(&["grpc.test"]))).await;
    let ch = channel(p.https, Some("grpc.test")).await;
    let cases = [
        ("/t.Dead/Call", Code::Unavailable, "502"),
        ("/t.Empty/Call", Code::Unavailable, "503"),
        ("/t.Nowhere/Call", Code::Unimplemented, "404"),
    ];
    for (path, code, http) in cases {
        let err = unary(&ch, path, msg("x", 0)).await.unwrap_err();
        assert_eq!(err.code(), code, "{path}: {err:?}");
        assert!(err.message().starts_with(http), "{path}: {err:?}");
    }
    // The connection is still good afterwards.
    assert_eq!(unary(&ch, "/t.Test/Echo", msg("ok", 0)).await.unwrap().get_ref().text, "echo: ok");
}

#[tokio::test]
async fn grpcs_upstream_over_tls_with_a_verified_certificate() {
    let backend_ca = Ca::new();
    let backend = grpc_backend_tls(&backend_ca.leaf(&["grpc.internal"])).await;
    let mut be = backend_named("grpcs", backend);
    be.backend.protocol = UpstreamProtocol::H2;
    be.backend.tls = Some(weir_dataplane::model::UpstreamTls {
        ca_pem: Some(backend_ca.pem.clone()),
        server_name: Some("grpc.internal".into()),
        ..Default::default()
    });
    let ca = Ca::new();
    let table = with_cert(
        table().host("grpc.test").prefix("/t.Test", &be).build(),
        "g",
        &["grpc.test"],
        &ca.leaf(&["grpc.test"]),
    );
    let p = tls_proxy(table).await;
    let ch = channel(p.https, Some("grpc.test")).await;
    assert_eq!(unary(&ch, "/t.Test/Echo", msg("tls", 1)).await.unwrap().get_ref(), &msg("echo: tls", 2));
    let err = unary(&ch, "/t.Test/Fail", msg("x", 0)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    tx.send(msg("a", 1)).await.unwrap();
    let resp = grpc
        .streaming(
            Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            PathAndQuery::from_static("/t.Test/Chat"),
            codec(),
        )
        .await
        .unwrap();
    let mut inbound = resp.into_inner();
    assert_eq!(inbound.message().await.unwrap().unwrap(), msg("A", 1));
    tx.send(msg("b", 2)).await.unwrap();
    assert_eq!(inbound.message().await.unwrap().unwrap(), msg("B", 2));
    drop(tx);
    let end = inbound.message().await.unwrap_err();
    assert_eq!((end.code(), end.metadata().get("x-count").unwrap().to_str().unwrap()), (Code::Aborted, "2"));
}
