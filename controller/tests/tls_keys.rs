//! The ConfigMap's TLS keys as a user sees them: `weir serve --manifests` with a certificate made
//! by the openssl CLI, reached with `openssl s_client`.
//!
//! - `ssl-session-tickets` with `ssl-session-ticket-key`: two weir processes given the same key
//!   resume each other's sessions (`-sess_out` from one, `-sess_in` to the other).
//! - `enable-ocsp`: a real OCSP responder (`openssl ocsp -index`, reached over a loopback HTTP
//!   front the test runs, which can also hang or refuse), the staple read by
//!   `openssl s_client -status`; a dead or hanging responder leaves handshakes working.
//! - `ssl-ecdh-curve`, `ssl-reject-handshake`, `ssl-buffer-size`: the group s_client gets, the
//!   handshakes refused for unknown names, the size of the records it receives.

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support_app;
mod support_proc;

use support_proc::spawn;

/// The host `support_app`'s Ingress routes.
const HOST: &str = "app.test";

/// Whether the openssl CLI is installed (see [`support_proc::have`]).
fn have_openssl() -> bool {
    support_proc::have("openssl", "scripts/test.sh install")
}

/// Runs `openssl ARGS` in `dir`; panics with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a leaf for `app.test` (serial 0x1234) made with the openssl CLI in `dir`:
/// `ca.pem`, `ca.key`, `leaf.pem`, `leaf.key`. `ocsp_url` goes into the leaf's Authority
/// Information Access.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path, ocsp_url: Option<&str>) -> Pki {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=weir test CA", "-days", "2"]);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        ca.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"]);
        openssl(dir, &ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend(["-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=app.test"]);
        openssl(dir, &csr);
        let mut ext = "subjectAltName=DNS:app.test\n".to_string();
        if let Some(url) = ocsp_url {
            ext.push_str(&format!("authorityInfoAccess=OCSP;URI:{url}\n"));
        }
        std::fs::write(dir.join("ext.cnf"), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                "0x1234",
                "-days",
                "2",
                "-out",
                "leaf.pem",
                "-extfile",
                "ext.cnf",
            ],
        );
        Pki { dir: dir.to_path_buf() }
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap()
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The `kubernetes.io/tls` Secret `app-tls` (leaf and CA as the chain) and the Ingress's
    /// `tls` entry for `app.test`.
    fn secret_yaml(&self) -> String {
        use base64::Engine as _;
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: app-tls, namespace: default}}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
            b64(self.read("leaf.pem") + &self.read("ca.pem")),
            b64(self.read("leaf.key")),
        )
    }
}

/// Writes the app (with TLS for `app.test`), its Secret and the settings ConfigMap into `dir`.
fn manifests(dir: &Path, pki: &Pki, backend: SocketAddr, settings: &str) {
    manifests_annotated(dir, pki, backend, settings, "{}");
}

/// [`manifests`] with the Ingress's `annotations` (a YAML flow mapping).
fn manifests_annotated(dir: &Path, pki: &Pki, backend: SocketAddr, settings: &str, annotations: &str) {
    let app = support_app::app_yaml(backend, "/")
        .replace("  rules:\n", &format!("  tls:\n  - hosts: [{HOST}]\n    secretName: app-tls\n  rules:\n"))
        .replace(
            "metadata: {name: web, namespace: default}",
            &format!("metadata: {{name: web, namespace: default, annotations: {annotations}}}"),
        );
    let yaml = format!(
        "{app}---\n{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: weir-settings, namespace: default}}\ndata:\n{settings}",
        pki.secret_yaml(),
    );
    let tmp = dir.join(".site.yaml.tmp");
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join("site.yaml")).unwrap();
}

/// `weir serve` on `dir`: (process, HTTPS address).
fn weir_serve(dir: &Path) -> (support_proc::Proc, SocketAddr) {
    let (weir, addrs) = support_proc::serve_manifests(dir, &["https"]);
    (weir, addrs[0])
}

/// A `weir echo` backend.
fn echo() -> (support_proc::Proc, SocketAddr) {
    let (echo, addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "app"], &["listen"]);
    (echo, addrs[0])
}

