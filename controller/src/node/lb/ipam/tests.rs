//! One test per rule of the assignment.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::node::lb::pool::{IpAddressPool, IpAddressPoolSpec, ServiceAllocation, validate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn raw_pool(name: &str, addresses: &[&str]) -> IpAddressPool {
    IpAddressPool {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: IpAddressPoolSpec {
            addresses: addresses.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn pools(raw: Vec<IpAddressPool>) -> Vec<Pool> {
    let (valid, errors) = validate(&raw);
    assert!(errors.is_empty(), "{errors:?}");
    valid
}

/// A Service `ns/name` created at minute `minute`, asking for one IPv4 address, port 80/TCP.
fn req(name: &str, minute: u32) -> Request {
    let (ns, name) = name.split_once('/').unwrap_or(("default", name));
    Request {
        service: ObjectRef::new(ns, name),
        created: Some(Time(format!("2026-01-01T00:{minute:02}:00Z").parse().unwrap())),
        labels: BTreeMap::new(),
        namespace_labels: BTreeMap::new(),
        families: vec![IpFamily::IPv4],
        optional: BTreeSet::new(),
        requested: Vec::new(),
        pool: None,
        sharing_key: None,
        ports: BTreeSet::from([(Protocol::Tcp, 80)]),
        local_selector: None,
        current: Vec::new(),
        invalid: None,
    }
}

fn got(a: &Assignment, name: &str) -> Vec<String> {
    a.addresses(&ObjectRef::new("default", name)).iter().map(ToString::to_string).collect()
}

fn refused(a: &Assignment, name: &str) -> Refusal {
    match a.services.get(&ObjectRef::new("default", name)) {
        Some(Outcome::Refused(r)) => r.clone(),
        other => panic!("{name}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn oldest_first_get_the_first_free_addresses() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.10-192.0.2.12"])]);
    let a = assign(&p, &[req("c", 3), req("a", 1), req("b", 2)]);
    assert_eq!(
        (got(&a, "a"), got(&a, "b"), got(&a, "c")),
        (vec!["192.0.2.10".to_string()], vec!["192.0.2.11".to_string()], vec!["192.0.2.12".to_string()])
    );
    let u = a.usage["lan"];
    assert_eq!((u.assigned_v4, u.available_v4, u.assigned_v6, u.available_v6), (3, 0, 0, 0));
}

#[test]
fn held_addresses_are_stable() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.10-192.0.2.12"])]);
    // "b" holds .10 from an earlier run; an older Service arriving now does not take it.
    let mut b = req("b", 2);
    b.current = vec![ip("192.0.2.10")];
    let a = assign(&p, &[b.clone(), req("a", 1)]);
    assert_eq!(got(&a, "b"), ["192.0.2.10"]);
    assert_eq!(got(&a, "a"), ["192.0.2.11"]);
    // The same answer whatever the input order.
    assert_eq!(assign(&p, &[req("a", 1), b]), a);
}

#[test]
fn two_holders_of_one_address_the_older_keeps_it() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.10-192.0.2.12"])]);
    let (mut old, mut young) = (req("old", 1), req("young", 2));
    old.current = vec![ip("192.0.2.11")];
    young.current = vec![ip("192.0.2.11")];
    let a = assign(&p, &[young, old]);
    assert_eq!(got(&a, "old"), ["192.0.2.11"]);
    assert_eq!(got(&a, "young"), ["192.0.2.10"]);
}

#[test]
fn avoid_buggy_ips_skips_dot_zero_and_dot_255() {
    let mut raw = raw_pool("lan", &["192.0.2.255-192.0.3.1"]);
    raw.spec.avoid_buggy_ips = Some(true);
    let p = pools(vec![raw]);
    let a = assign(&p, &[req("a", 1), req("b", 2), req("c", 3)]);
    assert_eq!((got(&a, "a"), got(&a, "b")), (vec!["192.0.3.1".to_string()], vec![]));
    assert_eq!(refused(&a, "b"), Refusal::Exhausted(IpFamily::IPv4));
    let u = a.usage["lan"];
    assert_eq!((u.assigned_v4, u.available_v4), (1, 0));
    // Asking for one is refused as well: the pool does not hand it out.
    let mut want = req("d", 4);
    want.requested = vec![ip("192.0.3.0")];
    assert_eq!(refused(&assign(&p, &[want]), "d"), Refusal::NotInAnyPool(ip("192.0.3.0")));
}

