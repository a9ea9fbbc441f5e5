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
    let weir_ca = Ca::new();
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
            backend: pass_be.id.clone(),
            split: Vec::new(),
            terminate: false,
        });
    }
    Setup { p: tls_proxy(table).await, weir_ca, backend_ca, backend_leaf }
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
        backend: be.id.clone(),
        split: Vec::new(),
        terminate: false,
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
