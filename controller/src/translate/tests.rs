//! Focused tests of translation rules: one test per precedence, conflict or class rule.
//! (The golden fixtures in `tests/fixtures` cover the whole pipeline.)

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use weir_dataplane::model::{BackendId, HostMatch, ObjectRef, PathMatch, ServicePort};

use super::class::{ClassSelector, Selected};
use super::rank::Rank;
use super::routes::{Field, backend_id, path_match};
use super::*;
use crate::snapshot::{Object, Objects};
use crate::source::manifest::parse_manifests;

fn snapshot(yaml: &str) -> Snapshot {
    parse_manifests(yaml).unwrap().into_iter().collect()
}

fn ingress_yaml(
    name: &str,
    created: Option<&str>,
    class: Option<&str>,
    host: &str,
    path: &str,
    svc: &str,
) -> String {
    let created = created.map(|t| format!("  creationTimestamp: \"{t}\"\n")).unwrap_or_default();
    let class = class.map(|c| format!("  ingressClassName: {c}\n")).unwrap_or_default();
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n{created}spec:\n{class}  rules:\n  - host: {host}\n    http:\n      paths:\n      - path: {path}\n        pathType: Prefix\n        backend:\n          service:\n            name: {svc}\n            port:\n              number: 80\n"
    )
}

fn class_yaml(name: &str, controller: &str, default: bool) -> String {
    let annotations = if default {
        "  annotations:\n    ingressclass.kubernetes.io/is-default-class: \"true\"\n"
    } else {
        ""
    };
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: {name}\n{annotations}spec:\n  controller: {controller}\n"
    )
}

fn ingress(yaml: &str) -> Ingress {
    match parse_manifests(yaml).unwrap().remove(0) {
        Object::Ingress(i) => *i,
        other => panic!("{other:?}"),
    }
}

fn classes(yaml: &str) -> Objects<IngressClass, String> {
    snapshot(yaml).ingress_classes
}

const OURS: &str = "weir.dev/ingress-controller";

// === class selection ===

#[test]
fn class_name_resolves_through_the_ingress_class_object() {
    let config = TranslateConfig::default();
    let classes = classes(&(class_yaml("edge", OURS, false) + &class_yaml("weir", "other.io/ctl", false)));
    let sel = ClassSelector::new(&classes, &config);
    assert!(sel.is_ours("edge"), "a class of our controller, whatever its name");
    assert!(!sel.is_ours("weir"), "an existing class of another controller, even named like ours");
    assert!(!sel.is_ours("nginx"), "no such class and not our configured name");
    let none = Objects::default();
    let sel = ClassSelector::new(&none, &config);
    assert!(sel.is_ours("weir"), "no IngressClass objects: the configured name");
}

#[test]
fn class_field_then_annotation_then_default() {
    let config = TranslateConfig::default();
    let none = Objects::default();
    let sel = ClassSelector::new(&none, &config);
    let with_annotation = |field: Option<&str>, annotation: &str| {
        let mut ing = ingress(&ingress_yaml("a", None, field, "a.example.com", "/", "s"));
        ing.metadata.annotations =
            Some([("kubernetes.io/ingress.class".to_string(), annotation.to_string())].into());
        ing
    };
    assert_eq!(sel.select(&with_annotation(Some("weir"), "nginx")), Some(Selected::ClassName));
    assert_eq!(
        sel.select(&with_annotation(Some("nginx"), "weir")),
        None,
        "the field wins over the annotation"
    );
    assert_eq!(sel.select(&with_annotation(None, "weir")), Some(Selected::LegacyAnnotation("weir")));
    assert_eq!(sel.select(&with_annotation(None, "nginx")), None);
    let classless = ingress(&ingress_yaml("a", None, None, "a.example.com", "/", "s"));
    assert_eq!(sel.select(&classless), None, "class-less Ingresses are not ours by default");
}

#[test]
fn classless_ingress_needs_our_default_class_or_the_flag() {
    let classless = ingress(&ingress_yaml("a", None, None, "a.example.com", "/", "s"));
    let config = TranslateConfig::default();
    let ours_default = classes(&class_yaml("edge", OURS, true));
    assert_eq!(ClassSelector::new(&ours_default, &config).select(&classless), Some(Selected::Default));
    let other_default =
        classes(&(class_yaml("nginx", "k8s.io/ingress-nginx", true) + &class_yaml("edge", OURS, false)));
    assert_eq!(ClassSelector::new(&other_default, &config).select(&classless), None);
    let watch = TranslateConfig { watch_ingress_without_class: true, ..TranslateConfig::default() };
    assert_eq!(ClassSelector::new(&other_default, &watch).select(&classless), Some(Selected::Default));
}