/// `openssl s_client` to `https` for `app.test`, verifying against `ca`, sending one request
/// and reading the answer to the end (TLS 1.3 tickets come after the handshake); `args` are
/// added. Returns what it printed.
fn s_client(https: SocketAddr, ca: &Path, args: &[&str]) -> String {
    s_client_within(20, https, ca, args)
}

/// [`s_client`] killed (and failed) after `secs` seconds.
fn s_client_within(secs: u32, https: SocketAddr, ca: &Path, args: &[&str]) -> String {
    s_client_padded(secs, https, ca, args, 0)
}

/// [`s_client_within`] with a request carrying `pad` bytes in a header (which the echo backend
/// sends back: a larger answer).
fn s_client_padded(secs: u32, https: SocketAddr, ca: &Path, args: &[&str], pad: usize) -> String {
    use std::io::Write as _;
    let mut child = Command::new("timeout")
        .args([
            &secs.to_string(),
            "openssl",
            "s_client",
            "-connect",
            &https.to_string(),
            "-servername",
            HOST,
            "-CAfile",
        ])
        .arg(ca)
        .args(["-verify_return_error", "-ign_eof"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pad = "x".repeat(pad);
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nX-Pad: {pad}\r\nConnection: close\r\n\r\n");
    child.stdin.take().unwrap().write_all(request.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "s_client {args:?}: {text}");
    assert!(text.contains("HTTP/1.1 200"), "s_client {args:?}: no answer: {text}");
    text
}

/// Whether a session was resumed, from s_client's summary line (`New, ...` or `Reused, ...`).
fn reused(text: &str) -> bool {
    let summary = text.lines().find(|l| l.starts_with("New, ") || l.starts_with("Reused, "));
    summary.unwrap_or_else(|| panic!("no session summary: {text}")).starts_with("Reused, ")
}

#[test]
fn replicas_with_the_same_ticket_key_resume_each_others_sessions() {
    if !have_openssl() {
        return;
    }
    let (_echo, backend) = echo();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path(), None);
    let sessions = tempfile::tempdir().unwrap();
    let session = sessions.path().join("session.pem");
    let session = session.to_str().unwrap();
    // `openssl rand 80 | openssl enc -A -base64`, as ingress-nginx's docs make one.
    let key = {
        use base64::Engine as _;
        let bytes: Vec<u8> = (0..80).map(|_| rand::random::<u8>()).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let shared = format!("  ssl-session-tickets: \"true\"\n  ssl-session-ticket-key: {key}\n");
    let cases = [
        // (settings, resumed by the other replica, a ticket sent in TLS 1.2)
        (shared.as_str(), true, true),
        ("  ssl-session-tickets: \"true\"\n", false, true),
        ("", false, false),
    ];
    for (settings, shared, tls12_ticket) in cases {
        let dir = tempfile::tempdir().unwrap();
        manifests(dir.path(), &pki, backend, settings);
        let (_a, a) = weir_serve(dir.path());
        let (_b, b) = weir_serve(dir.path());
        for version in ["-tls1_3", "-tls1_2"] {
            let first = s_client(a, &pki.ca(), &[version, "-sess_out", session]);
            assert!(!reused(&first), "{settings:?} {version}: first visit");
            if version == "-tls1_2" {
                let has_ticket = first.contains("TLS session ticket lifetime hint");
                assert_eq!(has_ticket, tls12_ticket, "{settings:?}: {first}");
                if tls12_ticket {
                    assert!(first.contains("lifetime hint: 600 (seconds)"), "ssl-session-timeout: {first}");
                }
            }
            let other = s_client(b, &pki.ca(), &[version, "-sess_in", session]);
            assert_eq!(reused(&other), shared, "{settings:?} {version}: the other replica: {other}");
            // The replica that made the session resumes it either way.
            let first = s_client(a, &pki.ca(), &[version, "-sess_out", session]);
            let again = s_client(a, &pki.ca(), &[version, "-sess_in", session]);
            assert!(reused(&again), "{settings:?} {version}: the same replica: {first}\n{again}");
        }
    }
}

// === OCSP ===

/// What the OCSP responder front does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Passes it to `openssl ocsp -index` and returns its response.
    Answer,
    /// Reads it and never answers (holds the connection).
    Hang,
    /// Closes the connection at once.
    Refuse,
}

/// A loopback HTTP front for `openssl ocsp` as a responder over the test CA's `index.txt`
/// (the leaf, serial 1234, good), with responses valid for one minute (`-nmin 1`).
struct Responder {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    answered: Arc<Mutex<u32>>,
}

impl Responder {
    fn start(pki_dir: &Path) -> Responder {
        std::fs::write(pki_dir.join("index.txt"), "V\t301231235959Z\t\t1234\tunknown\t/CN=app.test\n")
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Mode::Answer));
        let answered = Arc::new(Mutex::new(0));
        let (m, a, dir) = (mode.clone(), answered.clone(), pki_dir.to_path_buf());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (m, a, dir) = (m.clone(), a.clone(), dir.clone());
                std::thread::spawn(move || respond(stream, &m, &a, &dir));
            }
        });
        Responder { addr, mode, answered }
    }

    fn url(&self) -> String {
        format!("http://{}/ocsp", self.addr)
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn answered(&self) -> u32 {
        *self.answered.lock().unwrap()
    }
}

