//! Harness of the Kubernetes end-to-end tests: a real etcd and kube-apiserver on loopback,
//! `weir serve` processes talking to it, `weir echo` backends, and plain HTTP requests.
//!
//! The API server refuses Endpoints on loopback addresses (127.0.0.0/8), so each test runs in a
//! private network namespace (`unshare --net`, root only) whose `lo` also carries
//! 10.0.0.0/8 (so [`BACKEND_IP`] is local): nothing is reachable from outside and the host's network is untouched.
//! Binaries come from `scripts/kube-apiserver.sh build` (cached in /var/cache/weir/kube/bin, or
//! `WEIR_KUBE_BIN`). Without them (or without root) a test is skipped with a printed reason,
//! or fails when `WEIR_REQUIRE_ALL=1`.

#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::IngressClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The address the echo backends listen on (added to `lo` of the test's network namespace).
pub const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 7, 1);
const INSIDE: &str = "WEIR_E2E_INSIDE_NETNS";
/// The weir binary (only known to the controller crate's tests; the conformance runner runs
/// weir in-process).
const WEIR: Option<&str> = option_env!("CARGO_BIN_EXE_weir");

/// Serialises the tests of one binary: each brings its own API server, and two cores do not
/// carry several at once.
static SERIAL: Mutex<()> = Mutex::new(());

fn require_all() -> bool {
    std::env::var("WEIR_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// The directory holding kube-apiserver and etcd.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("WEIR_KUBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/weir/kube/bin"))
}

fn missing_prerequisite() -> Option<String> {
    let uid_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if !uid_root {
        return Some("not root (the tests need a private network namespace)".into());
    }
    for bin in ["kube-apiserver", "etcd"] {
        if !bin_dir().join(bin).is_file() {
            return Some(format!(
                "{} missing: run scripts/kube-apiserver.sh build (or set WEIR_KUBE_BIN)",
                bin_dir().join(bin).display()
            ));
        }
    }
    for tool in ["unshare", "ip", "openssl"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            return Some(format!("{tool} not found"));
        }
    }
    None
}

