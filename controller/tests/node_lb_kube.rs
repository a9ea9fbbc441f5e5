//! `weir node --load-balancer` against the real kube-apiserver (see `support_kube`): the
//! `IPAddressPool` CRD of `examples/kubernetes/`, its schema refusing bad pools, and the `weir`
//! binary with a token of exactly the ServiceAccount of `node-rbac.yaml` + `node-lb-rbac.yaml`
//! assigning, sharing, refusing (with Events), keeping and freeing addresses, across a takeover
//! by a second replica and a restart of every replica. Root only (a private network namespace, where weir node
//! also programs the addresses it assigns): skipped with a reason otherwise, failed instead
//! when `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

mod support_kube;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support_kube::{ApiServer, apply, create_namespace, delete, eventually, isolated, measured};
use weir::node::lb::pool::IpAddressPool;

const NS: &str = "shop";

/// A `weir node --load-balancer` process; killed (SIGKILL) when dropped.
struct Node {
    child: Child,
    log: PathBuf,
}

impl Node {
    fn start(api: &ApiServer, kubeconfig: &Path, identity: &str) -> Node {
        let log = api.dir.path().join(format!("weir-node-{identity}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["node", "--mode", "iptables", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--load-balancer", "--listen-admin", "127.0.0.1:0", "--min-sync-interval", "100ms"])
            .args(["--election-namespace", "weir-system", "--election-lease-duration", "4"])
            .args(["--election-identity", identity, "--log-level", "info,weir=debug"])
            .env("NODE_NAME", identity)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Node { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A LoadBalancer Service `name` with TCP `port`, `annotations`, and `extra` merged into spec.
fn lb_service(name: &str, port: u16, annotations: Value, extra: Value) -> Value {
    let mut spec = json!({"type": "LoadBalancer", "ports": [{"name": "p", "port": port, "protocol": "TCP"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

async fn status(admin: &kube::Client, name: &str) -> Option<Vec<String>> {
    let svc = Api::<Service>::namespaced(admin.clone(), NS).get_opt(name).await.ok()??;
    Some(
        svc.status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip)
            .collect(),
    )
}

/// Waits until every Service of `expected` has exactly those addresses (empty: none).
async fn expect(admin: &kube::Client, nodes: &[&Node], expected: &[(&str, &[&str])], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut wrong = Vec::new();
        for (name, want) in expected {
            let got = status(admin, name).await.unwrap_or_default();
            if got != *want {
                wrong.push(format!("{name}: {got:?}, expected {want:?}"));
            }
        }
        if wrong.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> =
                nodes.iter().map(|n| format!("--- {}\n{}", n.log.display(), n.log())).collect();
            panic!("statuses not as expected within {within:?}:\n{}\n{}", wrong.join("\n"), logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for an Event with `reason` about `name` (in `namespace`) whose note contains `text`.
async fn expect_event(
    admin: &kube::Client,
    node: &Node,
    namespace: &str,
    name: &str,
    reason: &str,
    text: &str,
) {
    let events: Api<Event> = Api::namespaced(admin.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let found = list.iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.note.as_deref().is_some_and(|n| n.contains(text))
        });
        if found {
            return;
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = list
                .iter()
                .map(|e| {
                    format!(
                        "{:?} {:?} {:?}",
                        e.regarding.as_ref().and_then(|r| r.name.clone()),
                        e.reason,
                        e.note
                    )
                })
                .collect();
            panic!(
                "no Event {reason} on {namespace}/{name} containing {text:?}; seen:\n{}\n--- weir node log\n{}",
                seen.join("\n"),
                node.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pools_api() -> (ApiResource, GroupVersionKind) {
    let gvk = GroupVersionKind::gvk("weir.dev", "v1alpha1", "IPAddressPool");
    (ApiResource::from_gvk_with_plural(&gvk, "ipaddresspools"), gvk)
}

/// Creates a pool from raw JSON `spec` (so ill-typed specs reach the API server too).
async fn create_pool(admin: &kube::Client, name: &str, spec: Value) -> kube::Result<DynamicObject> {
    let (ar, _) = pools_api();
    let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "weir.dev/v1alpha1", "kind": "IPAddressPool",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await
}

#[test]
fn weir_node_assigns_load_balancer_addresses() {
    isolated("weir_node_assigns_load_balancer_addresses", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes");

        // The CRD, as a user installs it.
        let text = std::fs::read_to_string(examples.join("ipaddresspool-crd.yaml")).unwrap();
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        Api::<CustomResourceDefinition>::all(admin.clone())
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
        let started = Instant::now();
        eventually("the IPAddressPool API is served", Duration::from_secs(30), || {
            let admin = admin.clone();
            async move {
                let api: Api<IpAddressPool> = Api::all(admin);
                api.list(&ListParams::default()).await.ok()
            }
        })
        .await;
        measured("CRD created to served", started.elapsed());

        // The schema refuses malformed pools, saying which field.
        for (name, spec, field) in [
            ("no-prefix", json!({"addresses": ["192.0.2.0"]}), "spec.addresses"),
            ("bad-octet", json!({"addresses": ["192.0.2.300/32"]}), "spec.addresses"),
            ("long-prefix", json!({"addresses": ["192.0.2.0/33"]}), "spec.addresses"),
            ("mixed", json!({"addresses": ["192.0.2.1-2001:db8::1"]}), "spec.addresses"),
            ("injection", json!({"addresses": ["192.0.2.0/24; rm -rf /"]}), "spec.addresses"),
            ("empty", json!({"addresses": []}), "spec.addresses"),
            ("missing", json!({"autoAssign": true}), "spec.addresses"),
            ("not-bool", json!({"addresses": ["192.0.2.0/24"], "autoAssign": "yes"}), "spec.autoAssign"),
            (
                "bad-op",
                json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {"serviceSelectors": [{"matchExpressions": [{"key": "a", "operator": "Matches"}]}]}}),
                "operator",
            ),
            (
                "bad-ns",
                json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {"namespaces": ["Not_A_Namespace"]}}),
                "namespaces",
            ),
        ] {
            match create_pool(&admin, name, spec).await {
                Err(kube::Error::Api(status)) => {
                    assert_eq!(status.code, 422, "{name}: {status:?}");
                    assert!(status.message.contains(field), "{name}: {}", status.message);
                }
                other => {
                    let _ = std::fs::copy(api.dir.path().join("apiserver.log"), "/tmp/lb-apiserver.log");
                    panic!("the API server accepted pool {name}: {other:?}")
                }
            }
        }

        // Pools: three auto-assigned addresses; a manual pool; and an inverted range the
        // schema cannot see, which weir refuses on its own.
        create_pool(&admin, "lan", json!({"addresses": ["192.0.2.10-192.0.2.12"]})).await.unwrap();
        create_pool(&admin, "manual", json!({"addresses": ["198.51.100.0/30"], "autoAssign": false}))
            .await
            .unwrap();
        create_pool(&admin, "inverted", json!({"addresses": ["203.0.113.30-203.0.113.20"]})).await.unwrap();

        // weir node with exactly the example RBAC.
        support_kube::apply_file(&admin, &examples.join("node-rbac.yaml")).await;
        support_kube::apply_file(&admin, &examples.join("node-lb-rbac.yaml")).await;
        let token = support_kube::service_account_token(&admin, "weir-system", "weir-node").await;
        let kubeconfig = api.kubeconfig_for(&token);
        create_namespace(&admin, NS).await;

        let shared = |ip: &str| json!({"weir.dev/allow-shared-ip": "k", "weir.dev/load-balancer-ips": ip});
        apply::<Service>(&admin, NS, lb_service("a", 80, json!({}), json!({}))).await;
        apply::<Service>(&admin, NS, lb_service("b", 80, shared("198.51.100.1"), json!({}))).await;
        apply::<Service>(&admin, NS, lb_service("c", 443, shared("198.51.100.1"), json!({}))).await;
        apply::<Service>(&admin, NS, lb_service("f", 80, json!({}), json!({}))).await;
        apply::<Service>(&admin, NS, lb_service("g", 80, json!({}), json!({}))).await;
        let cluster_ip =
            json!({"metadata": {"name": "plain"}, "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}});
        apply::<Service>(&admin, NS, cluster_ip).await;

        let started = Instant::now();
        let mut n1 = Node::start(&api, &kubeconfig, "node-1");
        let ok: &[(&str, &[&str])] = &[
            ("a", &["192.0.2.10"]),
            ("b", &["198.51.100.1"]),
            ("c", &["198.51.100.1"]),
            ("f", &["192.0.2.11"]),
            ("g", &["192.0.2.12"]),
            ("plain", &[]),
        ];
        expect(&admin, &[&n1], ok, Duration::from_secs(30)).await;
        measured("weir node start to every address assigned", started.elapsed());
        expect_event(&admin, &n1, NS, "a", "AddressAssigned", "192.0.2.10").await;

        // Refusals: an Event each, and no address.
        apply::<Service>(&admin, NS, lb_service("d", 80, shared("198.51.100.1"), json!({}))).await;
        let outside = json!({"weir.dev/load-balancer-ips": "203.0.113.5"});
        apply::<Service>(&admin, NS, lb_service("e", 80, outside, json!({}))).await;
        apply::<Service>(&admin, NS, lb_service("h", 80, json!({}), json!({}))).await;
        expect_event(
            &admin,
            &n1,
            NS,
            "d",
            "SharedPortsCollide",
            "shared with Service shop/b, which uses port 80/tcp",
        )
        .await;
        expect_event(&admin, &n1, NS, "e", "AddressNotInPool", "203.0.113.5 is in no IPAddressPool").await;
        expect_event(&admin, &n1, NS, "h", "PoolExhausted", "free IPv4 address").await;
        expect(&admin, &[&n1], &[("d", &[]), ("e", &[]), ("h", &[])], Duration::from_secs(5)).await;

        // The invalid pool: refused with its reason in its status and an Event; counts in the others'.
        let pools: Api<IpAddressPool> = Api::all(admin.clone());
        let counts = eventually("pool statuses", Duration::from_secs(15), || {
            let pools = pools.clone();
            async move {
                let lan = pools.get("lan").await.ok()?.status?;
                let inverted = pools.get("inverted").await.ok()?.status?;
                let manual = pools.get("manual").await.ok()?.status?;
                (lan.assigned_ipv4 == 3 && manual.assigned_ipv4 == 1).then_some((lan, manual, inverted))
            }
        })
        .await;
        assert_eq!((counts.0.available_ipv4, counts.1.available_ipv4), (0, 3));
        let error = counts.2.error.unwrap_or_default();
        assert!(error.contains("the first address is after the last"), "{error}");
        expect_event(
            &admin,
            &n1,
            "kube-system",
            "inverted",
            "InvalidPool",
            "first address is after the last",
        )
        .await;

        // The node module programs what was assigned (the Services have no endpoints here:
        // their addresses reject, in the filter table).
        let rules = Command::new("iptables-save").output().unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout);
        assert!(rules.contains("192.0.2.10/32") && rules.contains("198.51.100.1/32"), "{rules}");

        // A deleted Service frees its address, which the waiting one gets.
        delete::<Service>(&admin, NS, "f").await;
        expect(&admin, &[&n1], &[("h", &["192.0.2.11"])], Duration::from_secs(10)).await;
        // A Service that stops being a LoadBalancer frees its address too.
        let to_cluster_ip = json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null,
            "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 80}]}});
        Api::<Service>::namespaced(admin.clone(), NS)
            .patch("g", &PatchParams::default(), &Patch::Merge(&to_cluster_ip))
            .await
            .unwrap();
        apply::<Service>(&admin, NS, lb_service("i", 80, json!({}), json!({}))).await;
        expect(&admin, &[&n1], &[("g", &[]), ("i", &["192.0.2.12"])], Duration::from_secs(10)).await;

        // A second replica waits; the first one holds the Lease.
        let mut n2 = Node::start(&api, &kubeconfig, "node-2");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let lease =
            Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), "weir-system")
                .get("weir-node-lb")
                .await
                .unwrap();
        assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("node-1"));
        assert!(!n2.log().contains("LoadBalancer status updated"), "a second replica wrote:\n{}", n2.log());

        // The first one dies without releasing the Lease: the second takes over, keeps every
        // address, and serves what changes.
        n1.kill();
        let killed = Instant::now();
        apply::<Service>(&admin, NS, lb_service("j", 8080, shared("198.51.100.1"), json!({}))).await;
        let after: &[(&str, &[&str])] = &[
            ("a", &["192.0.2.10"]),
            ("b", &["198.51.100.1"]),
            ("c", &["198.51.100.1"]),
            ("d", &[]),
            ("h", &["192.0.2.11"]),
            ("i", &["192.0.2.12"]),
            ("j", &["198.51.100.1"]),
        ];
        expect(&admin, &[&n2], after, Duration::from_secs(20)).await;
        measured("takeover by the second replica (4 s Lease)", killed.elapsed());

        // Every weir node restarted: every address stays where it was.
        n2.kill();
        let earlier = format!("{}{}", n1.log(), n2.log());
        drop((n1, n2));
        // While no weir node runs, "a" goes away and "k" arrives.
        delete::<Service>(&admin, NS, "a").await;
        apply::<Service>(&admin, NS, lb_service("k", 80, json!({}), json!({}))).await;
        let n3 = Node::start(&api, &kubeconfig, "node-3");
        let restarted: &[(&str, &[&str])] = &[
            ("b", &["198.51.100.1"]),
            ("c", &["198.51.100.1"]),
            ("h", &["192.0.2.11"]),
            ("i", &["192.0.2.12"]),
            ("j", &["198.51.100.1"]),
            ("k", &["192.0.2.10"]),
        ];
        // The Lease of node-2 expires first (4 s).
        expect(&admin, &[&n3], restarted, Duration::from_secs(20)).await;
        let log = n3.log();
        for text in [&earlier, &log] {
            // node-rbac.yaml and node-lb-rbac.yaml grant everything weir node asks for.
            assert!(!text.to_lowercase().contains("forbidden"), "a request was forbidden:\n{text}");
            assert!(!text.contains("cannot publish an Event"), "an Event was refused:\n{text}");
        }
        for moved in ["shop/b", "shop/c", "shop/h", "shop/i", "shop/j"] {
            assert!(
                !log.lines().any(|l| l.contains("LoadBalancer status updated") && l.contains(moved)),
                "{moved} was rewritten after the restart:\n{log}"
            );
        }

        // A pool edit that drops an address in use: the Service keeps it, with a warning.
        let shrink = json!({"spec": {"addresses": ["192.0.2.10-192.0.2.11"]}});
        Api::<IpAddressPool>::all(admin.clone())
            .patch("lan", &PatchParams::default(), &Patch::Merge(&shrink))
            .await
            .unwrap();
        expect_event(
            &admin,
            &n3,
            NS,
            "i",
            "AddressOutsidePools",
            "192.0.2.12 is in no IPAddressPool any more",
        )
        .await;
        expect(
            &admin,
            &[&n3],
            &[("i", &["192.0.2.12"]), ("k", &["192.0.2.10"]), ("h", &["192.0.2.11"])],
            Duration::from_secs(2),
        )
        .await;
        weir::node::cleanup(&weir::node::exec::Runner::host()).unwrap();
    });
}
