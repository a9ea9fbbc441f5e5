//! `weir` started as a user starts it: a child process whose log says where it listens.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weir ARGS` and waits for the log line that carries `key=ADDR`; returns the addresses.
pub fn spawn(args: &[&str], keys: &[&str]) -> (Proc, Vec<SocketAddr>) {
    let (proc, addrs, _log) = spawn_logged(args, keys, Some("info"));
    (proc, addrs)
}

/// What a child process logged so far.
pub type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// [`spawn`] with `RUST_LOG` as given (unset: `None`); the returned log keeps every line.
pub fn spawn_logged(args: &[&str], keys: &[&str], rust_log: Option<&str>) -> (Proc, Vec<SocketAddr>, Log) {
    spawn_wrapped(&[], args, keys, rust_log)
}

/// [`spawn_logged`] through `wrapper` (a program and its arguments that runs `weir ARGS`, such
/// as `prlimit --nofile=N:N`).
pub fn spawn_wrapped(
    wrapper: &[&str],
    args: &[&str],
    keys: &[&str],
    rust_log: Option<&str>,
) -> (Proc, Vec<SocketAddr>, Log) {
    let (proc, addrs, log, _) = spawn_inner(wrapper, args, keys, rust_log, false);
    (proc, addrs, log)
}

/// [`spawn_logged`] keeping standard output too (the access log): its lines, as they come.
pub fn spawn_with_stdout(
    args: &[&str],
    keys: &[&str],
    rust_log: Option<&str>,
) -> (Proc, Vec<SocketAddr>, Log, Log) {
    let (proc, addrs, log, stdout) = spawn_inner(&[], args, keys, rust_log, true);
    (proc, addrs, log, stdout.unwrap_or_default())
}

fn spawn_inner(
    wrapper: &[&str],
    args: &[&str],
    keys: &[&str],
    rust_log: Option<&str>,
    keep_stdout: bool,
) -> (Proc, Vec<SocketAddr>, Log, Option<Log>) {
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(WEIR);
            command
        }
        None => Command::new(WEIR),
    };
    match rust_log {
        Some(filter) => command.env("RUST_LOG", filter),
        None => command.env_remove("RUST_LOG"),
    };
    let out = if keep_stdout { Stdio::piped() } else { Stdio::null() };
    let mut child = command.args(args).stdout(out).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().map(|stdout| {
        let lines = Log::default();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        lines
    });
    let mut proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let line = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_else(|_| {
            let _ = proc.0.kill();
            panic!("weir {args:?} did not log its addresses; saw:\n{}", seen.join("\n"))
        });
        let plain = strip_ansi(&line);
        let addrs: Vec<Option<SocketAddr>> = keys.iter().map(|k| field(&plain, k)).collect();
        if addrs.iter().all(Option::is_some) {
            // Keep draining stderr so the child never blocks on a full pipe.
            let log = Log::default();
            let kept = log.clone();
            kept.lock().unwrap().extend(seen.drain(..).chain([plain]));
            std::thread::spawn(move || {
                for line in rx {
                    kept.lock().unwrap().push(strip_ansi(&line));
                }
            });
            return (proc, addrs.into_iter().flatten().collect(), log, stdout);
        }
        seen.push(plain);
    }
}

/// `weir serve --manifests DIR` with every listener on an ephemeral loopback port: (process,
/// HTTP, admin).
pub fn serve_http_admin(dir: &std::path::Path) -> (Proc, SocketAddr, SocketAddr) {
    let (proc, addrs) = spawn(&serve_args(dir, &[]), &["http", "admin"]);
    (proc, addrs[0], addrs[1])
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn field(line: &str, key: &str) -> Option<SocketAddr> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

/// `weir serve --manifests DIR` on loopback ports (HTTP, HTTPS, admin); waits for the log line
/// naming `keys` (`http`, `https`, `admin`) and returns those addresses.
pub fn serve_manifests(dir: &std::path::Path, keys: &[&str]) -> (Proc, Vec<SocketAddr>) {
    spawn(&serve_args(dir, &[]), keys)
}

/// Whether `tool` is on the PATH. Without it a test is skipped with the reason printed (`install`
/// says how to get it), or fails under `WEIR_REQUIRE_ALL=1`.
pub fn have(tool: &str, install: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert_ne!(
            std::env::var("WEIR_REQUIRE_ALL").as_deref(),
            Ok("1"),
            "{tool} is required (WEIR_REQUIRE_ALL=1; {install})"
        );
        eprintln!("skipping: {tool} is not installed ({install})");
    }
    found
}

/// `serve --manifests DIR` on ephemeral loopback ports (HTTP, HTTPS, admin), then `extra`.
pub fn serve_args<'a, P: AsRef<std::path::Path> + ?Sized>(dir: &'a P, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "serve",
        "--manifests",
        dir.as_ref().to_str().expect("a UTF-8 manifest directory"),
        "--listen-http",
        "127.0.0.1:0",
        "--listen-https",
        "127.0.0.1:0",
        "--listen-admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    args
}

/// A port free for both TCP and UDP on loopback.
pub fn free_port() -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `weir serve --manifests DIR` with every listener on an ephemeral loopback port, then `extra`;
/// waits for the log line carrying `keys` (`http`, `https`, `admin`).
pub fn spawn_serve(dir: &std::path::Path, extra: &[&str], keys: &[&str]) -> (Proc, Vec<SocketAddr>) {
    spawn(&serve_args(dir, extra), keys)
}