fn respond(mut stream: std::net::TcpStream, mode: &Mutex<Mode>, answered: &Mutex<u32>, dir: &Path) {
    use std::io::{BufRead, BufReader, Read, Write};
    let now = *mode.lock().unwrap();
    if now == Mode::Refuse {
        return;
    }
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut request = vec![0; length];
    reader.read_exact(&mut request).unwrap();
    if now == Mode::Hang {
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("req.der"), &request).unwrap();
    let status = Command::new("openssl")
        .current_dir(dir)
        .args([
            "ocsp",
            "-index",
            "index.txt",
            "-rsigner",
            "ca.pem",
            "-rkey",
            "ca.key",
            "-CA",
            "ca.pem",
            "-nmin",
            "1",
        ])
        .arg("-reqin")
        .arg(work.path().join("req.der"))
        .arg("-respout")
        .arg(work.path().join("resp.der"))
        .output()
        .unwrap();
    assert!(status.status.success(), "openssl ocsp: {}", String::from_utf8_lossy(&status.stderr));
    let body = std::fs::read(work.path().join("resp.der")).unwrap();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/ocsp-response\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).is_ok() && stream.write_all(&body).is_ok() {
        *answered.lock().unwrap() += 1;
    }
}

/// The staple s_client saw: its `This Update` line, `None` when no response was sent.
fn staple(text: &str) -> Option<String> {
    if text.contains("OCSP response: no response sent") {
        return None;
    }
    assert!(text.contains("OCSP Response Status: successful"), "{text}");
    assert!(text.contains("Cert Status: good"), "{text}");
    assert!(text.contains("Serial Number: 1234"), "{text}");
    let line = text.lines().find(|l| l.trim_start().starts_with("This Update:"));
    Some(line.unwrap_or_else(|| panic!("no This Update: {text}")).trim().to_string())
}

