//! `weir node` reading a Kubernetes API server.
//!
//! - [`weir_node_follows_the_api`]: the real kube-apiserver (see `support_kube`) and the `weir`
//!   binary, as a user runs it, in the "node" namespace of a `support_netns` test bed, with a
//!   token of the ServiceAccount of `examples/kubernetes/node-rbac.yaml` (not the admin's).
//!   Services and endpoints created through the API are checked with real connections from the
//!   client namespace. Root only: skipped with a reason otherwise, failed instead when
//!   `WEIR_REQUIRE_ALL=1`.
//! - [`services_kinds_watch_services_and_slices_only`]: the source against a protocol-level fake
//!   API server serving `discovery.k8s.io/v1` EndpointSlices, which the 1.20 API server of the
//!   end-to-end test does not (there weir node reads core v1 Endpoints).

#![allow(clippy::unwrap_used)]

mod support_kube;
mod support_netns;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use support_kube::{ApiServer, apply, create_namespace, delete, isolated, measured};
use support_netns::{Helper, NODE_IP, POD_PORT, Testbed, pod_ip, pod_name};
use weir::node::plan::{PlanConfig, plan};
use weir::source::kube::{EndpointsApi, Kinds, KubeOptions, KubeSource, discover_endpoints_api};

/// Names the relay role of [`netns_helper`].
const RELAY_ENV: &str = "WEIR_NODE_KUBE_RELAY";
/// The node the test bed's namespace "is"; pods 0 and 1 run on it, pod 2 elsewhere.
const NODES: [&str; 3] = ["node-a", "node-a", "node-b"];
/// weir node's admin listener, on the node namespace's own loopback.
const ADMIN: &str = "127.0.0.1:10256";

/// Entry point of the helper processes (responders, clients, the API relay); a no-op in a
/// normal run.
#[test]
fn netns_helper() {
    if let Ok(spec) = std::env::var(RELAY_ENV) {
        relay_tcp_to_unix(&spec);
        return;
    }
    support_netns::helper_main();
}

// === the API server, reachable from the node namespace ===

/// In the node namespace, listens on `127.0.0.1:PORT` and forwards each connection to the Unix
/// socket PATH (`spec` is `PORT PATH`), where the test process forwards it to the API server in
/// its own namespace. TLS passes through untouched: weir node checks the API server's
/// certificate for 127.0.0.1 as it would anywhere.
fn relay_tcp_to_unix(spec: &str) {
    use std::io::Write as _;
    let (port, path) = spec.split_once(' ').unwrap();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    for tcp in listener.incoming().flatten() {
        let Ok(unix) = std::os::unix::net::UnixStream::connect(path) else { continue };
        let (mut tcp_in, mut unix_in) = (tcp.try_clone().unwrap(), unix.try_clone().unwrap());
        let (mut tcp_out, mut unix_out) = (tcp, unix);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut tcp_in, &mut unix_out);
            let _ = unix_out.shutdown(std::net::Shutdown::Write);
        });
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut unix_in, &mut tcp_out);
            let _ = tcp_out.shutdown(std::net::Shutdown::Write);
        });
    }
}

/// Makes the API server (on this namespace's 127.0.0.1:`port`) answer on 127.0.0.1:`port` of
/// the namespace `netns` too: a relay process there, and a Unix socket served here.
async fn expose_api_server(api: &ApiServer, netns: &str) -> Helper {
    let socket = api.dir.path().join("relay.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let port = api.port;
    tokio::spawn(async move {
        while let Ok((mut unix, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut unix, &mut tcp).await;
                }
            });
        }
    });
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "netns_helper", "--nocapture", "--test-threads=1", "--quiet"])
        .env(RELAY_ENV, format!("{port} {}", socket.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let relay = Helper(child);
    let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l == "READY");
    assert!(ready, "the API relay in {netns} did not start");
    relay
}

// === objects ===

