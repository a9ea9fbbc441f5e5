//! The L4 access log as a user sees it: `weir serve` with `--tcp-services-configmap` and
//! `--udp-services-configmap` writes one JSON line per TCP connection and per UDP flow when it
//! ends, on standard output by default; `log-format-stream` and `disable-stream-access-log`
//! change it without a restart.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support_proc;

use support_proc::{Log, free_port, serve_args, spawn_with_stdout};

/// A TCP backend echoing every byte; a UDP one answering each datagram with `pong`.
fn backends() -> (SocketAddr, SocketAddr) {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in tcp.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_addr = udp.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(b"pong", from);
        }
    });
    (tcp_addr, udp_addr)
}

/// Services `tcp-echo` and `udp-echo` on the backends, and the two L4 ConfigMaps.
fn manifests(dir: &Path, (tcp, udp): (SocketAddr, SocketAddr), (tcp_port, udp_port): (u16, u16)) {
    let mut yaml = String::new();
    for (name, protocol, backend) in [("tcp-echo", "TCP", tcp), ("udp-echo", "UDP", udp)] {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  ports: [{{name: p, port: 7000, protocol: {protocol}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: p, port: {port}, protocol: {protocol}}}]\nendpoints:\n- addresses: [\"{ip}\"]\n---\n",
            port = backend.port(),
            ip = backend.ip(),
        ));
    }
    yaml.push_str(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: tcp, namespace: default}}\ndata: {{\"{tcp_port}\": \"default/tcp-echo:7000\"}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: udp, namespace: default}}\ndata: {{\"{udp_port}\": \"default/udp-echo:7000\"}}\n"
    ));
    std::fs::write(dir.join("l4.yaml"), yaml).unwrap();
}

fn settings(dir: &Path, data: &[(&str, &str)]) {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: weir-settings, namespace: default}\ndata:",
    );
    if data.is_empty() {
        yaml.push_str(" {}");
    }
    for (k, v) in data {
        yaml.push_str(&format!("\n  {k}: {}", serde_json::to_string(v).unwrap()));
    }
    let tmp = dir.join(".settings.tmp");
    std::fs::write(&tmp, yaml + "\n").unwrap();
    std::fs::rename(tmp, dir.join("settings.yaml")).unwrap();
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON lines on standard output with `key` equal to `value`.
fn lines(out: &Log, key: &str, value: &str) -> Vec<Value> {
    let lines = out.lock().unwrap().clone();
    lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|v| v[key] == value).collect()
}

/// One TCP connection through weir: sends `data`, reads it back, closes; returns the client's
/// address.
fn tcp_session(port: u16, data: &[u8]) -> Option<SocketAddr> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let me = s.local_addr().unwrap();
    s.write_all(data).ok()?;
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).ok()?;
    s.shutdown(std::net::Shutdown::Write).ok()?;
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    (back == data).then_some(me)
}

#[test]
fn each_connection_and_flow_gets_a_line_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let ports = (free_port(), free_port());
    manifests(dir.path(), backends(), ports);
    settings(dir.path(), &[]);
    let (tcp_port, udp_port) = (ports.0.to_string(), ports.1.to_string());
    let args = serve_args(
        dir.path(),
        &[
            "--l4-listen-address",
            "127.0.0.1",
            "--tcp-services-configmap",
            "default/tcp",
            "--udp-services-configmap",
            "default/udp",
        ],
    );
    let (_weir, _addrs, log, out) = spawn_with_stdout(&args, &["http"], None);
    let published = || log.lock().unwrap().iter().filter(|l| l.contains("routing table published")).count();

    // TCP: 11 bytes each way.
    let mut client = None;
    wait_until("the TCP port", || {
        client = tcp_session(ports.0, b"hello there");
        client.is_some()
    });
    let client = client.unwrap();
    wait_until("the TCP line", || {
        lines(&out, "protocol", "TCP").iter().any(|v| v["remote_port"] == client.port())
    });
    let tcp = lines(&out, "protocol", "TCP");
    let v = tcp.iter().find(|v| v["remote_port"] == client.port()).unwrap_or_else(|| panic!("{tcp:?}"));
    assert_eq!(v["remote_addr"], "127.0.0.1");
    assert_eq!(v["status"], 200);
    assert_eq!((v["bytes_sent"].as_u64(), v["bytes_received"].as_u64()), (Some(11), Some(11)), "{v}");
    assert!(v["session_time"].as_f64().unwrap() >= 0.0);
    assert!(v["upstream_addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{v}");
    assert_eq!(v["server_port"].to_string(), tcp_port);
    assert!(v["time"].as_str().unwrap().ends_with("+00:00"));

    // UDP: the flow ends after its one reply (proxy-stream-responses: 1).
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 16];
    wait_until("a UDP reply", || {
        let _ = udp.send_to(b"ping!", ("127.0.0.1", ports.1));
        udp.recv(&mut buf).is_ok_and(|n| &buf[..n] == b"pong")
    });
    let me = udp.local_addr().unwrap().port();
    wait_until("the UDP line", || lines(&out, "protocol", "UDP").iter().any(|v| v["remote_port"] == me));
    let flows = lines(&out, "protocol", "UDP");
    let v = flows.iter().rev().find(|v| v["remote_port"] == me).unwrap();
    assert_eq!((v["bytes_received"].as_u64(), v["bytes_sent"].as_u64()), (Some(5), Some(4)), "{v}");
    assert_eq!(v["server_port"].to_string(), udp_port);
    assert_eq!(v["status"], 200);

    // log-format-stream, hot-reloaded; then disable-stream-access-log.
    settings(
        dir.path(),
        &[(
            "log-format-stream",
            r#"{"who": "$remote_addr:$remote_port", "proto": "$protocol", "in": $bytes_received}"#,
        )],
    );
    // A session's line is written after it ends (and the writer batches lines for a moment):
    // any session since the change may be the first one logged in the new format.
    let mut marked = Vec::new();
    let logged = |m: &SocketAddr| !lines(&out, "who", &format!("127.0.0.1:{}", m.port())).is_empty();
    wait_until("the stream format", || {
        marked.extend(tcp_session(ports.0, b"abc"));
        marked.iter().any(logged)
    });
    let m = marked.iter().find(|m| logged(m)).unwrap();
    let v = &lines(&out, "who", &format!("127.0.0.1:{}", m.port()))[0];
    assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
    assert_eq!((v["proto"].as_str(), v["in"].as_u64()), (Some("TCP"), Some(3)));

    let tables = published();
    settings(dir.path(), &[("disable-stream-access-log", "true")]);
    wait_until("the next table", || published() > tables);
    let before = out.lock().unwrap().len();
    let quiet = tcp_session(ports.0, b"quiet").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let after = out.lock().unwrap().clone();
    assert!(
        !after[before..].iter().any(|l| l.contains(&quiet.port().to_string())),
        "disable-stream-access-log: {:?}",
        &after[before..]
    );
}
