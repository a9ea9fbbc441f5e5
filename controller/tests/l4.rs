//! TCP and UDP services (`--tcp-services-configmap`, `--udp-services-configmap`) as a user runs
//! them: the `weir` binary serving a manifest directory, real backends and clients on loopback.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support_proc;

use support_proc::{field, free_port, strip_ansi};

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

// === harness ===

/// A child process killed on drop, with what it logged so far.
struct Weir {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    admin: SocketAddr,
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Weir {
    /// `weir serve` on `dir` with the two services ConfigMaps `default/tcp` and `default/udp`,
    /// L4 ports on 127.0.0.1; returns once it serves (its first table published).
    fn start(dir: &Path, extra: &[&str]) -> Weir {
        let mut args = vec!["serve", "--manifests", dir.to_str().unwrap()];
        let defaults = [
            ("--listen-http", "127.0.0.1:0"),
            ("--listen-https", "127.0.0.1:0"),
            ("--listen-admin", "127.0.0.1:0"),
            ("--l4-listen-address", "127.0.0.1"),
            ("--tcp-services-configmap", "default/tcp"),
            ("--udp-services-configmap", "default/udp"),
        ];
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let mut child = Command::new(WEIR)
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(strip_ansi(&line));
            }
        });
        let mut weir = Weir { child, log, admin: "127.0.0.1:1".parse().unwrap() };
        let line = weir.wait_log("weir is serving");
        weir.admin = field(&line, "admin").unwrap();
        weir
    }

    /// Waits for a log line containing `what`; returns it.
    fn wait_log(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = self.log.lock().unwrap().iter().find(|l| l.contains(what)) {
                return line.clone();
            }
            assert!(Instant::now() < deadline, "no log line with {what:?}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The admin listener's `/metrics` text.
    fn metrics(&self) -> String {
        let mut s = TcpStream::connect(self.admin).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// The value of the metric line starting with `prefix`.
    fn metric(&self, prefix: &str) -> Option<f64> {
        let text = self.metrics();
        text.lines().find(|l| l.starts_with(prefix))?.rsplit(' ').next()?.parse().ok()
    }
}

fn write(dir: &Path, name: &str, yaml: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// A Service `name` with one port `svc_port` named `port_name`, and an EndpointSlice with the
/// endpoints `backends` (all on the same port).
fn service(name: &str, svc_port: u16, port_name: &str, protocol: &str, backends: &[SocketAddr]) -> String {
    let addresses: Vec<String> = backends.iter().map(|b| format!("- addresses: [\"{}\"]", b.ip())).collect();
    let target = backends.first().map_or(1, |b| b.port());
    assert!(backends.iter().all(|b| b.port() == target), "one target port per slice");
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: {port_name}, port: {svc_port}, protocol: {protocol}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports: [{{name: {port_name}, port: {target}, protocol: {protocol}}}]
endpoints:
{addresses}
"#,
        addresses = addresses.join("\n"),
    )
}

/// A ConfigMap `default/NAME` with `entries` (key, value).
fn config_map(name: &str, entries: &[(u16, &str)]) -> String {
    let data: Vec<String> = entries.iter().map(|(k, v)| format!("  \"{k}\": \"{v}\"")).collect();
    let data = if data.is_empty() { " {}".to_string() } else { format!("\n{}", data.join("\n")) };
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:{data}\n")
}

fn settings(entries: &[(&str, &str)]) -> String {
    let data: Vec<String> = entries.iter().map(|(k, v)| format!("  {k}: \"{v}\"")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: weir-settings, namespace: default}}\ndata:\n{}\n",
        data.join("\n")
    )
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

// === backends ===

/// A TCP backend: for each connection, reads an optional PROXY v1 line (reported back first
/// as `HEADER <line>\n` when `expect_header`), echoes every byte, and after the client's end of
/// stream writes `END <bytes> <name>\n` and closes. Returns its address.
fn tcp_echo(name: &'static str, expect_header: bool) -> SocketAddr {
    serve_each(TcpListener::bind("127.0.0.1:0").unwrap(), move |mut stream| {
        if expect_header {
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                if stream.read(&mut byte).unwrap_or(0) == 0 {
                    return;
                }
                line.push(byte[0]);
            }
            let line = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
            if stream.write_all(format!("HEADER {line}\n").as_bytes()).is_err() {
                return;
            }
        }
        echo_to_end(&mut stream, name);
    })
}

