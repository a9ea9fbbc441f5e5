//! `enable-syslog`, `syslog-host` and `syslog-port` against a real syslog server: Debian's
//! rsyslog, started by the test with its own configuration, listening on a loopback UDP port.
//! The access log goes there instead of standard output (RFC 5424, facility local7, message id
//! `access`), and the error log goes there too (message id `error`, the event's severity).

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support_app;
mod support_proc;

use support_proc::{Proc, serve_args, spawn_with_stdout};

const RSYSLOGD: &str = "/usr/sbin/rsyslogd";

/// rsyslogd: skipped with a reason when missing, a failure under `WEIR_REQUIRE_ALL=1`.
fn have_rsyslog() -> bool {
    if Path::new(RSYSLOGD).exists() {
        return true;
    }
    let why = "rsyslogd (Debian's rsyslog; scripts/test.sh install)";
    if std::env::var("WEIR_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("{why} is required (WEIR_REQUIRE_ALL=1)");
    }
    eprintln!("skipping: needs {why}");
    false
}

/// Starts rsyslogd on a loopback UDP port, writing every message it receives into `out` with
/// what it parsed of it; returns it and its port once it receives.
fn rsyslog(dir: &Path, out: &Path) -> (Proc, u16) {
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let conf = dir.join("rsyslog.conf");
    std::fs::write(
        &conf,
        format!(
            r#"global(workDirectory="{dir}")
module(load="imudp")
input(type="imudp" address="127.0.0.1" port="{port}")
template(name="parsed" type="string" string="%syslogfacility-text%|%syslogseverity-text%|%app-name%|%msgid%|%msg%\n")
*.* action(type="omfile" file="{out}" template="parsed")
"#,
            dir = dir.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    let child = Command::new(RSYSLOGD)
        .args(["-n", "-f"])
        .arg(&conf)
        .arg("-i")
        .arg(dir.join("rsyslogd.pid"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    // Ready when a probe arrives.
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    wait_until("rsyslogd receiving", || {
        let _ = probe.send_to(b"<14>1 - - probe - - ready", ("127.0.0.1", port));
        std::thread::sleep(Duration::from_millis(50));
        std::fs::read_to_string(out).unwrap_or_default().contains("ready")
    });
    (proc, port)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A backend answering `ok` to everything.
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn get(addr: SocketAddr, id: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET /x HTTP/1.1\r\nHost: app.test\r\nX-Request-ID: {id}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out[9..12].parse().unwrap()
}

#[test]
fn the_logs_arrive_at_rsyslog() {
    if !have_rsyslog() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received.log");
    let (_rsyslog, port) = rsyslog(dir.path(), &received);
    let manifests = tempfile::tempdir().unwrap();
    std::fs::write(manifests.path().join("app.yaml"), support_app::app_yaml(backend(), "/")).unwrap();
    std::fs::write(
        manifests.path().join("settings.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: weir-settings, namespace: default}}\ndata:\n  enable-syslog: \"true\"\n  syslog-host: 127.0.0.1\n  syslog-port: \"{port}\"\n  no-such-key: \"x\"\n"
        ),
    )
    .unwrap();
    let args = serve_args(manifests.path(), &[]);
    let (_weir, addrs, _log, stdout) = spawn_with_stdout(&args, &["http"], None);
    wait_until("the route", || get(addrs[0], "warm") == 200);
    assert_eq!(get(addrs[0], "via-syslog"), 200);
    let lines = || std::fs::read_to_string(&received).unwrap_or_default();
    wait_until("the access-log line", || lines().contains("via-syslog"));
    let text = lines();
    let access = text.lines().find(|l| l.contains("via-syslog")).unwrap();
    let parts: Vec<&str> = access.splitn(5, '|').collect();
    assert_eq!(parts[..4], ["local7", "info", "weir", "access"], "{access}");
    let json: serde_json::Value = serde_json::from_str(parts[4].trim()).unwrap();
    assert_eq!((json["req_id"].as_str(), json["status"].as_u64()), (Some("via-syslog"), Some(200)));
    assert_eq!(json["ingress_name"], "web");
    // The error log: the unknown key's warning and the table's publication.
    let warning = text.lines().find(|l| l.contains("no-such-key")).unwrap_or_else(|| panic!("{text}"));
    assert!(warning.starts_with("local7|warning|weir|error|"), "{warning}");
    let published =
        text.lines().find(|l| l.contains("routing table published")).unwrap_or_else(|| panic!("{text}"));
    assert!(published.starts_with("local7|info|weir|error|"), "{published}");
    // Not on standard output: the access log went to syslog instead.
    assert!(!stdout.lock().unwrap().iter().any(|l| l.contains("via-syslog")));
}
