//! TLS passthrough: on the HTTPS listener, connections whose SNI is a passthrough host reach a
//! backend that terminates TLS itself, undecrypted; other hosts on the port are terminated by
//! weir. Checked with rustls, curl and openssl s_client.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::tls::*;
use support::*;
use weir_dataplane::model::{HostMatch, Passthrough, RouteTable};

struct Setup {
    p: TlsProxy,
    weir_ca: Ca,
    backend_ca: Ca,
    backend_leaf: Leaf,
}

async fn setup() -> Setup {
    setup_with(Ca::new(), |t| t).await
}

/// [`setup`] with the weir CA `weir_ca` and the table edited by `edit` before it is served.
async fn setup_with(weir_ca: Ca, edit: impl FnOnce(RouteTable) -> RouteTable) -> Setup {
    let backend_ca = Ca::new();
    let backend_leaf = backend_ca.leaf(&["pass.test", "x.passwild.test"]);
    let backend = tls_backend("b1", &backend_leaf).await;
    let e = echo("terminated").await;
    let pass_be = support::backend("pass", &[backend]);
    let table = table()
        .host("a.test")
        .prefix("/", &to(&e))
        .host("pass.test")
        .prefix("/", &pass_be)
        .host("*.passwild.test")
        .prefix("/", &pass_be)
        .build();
    let mut table: RouteTable = with_cert(table, "a", &["a.test"], &weir_ca.leaf(&["a.test"]));
    for host in ["pass.test", "*.passwild.test"] {
        table.passthrough.push(Passthrough {
            host: HostMatch::parse(host).unwrap(),
            backend: Some(pass_be.id.clone()),
            split: Vec::new(),
            terminate: false,
            relay: false,
        });
    }
    Setup { p: tls_proxy(edit(table)).await, weir_ca, backend_ca, backend_leaf }
}

#[tokio::test]
async fn passthrough_hosts_reach_the_backend_undecrypted_others_terminate() {
    let s = setup().await;
    // The backend's own certificate is presented: weir did not terminate.
    assert_eq!(presented(s.p.https, "pass.test").await, s.backend_leaf.der);
    assert_eq!(
        presented(s.p.https, "x.passwild.test").await,
        s.backend_leaf.der,
        "wildcard passthrough host"
    );
    for h2 in [false, true] {
        let r = https_get(s.p.https, "pass.test", "pass.test", "/", h2).await;
        let want = if h2 { "tls-backend b1 HTTP/2.0" } else { "tls-backend b1 HTTP/1.1" };
        assert_eq!(r.text(), want);
        // Same port, another host: terminated by weir, routed to the echo backend.
        assert_eq!(https_get(s.p.https, "a.test", "a.test", "/", h2).await.name(), "terminated");
    }
}

#[tokio::test]
async fn passthrough_to_a_dead_backend_closes_the_connection() {
    let dead = dead_addr().await;
    let be = support::backend("dead", &[dead]);
    let mut table = table().host("pass.test").prefix("/", &be).build();
    table.passthrough.push(Passthrough {
        host: HostMatch::parse("pass.test").unwrap(),
        backend: Some(be.id.clone()),
        split: Vec::new(),
        terminate: false,
        relay: false,
    });
    let p = tls_proxy(table).await;
    let r =
        tokio::time::timeout(Duration::from_secs(5), tls_connect(p.https, "pass.test", &[])).await.unwrap();
    assert!(r.is_err());
}

#[tokio::test]
async fn curl_and_openssl_through_passthrough() {
    if !have("curl") || !have("openssl") {
        return;
    }
    let s = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let (backend_ca, weir_ca) = (dir.path().join("backend.pem"), dir.path().join("weir.pem"));
    std::fs::write(&backend_ca, &s.backend_ca.pem).unwrap();
    std::fs::write(&weir_ca, &s.weir_ca.pem).unwrap();
    let port = s.p.https.port();
    let (s1, s2) = (curl(port, "pass.test", &backend_ca).await, curl(port, "a.test", &weir_ca).await);
    assert!(s1.0 && s1.1 == "tls-backend b1 HTTP/2.0", "{s1:?}");
    assert!(s2.0 && s2.1.contains("\"name\":\"terminated\""), "{s2:?}");
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &s.p.https.to_string(), "-servername", "pass.test", "-CAfile"])
        .arg(&backend_ca)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    assert!(text.contains("CN = pass.test") || text.contains("CN=pass.test"), "{text}");
}

async fn curl(port: u16, host: &str, ca: &std::path::Path) -> (bool, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http2", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1"), &format!("https://{host}:{port}/")])
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A plain TCP backend that answers each connection with `name:` and then echoes every byte
/// back; the bytes it received (all connections) are reported on the channel when a
/// connection ends.
async fn tcp_echo(
    name: &'static str,
) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                if s.write_all(format!("{name}:").as_bytes()).await.is_err() {
                    return;
                }
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                let _ = tx.send(seen); // the test may be done
            });
        }
    });
    (addr, rx)
}

/// Gateway API TLSRoute termination (`TLSRouteModeTerminate`, GEP-2643 "TLSRoute + TLS
/// Termination"; `Passthrough::relay`): a relayed name is terminated with its listener's
/// certificate, with no ALPN chosen though the client offers h2, and its decrypted bytes reach a
/// plain TCP backend and come back; passthrough and HTTPS names on the same socket keep working
/// (`TLSRouteModeMixed`); a relayed name without backend refuses its connections.
#[tokio::test]
async fn relayed_names_are_terminated_and_reach_a_plain_tcp_backend() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let weir_ca = Ca::new();
    let listener_leaf = weir_ca.leaf(&["tls.test"]);
    let (tcp, mut received) = tcp_echo("tcp-echo").await;
    let relay_be = support::backend("relay", &[tcp]);
    let s = setup_with(weir_ca, |mut table| {
        table.backends.insert(relay_be.id.clone(), relay_be.backend.clone());
        let mut table = with_listener(table, "default/edge/tls", "tls.test", &listener_leaf);
        for (host, backend) in [("tls.test", Some(relay_be.id.clone())), ("refused.test", None)] {
            table.passthrough.push(Passthrough {
                host: HostMatch::parse(host).unwrap(),
                backend,
                split: Vec::new(),
                terminate: false,
                relay: true,
            });
        }
        table
    })
    .await;

    let mut tls = tls_connect(s.p.https, "tls.test", &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(
        tls.get_ref().1.peer_certificates().unwrap()[0],
        listener_leaf.der,
        "the listener's certificate"
    );
    assert_eq!(tls.get_ref().1.alpn_protocol(), None, "no ALPN for relayed bytes");
    let mut answer = vec![0u8; "tcp-echo:".len()];
    tls.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, b"tcp-echo:");
    tls.write_all(b"hello over TLS").await.unwrap();
    let mut echoed = vec![0u8; "hello over TLS".len()];
    tls.read_exact(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"hello over TLS");
    // The client's close is passed on; the backend saw the plain bytes.
    tls.shutdown().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), received.recv()).await.unwrap().unwrap();
    assert_eq!(seen, b"hello over TLS");

    // Mixed on one socket: passthrough still presents the backend's certificate, HTTPS still
    // routes HTTP.
    assert_eq!(presented(s.p.https, "pass.test").await, s.backend_leaf.der);
    assert_eq!(https_get(s.p.https, "a.test", "a.test", "/", true).await.name(), "terminated");
    // No backend: refused before the handshake.
    let refused = tokio::time::timeout(Duration::from_secs(5), tls_connect(s.p.https, "refused.test", &[]))
        .await
        .unwrap();
    assert!(refused.is_err());
}