/// A ClusterIP Service `name` (the API server allocates the address) with TCP port `http` 80
/// to the pods' port; `extra` is merged into its spec.
fn service(name: &str, extra: Value) -> Value {
    let mut spec =
        json!({"ports": [{"name": "http", "port": 80, "targetPort": POD_PORT, "protocol": "TCP"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// Writes the endpoints of Service `name`: pods by index with their readiness, on the nodes of
/// [`NODES`]. An EndpointSlice where the API server serves `discovery.k8s.io/v1`, else core v1
/// Endpoints (what weir node then watches).
async fn set_endpoints(
    client: &kube::Client,
    api: EndpointsApi,
    ns: &str,
    name: &str,
    pods: &[(usize, bool)],
) {
    let port = json!({"name": "http", "port": POD_PORT, "protocol": "TCP"});
    match api {
        EndpointsApi::EndpointSlices => {
            let endpoints: Vec<Value> = pods
                .iter()
                .map(|&(i, ready)| {
                    json!({"addresses": [pod_ip(i)], "nodeName": NODES[i], "conditions": {"ready": ready}})
                })
                .collect();
            let slice = json!({
                "metadata": {"name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4", "ports": [port], "endpoints": endpoints
            });
            apply::<EndpointSlice>(client, ns, slice).await;
        }
        EndpointsApi::Endpoints => {
            let address = |&(i, _): &(usize, bool)| json!({"ip": pod_ip(i), "nodeName": NODES[i]});
            let ready: Vec<Value> = pods.iter().filter(|p| p.1).map(address).collect();
            let not_ready: Vec<Value> = pods.iter().filter(|p| !p.1).map(address).collect();
            let subsets = if pods.is_empty() {
                json!([])
            } else {
                json!([{"addresses": ready, "notReadyAddresses": not_ready, "ports": [port]}])
            };
            apply::<Endpoints>(client, ns, json!({"metadata": {"name": name}, "subsets": subsets})).await;
        }
    }
}

fn count(t: &BTreeMap<String, usize>, key: &str) -> usize {
    t.get(key).copied().unwrap_or(0)
}

fn answered(t: &BTreeMap<String, usize>) -> usize {
    (0..3).map(|i| count(t, &pod_name(i))).sum()
}

/// Polls `check` every 100 ms until it holds, failing after `within` with its last complaint.
async fn eventually(what: &str, within: Duration, log: &Path, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!("{what}: not within {within:?}: {e}\n--- weir node log\n{log}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

// === the end-to-end test ===

/// `weir node --mode iptables --kubeconfig` with node-rbac.yaml's privileges: a Service's
/// ClusterIP reaches its endpoints, a NodePort with `externalTrafficPolicy: Local` only this
/// node's (by `nodeName`); a removed or not-ready endpoint gets no new connections; a Service
/// without endpoints rejects; a deleted Service's rules are gone.
#[test]
fn weir_node_follows_the_api() {
    isolated("weir_node_follows_the_api", || async {
        let mut bed = Testbed::new(3).unwrap();
        bed.start_responders().unwrap();
        let api = ApiServer::start().await;
        let admin = api.client().await;
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes");
        support_kube::apply_file(&admin, &examples.join("node-rbac.yaml")).await;
        // The DaemonSet example is a valid object for the API server.
        support_kube::apply_file(&admin, &examples.join("node-daemonset.yaml")).await;

        // The ServiceAccount's token reads Services and endpoints, and nothing else weir serve
        // reads: weir node runs without Ingress, Secret or ConfigMap rights.
        let token = support_kube::service_account_token(&admin, "weir-system", "weir-node").await;
        let limited = api.client_for(&token).await.unwrap();
        let lp = ListParams::default();
        assert!(Api::<Service>::all(limited.clone()).list(&lp).await.is_ok());
        assert!(Api::<Ingress>::all(limited.clone()).list(&lp).await.is_err(), "Ingresses readable");
        assert!(Api::<Secret>::all(limited.clone()).list(&lp).await.is_err(), "Secrets readable");
        assert!(Api::<ConfigMap>::all(limited).list(&lp).await.is_err(), "ConfigMaps readable");

        let endpoints_api = discover_endpoints_api(&admin).await.unwrap();
        let ns = "shop";
        create_namespace(&admin, ns).await;
        let web = apply::<Service>(&admin, ns, service("web", json!({}))).await;
        let web_ip = web.spec.and_then(|s| s.cluster_ip).unwrap();
        let web_addr = format!("{web_ip}:80");
        set_endpoints(&admin, endpoints_api, ns, "web", &[(0, true), (1, true), (2, true)]).await;
        let local = json!({"type": "NodePort", "externalTrafficPolicy": "Local"});
        let local = apply::<Service>(&admin, ns, service("local", local)).await;
        let node_port = local.spec.and_then(|s| s.ports?.first()?.node_port).unwrap();
        set_endpoints(&admin, endpoints_api, ns, "local", &[(0, true), (1, true), (2, true)]).await;

        // weir node, the binary, in the node namespace; its node name from NODE_NAME as a
        // DaemonSet's downward API sets it.
        let _relay = expose_api_server(&api, &bed.node.name).await;
        let log = api.dir.path().join("weir-node.log");
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.node.name, env!("CARGO_BIN_EXE_weir"), "node"])
            .args(["--mode", "iptables", "--kubeconfig"])
            .arg(api.kubeconfig_for(&token))
            .args(["--cluster-cidr", "10.244.0.0/16", "--min-sync-interval", "100ms"])
            .args(["--sync-period", "5s", "--listen-admin", ADMIN])
            .env("NODE_NAME", "node-a")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut weir_node = Helper(child);
        let started = Instant::now();

        // The ClusterIP reaches every endpoint.
        eventually("the ClusterIP answers", Duration::from_secs(30), &log, || {
            if let Ok(Some(status)) = weir_node.0.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("weir node exited with {status}:\n{log}");
            }
            let t = bed.client(&web_addr, 60, "tcp")?;
            if answered(&t) == 60 && (0..3).all(|i| count(&t, &pod_name(i)) > 0) {
                Ok(())
            } else {
                Err(format!("{t:?}"))
            }
        })
        .await;
        measured("weir node start to ClusterIP answering", started.elapsed());
        // externalTrafficPolicy Local: the node port uses this node's endpoints only.
        let t = bed.client(&format!("{NODE_IP}:{node_port}"), 60, "tcp").unwrap();
        assert_eq!(count(&t, "pod1") + count(&t, "pod2"), 60, "eTP Local used a remote endpoint: {t:?}");

        // An endpoint removed, another not ready: neither gets new connections.
        let t0 = Instant::now();
        set_endpoints(&admin, endpoints_api, ns, "web", &[(0, true), (1, false)]).await;
        eventually("the edited endpoints apply", Duration::from_secs(10), &log, || {
            let t = bed.client(&web_addr, 20, "tcp")?;
            if count(&t, "pod1") == 20 { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .await;
        measured("endpoints edit to rules applied", t0.elapsed());
        let t = bed.client(&web_addr, 100, "tcp").unwrap();
        assert_eq!(count(&t, "pod1"), 100, "a removed or not-ready endpoint got connections: {t:?}");

        // No endpoints left: rejected at once (refused, not a timeout).
        set_endpoints(&admin, endpoints_api, ns, "web", &[]).await;
        eventually("a Service without endpoints rejects", Duration::from_secs(10), &log, || {
            let t = bed.client(&web_addr, 3, "tcp")?;
            if count(&t, "refused") == 3 { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .await;

        // The Service deleted: its rules are gone (its address is routed off the node, unanswered).
        delete::<Service>(&admin, ns, "web").await;
        eventually("the deleted Service's rules go", Duration::from_secs(10), &log, || {
            let nat = bed.node.exec("iptables-save", &["-t", "nat"])?;
            let filter = bed.node.exec("iptables-save", &["-t", "filter"])?;
            let needle = format!("{web_ip}/32");
            match format!("{nat}{filter}").lines().find(|l| l.contains(&needle)) {
                Some(line) => Err(format!("still in the rules: {line}")),
                None => Ok(()),
            }
        })
        .await;
        let t = bed.client(&web_addr, 2, "tcp").unwrap();
        assert_eq!(answered(&t), 0, "a deleted Service still answers: {t:?}");
        assert_eq!(count(&t, "refused"), 0, "a deleted Service is still rejected: {t:?}");
        // The other Service is untouched.
        let t = bed.client(&format!("{NODE_IP}:{node_port}"), 10, "tcp").unwrap();
        assert_eq!(count(&t, "pod1") + count(&t, "pod2"), 10, "{t:?}");

        drop(weir_node);
        let text = std::fs::read_to_string(&log).unwrap();
        let expected = match endpoints_api {
            EndpointsApi::EndpointSlices => "watching discovery.k8s.io/v1 EndpointSlices",
            EndpointsApi::Endpoints => "watching core v1 Endpoints instead",
        };
        assert!(text.contains(expected), "the endpoints API is logged:\n{text}");
        assert!(!text.to_lowercase().contains("forbidden"), "a request was forbidden:\n{text}");
        assert!(!text.contains("watch failed"), "a watch failed:\n{text}");
        weir::node::cleanup(&weir::node::exec::Runner::netns(&bed.node.name)).unwrap();
    });
}

// === the source against a fake API server serving EndpointSlice v1 ===

type Body = BoxBody<Bytes, Infallible>;

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Answers as an API server would with node-rbac.yaml's rights: discovery, Services and
/// EndpointSlices are served (watches stay open without events); anything else is forbidden.
async fn fake_api(
    seen: Arc<Mutex<BTreeSet<String>>>,
    req: Request<kube::client::Body>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    seen.lock().unwrap().insert(path.clone());
    let list = |kind: &str, items: Value| json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items});
    let watch = req.uri().query().unwrap_or_default().contains("watch=true");
    let body = match path.as_str() {
        "/apis/discovery.k8s.io/v1" => {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "discovery.k8s.io/v1",
            "resources": [{"name": "endpointslices", "singularName": "endpointslice", "namespaced": true, "kind": "EndpointSlice", "verbs": ["list", "watch"]}]})
        }
        "/api/v1/services" | "/apis/discovery.k8s.io/v1/endpointslices" if watch => {
            let pending = futures_util::stream::pending::<Result<hyper::body::Frame<Bytes>, Infallible>>();
            return Ok(Response::new(BodyExt::boxed(StreamBody::new(pending))));
        }
        "/api/v1/services" => list(
            "Service",
            json!([{
                "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "1"},
                "spec": {"clusterIP": "10.96.0.10", "type": "NodePort", "externalTrafficPolicy": "Local",
                         "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]}
            }]),
        ),
        "/apis/discovery.k8s.io/v1/endpointslices" => list(
            "EndpointSlice",
            json!([{
                "metadata": {"name": "web-1", "namespace": "shop", "resourceVersion": "1",
                             "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": ["10.244.1.11"], "nodeName": "node-a", "conditions": {"ready": true}},
                    {"addresses": ["10.244.1.12"], "nodeName": "node-b", "conditions": {"ready": true}},
                    {"addresses": ["10.244.1.13"], "nodeName": "node-a", "conditions": {"ready": false}}
                ]
            }]),
        ),
        _ => {
            let forbidden = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                "code": 403, "message": format!("{path} is forbidden")});
            return Ok(json_response(StatusCode::FORBIDDEN, &forbidden));
        }
    };
    Ok(json_response(StatusCode::OK, &body))
}

/// `Kinds::Services` lists and watches Services and EndpointSlices only (an API server that
/// forbids everything else does not keep it from syncing), and the plan of its snapshot uses
/// the slices' ready endpoints, with `nodeName` deciding what is local.
#[tokio::test]
async fn services_kinds_watch_services_and_slices_only() {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let fake = seen.clone();
    let client = kube::Client::new(tower::service_fn(move |req| fake_api(fake.clone(), req)), "default");
    let api = discover_endpoints_api(&client).await.unwrap();
    assert_eq!(api, EndpointsApi::EndpointSlices);
    let options = KubeOptions { kinds: Kinds::Services, ..KubeOptions::default() };
    let source = KubeSource::start(&client, &options, api);
    let synced = tokio::time::timeout(Duration::from_secs(10), source.wait_until_synced()).await;
    assert_eq!(synced.ok(), Some(true), "not synced; requested: {:?}", seen.lock().unwrap());
    let expected: BTreeSet<String> =
        ["/apis/discovery.k8s.io/v1", "/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"]
            .map(String::from)
            .into();
    assert_eq!(*seen.lock().unwrap(), expected);

    let ruleset = plan(&source.stores.snapshot(), &PlanConfig { node_name: Some("node-a".into()) });
    assert!(ruleset.warnings.is_empty(), "{:?}", ruleset.warnings);
    let [sp] = ruleset.services.as_slice() else { panic!("{:?}", ruleset.services) };
    let ips = |eps: &[weir::node::plan::Endpoint]| eps.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>();
    assert_eq!(ips(&sp.cluster_endpoints), ["10.244.1.11", "10.244.1.12"], "ready endpoints");
    assert_eq!(ips(&sp.local_endpoints), ["10.244.1.11"], "ready endpoints on node-a");
    assert_eq!(sp.node_port, Some(30080));
}

// === the examples ===

/// The DaemonSet example runs `weir node` with arguments the command accepts, under the
/// ServiceAccount node-rbac.yaml grants, with what the rules need from the host.
#[test]
fn daemonset_example_runs_weir_node_with_the_node_rbac() {
    use clap::Parser as _;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes");
    let docs = |file: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(examples.join(file)).unwrap();
        text.split("\n---\n").map(|doc| serde_saphyr::from_str(doc).unwrap()).collect()
    };
    let [ds] = docs("node-daemonset.yaml").try_into().unwrap();
    let rbac = docs("node-rbac.yaml");
    let binding = rbac.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let account = &binding["subjects"][0];
    assert_eq!(pod["serviceAccountName"], account["name"]);
    assert_eq!(ds["metadata"]["namespace"], account["namespace"]);
    assert_eq!(pod["hostNetwork"], true);

    let [container] = pod["containers"].as_array().unwrap().as_slice() else { panic!("{pod}") };
    let words =
        |v: &Value| v.as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let argv = [words(&container["command"]), words(&container["args"])].concat();
    let cli = weir::cli::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let weir::cli::Command::Node(args) = cli.command else { panic!("not `weir node`: {argv:?}") };
    assert!(args.manifests.is_none() && args.kubeconfig.is_none(), "in-cluster configuration: {argv:?}");
    let node_name = container["env"].as_array().unwrap().iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    let caps = words(&container["securityContext"]["capabilities"]["add"]);
    assert!(caps.contains(&"NET_ADMIN".into()) && caps.contains(&"NET_RAW".into()), "{caps:?}");
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["/run/xtables.lock", "/lib/modules"]);
}
