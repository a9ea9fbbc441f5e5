//! nginx's buffer settings (`proxy-buffer-size`, `proxy-buffers-number`,
//! `client-body-buffer-size`, `proxy-max-temp-file-size`) are validated and change nothing in
//! weir, which streams. What users see instead, through a real proxy: an upstream response head
//! far larger than nginx's default `proxy-buffer-size` (4k) passes, up to the upstream client's limit of
//! 408 KiB (hyper's default read limit: a 400 KiB head passes, 420 KiB does not), past which the answer
//! is 502 as nginx's "upstream sent too big header"; request bodies stream without a buffer size.
#![allow(clippy::unwrap_used)]

mod support;

use bytes::Bytes;
use support::*;

/// An upstream answering with one `x-big` header of the size asked in `x-size`.
async fn big_header_upstream() -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let size: usize = req.headers()["x-size"].to_str().unwrap().parse().unwrap();
                    let resp = http::Response::builder().header("x-big", "a".repeat(size));
                    Ok::<_, std::convert::Infallible>(
                        resp.body(Full::new(Bytes::from_static(b"ok"))).unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .max_buf_size(4 << 20)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn response_heads_are_not_bounded_by_a_buffer_size() {
    let up = big_header_upstream().await;
    let p = proxy(table().host("app.test").prefix("/", &backend("big", &[up])).build()).await;
    let sized = |n: usize| p.req("app.test", "/").header("x-size", n.to_string()).body(empty()).unwrap();
    // 64 KiB: sixteen times nginx's default proxy-buffer-size.
    let r = p.send(sized(64 << 10)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-big"].len(), 64 << 10);
    // Up to the limit (417,792 bytes), passed on; past it, the upstream's answer is refused.
    let r = p.send(sized(400 << 10)).await;
    assert_eq!((r.status.as_u16(), r.headers["x-big"].len()), (200, 400 << 10));
    p.send(sized(420 << 10)).await.assert_local(502);
    p.send(sized(1 << 20)).await.assert_local(502);
}

#[tokio::test]
async fn request_bodies_stream_whatever_their_size() {
    let e = echo("e").await;
    let p = proxy(table().host("app.test").prefix("/", &to(&e)).build()).await;
    let body = vec![b'x'; 3 << 20];
    let r = p.send(p.req("app.test", "/upload").method("POST").body(full(body)).unwrap()).await;
    assert_eq!(r.echo().body_bytes, 3 << 20);
}
