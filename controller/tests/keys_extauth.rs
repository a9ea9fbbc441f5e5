//! `auth-url: https://$host:PORT/check` end to end: `weir serve --manifests` reads the Ingress
//! (with `proxy-ssl-secret` naming a Secret whose `ca.crt` is the test CA), a real TLS
//! authentication service (Python's `http.server` behind `ssl`) decides, and curl is the client.
//! A service whose certificate cannot be verified fails closed: 500, and a log line says why.
#![allow(clippy::unwrap_used)]

mod support_app;
mod support_proc;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The authentication service: `Authorization: Bearer good` → 200 with `X-Auth-User`, else 401.
const AUTH_SERVICE: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer good"
        self.send_response(200 if ok else 401)
        if ok:
            self.send_header("X-Auth-User", "good")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// A test CA (PEM) and a leaf for `localhost` written to `dir` as `leaf.pem` and `leaf.key`.
fn pki(dir: &Path) -> String {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "weir auth test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf =
        CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("leaf.key"), key.serialize_pem()).unwrap();
    ca_cert.pem()
}

/// Starts the TLS authentication service; its port.
fn auth_service(dir: &Path) -> Option<(support_proc::Proc, u16)> {
    let started = Command::new("python3")
        .args(["-c", AUTH_SERVICE])
        .arg(dir.join("leaf.pem"))
        .arg(dir.join("leaf.key"))
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            let why = format!("python3 is needed for the TLS authentication service: {e}");
            assert!(std::env::var("WEIR_REQUIRE_ALL").as_deref() != Ok("1"), "{why} (WEIR_REQUIRE_ALL=1)");
            eprintln!("skipping: {why}");
            return None;
        }
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let proc = support_proc::Proc(child);
    Some((proc, line.trim().parse().unwrap_or_else(|_| panic!("the service printed {line:?}"))))
}

fn manifests(dir: &Path, backend: SocketAddr, ca_pem: &str, port: u16) {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let ingress = |name: &str, host: &str, annotations: &str| {
        format!(
            r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: default
  annotations:
{annotations}
spec:
  ingressClassName: weir
  rules:
  - host: {host}
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}
"#
        )
    };
    let yaml = [
        support_app::app_yaml(backend, "/"),
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: auth-ca, namespace: default}}\ndata: {{ca.crt: {ca}}}\n"
        ),
        // oauth2-proxy's example, with the test service's port; the CA given as trust.
        ingress(
            "trusted",
            "localhost",
            &format!(
                "    nginx.ingress.kubernetes.io/auth-url: \"https://$host:{port}/check\"\n    nginx.ingress.kubernetes.io/auth-response-headers: X-Auth-User\n    nginx.ingress.kubernetes.io/proxy-ssl-secret: default/auth-ca\n"
            ),
        ),
        // No trust given: the system's roots, which do not know the test CA.
        ingress(
            "untrusted",
            "untrusted.test",
            &format!("    nginx.ingress.kubernetes.io/auth-url: \"https://localhost:{port}/check\"\n"),
        ),
    ]
    .join("---\n");
    std::fs::write(dir.join("app.yaml"), yaml).unwrap();
}

/// curl through weir: the status and the body.
fn curl(http: SocketAddr, host: &str, token: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-H", &format!("Host: {host}")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("http://{http}/"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

fn have_curl() -> bool {
    if Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(std::env::var("WEIR_REQUIRE_ALL").as_deref() != Ok("1"), "curl is required (WEIR_REQUIRE_ALL=1)");
    eprintln!("skipping: needs curl");
    false
}

#[test]
fn https_auth_url_with_the_host_variable_and_a_given_ca() {
    if !have_curl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = pki(dir.path());
    let Some((_auth, port)) = auth_service(dir.path()) else { return };
    let (_echo, echo) =
        support_proc::spawn(&["echo", "--listen", "127.0.0.1:0", "--name", "app"], &["listen"]);
    let manifests_dir = dir.path().join("manifests");
    std::fs::create_dir(&manifests_dir).unwrap();
    manifests(&manifests_dir, echo[0], &ca, port);
    let (_weir, addrs, log) =
        support_proc::spawn_logged(&support_proc::serve_args(&manifests_dir, &[]), &["http"], Some("info"));
    let http = addrs[0];
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let got = curl(http, "localhost", "good");
        if got.0 != 404 || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"x-auth-user\":\"good\""), "the service's header reaches the app: {body}");
    assert_eq!(curl(http, "localhost", "bad").0, 401);
    // Unverifiable: closed, with the reason in the log.
    assert_eq!(curl(http, "untrusted.test", "good").0, 500);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines = log.lock().unwrap().clone();
        let line = lines.iter().find(|l| l.contains("external authentication failed"));
        if let Some(line) = line {
            assert!(line.contains(&format!("https://localhost:{port}/check")), "{line}");
            assert!(line.contains("certificate"), "the reason is given: {line}");
            break;
        }
        assert!(Instant::now() < deadline, "no log line about the failure:\n{}", lines.join("\n"));
        std::thread::sleep(Duration::from_millis(50));
    }
}