/// Polls `f` every 200 ms for up to `secs` seconds.
fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn ocsp_staples_are_fetched_refreshed_and_never_hold_up_handshakes() {
    if !have_openssl() {
        return;
    }
    let (_echo, backend) = echo();
    let certs = tempfile::tempdir().unwrap();
    let responder = Responder::start(certs.path());
    let pki = Pki::new(certs.path(), Some(&responder.url()));
    let ca = pki.ca();
    let dir = tempfile::tempdir().unwrap();
    // Off by default, as in ingress-nginx: no staple, the responder is not asked.
    manifests(dir.path(), &pki, backend, "  ssl-session-cache: \"true\"\n");
    let (_weir, https) = weir_serve(dir.path());
    assert_eq!(staple(&s_client(https, &ca, &["-status"])), None);
    assert_eq!(responder.answered(), 0);
    // Switched on without a restart: stapled once the responder has answered.
    manifests(dir.path(), &pki, backend, "  enable-ocsp: \"true\"\n");
    let first = wait_for("the first staple", 20, || staple(&s_client(https, &ca, &["-status"])));
    // Refreshed before nextUpdate (the responses live a minute): a newer staple.
    let newer = wait_for("a refreshed staple", 60, || {
        staple(&s_client(https, &ca, &["-status"])).filter(|s| *s != first)
    });
    assert!(responder.answered() >= 2);
    // A responder that stops answering, or fails, changes nothing for clients: the staple,
    // still valid, is served, and handshakes complete at once (the fetch waits 10 s for a
    // hanging responder; these handshakes get 5 s).
    for mode in [Mode::Hang, Mode::Refuse] {
        responder.set(mode);
        for _ in 0..3 {
            let text = s_client_within(5, https, &ca, &["-status"]);
            assert_eq!(staple(&text).as_ref(), Some(&newer), "{mode:?}");
        }
    }
    // A replica started while its responder hangs, or where none listens: no staple, and
    // handshakes work.
    responder.set(Mode::Hang);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for url in [responder.url(), format!("http://{dead}/ocsp")] {
        let other_certs = tempfile::tempdir().unwrap();
        let other_pki = Pki::new(other_certs.path(), Some(&url));
        let other_dir = tempfile::tempdir().unwrap();
        manifests(other_dir.path(), &other_pki, backend, "  enable-ocsp: \"true\"\n");
        let (_other, other_https) = weir_serve(other_dir.path());
        for _ in 0..3 {
            let text = s_client_within(5, other_https, &other_pki.ca(), &["-status"]);
            assert_eq!(staple(&text), None, "{url}");
        }
    }
}

// === groups, unknown names, record size ===

/// Like [`s_client`], but the handshake may fail: (succeeded, output).
fn s_client_may_fail(https: SocketAddr, ca: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .args(["20", "openssl", "s_client", "-connect", &https.to_string(), "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && text.contains("Verify return code: 0 (ok)"), text)
}

#[test]
fn ecdh_curves_reject_handshake_and_buffer_size() {
    if !have_openssl() {
        return;
    }
    let (_echo, backend) = echo();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path(), None);
    let ca = pki.ca();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &pki, backend, "");
    let (_weir, https) = weir_serve(dir.path());
    let sni = ["-servername", HOST];
    // Defaults: every group a client offers of rustls's; unknown names get the default
    // (self-signed) certificate, which the test CA does not verify.
    for group in ["X25519", "prime256v1", "secp384r1"] {
        let (ok, text) = s_client_may_fail(https, &ca, &[&sni[..], &["-groups", group]].concat());
        assert!(ok, "{group}: {text}");
    }
    let (ok, text) = s_client_may_fail(https, &ca, &["-servername", "unknown.test"]);
    assert!(!ok && text.contains("CONNECTED"), "the default certificate: {text}");
    assert!(text.contains("depth=0 CN = rcgen self signed cert"), "the self-signed certificate: {text}");
    // `ssl-ecdh-curve: secp384r1`: only P-384; `ssl-reject-handshake`: no certificate at all
    // for names no Ingress has.
    manifests(dir.path(), &pki, backend, "  ssl-ecdh-curve: secp384r1\n  ssl-reject-handshake: \"true\"\n");
    let only_p384 = || {
        let (ok, text) =
            s_client_may_fail(https, &ca, &[&sni[..], &["-groups", "X25519:prime256v1"]].concat());
        (!ok).then_some(text)
    };
    let text = wait_for("the new groups", 20, only_p384);
    assert!(text.contains("alert handshake failure") || text.contains("handshake failure"), "{text}");
    let (ok, text) = s_client_may_fail(https, &ca, &[&sni[..], &["-groups", "X25519:secp384r1"]].concat());
    assert!(ok, "{text}");
    assert!(text.contains("Server Temp Key: ECDH, secp384r1") || text.contains("secp384r1"), "{text}");
    for unknown in [&["-servername", "unknown.test"][..], &["-noservername"]] {
        let (ok, text) = s_client_may_fail(https, &ca, unknown);
        assert!(!ok, "{unknown:?}: {text}");
        assert!(!text.contains("depth=0"), "{unknown:?}: no certificate is sent: {text}");
    }
    // The host still works. `ssl-buffer-size`: the records of a large answer carry at most that
    // many bytes (TLS 1.3 adds 17: the content type and the AEAD tag).
    manifests(dir.path(), &pki, backend, "  ssl-ecdh-curve: secp384r1\n  ssl-buffer-size: 1k\n");
    let small = wait_for("records of 1k", 20, || {
        let sizes = records(&s_client_padded(20, https, &ca, &["-msg", "-tls1_3"], 6000));
        (sizes.len() >= 6 && sizes.iter().all(|n| *n <= 1024 + 17)).then_some(sizes)
    });
    assert!(small.contains(&(1024 + 17)), "full records are 1k: {small:?}");
    // Without it: the TLS maximum, 16k (the answer fits one record).
    manifests(dir.path(), &pki, backend, "");
    wait_for("records of 16k", 20, || {
        let sizes = records(&s_client_padded(20, https, &ca, &["-msg", "-tls1_3"], 6000));
        sizes.iter().any(|n| *n > 6000).then_some(())
    });
}