/// Serves each connection `listener` accepts with `handler`, on a thread of its own. Returns
/// the listener's address.
fn serve_each(listener: TcpListener, handler: impl Fn(TcpStream) + Clone + Send + 'static) -> SocketAddr {
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let handler = handler.clone();
            std::thread::spawn(move || handler(stream));
        }
    });
    addr
}

/// Echoes every byte of `stream` until its end of stream, then writes `END <bytes> <name>\n`.
fn echo_to_end(stream: &mut TcpStream, name: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = stream.write_all(format!("END {total} {name}\n").as_bytes());
}

/// Reads one `\n`-terminated line from `s`.
fn read_line(s: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "connection closed mid-line: {line:?}");
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap().trim_end().to_string()
}

/// One echo round trip on `s`.
fn ping(s: &mut TcpStream, what: &str) {
    s.write_all(what.as_bytes()).unwrap();
    let mut back = vec![0u8; what.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, what.as_bytes());
}

// === TCP ===

/// 64 MiB through a mapped port, every byte checked as it comes back; then a half-close: the
/// client shuts its write side and still reads the backend's answer to the end of stream.
#[test]
fn tcp_echo_carries_64_mib_intact_and_passes_half_close_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let backend = tcp_echo("a", false);
    let port = free_port();
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[backend]));
    write(dir.path(), "tcp.yaml", &config_map("tcp", &[(port, "default/echo:9000")]));
    let weir = Weir::start(dir.path(), &[]);

    const SIZE: usize = 64 << 20;
    let pattern = |i: usize| (i.wrapping_mul(31).wrapping_add(i >> 13) % 251) as u8;
    let mut client = connect(port);
    let mut writer = client.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut chunk = vec![0u8; 256 * 1024];
        let mut sent = 0;
        while sent < SIZE {
            for (j, b) in chunk.iter_mut().enumerate() {
                *b = pattern(sent + j);
            }
            writer.write_all(&chunk).unwrap();
            sent += chunk.len();
        }
        // The half-close: no more bytes from the client, the connection stays open for reading.
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0usize;
    while got < SIZE {
        let n = client.read(&mut buf[..(SIZE - got).min(256 * 1024)]).unwrap();
        assert!(n > 0, "stream ended after {got} bytes");
        for (j, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, pattern(got + j), "byte {} differs", got + j);
        }
        got += n;
    }
    sender.join().unwrap();
    // The backend saw the client's end of stream (passed upstream), answered, and closed: the
    // answer and the end of stream come back to the half-closed client.
    assert_eq!(read_line(&mut client), format!("END {SIZE} a"));
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    let labels = format!("{{protocol=\"TCP\",port=\"{port}\",service=\"default/echo:9000\"}}");
    wait_until("the connection counted closed", || {
        weir.metric(&format!("weir_l4_open{labels}")) == Some(0.0)
    });
    assert_eq!(weir.metric(&format!("weir_l4_connections_total{labels}")), Some(1.0), "{}", weir.metrics());
    let up = weir.metric(&format!("weir_l4_received_bytes_total{labels}")).unwrap();
    let down = weir.metric(&format!("weir_l4_sent_bytes_total{labels}")).unwrap();
    assert_eq!(up, SIZE as f64);
    assert_eq!(down, (SIZE + format!("END {SIZE} a\n").len()) as f64);
    // The connection took the zero-copy path (splice(2)).
    let spliced = weir.metric(&format!("weir_l4_spliced_connections_total{labels}"));
    assert_eq!(spliced, Some(1.0), "{}", weir.metrics());
}

/// A TCP backend that reads each connection to its end of stream without answering, then
/// writes `END <bytes>\n` and closes. Returns its address.
fn tcp_sink() -> SocketAddr {
    serve_each(TcpListener::bind("127.0.0.1:0").unwrap(), |mut stream| {
        let total = std::io::copy(&mut stream, &mut std::io::sink()).unwrap_or(0);
        let _ = stream.write_all(format!("END {total}\n").as_bytes());
    })
}

/// Sends 4 MiB on `s` (reads that fill weir's copy buffer), shuts its write side and checks the
/// sink counted every byte.
fn upload(s: &mut TcpStream) {
    const SIZE: usize = 4 << 20;
    s.write_all(&vec![7u8; SIZE]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_line(s), format!("END {SIZE}"));
}

