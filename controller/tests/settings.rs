//! The settings ConfigMap in standalone mode: `weir serve --manifests DIR` reads it from DIR
//! (`default/weir-settings` unless `--configmap` names another), and an edit of the file changes
//! the next response without a restart; a bad value keeps that key's default while the others
//! apply.
#![allow(clippy::unwrap_used)]

mod support_app;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use weir::serve::{Running, ServeOptions};
use weir_dataplane::model::ObjectRef;
use weir_dataplane::proxy::ProxyConfig;
use weir_dataplane::proxy::accesslog::Output;

/// A ConfigMap `namespace/name` with `data` (YAML lines, indented by the caller's `key: value`).
fn configmap(namespace: &str, name: &str, data: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {namespace}}}\ndata:\n"
    );
    for (key, value) in data {
        yaml.push_str(&format!("  {key}: {}\n", serde_json::to_string(value).unwrap()));
    }
    yaml
}

/// Writes then renames, as editors and ConfigMap mounts do.
fn write(dir: &Path, file: &str, text: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}

struct Harness {
    weir: Running,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Harness {
    async fn start(dir: &Path, settings: Option<ObjectRef>, access_log: &Path) -> Harness {
        let mut options = ServeOptions {
            manifests: dir.to_path_buf(),
            debounce: Duration::from_millis(50),
            poll_interval: Duration::from_millis(200),
            proxy: ProxyConfig {
                access_log_output: Output::File(access_log.to_path_buf()),
                ..ProxyConfig::default()
            },
            ..ServeOptions::default()
        };
        if settings.is_some() {
            options.settings = settings;
        }
        let weir = Running::start(options).await.unwrap();
        Harness { weir, client: Client::builder(TokioExecutor::new()).build_http() }
    }

    /// Sends a request for app.test with `headers` and `body`: the status and the body.
    async fn send(&self, method: &str, headers: &[(&str, &str)], body: usize) -> (u16, String) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}/", self.weir.http_addr))
            .header("host", "app.test");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp =
            self.client.request(req.body(Full::new(Bytes::from(vec![b'x'; body]))).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The `X-Real-IP` the backend saw for a request claiming to be from 203.0.113.7.
    async fn real_ip(&self) -> String {
        let (status, body) = self.send("GET", &[("x-forwarded-for", "203.0.113.7")], 0).await;
        assert_eq!(status, 200, "{body}");
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
        seen["headers"]["x-real-ip"].as_str().unwrap().to_string()
    }

    /// Waits for the table after `version` (the file edit's).
    async fn next_table(&self, version: u64) -> u64 {
        self.weir.wait_for_version(version, Duration::from_secs(10)).await.unwrap()
    }
}

async fn echo() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(weir_dataplane::echo::serve(listener, "echo".into(), std::future::pending()));
    addr
}

#[tokio::test]
async fn a_configmap_edit_changes_the_next_response_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("access.log");
    write(dir.path(), "app.yaml", &support_app::app_yaml(echo().await, "/"));
    let h = Harness::start(dir.path(), None, &log).await;
    // No settings ConfigMap yet: the peer is the client, bodies are unlimited.
    assert_eq!(h.real_ip().await, "127.0.0.1");
    assert_eq!(h.send("POST", &[], 4096).await.0, 200);

    let v = h.weir.table_version();
    let settings = [
        ("use-forwarded-headers", "true"),
        ("proxy-real-ip-cidr", "127.0.0.1"),
        ("proxy-body-size", "1k"),
        ("log-format-upstream", r#"{"client": "$remote_addr", "status": $status, "host": "$host"}"#),
    ];
    write(dir.path(), "settings.yaml", &configmap("default", "weir-settings", &settings));
    h.next_table(v).await;
    assert_eq!(h.real_ip().await, "203.0.113.7");
    assert_eq!(h.send("POST", &[], 4096).await.0, 413);
    let line = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            // The lines before the ConfigMap have the default fields (`req_id` among them).
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| !l.contains("\"req_id\"")) {
                return line.to_string();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("an access-log line");
    let line: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line, serde_json::json!({"client": "203.0.113.7", "status": 200, "host": "app.test"}));

    // A bad value keeps that key's default (no body limit); the other keys still apply.
    let v = h.weir.table_version();
    let broken =
        [("use-forwarded-headers", "true"), ("proxy-real-ip-cidr", "127.0.0.1"), ("proxy-body-size", "lots")];
    write(dir.path(), "settings.yaml", &configmap("default", "weir-settings", &broken));
    h.next_table(v).await;
    assert_eq!(h.send("POST", &[], 4096).await.0, 200);
    assert_eq!(h.real_ip().await, "203.0.113.7");

    // Deleting the ConfigMap restores the defaults.
    let v = h.weir.table_version();
    std::fs::remove_file(dir.path().join("settings.yaml")).unwrap();
    h.next_table(v).await;
    assert_eq!(h.real_ip().await, "127.0.0.1");
    h.weir.shutdown().await;
}