/// The sizes of the application-data records s_client received (`-msg`: each record header is
/// printed as `<<< TLS 1.2, RecordHeader [length 0005]` followed by its five bytes in hex: type,
/// version, length).
fn records(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut sizes = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        // The header line may follow the previous record's data on the same line.
        if line.contains("<<< TLS") && line.contains("RecordHeader") {
            let bytes: Vec<u8> = lines
                .get(i + 1)
                .map(|l| l.split_whitespace().filter_map(|b| u8::from_str_radix(b, 16).ok()).collect())
                .unwrap_or_default();
            if bytes.len() == 5 && bytes[0] == 0x17 {
                sizes.push((usize::from(bytes[3]) << 8) | usize::from(bytes[4]));
            }
        }
    }
    sizes
}

// === per-host cipher suites ===

/// The TLS 1.2 suite s_client negotiated (`New, TLSv1.2, Cipher is NAME`), `None` when the
/// handshake failed.
fn negotiated(https: SocketAddr, ca: &Path, sni: &str, ciphers: &str) -> Option<String> {
    let (_, text) = s_client_may_fail(https, ca, &["-servername", sni, "-tls1_2", "-cipher", ciphers]);
    let line = text.lines().find(|l| l.starts_with("New, TLSv1.2, Cipher is "))?;
    let name = line.trim_start_matches("New, TLSv1.2, Cipher is ").trim();
    (name != "(NONE)").then(|| name.to_string())
}

/// `ssl-ciphers` and `ssl-prefer-server-ciphers` on an Ingress: its host offers only its own
/// TLS 1.2 suites, in its order when it prefers its own; other hosts keep the ConfigMap's.
#[test]
fn per_host_ciphers_and_server_preference() {
    if !have_openssl() {
        return;
    }
    const AES128: &str = "ECDHE-ECDSA-AES128-GCM-SHA256";
    const AES256: &str = "ECDHE-ECDSA-AES256-GCM-SHA384";
    let both_client_order = format!("{AES128}:{AES256}");
    let (_echo, backend) = echo();
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path(), None);
    let ca = pki.ca();
    let dir = tempfile::tempdir().unwrap();
    manifests(dir.path(), &pki, backend, "");
    let (_weir, https) = weir_serve(dir.path());
    // Without the annotations every suite is offered and the client's order counts.
    assert_eq!(negotiated(https, &ca, HOST, AES128).as_deref(), Some(AES128));
    assert_eq!(negotiated(https, &ca, HOST, &both_client_order).as_deref(), Some(AES128));

    // Only AES-256 for app.test: a client offering only AES-128 is refused there, and still
    // served by a name without options (the default certificate).
    let only_256 = format!("{{nginx.ingress.kubernetes.io/ssl-ciphers: \"{AES256}\"}}");
    manifests_annotated(dir.path(), &pki, backend, "", &only_256);
    wait_for("app.test to refuse AES-128", 20, || {
        negotiated(https, &ca, HOST, AES128).is_none().then_some(())
    });
    assert_eq!(negotiated(https, &ca, HOST, &both_client_order).as_deref(), Some(AES256));
    assert_eq!(negotiated(https, &ca, "other.test", AES128).as_deref(), Some(AES128));
    // The host is still served over it.
    s_client(https, &ca, &["-tls1_2", "-cipher", AES256]);

    // Both, the server's order first: AES-256 even though the client prefers AES-128.
    let server_order = |prefer: &str| {
        format!(
            "{{nginx.ingress.kubernetes.io/ssl-ciphers: \"{AES256}:{AES128}\", nginx.ingress.kubernetes.io/ssl-prefer-server-ciphers: \"{prefer}\"}}"
        )
    };
    manifests_annotated(dir.path(), &pki, backend, "", &server_order("true"));
    wait_for("the server's order", 20, || {
        (negotiated(https, &ca, HOST, &both_client_order).as_deref() == Some(AES256)).then_some(())
    });
    // Not preferred: the client's order again.
    manifests_annotated(dir.path(), &pki, backend, "", &server_order("false"));
    wait_for("the client's order", 20, || {
        (negotiated(https, &ca, HOST, &both_client_order).as_deref() == Some(AES128)).then_some(())
    });
    // Removed: every suite again.
    manifests(dir.path(), &pki, backend, "");
    wait_for("every suite again", 20, || {
        (negotiated(https, &ca, HOST, AES128).as_deref() == Some(AES128)).then_some(())
    });
}

