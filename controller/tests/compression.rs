//! Response compression as a user sees it: `weir serve` with the ConfigMap's `use-gzip`,
//! `enable-brotli` and `enable-zstd`, in front of a plain HTTP/1.1 backend, fetched with curl and
//! decoded with curl itself (gzip) and Python's `brotli` and `zstandard` packages.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod support_app;
mod support_proc;

/// The host `support_app`'s Ingress routes.
const HOST: &str = "app.test";
/// Debian's Python, which `python3-brotli` and `python3-zstandard` install into (a `python3`
/// earlier on the PATH, such as pyenv's, would not see them).
const PYTHON: &str = "/usr/bin/python3";

/// A 100 KB HTML page, as a site would serve it.
fn page() -> Vec<u8> {
    let mut html = b"<!doctype html><html><head><title>weir</title></head><body>\n".to_vec();
    let mut i = 0u32;
    while html.len() < 100_000 {
        html.extend_from_slice(
            format!("<p class=\"row\">Row {i}: the quick brown fox jumps over the lazy dog.</p>\n")
                .as_bytes(),
        );
        i += 1;
    }
    html.extend_from_slice(b"</body></html>\n");
    html
}

/// 1 MiB of JSON-ish text, sent chunked.
fn big() -> Vec<u8> {
    (0..1_048_576u32).map(|i| b"{\"k\": 12345678, \"v\": [1, 2, 3]}\n"[(i % 32) as usize]).collect()
}

/// The backend's held streaming response: released by the test.
type Gate = Arc<(Mutex<bool>, Condvar)>;

/// A plain HTTP/1.1 backend answering by path; one thread per connection.
fn backend(gate: Gate) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let gate = gate.clone();
            std::thread::spawn(move || answer(stream, &gate));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, gate: &Gate) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let head_only = line.starts_with("HEAD ");
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
        }
        let fixed = |ty: &str, extra: &str, body: &[u8]| {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {ty}\r\nContent-Length: {}\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            if !head_only {
                out.extend_from_slice(body);
            }
            out
        };
        let out = match path.as_str() {
            "/page.html" => {
                fixed("text/html; charset=utf-8", "ETag: \"page-v1\"\r\nAccept-Ranges: bytes\r\n", &page())
            }
            "/small.txt" => fixed("text/plain", "", &[b'x'; 100]),
            "/image.png" => fixed("image/png", "", &page()),
            "/encoded" => fixed("text/plain", "Content-Encoding: gzip\r\n", b"not really gzip"),
            "/no-transform" => fixed("text/plain", "Cache-Control: no-transform\r\n", &page()),
            "/big.json" => {
                let mut out =
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        .to_vec();
                for chunk in big().chunks(10_000) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            }
            "/stream" => {
                let first = b"event one\n";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                    first.len()
                );
                if stream.write_all(head.as_bytes()).is_err()
                    || stream.write_all(first).is_err()
                    || stream.write_all(b"\r\n").is_err()
                {
                    return;
                }
                let (open, cv) = &**gate;
                let mut released = open.lock().unwrap();
                while !*released {
                    released = cv.wait(released).unwrap();
                }
                b"a\r\nevent two\n\r\n0\r\n\r\n".to_vec()
            }
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        };
        if stream.write_all(&out).is_err() {
            return;
        }
    }
}