#[tokio::test]
async fn only_the_configmap_named_by_configmap_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    write(dir.path(), "app.yaml", &support_app::app_yaml(echo().await, "/"));
    let trust = [("use-forwarded-headers", "true"), ("proxy-real-ip-cidr", "127.0.0.0/8")];
    write(dir.path(), "default.yaml", &configmap("default", "weir-settings", &trust));
    write(
        dir.path(),
        "named.yaml",
        &configmap("ingress-nginx", "controller", &[("whitelist-source-range", "192.0.2.0/24")]),
    );
    let named = ObjectRef::new("ingress-nginx", "controller");
    let h = Harness::start(dir.path(), Some(named), &logs.path().join("access.log")).await;
    // The named ConfigMap's allow list applies, the default-named one's trust does not.
    assert_eq!(h.send("GET", &[("x-forwarded-for", "192.0.2.7")], 0).await.0, 403);
    h.weir.shutdown().await;
}

/// An authentication service: 200 with `X-Auth-Request-User: alice` for `Authorization: Bearer
/// ok`, else 401.
async fn auth_service() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                        let ok = req.headers().get("authorization").is_some_and(|v| v == "Bearer ok");
                        let mut resp = http::Response::new(Full::new(Bytes::new()));
                        if ok {
                            resp.headers_mut()
                                .insert("x-auth-request-user", http::HeaderValue::from_static("alice"));
                        } else {
                            *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn global_auth_guards_every_ingress_but_those_that_opt_out_and_acme_challenges() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    write(dir.path(), "app.yaml", &support_app::app_yaml(echo().await, "/"));
    let ingress = |name: &str, host: &str, path: &str, annotations: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{{annotations}}}\nspec:\n  ingressClassName: weir\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - {{path: {path}, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}\n"
        )
    };
    let more = [
        ingress("acme", "app.test", "/.well-known/acme-challenge", ""),
        ingress("open", "open.test", "/", "nginx.ingress.kubernetes.io/enable-global-auth: \"false\""),
    ]
    .join("---\n");
    write(dir.path(), "more.yaml", &more);
    let auth = auth_service().await;
    let settings = [
        ("global-auth-url", format!("http://{auth}/check")),
        ("global-auth-response-headers", "X-Auth-Request-User".to_string()),
    ];
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    write(dir.path(), "settings.yaml", &configmap("default", "weir-settings", &settings));
    let h = Harness::start(dir.path(), None, &logs.path().join("access.log")).await;
    let get = |host: &'static str, path: &'static str, token: Option<&'static str>| {
        let mut req = http::Request::get(format!("http://{}{path}", h.weir.http_addr)).header("host", host);
        if let Some(token) = token {
            req = req.header("authorization", token);
        }
        let client = h.client.clone();
        async move {
            let resp = client.request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("app.test", "/", None).await.0, 401);
    assert_eq!(get("app.test", "/", Some("Bearer wrong")).await.0, 401);
    let (status, body) = get("app.test", "/page", Some("Bearer ok")).await;
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["x-auth-request-user"], "alice");
    // `enable-global-auth: "false"` and the default `no-auth-locations`.
    assert_eq!(get("open.test", "/", None).await.0, 200);
    assert_eq!(get("app.test", "/.well-known/acme-challenge/token", None).await.0, 200);
    h.weir.shutdown().await;
}