#[test]
fn requested_addresses() {
    let mut manual = raw_pool("manual", &["198.51.100.0/30"]);
    manual.spec.auto_assign = Some(false);
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/30"]), manual]);
    let mut inside = req("inside", 1);
    inside.requested = vec![ip("198.51.100.2")];
    let mut outside = req("outside", 2);
    outside.requested = vec![ip("203.0.113.9")];
    let mut taken = req("taken", 3);
    taken.requested = vec![ip("198.51.100.2")];
    let auto = req("auto", 4);
    let a = assign(&p, &[inside, outside, taken, auto]);
    // A pool with autoAssign false still serves a Service asking for its address.
    assert_eq!(got(&a, "inside"), ["198.51.100.2"]);
    assert_eq!(refused(&a, "outside"), Refusal::NotInAnyPool(ip("203.0.113.9")));
    assert_eq!(refused(&a, "taken"), Refusal::Taken(ip("198.51.100.2"), ObjectRef::new("default", "inside")));
    assert_eq!(
        refused(&a, "taken").to_string(),
        "the requested address 198.51.100.2 is held by Service default/inside (sharing needs the same weir.dev/allow-shared-ip on both)"
    );
    // Nothing asked: only autoAssign pools.
    assert_eq!(got(&a, "auto"), ["192.0.2.0"]);
}

#[test]
fn a_new_request_moves_a_service_to_its_new_address() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/29"])]);
    let mut s = req("s", 1);
    s.current = vec![ip("192.0.2.1")];
    s.requested = vec![ip("192.0.2.5")];
    let a = assign(&p, &[s, req("t", 2)]);
    assert_eq!(got(&a, "s"), ["192.0.2.5"]);
    // The old one is free again.
    assert_eq!(got(&a, "t"), ["192.0.2.0"]);
    assert_eq!(a.usage["lan"].assigned_v4, 2);
}

#[test]
fn sharing_needs_the_same_key_and_distinct_ports() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/30"])]);
    let shared = |name: &str, minute, key: Option<&str>, port| {
        let mut r = req(name, minute);
        r.sharing_key = key.map(String::from);
        r.ports = BTreeSet::from([(Protocol::Tcp, port)]);
        r
    };
    let web = shared("web", 1, Some("k"), 80);
    // Same key, other port, auto: the shared address.
    let https = shared("https", 2, Some("k"), 443);
    // Same key, same port, asking for the address: refused, naming the port.
    let mut clash = shared("clash", 3, Some("k"), 80);
    clash.requested = vec![ip("192.0.2.0")];
    // Other key, asking for it: taken.
    let mut other = shared("other", 4, Some("x"), 8080);
    other.requested = vec![ip("192.0.2.0")];
    // Same key, same port, auto: a fresh address rather than a refusal.
    let dns = shared("dns", 5, Some("k"), 80);
    let a = assign(&p, &[web, https, clash, other, dns]);
    assert_eq!(got(&a, "web"), ["192.0.2.0"]);
    assert_eq!(got(&a, "https"), ["192.0.2.0"]);
    assert_eq!(
        refused(&a, "clash"),
        Refusal::PortsCollide {
            ip: ip("192.0.2.0"),
            with: ObjectRef::new("default", "web"),
            port: (Protocol::Tcp, 80)
        }
    );
    assert_eq!(refused(&a, "clash").reason(), "SharedPortsCollide");
    assert_eq!(refused(&a, "other"), Refusal::Taken(ip("192.0.2.0"), ObjectRef::new("default", "web")));
    assert_eq!(got(&a, "dns"), ["192.0.2.1"]);
    // A shared address counts once.
    assert_eq!(a.usage["lan"].assigned_v4, 2);
    // UDP and TCP on one port do not collide.
    let mut udp = shared("udp", 6, Some("k"), 80);
    udp.ports = BTreeSet::from([(Protocol::Udp, 80)]);
    udp.requested = vec![ip("192.0.2.0")];
    let a = assign(&p, &[shared("web", 1, Some("k"), 80), udp]);
    assert_eq!(got(&a, "udp"), ["192.0.2.0"]);
}