/// Small exchanges are copied and take no pipe; a direction whose reads fill the copy buffer
/// turns to splice(2), and its pipe (two descriptors) counts one more of `--max-connections`'
/// pairs while its connection holds it; a direction whose pipe does not fit keeps copying (the
/// connection is never refused for it); past the limit a connection is reset; the
/// open-connections gauge still counts connections.
#[test]
fn a_spliced_connection_counts_its_pipes_against_the_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (echo, sink) = (tcp_echo("a", false), tcp_sink());
    let (echo_port, sink_port) = (free_port(), free_port());
    write(dir.path(), "echo.yaml", &service("echo", 9000, "tcp", "TCP", &[echo]));
    write(dir.path(), "sink.yaml", &service("sink", 9000, "tcp", "TCP", &[sink]));
    let entries = [(echo_port, "default/echo:9000"), (sink_port, "default/sink:9000")];
    write(dir.path(), "tcp.yaml", &config_map("tcp", &entries));
    let weir = Weir::start(dir.path(), &["--max-connections", "3"]);
    let spliced = |port: u16, svc: &str| {
        let labels = format!("{{protocol=\"TCP\",port=\"{port}\",service=\"default/{svc}:9000\"}}");
        weir.metric(&format!("weir_l4_spliced_connections_total{labels}"))
    };

    // 1 pair of 3: a small exchange, copied.
    let mut small = connect(echo_port);
    ping(&mut small, "small");
    assert_eq!(spliced(echo_port, "echo"), Some(0.0), "{}", weir.metrics());
    // 1 + 1 + 1 pipe of 3: a bulk upload turns to splice (its connection stays open).
    let mut bulk = connect(sink_port);
    bulk.write_all(&vec![7u8; 4 << 20]).unwrap();
    wait_until("the upload spliced", || spliced(sink_port, "sink") == Some(1.0));
    assert_eq!(weir.metric("weir_connections_open "), Some(2.0), "{}", weir.metrics());

    // The pipe is counted: no room for a third connection, which is reset.
    let mut third = connect(echo_port);
    let _ = third.write_all(b"third");
    let mut buf = [0u8; 8];
    assert!(!matches!(third.read(&mut buf), Ok(n) if n > 0), "the third connection is reset");
    wait_until("the refusal counted", || {
        weir.metric("weir_connections_refused_total{limit=\"total\"}") == Some(1.0)
    });

    // The small connection ends: 1 + 1 + 1 of 3 with another upload, whose pipe does not fit:
    // it is copied, every byte.
    drop(small);
    wait_until("the small connection counted closed", || weir.metric("weir_connections_open ") == Some(1.0));
    let mut copied = connect(sink_port);
    upload(&mut copied);
    assert_eq!(spliced(sink_port, "sink"), Some(1.0), "copied, not spliced; {}", weir.metrics());

    // The spliced connection ends, its pipe is free: the next upload splices.
    bulk.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_line(&mut bulk), format!("END {}", 4 << 20));
    drop((bulk, copied));
    wait_until("the connections counted closed", || weir.metric("weir_connections_open ") == Some(0.0));
    upload(&mut connect(sink_port));
    assert_eq!(spliced(sink_port, "sink"), Some(2.0), "{}", weir.metrics());
}

/// The first `:PROXY`: clients announce themselves (curl `--haproxy-protocol`, and a raw client
/// with a made-up address); the second: weir announces the client to the backend, which parses
/// the header it receives.
#[test]
fn proxy_protocol_in_and_out() {
    let dir = tempfile::tempdir().unwrap();
    let backend = tcp_echo("pp", true);
    let (both, out_only) = (free_port(), free_port());
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[backend]));
    write(
        dir.path(),
        "tcp.yaml",
        &config_map("tcp", &[(both, "default/echo:tcp:PROXY:PROXY"), (out_only, "default/echo:9000::PROXY")]),
    );
    let _weir = Weir::start(dir.path(), &[]);

    // A raw client behind a "balancer" that announces 203.0.113.7:4242.
    let mut client = connect(both);
    client.write_all(b"PROXY TCP4 203.0.113.7 127.0.0.1 4242 80\r\nhello").unwrap();
    assert_eq!(read_line(&mut client), format!("HEADER PROXY TCP4 203.0.113.7 127.0.0.1 4242 {both}"));
    let mut hello = [0u8; 5];
    client.read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"hello", "the bytes after the header pass as they are");

    // curl speaks PROXY v1 first, then HTTP; the backend echoes the request back after the
    // header line weir sent it (curl only needs to get bytes back; we check them).
    let out = Command::new("curl")
        .args(["-s", "--max-time", "3", "--haproxy-protocol", "--http0.9", "-o", "-"])
        .arg(format!("http://127.0.0.1:{both}/pp"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("HEADER PROXY TCP4 127.0.0.1 127.0.0.1 "), "{text}");
    assert!(first.ends_with(&format!(" {both}")), "{text}");
    assert!(text.contains("GET /pp HTTP/1.1"), "the request follows the header: {text}");

    // Without the first PROXY, weir announces the socket's peer.
    let mut client = connect(out_only);
    let local = client.local_addr().unwrap();
    client.write_all(b"x").unwrap();
    assert_eq!(
        read_line(&mut client),
        format!("HEADER PROXY TCP4 127.0.0.1 127.0.0.1 {} {out_only}", local.port())
    );

    // A client that does not send the header it must send is cut.
    let mut rude = connect(both);
    rude.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = rude.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing reaches a backend without a PROXY header: {rest:?}");
}

