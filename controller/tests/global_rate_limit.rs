//! The global rate limit (`global-rate-limit*` annotations, `global-rate-limit-memcached-*`
//! keys) as a user sees it: two `weir serve` replicas share one count through a real memcached
//! (Debian's `memcached`), clients in `global-rate-limit-ignored-cidrs` are never limited, and
//! a dead memcached lets requests through.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support_app;
mod support_proc;

use support_proc::{Proc, free_port, serve_manifests};

/// A backend answering 200 `ok` to every request, one thread per connection.
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The status of `GET /` for `host` through `proxy`.
fn status(proxy: SocketAddr, host: &str) -> u16 {
    let mut stream = TcpStream::connect(proxy).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {answer:?}"))
}

/// memcached on `port`, killed on drop; waits until it accepts connections.
fn memcached(port: u16) -> Option<Proc> {
    let child = Command::new("memcached")
        .args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0", "-u", "root", "-m", "16"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(child) => Proc(child),
        Err(e) => {
            assert!(std::env::var_os("WEIR_REQUIRE_ALL").is_none(), "memcached cannot start: {e}");
            eprintln!("skipping: memcached cannot start ({e}); scripts/test.sh install installs it");
            return None;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child)
}

/// An Ingress `name` for host `name.test` with the global-rate-limit annotations `extra`.
fn ingress(name: &str, extra: &str) -> String {
    format!(
        r#"---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: default
  annotations:
{extra}
spec:
  ingressClassName: weir
  rules:
  - host: {name}.test
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}
"#
    )
}

fn manifests(backend: SocketAddr, memcached_port: u16) -> String {
    // The Service `echo` (and an Ingress for app.test, unused here).
    let mut yaml = support_app::app_yaml(backend, "/");
    yaml.push_str(&format!(
        r#"---
apiVersion: v1
kind: ConfigMap
metadata: {{name: weir-settings, namespace: default}}
data:
  global-rate-limit-memcached-host: 127.0.0.1
  global-rate-limit-memcached-port: "{memcached_port}"
  # A shared, busy test machine: ingress-nginx's 50 ms would fail open now and then.
  global-rate-limit-memcached-connect-timeout: "2000"
"#
    ));
    // A day's window: the test never straddles two windows in practice, so counts are exact.
    let limited = "    nginx.ingress.kubernetes.io/global-rate-limit: \"10\"\n    nginx.ingress.kubernetes.io/global-rate-limit-window: 24h";
    yaml.push_str(&ingress("limited", limited));
    yaml.push_str(&ingress(
        "exempt",
        &format!("{limited}\n    nginx.ingress.kubernetes.io/global-rate-limit-ignored-cidrs: 127.0.0.0/8"),
    ));
    yaml.push_str(&ingress(
        "open",
        "    nginx.ingress.kubernetes.io/global-rate-limit: \"1\"\n    nginx.ingress.kubernetes.io/global-rate-limit-window: 24h",
    ));
    yaml
}

fn replica(dir: &std::path::Path) -> (Proc, SocketAddr) {
    let (weir, addrs) = serve_manifests(dir, &["http"]);
    (weir, addrs[0])
}

#[test]
fn replicas_share_the_limit_through_memcached() {
    let port = free_port();
    let Some(mut cache) = memcached(port) else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.yaml"), manifests(backend(), port)).unwrap();
    let (_a, a) = replica(dir.path());
    let (_b, b) = replica(dir.path());

    // 16 requests, alternating between the replicas: the shared count lets exactly 10 through,
    // and the rest get ingress-nginx's default 429.
    let statuses: Vec<u16> =
        (0..16).map(|i| status(if i % 2 == 0 { a } else { b }, "limited.test")).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert_eq!(&statuses[..10], &[200; 10], "the first ten pass: {statuses:?}");
    // Both replicas refuse now.
    assert_eq!((status(a, "limited.test"), status(b, "limited.test")), (429, 429));

    // The same limit, but loopback clients are ignored: never refused.
    for i in 0..15 {
        assert_eq!(status(if i % 2 == 0 { a } else { b }, "exempt.test"), 200, "request {i}");
    }

    // memcached gone: the requests it would have counted go through (ingress-nginx fails open),
    // and the keys already over their limit stay refused until their window allows them.
    let _ = cache.0.kill();
    let _ = cache.0.wait();
    for replica in [a, b, a] {
        assert_eq!(status(replica, "open.test"), 200);
    }
    assert_eq!(status(a, "limited.test"), 429);
}
