//! `scripts/image.sh`: the OCI image, built without a container daemon from the weir binary
//! cargo built for these tests (the debug build: a release build would add about 15 minutes to
//! CI; the script strips its debug info). The test unpacks the image with umoci and runs
//! `weir --version` and a `weir serve --manifests` smoke test from the unpacked root, in a
//! chroot, as the image's user (65532), listening on ports 80 and 443 as the chart's hostNetwork
//! DaemonSet does (the binary carries the file capability CAP_NET_BIND_SERVICE), from a
//! read-only root (the chart's `readOnlyRootFilesystem`). It runs in private network and mount
//! namespaces (`unshare --net --mount`), so those ports and that mount are its own. Then the
//! node module in the chart's default mode (nftables, over netlink: the image has no `nft`)
//! runs from the same root and programs a ClusterIP that a connection then reaches.
//!
//! Needs root (chroot, unshare), umoci, skopeo and getcap (`scripts/test.sh install`). Without
//! them it is skipped with a printed reason, or fails when `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn missing() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"));
    if !root {
        return Some("not root (the smoke test runs weir in a chroot)".into());
    }
    for tool in ["umoci", "skopeo", "chroot", "ldd", "getcap", "unshare", "ip", "nft"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("{tool} not found: run scripts/test.sh install"));
        }
    }
    None
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every path under `root`, relative, directories included.
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.insert(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

fn manifests(dir: &Path, backend: SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    let text = r#"apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: weir}
spec: {controller: weir.dev/ingress-controller}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: smoke}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: smoke
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: @PORT@, protocol: TCP}]
endpoints: [{addresses: ["@IP@"], conditions: {ready: true}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: smoke}
spec:
  ingressClassName: weir
  rules:
  - host: smoke.example
    http:
      paths:
      - path: /
        pathType: Prefix
        backend: {service: {name: web, port: {name: http}}}
"#
    .replace("@PORT@", &backend.port().to_string())
    .replace("@IP@", &backend.ip().to_string());
    std::fs::write(dir.join("smoke.yaml"), text).unwrap();
}