/// Runs the test `name` (this very function) in a private network namespace, then `body`
/// inside it. Returns without running when skipped.
pub fn isolated<F, Fut>(name: &str, body: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if std::env::var_os(INSIDE).is_some() {
        // All of 10.0.0.0/8 becomes local (as 127.0.0.0/8 is): BACKEND_IP and the conformance
        // replicas' addresses are in it.
        for args in [["link", "set", "lo", "up", ""], ["addr", "add", "10.0.0.1/8", "dev", "lo"]] {
            let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
            let out = Command::new("ip").args(&args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(body());
        return;
    }
    if let Some(reason) = missing_prerequisite() {
        if require_all() {
            panic!("cannot run the Kubernetes end-to-end tests and WEIR_REQUIRE_ALL=1: {reason}");
        }
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let out = Command::new("unshare")
        .arg("--net")
        .arg(&exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // MEASURED: figures; REPORT: what a test wants shown even when it passes.
    let shown = |l: &'static str| move |line: &str| line.find(l).map(|i| line[i..].to_owned());
    let lines = stdout.lines().chain(stderr.lines());
    for line in lines.filter_map(|l| shown("MEASURED")(l).or_else(|| shown("REPORT")(l))) {
        eprintln!("{line}");
    }
    if !out.status.success() || !stdout.contains("1 passed") {
        panic!(
            "{name} failed in its network namespace after {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            started.elapsed()
        );
    }
}

/// Prints a figure the parent process repeats (test output is otherwise only shown on failure).
pub fn measured(what: &str, value: Duration) {
    println!("MEASURED {what}: {} ms", value.as_millis());
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

// === impl ApiServer ===

/// etcd and kube-apiserver on loopback, with an admin token.
pub struct ApiServer {
    pub dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Option<Child>,
    etcd_port: u16,
    pub port: u16,
    pub admin_token: String,
    /// A kubeconfig with the admin token.
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        let dir = tempfile::tempdir().unwrap();
        let token = format!("admin-{}", std::process::id());
        std::fs::write(dir.path().join("tokens.csv"), format!("{token},admin,admin,system:masters\n"))
            .unwrap();
        let key = dir.path().join("sa.key");
        let out = Command::new("openssl").arg("genrsa").arg("-out").arg(&key).arg("2048").output().unwrap();
        assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
        let (etcd_port, peer_port, port) = (free_port(), free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Command::new(bin_dir().join("etcd"))
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .args([
                "--name",
                "e2e",
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("e2e={peer_url}")])
            .stdout(log_file(dir.path(), "etcd.log"))
            .stderr(log_file(dir.path(), "etcd.log"))
            .spawn()
            .unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut server =
            ApiServer { dir, etcd, apiserver: None, etcd_port, port, admin_token: token.clone(), kubeconfig };
        let started = Instant::now();
        server.start_apiserver().await;
        measured("kube-apiserver ready after start", started.elapsed());
        let kubeconfig = server.kubeconfig_for(&token);
        std::fs::copy(&kubeconfig, &server.kubeconfig).unwrap();
        server
    }

    /// (Re)starts kube-apiserver on the same port and waits until it is ready.
    pub async fn start_apiserver(&mut self) {
        assert!(self.apiserver.is_none());
        let dir = self.dir.path();
        let child = Command::new(bin_dir().join("kube-apiserver"))
            .args(["--etcd-servers", &format!("http://127.0.0.1:{}", self.etcd_port)])
            .args(["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"])
            .args(["--secure-port", &self.port.to_string()])
            .arg("--cert-dir")
            .arg(dir.join("certs"))
            .arg("--token-auth-file")
            .arg(dir.join("tokens.csv"))
            .args(["--authorization-mode", "RBAC"])
            .args(["--service-account-issuer", "https://kubernetes.default.svc"])
            .arg("--service-account-key-file")
            .arg(dir.join("sa.key"))
            .arg("--service-account-signing-key-file")
            .arg(dir.join("sa.key"))
            .args(["--service-cluster-ip-range", "10.96.0.0/16"])
            .stdout(log_file(dir, "apiserver.log"))
            .stderr(log_file(dir, "apiserver.log"))
            .spawn()
            .unwrap();
        self.apiserver = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self.ready().await {
                return;
            }
            if let Some(status) = self.apiserver.as_mut().unwrap().try_wait().unwrap() {
                panic!("kube-apiserver exited with {status}:\n{}", self.log("apiserver.log"));
            }
            assert!(Instant::now() < deadline, "kube-apiserver not ready:\n{}", self.log("apiserver.log"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills kube-apiserver (etcd keeps running).
    pub fn kill_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn ready(&self) -> bool {
        // The API server's certificate exists once it serves; before that, a plain TCP probe.
        if TcpStream::connect(("127.0.0.1", self.port)).is_err() || !self.ca().exists() {
            return false;
        }
        let Ok(client) = self.client_for(&self.admin_token).await else { return false };
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        client.request_text(req).await.is_ok_and(|t| t.trim() == "ok")
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    /// A kubeconfig authenticating with `token`, trusting the API server's own certificate.
    pub fn kubeconfig_for(&self, token: &str) -> PathBuf {
        let path =
            self.dir.path().join(format!("kubeconfig-{}", &token[..token.len().min(12)].replace('/', "_")));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: u}}\ncurrent-context: e2e\n",
            self.port,
            self.ca().display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    pub async fn client_for(&self, token: &str) -> kube::Result<Client> {
        use kube::config::{Config, KubeConfigOptions, Kubeconfig};
        let path = self.kubeconfig_for(token);
        let kc = Kubeconfig::read_from(&path).unwrap();
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
        Client::try_from(config)
    }

    /// An admin client.
    pub async fn client(&self) -> Client {
        self.client_for(&self.admin_token).await.unwrap()
    }

    pub fn log(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let mut start = text.len().saturating_sub(6000);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.kill_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name)).unwrap()
}

// === objects ===

/// Creates or replaces a namespaced object given as JSON (server-side apply, forced).
pub async fn apply<K>(client: &Client, namespace: &str, value: serde_json::Value) -> K
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    apply_with(Api::namespaced(client.clone(), namespace), value).await
}

/// Creates or replaces an IngressClass.
pub async fn apply_class(client: &Client, name: &str, controller: &str) -> IngressClass {
    let value = serde_json::json!({"metadata": {"name": name}, "spec": {"controller": controller}});
    apply_with(Api::all(client.clone()), value).await
}

pub async fn apply_with<K>(api: Api<K>, value: serde_json::Value) -> K
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    let name = object.meta().name.clone().unwrap();
    let mut value = serde_json::to_value(&object).unwrap();
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&value))
        .await
        .unwrap_or_else(|e| panic!("applying {} {name}: {e}", K::kind(&())))
}

/// Applies every document of a YAML manifest file (`---`-separated) as the admin: Namespaces,
/// ServiceAccounts, (Cluster)Roles and their bindings, DaemonSets.
pub async fn apply_file(admin: &Client, path: &Path) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for doc in text.split("\n---\n") {
        let value: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        let ns = value["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        match value["kind"].as_str().unwrap() {
            "Namespace" => drop(apply_with::<Namespace>(Api::all(admin.clone()), value).await),
            "ServiceAccount" => drop(apply::<ServiceAccount>(admin, &ns, value).await),
            "ClusterRole" => drop(apply_with::<ClusterRole>(Api::all(admin.clone()), value).await),
            "ClusterRoleBinding" => {
                drop(apply_with::<ClusterRoleBinding>(Api::all(admin.clone()), value).await)
            }
            "Role" => drop(apply::<Role>(admin, &ns, value).await),
            "RoleBinding" => drop(apply::<RoleBinding>(admin, &ns, value).await),
            "DaemonSet" => drop(apply::<DaemonSet>(admin, &ns, value).await),
            other => panic!("unexpected kind {other} in {}", path.display()),
        }
    }
}

/// A token of the ServiceAccount `namespace/name`, valid for an hour.
pub async fn service_account_token(admin: &Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &Default::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"))
        .status
        .unwrap()
        .token
}

pub async fn delete<K>(client: &Client, namespace: &str, name: &str)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

pub async fn create_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

/// A Service with one named TCP port `http` (80).
pub fn service(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    })
}

