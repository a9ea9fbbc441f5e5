//! Gateway client certificate validation (`Gateway.spec.tls.frontend`, `FrontendTLSConfig`)
//! over real sockets: `weir serve --manifests` with HTTPS listeners, `weir echo` backends on
//! loopback, and curl as the client over HTTP/1.1 and HTTP/2, with and without a client
//! certificate (`--cert`/`--key`). Each test follows the upstream conformance test it names
//! (`conformance/tests/gateway-*client*certificate*.go` of Gateway API v1.6.1), adapted to
//! weir's one HTTPS port (its `perPort` entries name port 443).

#![allow(clippy::unwrap_used)] // test helpers: a failed setup step should panic the test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;

mod support_gateway;
mod support_proc;

use support_gateway::{CLASS, Ca, echo, have_curl, service, wait_until, write};
use support_proc::spawn_serve;

/// What curl saw: `Ok((status, body))` or `Err(curl's message)` (a failed handshake).
type Seen = Result<(u16, String), String>;

/// `curl https://host/` on weir's `https`, the server verified against `ca`, presenting
/// `cert` (certificate and key files) when given, over HTTP/2 or HTTP/1.1.
fn curl(https: SocketAddr, host: &str, ca: &Path, cert: Option<&(PathBuf, PathBuf)>, h2: bool) -> Seen {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg(if h2 { "--http2" } else { "--http1.1" })
        .args(["--resolve", &format!("{host}:{}:127.0.0.1", https.port())])
        .arg("--cacert")
        .arg(ca);
    if let Some((c, k)) = cert {
        cmd.arg("--cert").arg(c).arg("--key").arg(k);
    }
    let out = cmd.arg(format!("https://{host}:{}/", https.port())).output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    Ok((code.parse().unwrap(), body.to_string()))
}

/// The echo's name and the `ssl-client-verify` it received (`-` when none) of a 200 answer.
fn served(seen: &Seen) -> Option<(String, String)> {
    let (200, body) = seen.as_ref().ok()? else { return None };
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let verify = v["headers"]["ssl-client-verify"].as_str().unwrap_or("-");
    Some((v["name"].as_str()?.to_string(), verify.to_string()))
}

/// The Gateway `default/name` of class `weir` with `tls` (a YAML mapping) and `listeners`
/// (YAML list items), and an HTTPRoute of the same name on all its listeners to Service `to`.
fn gateway(name: &str, tls: &str, listeners: &str, to: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  gatewayClassName: weir\n  tls: {tls}\n  listeners:\n{listeners}---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{parentRefs: [{{name: {name}}}], rules: [{{backendRefs: [{{name: {to}, port: 80}}]}}]}}\n---\n"
    )
}