fn get(addr: SocketAddr, host: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// Starts `cmd` (no input, output discarded) with its stderr collected, line by line, into
/// the returned log.
fn spawn_logging(cmd: &mut Command) -> (std::process::Child, std::sync::Arc<std::sync::Mutex<String>>) {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = sink.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    (child, log)
}

/// GETs `/` from `addr` until it answers 200 or `secs` have passed; the last answer.
fn get_until_ok(addr: SocketAddr, host: &str, secs: u64) -> Option<(u16, String)> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = get(addr, host);
        if got.as_ref().is_some_and(|(s, _)| *s == 200) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Unmounts its path when dropped (before the temporary directory holding it is removed).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The image holds weir, its libraries, CA certificates and user 65532, and nothing else (no
/// shell); its configuration runs `weir serve` as 65532 with the OCI labels; the docker-archive
/// is tagged; and weir runs from the unpacked root: `--version`, then serving an Ingress.
#[test]
fn image_builds_unpacks_and_serves() {
    const INSIDE: &str = "WEIR_IMAGE_TEST_INSIDE_NETNS";
    if std::env::var_os(INSIDE).is_none() {
        if let Some(reason) = missing() {
            let require_all = std::env::var("WEIR_REQUIRE_ALL").is_ok_and(|v| v == "1");
            assert!(!require_all, "cannot run the image test and WEIR_REQUIRE_ALL=1: {reason}");
            eprintln!("SKIPPED: {reason}");
            return;
        }
        // Again, in private network and mount namespaces.
        let out = Command::new("unshare")
            .args(["--net", "--mount"])
            .arg(std::env::current_exe().unwrap())
            .args(["image_builds_unpacks_and_serves", "--exact", "--nocapture", "--test-threads=1"])
            .env(INSIDE, "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        for line in stdout.lines().chain(stderr.lines()).filter(|l| l.contains("MEASURED")) {
            eprintln!("{line}");
        }
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "failed in its network namespace:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
        return;
    }
    run(Command::new("ip").args(["link", "set", "lo", "up"]));
    let weir = env!("CARGO_BIN_EXE_weir");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run(Command::new(repo().join("scripts/image.sh"))
        .args(["--binary", weir, "--tag", "test", "--output"])
        .arg(&out)
        .stdin(Stdio::null()));

    // The docker-archive (what `podman load` / `docker load` read) names weir:test.
    let archive = out.join("weir-test.docker.tar");
    let manifest = run(Command::new("tar").arg("-xOf").arg(&archive).arg("manifest.json"));
    let manifest: Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(manifest[0]["RepoTags"][0], "docker.io/library/weir:test");
    let loaded = run(Command::new("skopeo")
        .arg("inspect")
        .arg("--config")
        .arg(format!("docker-archive:{}", archive.display())));
    let loaded: Value = serde_json::from_str(&loaded).unwrap();
    assert_eq!(loaded["config"]["Entrypoint"], serde_json::json!(["weir"]));

    // The image's configuration.
    let inspect = run(Command::new("skopeo")
        .arg("inspect")
        .arg("--config")
        .arg(format!("oci:{}:test", out.join("oci").display())));
    let config: Value = serde_json::from_str(&inspect).unwrap();
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532");
    assert_eq!(c["Entrypoint"], serde_json::json!(["weir"]));
    assert_eq!(c["Cmd"], serde_json::json!(["serve"]));
    let version = run(Command::new(weir).arg("--version"));
    let version = version.split_whitespace().nth(1).unwrap();
    assert_eq!(c["Labels"]["org.opencontainers.image.version"], version);
    assert_eq!(c["Labels"]["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(c["Labels"]["org.opencontainers.image.source"].as_str().is_some_and(|s| !s.is_empty()));

    // Unpacked: exactly the binary, the libraries ldd names, CA certificates, passwd/group.
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:test", out.join("oci").display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let files = tree(&rootfs);
    let mut expected: BTreeSet<String> = [
        "etc",
        "etc/group",
        "etc/nsswitch.conf",
        "etc/passwd",
        "etc/ssl",
        "etc/ssl/certs",
        "etc/ssl/certs/ca-certificates.crt",
        "tmp",
        "usr",
        "usr/local",
        "usr/local/bin",
        "usr/local/bin/weir",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let ldd = run(Command::new("ldd").arg(weir));
    for lib in ldd.split_whitespace().filter(|w| w.starts_with('/')) {
        let mut path = Path::new(lib.trim_start_matches('/'));
        expected.insert(path.display().to_string());
        while let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            expected.insert(parent.display().to_string());
            path = parent;
        }
    }
    assert_eq!(files, expected, "the image's files");
    for shell in ["bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/apt", "usr/bin/dpkg"] {
        assert!(!rootfs.join(shell).exists(), "{shell} is in the image");
    }
    let caps = run(Command::new("getcap").arg(rootfs.join("usr/local/bin/weir")));
    assert!(caps.contains("cap_net_bind_service=ep"), "the binary's file capabilities: {caps:?}");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")), "{passwd}");
    let runtime: Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(runtime["process"]["args"], serde_json::json!(["weir", "serve"]));
    assert_eq!(runtime["process"]["user"]["uid"], 65532);

    let size: u64 =
        files.iter().filter_map(|f| std::fs::symlink_metadata(rootfs.join(f)).ok()).map(|m| m.len()).sum();
    eprintln!("MEASURED image (debug binary, stripped of debug info) unpacked: {} bytes", size);

    // weir --version from the unpacked root, as the image's user.
    let chroot_bin = run(Command::new("sh").args(["-c", "command -v chroot"])).trim().to_string();
    let chroot = |args: &[&str]| {
        let mut cmd = Command::new(&chroot_bin);
        cmd.arg("--userspec=65532:65532")
            .arg(&rootfs)
            .arg("/usr/local/bin/weir")
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin");
        cmd
    };
    let printed = run(&mut chroot(&["--version"]));
    assert_eq!(printed.trim(), format!("weir {version}"));

    // weir serve --manifests from the unpacked root routes to a backend outside it.
    let backend = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = backend.local_addr().unwrap();
    drop(backend);
    let mut echo = Command::new(weir)
        .args(["echo", "--name", "outside", "--listen", &backend_addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The echo backend listens before weir's ports are picked (they could reuse its port).
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(backend_addr).is_err() {
        assert!(Instant::now() < deadline, "weir echo does not listen on {backend_addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    manifests(&rootfs.join("srv/manifests"), backend_addr);
    node_manifests(&rootfs.join("srv/node"), NODE_POD);
    // The mount point of /proc, which a container runtime provides.
    std::fs::create_dir(rootfs.join("proc")).unwrap();
    // A read-only root file system, as the chart's securityContext makes it (this mount
    // namespace is the test's own).
    let root = rootfs.to_str().unwrap();
    run(Command::new("mount").args(["--bind", root, root]));
    let _unmount = Unmount(rootfs.clone());
    run(Command::new("mount").args(["-o", "remount,bind,ro", root, root]));
    assert!(std::fs::write(rootfs.join("tmp/probe"), "x").is_err(), "the root is not read-only");
    // Ports 80 and 443, as the user 65532: the file capability at work.
    let http = SocketAddr::from(([127, 0, 0, 1], 80));
    let mut serve = chroot(&[
        "serve",
        "--manifests",
        "/srv/manifests",
        "--listen-http",
        &http.to_string(),
        "--listen-https",
        "127.0.0.1:443",
        "--listen-admin",
        "127.0.0.1:10254",
    ]);
    let (mut serve, log) = spawn_logging(&mut serve);
    let answer = get_until_ok(http, "smoke.example", 20);
    let _ = serve.kill();
    let _ = serve.wait();
    let _ = echo.kill();
    let _ = echo.wait();
    let (status, body) =
        answer.unwrap_or_else(|| panic!("no answer from weir in the image:\n{}", log.lock().unwrap()));
    assert_eq!(status, 200, "{body}\n{}", log.lock().unwrap());
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["name"], "outside");

    node_serves_from_the_image(weir, &chroot_bin, &rootfs);
}

/// The pod of the node module's check: an address of this network namespace's loopback.
const NODE_POD: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 0, 5)), 8080);

/// A Service `web` with ClusterIP 10.96.0.10:80 on `pod`.
fn node_manifests(dir: &Path, pod: SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: smoke}}\n\
         spec:\n  clusterIP: 10.96.0.10\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: web-1, namespace: smoke, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {port}}}]\n\
         endpoints: [{{addresses: [\"{ip}\"], nodeName: node-a, conditions: {{ready: true}}}}]\n",
        port = pod.port(),
        ip = pod.ip()
    );
    std::fs::write(dir.join("svc.yaml"), text).unwrap();
}

/// The node module in the chart's default mode (`--mode nftables`) from the image's files alone
/// (no `nft`, no iptables tools: its rules go over nf_tables netlink), as root as the chart's
/// DaemonSet runs it: a connection to the Service's ClusterIP reaches the pod, and
/// `weir node --cleanup` from the image removes the table again.
fn node_serves_from_the_image(weir: &str, chroot_bin: &str, rootfs: &Path) {
    run(Command::new("mount").arg("-t").arg("proc").arg("proc").arg(rootfs.join("proc")));
    let _proc = Unmount(rootfs.join("proc"));
    run(Command::new("ip").args(["addr", "add", "10.244.0.5/32", "dev", "lo"]));
    // Service addresses are routed (as on a node, by its default route) until the rules DNAT them.
    run(Command::new("ip").args(["route", "add", "10.96.0.0/16", "dev", "lo"]));
    let mut pod = Command::new(weir)
        .args(["echo", "--name", "pod", "--listen", &NODE_POD.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let image_weir = |args: &[&str]| {
        let mut cmd = Command::new(chroot_bin);
        cmd.arg(rootfs).arg("/usr/local/bin/weir").args(args).env_clear().env("PATH", "/usr/local/bin");
        cmd
    };
    let mut node = image_weir(&[
        "node",
        "--mode",
        "nftables",
        "--manifests",
        "/srv/node",
        "--node-name",
        "node-a",
        "--listen-admin",
        "127.0.0.1:10256",
    ]);
    let (mut node, log) = spawn_logging(&mut node);
    let answer = get_until_ok(SocketAddr::from(([10, 96, 0, 10], 80)), "web", 30);
    let _ = node.kill();
    let _ = node.wait();
    let _ = pod.kill();
    let _ = pod.wait();
    let log = log.lock().unwrap().clone();
    let (status, body) = answer.unwrap_or_else(|| panic!("the ClusterIP never answered:\n{log}"));
    assert_eq!(status, 200, "{body}\n{log}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["name"], "pod", "{log}");
    assert!(log.contains("node rules synced"), "{log}");

    // The table is there (the test's own nft looks), and --cleanup from the image removes it.
    let tables = run(Command::new("nft").args(["list", "tables"]));
    assert!(tables.contains("table ip weir"), "{tables}");
    let cleanup = image_weir(&["node", "--cleanup"]).output().unwrap();
    assert!(cleanup.status.success(), "{}", String::from_utf8_lossy(&cleanup.stderr));
    let tables = run(Command::new("nft").args(["list", "tables"]));
    assert!(!tables.contains("table ip weir"), "{tables}");
}