#[test]
fn ingresses_of_other_classes_are_ignored_without_warnings() {
    let snap = snapshot(
        &(ingress_yaml("theirs", None, Some("nginx"), "bad_host", "nope", "missing")
            + &ingress_yaml("mine", None, Some("weir"), "a.example.com", "/", "missing")),
    );
    let t = translate(&snap, &TranslateConfig::default());
    assert_eq!(t.ingresses, vec![ObjectRef::new("default", "mine")]);
    assert!(t.warnings.iter().all(|w| w.object.name == "mine"), "{:?}", t.warnings);
    assert_eq!(t.table.hosts.len(), 1);
}

// === precedence ===

#[test]
fn rank_orders_by_creation_then_namespace_name() {
    let rank = |ns: &str, name: &str, created: Option<&str>| {
        let mut yaml = ingress_yaml(name, created, Some("weir"), "a.example.com", "/", "s");
        yaml = yaml.replace("metadata:\n", &format!("metadata:\n  namespace: {ns}\n"));
        Rank::of(ObjectRef::new(ns, name), &ingress(&yaml))
    };
    let old = rank("zz", "zz", Some("2020-01-01T00:00:00Z"));
    let new = rank("aa", "aa", Some("2021-01-01T00:00:00Z"));
    let undated = rank("a", "a", None);
    let tie = rank("zz", "aa", Some("2020-01-01T00:00:00Z"));
    assert!(old < new, "older wins whatever the name");
    assert!(new < undated, "no timestamp counts as the newest");
    assert!(tie < old, "same timestamp: namespace/name");
    assert!(rank("a", "b", None) < rank("b", "a", None), "both undated: namespace first");
}

#[test]
fn conflict_gives_every_loser_a_warning_naming_the_winner() {
    let snap = snapshot(
        &(ingress_yaml("c", Some("2022-01-01T00:00:00Z"), Some("weir"), "x.example.com", "/api/", "c")
            + &ingress_yaml("a", Some("2021-01-01T00:00:00Z"), Some("weir"), "x.example.com", "/api", "a")
            + &ingress_yaml("b", None, Some("weir"), "X.Example.com", "/api", "b")),
    );
    let t = translate(&snap, &TranslateConfig::default());
    let routes = &t.table.hosts[0].routes;
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].origin, ObjectRef::new("default", "a"));
    let lost: Vec<_> = t.warnings.iter().filter(|w| w.reason == Reason::ConflictLost).collect();
    assert_eq!(lost.len(), 2, "{lost:?}");
    for w in lost {
        assert_eq!(w.severity, Severity::Error);
        assert!(w.message.contains("Ingress default/a"), "{w}");
        assert!(
            w.to_string().starts_with(&format!("Ingress default/{}: spec.rules[0]", w.object.name)),
            "{w}"
        );
    }
}

#[test]
fn exact_and_prefix_of_the_same_path_do_not_conflict() {
    let yaml = ingress_yaml("a", None, Some("weir"), "x.example.com", "/p", "a")
        + &ingress_yaml("b", None, Some("weir"), "x.example.com", "/p", "b")
            .replace("pathType: Prefix", "pathType: Exact");
    let t = translate(&snapshot(&yaml), &TranslateConfig::default());
    let paths: Vec<_> = t.table.hosts[0].routes.iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, vec![PathMatch::Exact("/p".into()), PathMatch::Prefix("/p".into())]);
    assert!(t.warnings.iter().all(|w| w.reason != Reason::ConflictLost), "{:?}", t.warnings);
}

#[test]
fn same_path_on_different_hosts_does_not_conflict() {
    let yaml = ingress_yaml("a", None, Some("weir"), "a.example.com", "/", "a")
        + &ingress_yaml("b", None, Some("weir"), "\"*.example.com\"", "/", "b");
    let t = translate(&snapshot(&yaml), &TranslateConfig::default());
    let hosts: Vec<_> = t.table.hosts.iter().map(|h| h.host.clone()).collect();
    assert_eq!(
        hosts,
        vec![HostMatch::Exact("a.example.com".into()), HostMatch::Wildcard("example.com".into())]
    );
}

// === paths and backends ===

