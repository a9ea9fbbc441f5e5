//! `weir migrate`: a directory of Ingresses (with ingress-nginx annotations) and the Gateway
//! API objects it produces route the same requests to the same backends. Both directories are
//! served by a real weir (`weir serve --manifests`, in-process) with real echo backends, and
//! the same requests are sent to both. What cannot be converted is listed, naming the Ingress
//! and the annotation, on stderr and atop the YAML.

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use weir::serve::{Running, ServeOptions};
use weir::source::files::ManifestDir;
use weir_dataplane::echo::EchoResponse;

/// Services and their EndpointSlices (one echo each), kept in both directories.
fn services(ports: &[(&str, u16)]) -> String {
    let mut out = String::new();
    for (name, port) in ports {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
             spec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: {port}}}]\n\
             endpoints: [{{addresses: [\"127.0.0.1\"]}}]\n---\n"
        ));
    }
    out
}

/// The Ingresses migrated (Services `a`, `b`, `c` are written beside them).
const INGRESSES: &str = include_str!("migrate_ingresses.yaml");

/// What a request got, as far as routing goes.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Seen {
    status: u16,
    /// The echo that answered, the path and `Host` it received.
    echo: Option<(String, String, Option<String>)>,
    location: Option<String>,
    /// The `X-Custom` response header (`custom-headers`).
    custom: Option<String>,
}

async fn get(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    weir: SocketAddr,
    host: &str,
    path: &str,
) -> Seen {
    let request = http::Request::get(format!("http://{weir}{path}"))
        .header(http::header::HOST, host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response =
        tokio::time::timeout(Duration::from_secs(15), client.request(request)).await.unwrap().unwrap();
    let status = response.status().as_u16();
    let location =
        response.headers().get(http::header::LOCATION).map(|v| v.to_str().unwrap_or_default().to_owned());
    let custom = response.headers().get("x-custom").map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let echo = serde_json::from_slice::<EchoResponse>(&body).ok().map(|e| (e.name, e.path, e.host));
    Seen { status, echo, location, custom }
}

async fn start(dir: &Path) -> Running {
    let running = Running::start(ServeOptions { manifests: dir.to_path_buf(), ..ServeOptions::default() })
        .await
        .unwrap();
    running.wait_for_version(0, Duration::from_secs(15)).await.unwrap();
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrated_objects_route_like_the_ingresses() {
    let mut ports = Vec::new();
    let mut stops = Vec::new();
    for name in ["a", "b", "c"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        ports.push((name, listener.local_addr().unwrap().port()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        tokio::spawn(weir_dataplane::echo::serve(listener, name.to_owned(), async {
            let _stopped = stopped.await;
        }));
    }
    let root = tempfile::tempdir().unwrap();
    let (ingress_dir, gateway_dir) = (root.path().join("ingress"), root.path().join("gateway"));
    std::fs::create_dir(&ingress_dir).unwrap();
    std::fs::create_dir(&gateway_dir).unwrap();
    std::fs::write(ingress_dir.join("services.yaml"), services(&ports)).unwrap();
    std::fs::write(gateway_dir.join("services.yaml"), services(&ports)).unwrap();
    std::fs::write(ingress_dir.join("ingresses.yaml"), INGRESSES).unwrap();

    // `weir migrate --manifests ingress --out gateway/migrated.yaml`, through the binary.
    let out = gateway_dir.join("migrated.yaml");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["migrate", "--manifests"])
        .arg(&ingress_dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let yaml = std::fs::read_to_string(&out).unwrap();
    println!("{yaml}\n--- stderr\n{stderr}");

    // What could not be converted is named, with the Ingress, on stderr and atop the YAML.
    for key in ["limit-rps", "proxy-read-timeout"] {
        let line = format!("Ingress default/limited: nginx.ingress.kubernetes.io/{key}:");
        assert!(stderr.contains(&line), "{line} missing from stderr: {stderr}");
        assert!(yaml.lines().take_while(|l| l.starts_with('#')).any(|l| l.contains(&line)), "{yaml}");
    }
    assert!(!yaml.contains("other.example.com"), "an Ingress of another class is not migrated");

    // The output is valid for weir: read back as manifests, translated without errors, and
    // holds no Ingress.
    let mut dir = ManifestDir::new(&gateway_dir);
    dir.rescan(true).unwrap();
    assert!(dir.errors().is_empty(), "{:?}", dir.errors());
    let (snapshot, _) = dir.snapshot();
    assert!(snapshot.ingresses.is_empty());
    assert!(!snapshot.http_routes.is_empty());
    let translation = weir::translate::translate(&snapshot, &weir::translate::TranslateConfig::default());
    let errors: Vec<String> = translation
        .warnings
        .iter()
        .filter(|w| w.severity == weir::translate::Severity::Error)
        .map(|w| w.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");

    let before = start(&ingress_dir).await;
    let after = start(&gateway_dir).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let requests = [
        ("web.example.com", "/app"),
        ("web.example.com", "/app/x"),
        ("web.example.com", "/apps"),
        ("web.example.com", "/exact"),
        ("web.example.com", "/exact/x"),
        ("web.example.com", "/"),
        ("rw.example.com", "/old/x"),
        ("rw.example.com", "/OLD"),
        ("rw.example.com", "/other"),
        ("re.example.com", "/v2/x"),
        ("re.example.com", "/V3"),
        ("re.example.com", "/w"),
        ("redir.example.com", "/x"),
        ("limited.example.com", "/"),
        ("hdr.example.com", "/"),
        ("nowhere.example.com", "/x"),
        ("other.example.com", "/"),
    ];
    let mut answers = BTreeSet::new();
    for (host, path) in requests {
        let (want, got) = (
            get(&client, before.http_addr, host, path).await,
            get(&client, after.http_addr, host, path).await,
        );
        assert_eq!(got, want, "GET http://{host}{path}: the migrated objects answer differently");
        answers.insert((want.status, want.echo.map(|e| e.0)));
    }
    let custom = get(&client, after.http_addr, "hdr.example.com", "/").await.custom;
    assert_eq!(custom.as_deref(), Some("yes"), "custom-headers became a ResponseHeaderModifier");
    assert!(answers.len() >= 4, "the requests exercise several outcomes: {answers:?}");
    // The canary's 50 % weight: both backends answer, on both.
    for running in [&before, &after] {
        let mut seen = BTreeSet::new();
        for _ in 0..60 {
            let answer = get(&client, running.http_addr, "canary.example.com", "/").await;
            seen.insert(answer.echo.map(|e| e.0));
        }
        assert_eq!(seen, BTreeSet::from([Some("a".to_owned()), Some("b".to_owned())]));
    }
    before.shutdown().await;
    after.shutdown().await;
    drop(stops);
}