/// An entry removed while a connection is open: the port stops accepting, the open connection
/// keeps working until it ends.
#[test]
fn removed_entry_lets_its_open_connection_finish() {
    let dir = tempfile::tempdir().unwrap();
    let backend = tcp_echo("a", false);
    let (port, other) = (free_port(), free_port());
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[backend]));
    write(
        dir.path(),
        "tcp.yaml",
        &config_map("tcp", &[(port, "default/echo:9000"), (other, "default/echo:9000")]),
    );
    let weir = Weir::start(dir.path(), &[]);
    let mut open = connect(port);
    ping(&mut open, "before");
    write(dir.path(), "tcp.yaml", &config_map("tcp", &[(other, "default/echo:9000")]));
    wait_until("the removed port refuses connections", || TcpStream::connect(("127.0.0.1", port)).is_err());
    ping(&mut open, "after the removal");
    open.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_line(&mut open), format!("END {} a", "before".len() + "after the removal".len()));
    // The other port never stopped.
    ping(&mut connect(other), "still here");
    assert!(weir.log().contains("L4 port removed"), "{}", weir.log());
}

/// The Service's endpoints change under 200 open connections: none fails, the open ones stay
/// on their endpoint, new ones go to the new endpoints.
#[test]
fn endpoint_change_under_200_open_connections_fails_none() {
    let dir = tempfile::tempdir().unwrap();
    let a = tcp_echo("a", false);
    let b = tcp_echo_on_port_of("b", a);
    let port = free_port();
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[a]));
    write(dir.path(), "tcp.yaml", &config_map("tcp", &[(port, "default/echo:9000")]));
    let _weir = Weir::start(dir.path(), &[]);
    let mut conns: Vec<TcpStream> = (0..200).map(|_| connect(port)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        ping(c, &format!("first {i}"));
    }
    // Traffic keeps flowing on every connection while the endpoints change.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 2 {
                    ping(&mut c, &format!("round {rounds} of {i}"));
                    rounds += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                c.shutdown(Shutdown::Write).unwrap();
                read_line(&mut c)
            })
        })
        .collect();
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[b]));
    // New connections reach the new endpoint once the table is swapped.
    wait_until("a new connection lands on b", || {
        let mut c = connect(port);
        c.shutdown(Shutdown::Write).unwrap();
        read_line(&mut c).ends_with(" b")
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        let end = worker.join().expect("a connection failed");
        assert!(
            end.starts_with("END ") && end.ends_with(" a"),
            "open connections stay on their endpoint: {end}"
        );
    }
    for i in 0..50 {
        let mut c = connect(port);
        ping(&mut c, &format!("new {i}"));
        c.shutdown(Shutdown::Write).unwrap();
        assert!(read_line(&mut c).ends_with(" b"));
    }
}

/// An echo backend on another loopback address with the same port as `like` (one EndpointSlice
/// port serves every endpoint).
fn tcp_echo_on_port_of(name: &'static str, like: SocketAddr) -> SocketAddr {
    for last in 2..250u8 {
        let addr = SocketAddr::from(([127, 0, 0, last], like.port()));
        if let Ok(listener) = TcpListener::bind(addr) {
            drop(listener);
            return tcp_echo_at(name, addr);
        }
    }
    panic!("no loopback address free for port {}", like.port());
}

/// `tcp_echo`'s echo (no PROXY header) on `addr`.
fn tcp_echo_at(name: &'static str, addr: SocketAddr) -> SocketAddr {
    serve_each(TcpListener::bind(addr).unwrap(), move |mut stream| echo_to_end(&mut stream, name))
}

