//! weir against a real kube-apiserver (1.20, built by `scripts/kube-apiserver.sh build`):
//! objects created through the API, behaviour checked with real HTTP requests through weir.
//!
//! Each test runs in its own network namespace with its own etcd and API server (see
//! `support_kube`). Skipped with a printed reason when the binaries or root are missing, failed
//! instead when `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

mod support_kube;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use support_kube::{
    ApiServer, Echo, Weir, apply, apply_class, create_namespace, delete, endpoints, eventually, ingress,
    isolated, measured, service,
};

const CONTROLLER: &str = "weir.dev/ingress-controller";

/// The status of a POST to `host` announcing a body of `len` bytes it never sends: a refusal
/// comes at once; a forwarded request waits for the body (`None` after a second).
fn declared_body(addr: std::net::SocketAddr, host: &str, len: usize) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(s, "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The promise: a change in the API is routed within 2 s.
const REROUTE: Duration = Duration::from_secs(2);

/// Routes appear, follow edited Ingresses and Endpoints, disappear with their Ingress; another
/// class is ignored; a bad Ingress gets an Event and does not disturb the others.
#[test]
fn routes_follow_the_api() {
    isolated("routes_follow_the_api", || async {
        let api = ApiServer::start().await;
        let client = api.client().await;
        let ns = "shop";
        create_namespace(&client, ns).await;
        let echo = Echo::start(&["a", "b", "c"]).await;
        apply_class(&client, "weir", CONTROLLER).await;
        apply_class(&client, "other", "example.com/other").await;
        for (svc, port) in [("web", echo.ports[0]), ("api", echo.ports[1])] {
            apply::<Service>(&client, ns, service(svc)).await;
            apply::<Endpoints>(&client, ns, endpoints(svc, &[port])).await;
        }
        apply::<Ingress>(&client, ns, ingress("web", "weir", "web.example", "web")).await;
        apply::<Ingress>(&client, ns, ingress("foreign", "other", "foreign.example", "web")).await;
        // An unwatched namespace.
        create_namespace(&client, "elsewhere").await;
        apply::<Service>(&client, "elsewhere", service("web")).await;
        apply::<Endpoints>(&client, "elsewhere", endpoints("web", &[echo.ports[0]])).await;
        apply::<Ingress>(&client, "elsewhere", ingress("web", "weir", "elsewhere.example", "web")).await;
        let settings =
            serde_json::json!({"metadata": {"name": "weir-settings"}, "data": {"proxy-body-size": "8m"}});
        apply::<ConfigMap>(&client, ns, settings).await;

        let weir = Weir::start(
            &api.kubeconfig,
            &[
                "--watch-namespace",
                ns,
                "--configmap",
                "shop/weir-settings",
                "--publish-status-address",
                "192.0.2.10",
            ],
        );
        let ready = weir.wait_ready(Duration::from_secs(30)).await;
        measured("weir start to first publish (readyz)", ready);
        assert!(
            weir.log().contains("watching core v1 Endpoints instead"),
            "the fallback is logged:\n{}",
            weir.log()
        );

        // Routes appear.
        weir.wait_route("web.example", "a", REROUTE).await;
        // Another class is ignored entirely, and so is an unwatched namespace.
        assert_eq!(weir.get("foreign.example", "/").map(|r| r.0), Some(404));
        assert_eq!(weir.get("elsewhere.example", "/").map(|r| r.0), Some(404));
        // The settings ConfigMap applies: a body declared over its proxy-body-size (8m) gets 413
        // at once, and an edit of the ConfigMap (1k) changes that without a restart.
        eventually("the settings ConfigMap's body limit", Duration::from_secs(5), || async {
            (declared_body(weir.http, "web.example", 9 << 20) == Some(413)).then_some(())
        })
        .await;
        let settings =
            serde_json::json!({"metadata": {"name": "weir-settings"}, "data": {"proxy-body-size": "1k"}});
        apply::<ConfigMap>(&client, ns, settings).await;
        eventually("the edited body limit", Duration::from_secs(10), || async {
            (declared_body(weir.http, "web.example", 4096) == Some(413)).then_some(())
        })
        .await;

        // An edited Ingress reroutes.
        let t = Instant::now();
        apply::<Ingress>(&client, ns, ingress("web", "weir", "web.example", "api")).await;
        weir.wait_route("web.example", "b", REROUTE).await;
        measured("Ingress edit to rerouted", t.elapsed());

        // Edited Endpoints reroute.
        let t = Instant::now();
        apply::<Endpoints>(&client, ns, endpoints("api", &[echo.ports[2]])).await;
        weir.wait_route("web.example", "c", REROUTE).await;
        measured("Endpoints edit to rerouted", t.elapsed());

        // A bad Ingress (its Service does not exist) gets an Event; the others keep serving.
        apply::<Ingress>(&client, ns, ingress("broken", "weir", "broken.example", "missing")).await;
        weir.wait_route("broken.example", "503", REROUTE).await;
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        let event = eventually("an Event on the bad Ingress", Duration::from_secs(10), || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("broken"))
        })
        .await;
        assert_eq!(event.reason.as_deref(), Some("ServiceNotFound"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert!(event.note.as_deref().unwrap_or_default().contains("missing"), "{event:?}");
        assert_eq!(event.reporting_controller.as_deref(), Some(CONTROLLER));
        weir.wait_route("web.example", "c", REROUTE).await;
        let (_, metrics) = weir.admin("/metrics").unwrap();
        assert!(metrics.lines().any(|l| l == "weir_translation_warnings 1"), "{metrics}");
        // Deduplicated: further translations (another change) do not repeat the Event.
        apply::<Ingress>(&client, ns, ingress("web", "weir", "web.example", "web")).await;
        weir.wait_route("web.example", "a", REROUTE).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let count = events.list(&ListParams::default()).await.unwrap().items.len();
        assert_eq!(count, 1, "one Event per distinct warning");

        // A deleted Ingress stops routing.
        let t = Instant::now();
        delete::<Ingress>(&client, ns, "web").await;
        weir.wait_route("web.example", "404", REROUTE).await;
        measured("Ingress delete to unrouted", t.elapsed());
        assert_eq!(weir.get("foreign.example", "/").map(|r| r.0), Some(404), "still ignored");
        drop(echo);
    });
}

/// Only the leader writes `status.loadBalancer.ingress`, without rewriting what is already
/// right; a second replica takes over when the first is killed; an Ingress that leaves weir's
/// class loses weir's addresses.
#[test]
fn leader_writes_status_and_a_second_replica_takes_over() {
    isolated("leader_writes_status_and_a_second_replica_takes_over", || async {
        let api = ApiServer::start().await;
        let client = api.client().await;
        let ns = "status";
        create_namespace(&client, ns).await;
        let echo = Echo::start(&["a"]).await;
        apply_class(&client, "weir", CONTROLLER).await;
        apply::<Service>(&client, ns, service("web")).await;
        apply::<Endpoints>(&client, ns, endpoints("web", &echo.ports)).await;
        apply::<Ingress>(&client, ns, ingress("web", "weir", "web.example", "web")).await;
        // The second replica publishes a LoadBalancer Service's address.
        let mut lb = service("weir-lb");
        lb["spec"]["type"] = "LoadBalancer".into();
        apply::<Service>(&client, ns, lb).await;
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let lb_status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.20"}]}}});
        services.patch_status("weir-lb", &PatchParams::default(), &Patch::Merge(&lb_status)).await.unwrap();

        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), ns);
        let status_of = |name: &'static str| {
            let ingresses = ingresses.clone();
            async move {
                let ing = ingresses.get(name).await.ok()?;
                let lb = ing.status.and_then(|s| s.load_balancer).and_then(|l| l.ingress).unwrap_or_default();
                Some(lb.into_iter().filter_map(|i| i.ip.or(i.hostname)).collect::<Vec<_>>())
            }
        };
        let lease = ["--election-lease-duration", "2"];
        let mut first = Weir::start(
            &api.kubeconfig,
            &[&lease[..], &["--election-identity", "weir-a", "--publish-status-address", "192.0.2.10"]]
                .concat(),
        );
        first.wait_ready(Duration::from_secs(30)).await;
        let t = Instant::now();
        eventually("the leader writes the status", Duration::from_secs(10), || async {
            (status_of("web").await? == ["192.0.2.10"]).then_some(())
        })
        .await;
        measured("first status write after ready", t.elapsed());

        let second = Weir::start(
            &api.kubeconfig,
            &[&lease[..], &["--election-identity", "weir-b", "--publish-service", "status/weir-lb"]].concat(),
        );
        second.wait_ready(Duration::from_secs(30)).await;
        second.wait_route("web.example", "a", REROUTE).await;
        // The follower does not write; the leader does not rewrite an unchanged status.
        let version = ingresses.get("web").await.unwrap().metadata.resource_version;
        // (a new Service makes both replicas translate again)
        apply::<Service>(&client, ns, service("unrelated")).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = ingresses.get("web").await.unwrap();
        assert_eq!(after.metadata.resource_version, version, "no write when nothing changed");
        assert_eq!(status_of("web").await.unwrap(), ["192.0.2.10"]);

        // Kill the leader: the second replica takes over once the Lease expires.
        let t = Instant::now();
        first.kill();
        eventually("the second replica writes the status", Duration::from_secs(15), || async {
            (status_of("web").await? == ["192.0.2.20"]).then_some(())
        })
        .await;
        measured("leader killed to status rewritten by the new leader", t.elapsed());
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), "default");
        let holder = leases.get("weir-leader").await.unwrap().spec.and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some("weir-b"));

        // An Ingress leaving weir's class loses weir's addresses.
        apply_class(&client, "other", "example.com/other").await;
        apply::<Ingress>(&client, ns, ingress("web", "other", "web.example", "web")).await;
        eventually("the status is cleared", Duration::from_secs(5), || async {
            status_of("web").await?.is_empty().then_some(())
        })
        .await;
        second.wait_route("web.example", "404", REROUTE).await;
    });
}