#[test]
fn local_traffic_policy_shares_only_with_the_same_pods() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/30"])]);
    let mut a1 = req("a1", 1);
    a1.sharing_key = Some("k".into());
    a1.local_selector = Some(BTreeMap::from([("app".to_string(), "a".to_string())]));
    let mut a2 = a1.clone();
    a2.service = ObjectRef::new("default", "a2");
    a2.ports = BTreeSet::from([(Protocol::Tcp, 81)]);
    let mut b = a2.clone();
    b.service = ObjectRef::new("default", "b");
    b.ports = BTreeSet::from([(Protocol::Tcp, 82)]);
    b.local_selector = Some(BTreeMap::from([("app".to_string(), "b".to_string())]));
    let mut cluster = a2.clone();
    cluster.service = ObjectRef::new("default", "cluster");
    cluster.ports = BTreeSet::from([(Protocol::Tcp, 83)]);
    cluster.local_selector = None;
    let a = assign(&p, &[a1, a2, b, cluster]);
    assert_eq!(got(&a, "a1"), got(&a, "a2"));
    assert_ne!(got(&a, "a1"), got(&a, "b"));
    assert_ne!(got(&a, "a1"), got(&a, "cluster"));
}

#[test]
fn an_exhausted_pool_refuses_and_a_deleted_service_frees_its_address() {
    let p = pools(vec![raw_pool("small", &["192.0.2.8/31"])]);
    let mut a1 = req("a", 1);
    a1.current = vec![ip("192.0.2.8")];
    let mut b = req("b", 2);
    b.current = vec![ip("192.0.2.9")];
    let a = assign(&p, &[a1, b.clone(), req("c", 3)]);
    assert_eq!(refused(&a, "c"), Refusal::Exhausted(IpFamily::IPv4));
    assert_eq!(refused(&a, "c").to_string(), "no IPAddressPool open to this Service has a free IPv4 address");
    assert_eq!(a.usage["small"], Usage { assigned_v4: 2, ..Usage::default() });
    // "a" deleted (or no longer weir's): "c" gets its address.
    let a = assign(&p, &[b, req("c", 3)]);
    assert_eq!(got(&a, "c"), ["192.0.2.8"]);
}

#[test]
fn a_pool_edit_leaves_addresses_in_use_with_a_note() {
    // The pool shrank from /29 to .0-.3; "s" holds .6.
    let p = pools(vec![raw_pool("lan", &["192.0.2.0-192.0.2.3"])]);
    let mut s = req("s", 1);
    s.current = vec![ip("192.0.2.6")];
    let a = assign(&p, &[s, req("t", 2)]);
    assert_eq!(got(&a, "s"), ["192.0.2.6"]);
    assert_eq!(got(&a, "t"), ["192.0.2.0"]);
    assert_eq!(a.notes.len(), 1);
    assert_eq!(a.notes[0].service, ObjectRef::new("default", "s"));
    assert!(a.notes[0].message.contains("192.0.2.6 is in no IPAddressPool any more"), "{:?}", a.notes);
    // It does not count in the pool it left.
    assert_eq!(a.usage["lan"].assigned_v4, 1);
    // Every pool removed: still kept.
    let a = assign(
        &[],
        &[{
            let mut s = req("s", 1);
            s.current = vec![ip("192.0.2.6")];
            s
        }],
    );
    assert_eq!(got(&a, "s"), ["192.0.2.6"]);
}

