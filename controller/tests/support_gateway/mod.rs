//! Helpers of the Gateway API tests that run `weir serve --manifests`: a Service manifest for a
//! backend on loopback, manifests written as editors write them, `weir echo` backends, weir's
//! GatewayClass, and test CAs. (A test crate that uses it declares `mod support_proc` too.)
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::support_proc::{self, Proc, spawn};

/// The GatewayClass `weir` of weir's default controller name.
pub const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: weir}\n\
spec: {controllerName: weir.dev/gateway-controller}\n---\n";

/// A `weir echo --name NAME` backend.
pub fn echo(name: &str) -> (Proc, SocketAddr) {
    let (proc, addrs) = spawn(&["echo", "--listen", "127.0.0.1:0", "--name", name], &["listen"]);
    (proc, addrs[0])
}

/// Retries `probe` until `done` holds for its answer (a published table takes effect
/// asynchronously), or fails after 20 s with the last answer.
pub fn wait_until<T: std::fmt::Debug>(what: &str, probe: impl Fn() -> T, done: impl Fn(&T) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = probe();
        if done(&got) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether curl is installed (the tests that need it skip, or fail with `WEIR_REQUIRE_ALL`).
pub fn have_curl() -> bool {
    support_proc::have("curl", "scripts/test.sh install")
}

/// A test CA: its PEM and the issuer of its leaves.
pub struct Ca {
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    /// A CA with the common name `{name} test CA` (distinct subjects: a leaf whose issuer equals
    /// its subject looks self-signed to clients).
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { pem, issuer: rcgen::Issuer::new(params, key) }
    }

    /// A leaf for `names` (the first also its common name): (certificate PEM, key PEM).
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, names[0]);
        (params.signed_by(&key, &self.issuer).unwrap().pem(), key.serialize_pem())
    }

    /// A client certificate and key written under `dir` as `name.crt`, `name.key`.
    pub fn client(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.leaf(&[name]);
        let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    }

    /// The ConfigMap `default/name` with this CA in `ca.crt`.
    pub fn config_map(&self, name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:\n  ca.crt: {}\n---\n",
            serde_json::to_string(&self.pem).unwrap()
        )
    }
}

/// The manifests of a Service `name` (port 80) whose one endpoint is `addr`.
pub fn service(name: &str, addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n---\n",
        port = addr.port(),
        ip = addr.ip(),
    )
}

/// Writes `yaml` as `dir/file` (write then rename, as editors do).
pub fn write(dir: &Path, file: &str, yaml: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}