/// An API server restart leaves traffic flowing on the last table; weir resynchronises after.
#[test]
fn api_server_restart_keeps_traffic_and_resyncs() {
    isolated("api_server_restart_keeps_traffic_and_resyncs", || async {
        let mut api = ApiServer::start().await;
        let client = api.client().await;
        let ns = "restart";
        create_namespace(&client, ns).await;
        let echo = Echo::start(&["a", "b"]).await;
        apply_class(&client, "weir", CONTROLLER).await;
        apply::<Service>(&client, ns, service("web")).await;
        apply::<Endpoints>(&client, ns, endpoints("web", &echo.ports[..1])).await;
        apply::<Ingress>(&client, ns, ingress("web", "weir", "web.example", "web")).await;
        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("web.example", "a", REROUTE).await;

        api.kill_apiserver();
        let down = Instant::now();
        while down.elapsed() < Duration::from_secs(3) {
            assert_eq!(
                weir.get("web.example", "/"),
                Some((200, "a".to_string())),
                "traffic flows while the API is down"
            );
            assert_eq!(weir.admin("/readyz").map(|r| r.0), Some(200), "still ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        api.start_apiserver().await;
        let client = api.client().await;
        let t = Instant::now();
        apply::<Endpoints>(&client, ns, endpoints("web", &echo.ports[1..])).await;
        weir.wait_route("web.example", "b", Duration::from_secs(20)).await;
        measured("change after an API server restart to rerouted", t.elapsed());
        assert!(weir.log().contains("watch failed"), "the outage was logged:\n{}", weir.log());
        // The leader keeps writing status after the restart (its Lease survived in etcd).
        apply::<Ingress>(&client, ns, ingress("later", "weir", "later.example", "web")).await;
        weir.wait_route("later.example", "b", REROUTE).await;
        let ingresses: Api<Ingress> = Api::namespaced(client.clone(), ns);
        eventually("status of an Ingress created after the restart", Duration::from_secs(20), || async {
            let lb = ingresses.get("later").await.ok()?.status?.load_balancer?.ingress?;
            (lb.first()?.ip.as_deref() == Some("192.0.2.10")).then_some(())
        })
        .await;
    });
}

/// weir works with exactly the privileges of examples/kubernetes/rbac.yaml: a ServiceAccount
/// token bound to that ClusterRole and Role, not an admin token.
#[test]
fn rbac_is_sufficient() {
    isolated("rbac_is_sufficient", || async {
        use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

        let api = ApiServer::start().await;
        let admin = api.client().await;
        let rbac = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/rbac.yaml");
        support_kube::apply_file(&admin, &rbac).await;
        let ns = "app";
        create_namespace(&admin, ns).await;
        let echo = Echo::start(&["a"]).await;
        apply_class(&admin, "weir", CONTROLLER).await;
        apply::<Service>(&admin, ns, service("web")).await;
        apply::<Endpoints>(&admin, ns, endpoints("web", &echo.ports)).await;
        apply::<Ingress>(&admin, ns, ingress("web", "weir", "web.example", "web")).await;
        apply::<Ingress>(&admin, ns, ingress("broken", "weir", "broken.example", "missing")).await;

        let token = support_kube::service_account_token(&admin, "weir-system", "weir").await;
        // The token really is limited.
        let limited = api.client_for(&token).await.unwrap();
        let pods: Api<Pod> = Api::all(limited);
        assert!(pods.list(&ListParams::default()).await.is_err(), "the ServiceAccount must not list Pods");

        // A NodePort publish Service: the nodes' addresses are published (ExternalIP first).
        let mut np = service("weir-np");
        np["spec"]["type"] = "NodePort".into();
        apply::<Service>(&admin, "weir-system", np).await;
        let nodes: Api<Node> = Api::all(admin.clone());
        let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "node-1"}})).unwrap();
        nodes.create(&Default::default(), &node).await.unwrap();
        let addresses = serde_json::json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "10.1.0.5"}, {"type": "ExternalIP", "address": "192.0.2.31"}
        ]}});
        nodes.patch_status("node-1", &PatchParams::default(), &Patch::Merge(&addresses)).await.unwrap();

        let weir = Weir::start(
            &api.kubeconfig_for(&token),
            &["--election-namespace", "weir-system", "--publish-service", "weir-system/weir-np"],
        );
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("web.example", "a", REROUTE).await;
        let ingresses: Api<Ingress> = Api::namespaced(admin.clone(), ns);
        eventually("the status is written", Duration::from_secs(10), || async {
            let ing = ingresses.get("web").await.ok()?;
            let lb = ing.status?.load_balancer?.ingress?;
            (lb.first()?.ip.as_deref() == Some("192.0.2.31")).then_some(())
        })
        .await;
        let events: Api<Event> = Api::namespaced(admin.clone(), ns);
        eventually("an Event is recorded", Duration::from_secs(10), || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            (!list.items.is_empty()).then_some(())
        })
        .await;
        let log = weir.log();
        assert!(!log.to_lowercase().contains("forbidden"), "a request was forbidden:\n{log}");
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        assert!(namespaces.get("weir-system").await.is_ok());
    });
}