/// Endpoints for [`service`] naming the given backend ports on [`BACKEND_IP`].
pub fn endpoints(name: &str, ports: &[u16]) -> serde_json::Value {
    let subsets: Vec<_> = ports
        .iter()
        .map(|p| serde_json::json!({"addresses": [{"ip": BACKEND_IP.to_string()}], "ports": [{"name": "http", "port": p}]}))
        .collect();
    serde_json::json!({"metadata": {"name": name}, "subsets": subsets})
}

/// An Ingress of `class` routing `host` and Prefix `/` to `service` port `http`.
pub fn ingress(name: &str, class: &str, host: &str, service: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "ingressClassName": class,
            "rules": [{"host": host, "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": service, "port": {"name": "http"}}}
            }]}}]
        }
    })
}

// === backends and weir ===

/// `weir echo` backends (in-process) on [`BACKEND_IP`], each answering with its name.
pub struct Echo {
    pub ports: Vec<u16>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Echo {
    pub async fn start(names: &[&str]) -> Echo {
        let mut ports = Vec::new();
        let mut stop = Vec::new();
        for name in names {
            let listener = tokio::net::TcpListener::bind((IpAddr::V4(BACKEND_IP), 0)).await.unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let (tx, rx) = tokio::sync::oneshot::channel();
            stop.push(tx);
            tokio::spawn(weir_dataplane::echo::serve(listener, name.to_string(), async {
                let _ = rx.await;
            }));
        }
        Echo { ports, stop }
    }
}

/// A `weir serve` process reading the API server.
pub struct Weir {
    child: Child,
    pub http: SocketAddr,
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
    pub started: Instant,
}

impl Weir {
    /// Starts `weir serve --kubeconfig KUBECONFIG ARGS...` on ephemeral ports.
    pub fn start(kubeconfig: &Path, args: &[&str]) -> Weir {
        let started = Instant::now();
        let mut child = Command::new(WEIR.expect("the weir binary (CARGO_BIN_EXE_weir)"))
            .arg("serve")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--listen-http",
                "127.0.0.1:0",
                "--listen-https",
                "127.0.0.1:0",
                "--listen-admin",
                "127.0.0.1:0",
            ])
            .args(["--log-level", "info,weir=debug,kube=info"])
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("weir is serving") {
                    let _ = tx.send(line.clone());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("weir did not start: {}", log.lock().unwrap()));
        let field = |key: &str| -> SocketAddr {
            line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).unwrap().parse().unwrap()
        };
        Weir { http: field("http"), admin: field("admin"), child, log, started }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL: no graceful shutdown, no Lease release.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait.
    pub fn terminate(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }

    /// `(status, backend name)` of `GET http://HOST/PATH`, or `None` when the connection failed.
    pub fn get(&self, host: &str, path: &str) -> Option<(u16, String)> {
        http_get(self.http, host, path)
    }

    pub fn admin(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(self.admin).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
    }

    /// Waits until `/readyz` answers 200; returns how long after start.
    pub async fn wait_ready(&self, within: Duration) -> Duration {
        let deadline = Instant::now() + within;
        loop {
            if self.admin("/readyz").is_some_and(|(s, _)| s == 200) {
                return self.started.elapsed();
            }
            assert!(Instant::now() < deadline, "weir not ready within {within:?}:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `GET HOST/` is answered by `expect` (a backend name, or `404`/`503`); returns
    /// how long it took.
    pub async fn wait_route(&self, host: &str, expect: &str, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let got = self.get(host, "/");
            let ok = match &got {
                Some((200, name)) => name == expect,
                Some((status, _)) => status.to_string() == expect,
                None => false,
            };
            if ok {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{host}: expected {expect} within {within:?}, last answer {got:?}\n--- weir log\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `(status, echo backend name or body)` of a plain HTTP/1.1 GET.
pub fn http_get(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let name = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["name"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string());
    Some((status, name))
}

/// Polls `f` until it returns `Some`, failing after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