/// A connect that fails is retried on another endpoint: a client never sees the dead one.
#[test]
fn a_refusing_endpoint_is_skipped_by_retry() {
    let dir = tempfile::tempdir().unwrap();
    let live = tcp_echo("live", false);
    let dead = SocketAddr::from(([127, 0, 0, 3], live.port()));
    assert!(TcpStream::connect(dead).is_err(), "{dead} must refuse");
    let port = free_port();
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[live, dead]));
    write(dir.path(), "tcp.yaml", &config_map("tcp", &[(port, "default/echo:9000")]));
    let weir = Weir::start(dir.path(), &[]);
    for i in 0..10 {
        let mut c = connect(port);
        ping(&mut c, &format!("try {i}"));
    }
    let labels = format!("{{protocol=\"TCP\",port=\"{port}\",service=\"default/echo:9000\"}}");
    let errors = weir.metric(&format!("weir_l4_connect_errors_total{labels}")).unwrap();
    assert!(errors >= 4.0, "round robin sent about half the first tries to the dead endpoint: {errors}");
}

// === bad input ===

/// A malformed value, a missing Service, a clash with weir's own HTTP port and a port another
/// process holds: each is a clear error (log; `weir check` for what it can see), and the good
/// entry keeps serving.
#[test]
fn bad_entries_are_refused_clearly_and_the_rest_serves() {
    let dir = tempfile::tempdir().unwrap();
    let backend = tcp_echo("a", false);
    let (good, malformed, missing, http, taken) =
        (free_port(), free_port(), free_port(), free_port(), free_port());
    let holder = TcpListener::bind(("127.0.0.1", taken)).unwrap();
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[backend]));
    let entries = [
        (good, "default/echo:9000"),
        (malformed, "default/echo"),
        (missing, "default/nope:9000"),
        (http, "default/echo:9000"),
        (taken, "default/echo:9000"),
    ];
    write(dir.path(), "tcp.yaml", &config_map("tcp", &entries));

    let out = Command::new(WEIR)
        .args([
            "check",
            "--manifests",
            dir.path().to_str().unwrap(),
            "--tcp-services-configmap",
            "default/tcp",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("error: ConfigMap default/tcp: data[{malformed}]: TCP service refused: value \"default/echo\": no :port after the Service")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("error: ConfigMap default/tcp: data[{missing}]: TCP service refused: Service default/nope not found")),
        "{stdout}"
    );

    let http_listen = format!("127.0.0.1:{http}");
    let weir = Weir::start(dir.path(), &["--listen-http", &http_listen]);
    ping(&mut connect(good), "the good entry serves");
    let log = weir.log();
    for (port, why) in [
        (malformed, "no :port after the Service".to_string()),
        (missing, "Service default/nope not found".to_string()),
        (http, format!("port {http} is weir's own HTTP listener")),
        (
            taken,
            format!("cannot listen on TCP port {taken} (127.0.0.1): the port is taken by another process"),
        ),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("ConfigMap default/tcp: data[{port}]")) && l.contains(&why)),
            "{port}: {why}\n{log}"
        );
    }
    // Once the other process lets go, the next publish binds the port.
    drop(holder);
    write(dir.path(), "svc.yaml", &service("echo", 9000, "tcp", "TCP", &[backend, backend]));
    wait_until("the freed port is bound", || TcpStream::connect(("127.0.0.1", taken)).is_ok());
    ping(&mut connect(taken), "bound at last");
}

// === UDP ===

/// A UDP backend: answers each datagram with `replies` datagrams `NAME <i> <peer> <payload>`.
fn udp_backend(name: &'static str, replies: usize) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf) else { return };
            let payload = String::from_utf8_lossy(&buf[..n]).into_owned();
            for i in 0..replies {
                let _ = socket.send_to(format!("{name} {i} {peer} {payload}").as_bytes(), peer);
            }
        }
    });
    addr
}

fn udp_client() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn recv(s: &UdpSocket) -> String {
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf).expect("no reply");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// `<name> <i> <peer> <payload>` → the peer the backend saw (weir's upstream socket of the flow).
fn seen_peer(reply: &str) -> String {
    reply.split(' ').nth(2).unwrap().to_string()
}