fn manifests(dir: &Path, backend: SocketAddr, settings: &str) {
    let yaml = format!(
        "{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: weir-settings, namespace: default}}\ndata:\n{settings}",
        support_app::app_yaml(backend, "/")
    );
    let tmp = dir.join(".site.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join("site.yaml")).unwrap();
}

const ALL_ON: &str =
    "  use-gzip: \"true\"\n  enable-brotli: \"true\"\n  enable-zstd: \"true\"\n  gzip-disable: msie6\n";

/// What curl got: the response head's headers (lower-case names) and the body as sent.
struct Fetched {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Fetched {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `curl` through weir; `args` go before the URL.
fn curl(http: SocketAddr, path: &str, args: &[&str]) -> Fetched {
    let dir = tempfile::tempdir().unwrap();
    let headers = dir.path().join("headers");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-D"])
        .arg(&headers)
        .args(["--resolve", &format!("{HOST}:{}:127.0.0.1", http.port())])
        .args(args)
        .arg(format!("http://{HOST}:{}{path}", http.port()))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {args:?} {path}: {}", String::from_utf8_lossy(&out.stderr));
    let head = std::fs::read_to_string(headers).unwrap();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Fetched { headers, body: out.stdout }
}

/// Decodes `data` with Python's package for `coding` (`brotli`, `zstandard`).
fn python_decode(coding: &str, data: &[u8]) -> Vec<u8> {
    let script = match coding {
        "br" => "import brotli, sys; sys.stdout.buffer.write(brotli.decompress(sys.stdin.buffer.read()))",
        "zstd" => {
            "import zstandard, sys; sys.stdout.buffer.write(zstandard.ZstdDecompressor().decompressobj().decompress(sys.stdin.buffer.read()))"
        }
        other => panic!("no decoder for {other}"),
    };
    let mut child = Command::new(PYTHON)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "python {coding} decoder failed");
    out.stdout
}

/// curl, and Python with `brotli` and `zstandard`: skipped with a reason when missing, a
/// failure under `WEIR_REQUIRE_ALL=1`.
fn have_clients() -> bool {
    let curl = Command::new("curl").arg("--version").output().ok();
    let curl_ok = curl.is_some_and(|o| {
        let v = String::from_utf8_lossy(&o.stdout).to_string();
        v.contains("brotli") && v.contains("zstd")
    });
    let python_ok = Command::new(PYTHON)
        .args(["-c", "import brotli, zstandard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if curl_ok && python_ok {
        return true;
    }
    let why =
        "curl with brotli and zstd, and python3's brotli and zstandard packages (scripts/test.sh install)";
    if std::env::var("WEIR_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("{why} are required (WEIR_REQUIRE_ALL=1)");
    }
    eprintln!("skipping: needs {why}");
    false
}

fn weir_serve(dir: &Path) -> (support_proc::Proc, SocketAddr) {
    let (weir, addrs) = support_proc::serve_manifests(dir, &["http"]);
    (weir, addrs[0])
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn responses_are_compressed_as_clients_ask() {
    if !have_clients() {
        return;
    }
    let gate: Gate = Arc::default();
    let backend = backend(gate.clone());
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), backend, ALL_ON);
    let (_weir, http) = weir_serve(dir.path());
    let page = page();

    // gzip, decoded by curl: the page intact; headers for caches; ETag weakened.
    let got = curl(http, "/page.html", &["--compressed", "-H", "Accept-Encoding: gzip"]);
    assert_eq!(got.header("content-encoding"), Some("gzip"));
    assert_eq!(got.body, page, "curl decodes the page intact");
    assert_eq!(got.header("vary"), Some("Accept-Encoding"));
    assert_eq!(got.header("etag"), Some("W/\"page-v1\""));
    assert_eq!((got.header("content-length"), got.header("accept-ranges")), (None, None));
    let raw = curl(http, "/page.html", &["-H", "Accept-Encoding: gzip"]);
    assert!(
        raw.body.len() * 5 < page.len(),
        "gzip level 1 shrinks the page: {} of {}",
        raw.body.len(),
        page.len()
    );

    // brotli and zstd, decoded by Python's packages.
    for coding in ["br", "zstd"] {
        let raw = curl(http, "/page.html", &["-H", &format!("Accept-Encoding: {coding}")]);
        assert_eq!(raw.header("content-encoding"), Some(coding));
        assert!(raw.body.len() * 5 < page.len(), "{coding}: {} of {}", raw.body.len(), page.len());
        assert_eq!(python_decode(coding, &raw.body), page, "{coding} decodes to the page");
    }

    // The client's weights decide; among equals zstd, then brotli, then gzip.
    let encoding_for =
        |accept: &str| curl(http, "/page.html", &["-H", &format!("Accept-Encoding: {accept}")]);
    assert_eq!(encoding_for("gzip, deflate, br, zstd").header("content-encoding"), Some("zstd"));
    assert_eq!(encoding_for("gzip, br").header("content-encoding"), Some("br"));
    assert_eq!(encoding_for("gzip;q=1, br;q=0.5").header("content-encoding"), Some("gzip"));
    let none = encoding_for("identity");
    assert_eq!((none.header("content-encoding"), none.header("vary")), (None, Some("Accept-Encoding")));
    assert_eq!(none.body, page);

    // gzip-disable: msie6 gets no gzip (but still brotli if it asked).
    let msie = "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)";
    let got = curl(http, "/page.html", &["-A", msie, "-H", "Accept-Encoding: gzip"]);
    assert_eq!((got.header("content-encoding"), got.body == page), (None, true));

    // Left alone: other types, short bodies, encoded ones, no-transform, HEAD, HTTP/1.0.
    for (path, why) in [
        ("/image.png", "a type not listed"),
        ("/small.txt", "shorter than gzip-min-length"),
        ("/encoded", "already encoded"),
        ("/no-transform", "Cache-Control: no-transform"),
    ] {
        let got = curl(http, path, &["-H", "Accept-Encoding: gzip"]);
        let expected = if path == "/encoded" { Some("gzip") } else { None };
        assert_eq!(got.header("content-encoding"), expected, "{path}: {why}");
        if path == "/encoded" {
            assert_eq!(got.body, b"not really gzip", "passed through as it is");
        }
    }
    let head = curl(http, "/page.html", &["-I", "-H", "Accept-Encoding: gzip"]);
    let length = page.len().to_string();
    assert_eq!(
        (head.header("content-encoding"), head.header("content-length")),
        (None, Some(length.as_str()))
    );
    let old = curl(http, "/page.html", &["--http1.0", "-H", "Accept-Encoding: gzip"]);
    assert_eq!((old.header("content-encoding"), old.body == page), (None, true));

    // A chunked 1 MiB response, streamed through gzip: every byte arrives.
    let got = curl(http, "/big.json", &["--compressed", "-H", "Accept-Encoding: gzip"]);
    assert_eq!(got.header("content-encoding"), Some("gzip"));
    assert!(got.body == big(), "the 1 MiB body arrives intact ({} bytes)", got.body.len());

    // A response still streaming: what the upstream sent so far reaches the client now, not
    // when the body ends.
    let mut child = Command::new("curl")
        .args(["-sS", "-N", "--compressed", "--max-time", "20", "-H", "Accept-Encoding: gzip"])
        .args(["--resolve", &format!("{HOST}:{}:127.0.0.1", http.port())])
        .arg(format!("http://{HOST}:{}/stream", http.port()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 10];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"event one\n", "the first event arrives while the upstream holds the rest");
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "event two\n");
    assert!(child.wait().unwrap().success());

    // Switched off in the ConfigMap: served as the upstream sent it, without a restart.
    manifests(dir.path(), backend, "  use-gzip: \"false\"\n");
    wait_until("compression off", || {
        curl(http, "/page.html", &["-H", "Accept-Encoding: gzip, br, zstd"])
            .header("content-encoding")
            .is_none()
    });
}