/// Conformance `GatewayFrontendClientCertificateValidation` (`perPort` overrides `default` for
/// its port: the default CA's client is refused, the port's served; without a certificate or
/// with another CA's the request fails, `AllowValidOnly`),
/// `GatewayFrontendClientCertificateValidationInsecureFallback` (every client served; weir
/// tells the backend the result in `ssl-client-verify`) and
/// `GatewayFrontendInvalidDefaultClientCertificateValidation` (a CA ConfigMap that does not
/// exist: the HTTPS listener is not served, the Gateway's HTTP listener is, and a `perPort`
/// entry for port 80 does not touch it; once the ConfigMap is written the listener serves),
/// over HTTP/1.1 and HTTP/2.
#[test]
fn frontend_client_certificate_validation_modes_per_port_and_an_invalid_default() {
    if !have_curl() {
        return;
    }
    let (_a, a) = echo("backend-a");
    let (_b, b) = echo("backend-b");
    let dir = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let names = ["secure.example.org", "fallback.example.org", "broken.example.org"];
    let server_ca = Ca::new("server");
    let (cert, key) = server_ca.leaf(&names);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: site-tls, namespace: default}}\ntype: kubernetes.io/tls\n\
         data:\n  tls.crt: {}\n  tls.key: {}\n---\n",
        b64(&cert),
        b64(&key)
    );
    let server_ca_file = files.path().join("server-ca.pem");
    std::fs::write(&server_ca_file, &server_ca.pem).unwrap();
    let (default_ca, port_ca, stranger_ca) = (Ca::new("default"), Ca::new("port"), Ca::new("stranger"));
    let default_client = default_ca.client(files.path(), "default-client");
    let port_client = port_ca.client(files.path(), "port-client");
    let stranger = stranger_ca.client(files.path(), "stranger");

    let https_listener = |host: &str| {
        format!(
            "  - {{name: https, port: 443, protocol: HTTPS, hostname: {host}, tls: {{certificateRefs: [{{name: site-tls}}]}}}}\n"
        )
    };
    let mut yaml = String::from(CLASS);
    yaml.push_str(&gateway(
        "validated",
        r#"{frontend: {default: {validation: {caCertificateRefs: [{kind: ConfigMap, group: "", name: default-ca}]}},
    perPort: [{port: 443, tls: {validation: {caCertificateRefs: [{kind: ConfigMap, group: "", name: port-ca}]}}}]}}"#,
        &https_listener("secure.example.org"),
        "a",
    ));
    yaml.push_str(&gateway(
        "fallback",
        r#"{frontend: {default: {validation: {mode: AllowInsecureFallback, caCertificateRefs: [{kind: ConfigMap, group: "", name: default-ca}]}}}}"#,
        &https_listener("fallback.example.org"),
        "b",
    ));
    let broken_listeners = format!(
        "{}  - {{name: http, port: 80, protocol: HTTP, hostname: broken.example.org}}\n",
        https_listener("broken.example.org")
    );
    yaml.push_str(&gateway(
        "broken",
        r#"{frontend: {default: {validation: {caCertificateRefs: [{kind: ConfigMap, group: "", name: does-not-exist}]}},
    perPort: [{port: 80, tls: {validation: {caCertificateRefs: [{kind: ConfigMap, group: "", name: port-ca}]}}}]}}"#,
        &broken_listeners,
        "a",
    ));
    yaml.push_str(&default_ca.config_map("default-ca"));
    yaml.push_str(&port_ca.config_map("port-ca"));
    yaml.push_str(&format!("{}{}{secret}", service("a", a), service("b", b)));
    write(dir.path(), "gateways.yaml", &yaml);

    // `weir check` names the listener that cannot be served and why.
    let check = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["check", "--manifests"])
        .arg(dir.path())
        .output()
        .unwrap();
    let report =
        format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(!check.status.success(), "{report}");
    for needle in
        ["default/broken", "NoValidCACertificate", "InvalidCACertificateRef", "default/does-not-exist"]
    {
        assert!(report.contains(needle), "{needle} missing from:\n{report}");
    }
    assert!(!report.contains("default/validated") && !report.contains("default/fallback"), "{report}");

    let (_weir, addrs) = spawn_serve(dir.path(), &[], &["http", "https"]);
    let (http, https) = (addrs[0], addrs[1]);
    let ca = server_ca_file.as_path();
    wait_until(
        "secure.example.org with the port's client certificate",
        || curl(https, "secure.example.org", ca, Some(&port_client), true),
        |seen| served(seen).is_some(),
    );
    for h2 in [false, true] {
        let v = if h2 { "HTTP/2" } else { "HTTP/1.1" };
        // AllowValidOnly with the port's CA (perPort 443 overrides default).
        let seen = curl(https, "secure.example.org", ca, Some(&port_client), h2);
        assert_eq!(served(&seen), Some(("backend-a".into(), "SUCCESS".into())), "{v}: {seen:?}");
        for (who, cert) in [
            ("the default's client", Some(&default_client)),
            ("another CA's client", Some(&stranger)),
            ("no certificate", None),
        ] {
            let seen = curl(https, "secure.example.org", ca, cert, h2);
            assert!(seen.is_err(), "{v}, {who}: the request must fail, got {seen:?}");
        }
        // AllowInsecureFallback: everyone served, the backend told the verification result.
        for (cert, verdict) in
            [(Some(&default_client), "SUCCESS"), (None, "NONE"), (Some(&stranger), "FAILED:")]
        {
            let seen = curl(https, "fallback.example.org", ca, cert, h2);
            let (name, verify) = served(&seen).unwrap_or_else(|| panic!("{v}: {seen:?}"));
            assert_eq!(name, "backend-b", "{v}");
            assert!(verify.starts_with(verdict), "{v}: {verdict} wanted, got {verify}");
        }
        // An invalid default: the HTTPS listener is not served (weir's default certificate
        // answers, which the client does not trust).
        let seen = curl(https, "broken.example.org", ca, Some(&default_client), h2);
        assert!(seen.is_err(), "{v}: {seen:?}");
    }
    // The HTTP listener of that Gateway serves; the perPort entry for port 80 does not apply.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--resolve", &format!("broken.example.org:{}:127.0.0.1", http.port())])
        .arg(format!("http://broken.example.org:{}/", http.port()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");

    // The missing ConfigMap appears (with the default CA): the listener serves, validating.
    write(dir.path(), "late-ca.yaml", &default_ca.config_map("does-not-exist"));
    wait_until(
        "broken.example.org once its CA exists",
        || curl(https, "broken.example.org", ca, Some(&default_client), false),
        |seen| served(seen).is_some(),
    );
    assert!(curl(https, "broken.example.org", ca, None, true).is_err(), "still AllowValidOnly");
}