/// A DNS-like service (one reply per request, `proxy-stream-responses` 1: each request is a
/// flow) and a multi-reply service: every client gets its own replies.
#[test]
fn udp_request_response_and_multi_reply_per_client() {
    let dir = tempfile::tempdir().unwrap();
    let dns = udp_backend("dns", 1);
    let multi = udp_backend("multi", 3);
    let (dns_port, multi_port) = (free_port(), free_port());
    write(dir.path(), "dns.yaml", &service("dns", 53, "dns", "UDP", &[dns]));
    write(dir.path(), "multi.yaml", &service("multi", 7000, "feed", "UDP", &[multi]));
    write(
        dir.path(),
        "udp.yaml",
        &config_map("udp", &[(dns_port, "default/dns:dns"), (multi_port, "default/multi:7000")]),
    );
    write(dir.path(), "settings.yaml", &settings(&[("proxy-stream-responses", "3")]));
    let weir = Weir::start(dir.path(), &[]);
    let clients: Vec<UdpSocket> = (0..4).map(|_| udp_client()).collect();
    for round in 0..3 {
        for (i, c) in clients.iter().enumerate() {
            c.send_to(format!("q{round}-{i}").as_bytes(), ("127.0.0.1", dns_port)).unwrap();
        }
        for (i, c) in clients.iter().enumerate() {
            let reply = recv(c);
            assert!(reply.starts_with("dns 0 ") && reply.ends_with(&format!(" q{round}-{i}")), "{reply}");
        }
    }
    // Three replies per request, all to the client that asked.
    for (i, c) in clients.iter().enumerate() {
        c.send_to(format!("sub-{i}").as_bytes(), ("127.0.0.1", multi_port)).unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        let replies: Vec<String> = (0..3).map(|_| recv(c)).collect();
        for (j, r) in replies.iter().enumerate() {
            assert_eq!(r.split(' ').nth(1), Some(j.to_string().as_str()), "{replies:?}");
            assert!(r.ends_with(&format!(" sub-{i}")), "{replies:?}");
        }
        let peers: std::collections::BTreeSet<String> = replies.iter().map(|r| seen_peer(r)).collect();
        assert_eq!(peers.len(), 1, "one flow per client: {replies:?}");
    }
    let labels = format!("{{protocol=\"UDP\",port=\"{multi_port}\",service=\"default/multi:7000\"}}");
    // After its 3 replies each flow ends.
    wait_until("the flows end after their replies", || {
        weir.metric(&format!("weir_l4_open{labels}")) == Some(0.0)
    });
    assert_eq!(weir.metric(&format!("weir_l4_connections_total{labels}")), Some(4.0), "{}", weir.metrics());
}

/// A flow idle for `proxy-stream-timeout` ends (the next datagram starts another, from another
/// upstream socket); the flow table holds `--udp-max-flows`, the oldest flow is evicted.
#[test]
fn udp_flows_expire_when_idle_and_the_table_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let echo = udp_backend("e", 1);
    let port = free_port();
    write(dir.path(), "svc.yaml", &service("e", 9999, "udp", "UDP", &[echo]));
    write(dir.path(), "udp.yaml", &config_map("udp", &[(port, "default/e:9999")]));
    write(
        dir.path(),
        "settings.yaml",
        &settings(&[("proxy-stream-responses", "0"), ("proxy-stream-timeout", "1s")]),
    );
    let weir = Weir::start(dir.path(), &["--udp-max-flows", "2"]);
    let ask = |c: &UdpSocket, what: &str| {
        c.send_to(what.as_bytes(), ("127.0.0.1", port)).unwrap();
        seen_peer(&recv(c))
    };
    let a = udp_client();
    let first = ask(&a, "1");
    assert_eq!(ask(&a, "2"), first, "one flow while it is active");
    std::thread::sleep(Duration::from_millis(1600));
    let after_idle = ask(&a, "3");
    assert_ne!(after_idle, first, "the idle flow ended; a new one started");

    let (b, c) = (udp_client(), udp_client());
    let b_first = ask(&b, "b1");
    let _ = ask(&c, "c1"); // a third flow: a's (the oldest) is evicted
    let labels = format!("{{protocol=\"UDP\",port=\"{port}\",service=\"default/e:9999\"}}");
    assert_eq!(weir.metric(&format!("weir_l4_flows_evicted_total{labels}")), Some(1.0), "{}", weir.metrics());
    assert_eq!(ask(&b, "b2"), b_first, "b's flow was not the oldest");
    assert_ne!(ask(&a, "4"), after_idle, "a's flow was evicted; a new one started");
    // An evicted flow's task ends just after the eviction: the gauge follows, never above the cap
    // for long.
    wait_until("at most two open flows", || weir.metric(&format!("weir_l4_open{labels}")).unwrap() <= 2.0);
}