#[test]
fn dual_stack() {
    let p = pools(vec![raw_pool("v4", &["192.0.2.0/31"]), raw_pool("v6", &["2001:db8::/127"])]);
    let dual = |name: &str, minute, policy_optional: bool| {
        let mut r = req(name, minute);
        r.families = vec![IpFamily::IPv6, IpFamily::IPv4];
        if policy_optional {
            r.optional = BTreeSet::from([IpFamily::IPv4]);
        }
        r
    };
    let a = assign(&p, &[dual("a", 1, false), dual("b", 2, false)]);
    assert_eq!(got(&a, "a"), ["2001:db8::", "192.0.2.0"]);
    assert_eq!(got(&a, "b"), ["2001:db8::1", "192.0.2.1"]);
    let u = (a.usage["v4"], a.usage["v6"]);
    assert_eq!((u.0.assigned_v4, u.1.assigned_v6, u.1.available_v6), (2, 2, 0));

    // IPv6 exhausted: a Service requiring both gets nothing (its IPv4 stays free for others).
    let mut c = dual("c", 3, false);
    c.families = vec![IpFamily::IPv4, IpFamily::IPv6];
    let a = assign(&p, &[dual("a", 1, false), dual("b", 2, false), c, req("d", 4)]);
    assert_eq!(refused(&a, "c"), Refusal::Exhausted(IpFamily::IPv4));
    assert_eq!(refused(&a, "d"), Refusal::Exhausted(IpFamily::IPv4));
    let small = pools(vec![raw_pool("v4", &["192.0.2.0/30"]), raw_pool("v6", &["2001:db8::/128"])]);
    let mut c = dual("c", 3, false);
    c.families = vec![IpFamily::IPv4, IpFamily::IPv6];
    let a = assign(&small, &[dual("a", 1, false), c, req("d", 4)]);
    assert_eq!(refused(&a, "c"), Refusal::Exhausted(IpFamily::IPv6));
    assert_eq!(got(&a, "d"), ["192.0.2.1"]);

    // PreferDualStack: the second family is optional.
    let only_v6 = pools(vec![raw_pool("v6", &["2001:db8::/127"])]);
    let a = assign(&only_v6, &[dual("p", 1, true)]);
    assert_eq!(got(&a, "p"), ["2001:db8::"]);
}