// === hosts asking for client certificates ===

/// A host with `auth-tls-secret` runs its handshakes with a config of its own: it takes the
/// listener's `ssl-buffer-size`, and its session cache outlives a new routing table (here the
/// endpoints move to another backend), so returning clients still resume.
#[test]
fn client_certificate_hosts_keep_the_record_size_and_their_sessions_across_tables() {
    use base64::Engine as _;
    if !have_openssl() {
        return;
    }
    let (_echo, backend) = echo();
    let (_echo2, addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "app2"], &["listen"]);
    let backend2 = addrs[0];
    let certs = tempfile::tempdir().unwrap();
    let pki = Pki::new(certs.path(), None);
    let ca = pki.ca();
    let dir = tempfile::tempdir().unwrap();
    let client_ca = base64::engine::general_purpose::STANDARD.encode(pki.read("ca.pem"));
    std::fs::write(
        dir.path().join("client-ca.yaml"),
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: client-ca, namespace: default}}\ndata:\n  ca.crt: {client_ca}\n"
        ),
    )
    .unwrap();
    let mtls = "{nginx.ingress.kubernetes.io/auth-tls-secret: default/client-ca}";
    let settings = "  ssl-buffer-size: 1k\n";
    manifests_annotated(dir.path(), &pki, backend, settings, mtls);
    let (_weir, https) = weir_serve(dir.path());
    // The test's leaf (CA-signed, no extended key usage) is the client's certificate too.
    let leaf = certs.path().join("leaf.pem");
    let key = certs.path().join("leaf.key");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let with_cert = |more: &[&str]| {
        let mut args = vec!["-tls1_3".to_string(), "-cert".into(), path(&leaf), "-key".into(), path(&key)];
        args.extend(more.iter().map(|s| s.to_string()));
        args
    };
    let run = |more: &[&str], pad: usize| {
        let args = with_cert(more);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s_client_padded(20, https, &ca, &args, pad)
    };
    let text = run(&["-msg"], 6000);
    let sizes = records(&text);
    assert!(sizes.len() >= 6 && sizes.iter().all(|n| *n <= 1024 + 17), "records of 1k: {sizes:?}");

    let first = certs.path().join("first.sess");
    let second = certs.path().join("second.sess");
    let text = run(&["-sess_out", &path(&first)], 0);
    assert!(!reused(&text), "a first connection is a full handshake: {text}");
    let text = run(&["-sess_in", &path(&first), "-sess_out", &path(&second)], 0);
    assert!(reused(&text), "resumed from the host's session cache: {text}");

    // A new table: the endpoints move to the second backend.
    manifests_annotated(dir.path(), &pki, backend2, settings, mtls);
    wait_for("the second backend", 20, || run(&[], 0).contains("\"app2\"").then_some(()));
    let text = run(&["-sess_in", &path(&second)], 0);
    assert!(reused(&text), "the session outlived the table: {text}");
    assert!(text.contains("\"app2\""), "{text}");
}
