//! The ConfigMap's TLS keys as a user sees them: `weir serve --manifests` with a certificate made
//! by the openssl CLI, reached with `openssl s_client`.
//!
//! - `ssl-session-tickets` with `ssl-session-ticket-key`: two weir processes given the same key
//!   resume each other's sessions (`-sess_out` from one, `-sess_in` to the other).

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod support_app;
mod support_proc;

use support_proc::spawn;

/// The host `support_app`'s Ingress routes.
const HOST: &str = "app.test";

/// Whether the openssl CLI is installed; without it the test is skipped with a reason, or fails
/// under `WEIR_REQUIRE_ALL=1`.
fn have_openssl() -> bool {
    let found = Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert_ne!(
            std::env::var("WEIR_REQUIRE_ALL").as_deref(),
            Ok("1"),
            "openssl is required (WEIR_REQUIRE_ALL=1; scripts/test.sh install)"
        );
        eprintln!("skipping: openssl is not installed (scripts/test.sh install)");
    }
    found
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
    let app = support_app::app_yaml(backend, "/")
        .replace("  rules:\n", &format!("  tls:\n  - hosts: [{HOST}]\n    secretName: app-tls\n  rules:\n"));
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
    let (weir, addrs) = spawn(
        &[
            "serve",
            "--manifests",
            dir.to_str().unwrap(),
            "--listen-http",
            "127.0.0.1:0",
            "--listen-https",
            "127.0.0.1:0",
            "--listen-admin",
            "127.0.0.1:0",
        ],
        &["https"],
    );
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
    use std::io::Write as _;
    let mut child = Command::new("timeout")
        .args(["20", "openssl", "s_client", "-connect", &https.to_string(), "-servername", HOST, "-CAfile"])
        .arg(ca)
        .args(["-verify_return_error", "-ign_eof"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
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