#[test]
fn path_normalisation() {
    let prefix = |p: &str| Ok(PathMatch::Prefix(p.to_string()));
    assert_eq!(path_match(Some("/foo/"), "Prefix", false), prefix("/foo"));
    assert_eq!(path_match(Some("/foo//"), "Prefix", false), prefix("/foo"));
    assert_eq!(path_match(Some("/"), "Prefix", false), prefix("/"));
    assert_eq!(path_match(None, "Prefix", false), prefix("/"));
    assert_eq!(path_match(Some(""), "ImplementationSpecific", false), prefix("/"));
    assert_eq!(path_match(Some("/a/"), "ImplementationSpecific", false), prefix("/a"));
    assert_eq!(path_match(Some("/a/"), "Exact", false), Ok(PathMatch::Exact("/a/".into())));
    assert!(path_match(None, "Exact", false).is_err());
    assert!(path_match(Some("a"), "Prefix", false).is_err());
    assert!(path_match(Some("/a\tb"), "Prefix", false).is_err());
    assert!(path_match(Some("/a\u{7f}"), "Prefix", false).is_err());
    assert!(path_match(Some("/a"), "", false).is_err(), "missing pathType");
    assert!(path_match(Some("/a"), "prefix", false).is_err(), "pathType is case-sensitive");
    // With use-regex every path type is a case-insensitive regex; RE2 syntax is checked.
    let regex = |p: &str| Ok(PathMatch::Regex(p.into()));
    assert_eq!(path_match(Some("/a(/|$)(.*)"), "ImplementationSpecific", true), regex("(?i)/a(/|$)(.*)"));
    assert_eq!(path_match(Some("/a/"), "Prefix", true), regex("(?i)/a/"));
    assert_eq!(path_match(Some("/x"), "Exact", true), regex("(?i)/x"));
    assert_eq!(path_match(None, "Prefix", true), regex("(?i)/"));
    assert!(path_match(Some("/a(?=b)"), "ImplementationSpecific", true).is_err(), "look-ahead");
    assert!(path_match(Some("/a("), "ImplementationSpecific", true).is_err());
    assert_eq!(path_match(Some("/items/?"), "ImplementationSpecific", true), regex("(?i)/items/?"));
}

#[test]
fn backend_ids_keep_the_port_as_written() {
    let ing = |port: &str| {
        ingress(
            &ingress_yaml("a", None, Some("weir"), "a.example.com", "/", "svc").replace("number: 80", port),
        )
    };
    let id = |port: &str| {
        let i = ing(port);
        let rules = i.spec.unwrap().rules.unwrap();
        let backend = &rules[0].http.as_ref().unwrap().paths[0].backend;
        backend_id("ns", backend, Field::DefaultBackend).map_err(|(reason, _)| reason)
    };
    assert_eq!(
        id("number: 8080"),
        Ok(BackendId { namespace: "ns".into(), service: "svc".into(), port: ServicePort::Number(8080) })
    );
    assert_eq!(id("name: http").map(|b| b.port), Ok(ServicePort::Name("http".into())));
    assert_eq!(id("number: 0"), Err(Reason::InvalidBackend));
    assert_eq!(id("number: 70000"), Err(Reason::InvalidBackend));
    assert_eq!(id("name: \"\""), Err(Reason::InvalidBackend));
}

// === plumbing ===

#[test]
fn snapshot_insert_returns_the_replaced_object() {
    let mut snap = Snapshot::default();
    let objects = parse_manifests(
        &(ingress_yaml("a", None, None, "a.example.com", "/", "s")
            + &ingress_yaml("a", None, None, "b.example.com", "/", "s")),
    )
    .unwrap();
    let mut objects = objects.into_iter();
    assert!(snap.insert(objects.next().unwrap()).is_none());
    let old = snap.insert(objects.next().unwrap()).unwrap();
    assert_eq!(old.describe(), "Ingress default/a");
    assert_eq!(snap.ingresses.len(), 1);
    assert!(snap.insert(Object::Other { api_version: "v1".into(), kind: "ConfigMap".into() }).is_none());
}

#[test]
fn config_deserializes_with_defaults() {
    let config: TranslateConfig = serde_saphyr::from_str("watch_ingress_without_class: true\n").unwrap();
    assert_eq!(config, TranslateConfig { watch_ingress_without_class: true, ..TranslateConfig::default() });
    assert_eq!(config.ingress_class, "weir");
    assert_eq!(config.controller_name, "weir.dev/ingress-controller");
    assert!(serde_saphyr::from_str::<TranslateConfig>("ingres_class: x\n").is_err(), "typos are errors");
}

#[test]
fn warning_display_names_the_object() {
    let w = Warning {
        kind: ObjectKind::Ingress,
        object: ObjectRef::new("default", "web"),
        severity: Severity::Error,
        reason: Reason::InvalidPath,
        message: "spec.rules[0].http.paths[0]: bad".into(),
    };
    assert_eq!(w.to_string(), "Ingress default/web: spec.rules[0].http.paths[0]: bad");
    let class = Warning { kind: ObjectKind::IngressClass, object: ObjectRef::new("", "weir"), ..w };
    assert_eq!(class.to_string(), "IngressClass weir: spec.rules[0].http.paths[0]: bad");
}