#[test]
fn service_allocation_orders_and_restricts_pools() {
    let with = |name: &str, addr: &str, alloc: ServiceAllocation| {
        let mut p = raw_pool(name, &[addr]);
        p.spec.service_allocation = Some(alloc);
        p
    };
    let p = pools(vec![
        raw_pool("a-general", &["192.0.2.0/30"]),
        with(
            "shop-low",
            "198.51.100.0/30",
            ServiceAllocation { priority: Some(20), namespaces: vec!["shop".into()], ..Default::default() },
        ),
        with(
            "shop-high",
            "198.51.100.4/30",
            ServiceAllocation { priority: Some(10), namespaces: vec!["shop".into()], ..Default::default() },
        ),
        with(
            "edge",
            "203.0.113.0/30",
            ServiceAllocation {
                service_selectors: vec![LabelSelector {
                    match_labels: Some(BTreeMap::from([("tier".to_string(), "edge".to_string())])),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
        with(
            "team",
            "203.0.113.4/30",
            ServiceAllocation {
                namespace_selectors: vec![LabelSelector {
                    match_labels: Some(BTreeMap::from([("team".to_string(), "blue".to_string())])),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
    ]);
    let shop = req("shop/web", 1);
    let plain = req("web", 2);
    let mut edge = req("edge", 3);
    edge.labels = BTreeMap::from([("tier".to_string(), "edge".to_string())]);
    let mut blue = req("blue/web", 4);
    blue.namespace_labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
    let mut wrong_pool = req("wrong", 5);
    wrong_pool.pool = Some("shop-high".into());
    let mut no_pool = req("nopool", 6);
    no_pool.pool = Some("gone".into());
    let mut named = req("named", 7);
    named.pool = Some("a-general".into());
    named.current = vec![ip("198.51.100.5")]; // held from before the annotation: moved
    let mut wrong_ip = req("wrongip", 8);
    wrong_ip.requested = vec![ip("198.51.100.6")];
    let a = assign(&p, &[shop, plain, edge, blue, wrong_pool, no_pool, named, wrong_ip]);
    let of = |ns: &str, name: &str| {
        a.addresses(&ObjectRef::new(ns, name)).iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    // The pool naming the namespace, highest priority first.
    assert_eq!(of("shop", "web"), ["198.51.100.4"]);
    // Restricted pools are not open to others; pools with an allocation come first.
    assert_eq!(of("default", "web"), ["192.0.2.0"]);
    assert_eq!(of("default", "edge"), ["203.0.113.0"]);
    assert_eq!(of("blue", "web"), ["203.0.113.4"]);
    assert_eq!(refused(&a, "wrong"), Refusal::PoolNotAllowed("shop-high".into()));
    assert_eq!(refused(&a, "nopool"), Refusal::NoSuchPool("gone".into()));
    assert_eq!(got(&a, "named"), ["192.0.2.1"]);
    assert_eq!(refused(&a, "wrongip"), Refusal::PoolNotAllowed("shop-high".into()));
}

#[test]
fn named_pool_and_requested_address_must_agree() {
    let p = pools(vec![raw_pool("a", &["192.0.2.0/30"]), raw_pool("b", &["192.0.2.4/30"])]);
    let mut r = req("r", 1);
    r.pool = Some("a".into());
    r.requested = vec![ip("192.0.2.5")];
    assert_eq!(refused(&assign(&p, &[r]), "r"), Refusal::NotInNamedPool(ip("192.0.2.5"), "a".into()));
}

#[test]
fn invalid_requests_are_refused_and_free_what_they_held() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/31"])]);
    let mut bad = req("bad", 1);
    bad.current = vec![ip("192.0.2.0")];
    bad.invalid = Some("weir.dev/load-balancer-ips \"x\": \"x\" is not an IP address".into());
    let a = assign(&p, &[bad, req("ok", 2)]);
    assert_eq!(refused(&a, "bad").reason(), "InvalidLoadBalancerRequest");
    assert_eq!(got(&a, "ok"), ["192.0.2.0"]);
}

#[test]
fn the_result_does_not_depend_on_input_order() {
    let p = pools(vec![raw_pool("lan", &["192.0.2.0/29"]), raw_pool("v6", &["2001:db8::/125"])]);
    let mut reqs: Vec<Request> = (0..6u32)
        .map(|i| {
            let mut r = req(&format!("s{i}"), 6 - i);
            if i % 2 == 0 {
                r.sharing_key = Some("k".into());
                r.ports = BTreeSet::from([(Protocol::Tcp, 80 + i as u16)]);
            }
            if i == 3 {
                r.families = vec![IpFamily::IPv4, IpFamily::IPv6];
                r.current = vec![ip("192.0.2.5")];
            }
            r
        })
        .collect();
    let first = assign(&p, &reqs);
    for _ in 0..5 {
        reqs.rotate_left(1);
        assert_eq!(assign(&p, &reqs), first);
        reqs.reverse();
        assert_eq!(assign(&p, &reqs), first);
    }
}

#[test]
fn usage_counts_large_and_buggy_ranges() {
    let mut raw = raw_pool("big", &["10.0.0.0/16", "2001:db8::/64"]);
    raw.spec.avoid_buggy_ips = Some(true);
    let p = pools(vec![raw]);
    let a = assign(&p, &[req("a", 1)]);
    let u = a.usage["big"];
    // 65536 minus 256 ".0" and 256 ".255", minus the one assigned (10.0.0.1).
    assert_eq!((u.assigned_v4, u.available_v4), (1, 65536 - 512 - 1));
    assert_eq!(u.available_v6, 1 << 64);
    assert_eq!(got(&a, "a"), ["10.0.0.1"]);
    assert_eq!(count_last_octet(0, 255, 0), 1);
    assert_eq!(count_last_octet(1, 254, 0), 0);
    assert_eq!(count_last_octet(255, 256, 255), 1);
}

// === reading Services ===

fn service(yaml: &str) -> Service {
    serde_saphyr::from_str(yaml).unwrap()
}

#[test]
fn classes_choose_the_services() {
    let svc = |extra: &str| {
        service(&format!("metadata: {{name: s, namespace: d}}\nspec:\n  type: LoadBalancer\n{extra}"))
    };
    let default = ClassConfig::default();
    let required = ClassConfig { class_required: true, ..ClassConfig::default() };
    let no_class = svc("");
    let ours = svc("  loadBalancerClass: weir.dev/lb\n");
    let theirs = svc("  loadBalancerClass: metallb.io/metallb\n");
    let cluster_ip = service("metadata: {name: s}\nspec: {type: ClusterIP}\n");
    assert!(default.handles(&no_class) && default.handles(&ours) && !default.handles(&theirs));
    assert!(!required.handles(&no_class) && required.handles(&ours) && !required.handles(&theirs));
    assert!(!default.handles(&cluster_ip));
    let other = ClassConfig { class: "example.com/lb".into(), class_required: false };
    assert!(!other.handles(&ours) && other.handles(&no_class));
}

#[test]
fn requests_read_fields_annotations_and_status() {
    let svc = service(
        r#"
metadata:
  name: web
  namespace: shop
  labels: {tier: edge}
  creationTimestamp: "2026-01-01T00:00:00Z"
  annotations:
    weir.dev/load-balancer-ips: "192.0.2.7, 2001:db8::7"
    weir.dev/address-pool: lan
    weir.dev/allow-shared-ip: shop
spec:
  type: LoadBalancer
  loadBalancerIP: 192.0.2.99
  externalTrafficPolicy: Local
  selector: {app: web}
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv4]
  ports:
  - {port: 80, protocol: TCP}
  - {port: 53, protocol: UDP}
status:
  loadBalancer:
    ingress: [{ip: 192.0.2.7}, {hostname: lb.example.com}]
"#,
    );
    let labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
    let r = Request::from_service(&svc, &labels);
    assert_eq!(r.service, ObjectRef::new("shop", "web"));
    // The annotation wins over spec.loadBalancerIP; its families decide.
    assert_eq!(r.requested, [ip("192.0.2.7"), ip("2001:db8::7")]);
    assert_eq!(r.families, [IpFamily::IPv4, IpFamily::IPv6]);
    assert_eq!((r.pool.as_deref(), r.sharing_key.as_deref()), (Some("lan"), Some("shop")));
    assert_eq!(r.ports, BTreeSet::from([(Protocol::Tcp, 80), (Protocol::Udp, 53)]));
    assert_eq!(r.local_selector, Some(BTreeMap::from([("app".to_string(), "web".to_string())])));
    assert_eq!(r.current, [ip("192.0.2.7")]);
    assert_eq!(r.namespace_labels, labels);
    assert!(r.invalid.is_none());

    let plain = service(
        "metadata: {name: p}\nspec: {type: LoadBalancer, loadBalancerIP: 192.0.2.99, ipFamilyPolicy: RequireDualStack, ipFamilies: [IPv6, IPv4]}\n",
    );
    let r = Request::from_service(&plain, &BTreeMap::new());
    assert_eq!(
        (r.requested.as_slice(), r.families.as_slice()),
        ([ip("192.0.2.99")].as_slice(), [IpFamily::IPv4].as_slice())
    );
    let dual = service(
        "metadata: {name: p}\nspec: {type: LoadBalancer, ipFamilyPolicy: PreferDualStack, ipFamilies: [IPv6, IPv4]}\n",
    );
    let r = Request::from_service(&dual, &BTreeMap::new());
    assert_eq!(
        (r.families.as_slice(), r.optional.iter().collect::<Vec<_>>()),
        ([IpFamily::IPv6, IpFamily::IPv4].as_slice(), vec![&IpFamily::IPv4])
    );
    let bare = service("metadata: {name: p}\nspec: {type: LoadBalancer}\n");
    assert_eq!(Request::from_service(&bare, &BTreeMap::new()).families, [IpFamily::IPv4]);

    for (value, why) in
        [("192.0.2.1,192.0.2.2", "two addresses of one family"), ("192.0.2.x", "is not an IP address")]
    {
        let bad = service(&format!(
            "metadata: {{name: b, annotations: {{weir.dev/load-balancer-ips: \"{value}\"}}}}\nspec: {{type: LoadBalancer}}\n"
        ));
        let r = Request::from_service(&bad, &BTreeMap::new());
        assert!(r.invalid.as_deref().is_some_and(|m| m.contains(why)), "{value}: {:?}", r.invalid);
    }
}
