//! Golden tests of translation: `tests/fixtures/<case>/input.yaml` (manifests) and optional
//! `config.yaml` (a `TranslateConfig`) are translated and compared, as YAML, with
//! `expected.yaml`. Run with `WEIR_BLESS=1` to (re)write the expected files, then read them.
//!
//! No key material is committed: `GENERATED-CERT-n` / `GENERATED-KEY-n` in an input stand for
//! the PEM of certificate and key pair `n` (1 to 3) made with rcgen when the test starts, and
//! the `-B64` forms for their base64 (Secret `data`). The output names them the same way.

// Test helpers outside `#[test]` functions: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used)]

mod support_diff;
use support_diff::diff;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use weir::snapshot::{SharedObject, Snapshot, SnapshotKey};
use weir::source::manifest::parse_manifests;
use weir::translate::{TranslateConfig, Translation, Translator, translate};
use weir_dataplane::model::ObjectRef;
use weir_dataplane::model::changes::TableChanges;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("input.yaml").is_file())
        .collect();
    cases.sort();
    cases
}

fn config(case: &Path) -> TranslateConfig {
    match std::fs::read_to_string(case.join("config.yaml")) {
        Ok(text) => {
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}/config.yaml: {e}", case.display()))
        }
        Err(_) => TranslateConfig::default(),
    }
}

/// Certificate and key PEM of the generated pairs 1..=3.
fn generated() -> &'static [(String, String)] {
    static PAIRS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        (1..=3)
            .map(|n| {
                let c = rcgen::generate_simple_self_signed(vec![format!("generated-{n}.test")]).unwrap();
                (c.cert.pem(), c.signing_key.serialize_pem())
            })
            .collect()
    })
}

fn with_generated(input: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let json = |s: &str| serde_json::to_string(s).unwrap();
    let mut out = input.to_string();
    for (i, (cert, key)) in generated().iter().enumerate().rev() {
        let n = i + 1;
        out = out
            .replace(&format!("GENERATED-CERT-{n}-B64"), &b64(cert))
            .replace(&format!("GENERATED-KEY-{n}-B64"), &b64(key))
            .replace(&format!("GENERATED-CERT-{n}"), &json(cert))
            .replace(&format!("GENERATED-KEY-{n}"), &json(key));
    }
    out
}

fn run(case: &Path, input: &str, config: &TranslateConfig) -> Translation {
    let input = with_generated(input);
    let objects = parse_manifests(&input).unwrap_or_else(|e| panic!("{}/input.yaml: {e}", case.display()));
    let snapshot: Snapshot = objects.into_iter().collect();
    let mut translation = translate(&snapshot, config);
    let marker = |pem: &mut String| {
        if let Some(n) = generated().iter().position(|(c, _)| c == pem) {
            *pem = format!("GENERATED-CERT-{}", n + 1);
        }
    };
    for cert in translation.table.certificates.values_mut() {
        marker(&mut cert.chain_pem);
    }
    for auth in &mut translation.table.client_auth {
        marker(&mut auth.ca_pem);
    }
    for backend in translation.table.backends.values_mut() {
        if let Some(pem) = backend.tls.as_mut().and_then(|t| t.ca_pem.as_mut()) {
            marker(pem);
        }
    }
    translation
}

fn render(translation: &Translation) -> String {
    serde_saphyr::to_string(translation).unwrap()
}

#[test]
fn golden() {
    let bless = std::env::var_os("WEIR_BLESS").is_some_and(|v| v == "1");
    let cases = fixtures();
    assert!(cases.len() >= 25, "expected at least 25 fixtures, found {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let actual = render(&run(case, &input, &config(case)));
        let expected_path = case.join("expected.yaml");
        if bless {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!(
                "=== {} (- expected, + actual)\n{}",
                case.file_name().unwrap().to_string_lossy(),
                diff(&expected, &actual)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ (WEIR_BLESS=1 rewrites them):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A tiny deterministic PRNG (xorshift64*), so shuffles are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap();
            items.swap(i, j);
        }
    }
}

/// Splits manifests at `---` lines (the fixtures use no other document markers).
fn documents(input: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in input.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.retain(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')));
    docs
}

#[test]
fn translation_does_not_depend_on_input_order() {
    for case in fixtures() {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let config = config(&case);
        let reference = run(&case, &input, &config);
        let mut docs = documents(&input);
        for seed in [1u64, 7, 42, 1234, 0x9e37_79b9_7f4a_7c15] {
            let mut rng = Rng(seed);
            rng.shuffle(&mut docs);
            let shuffled = docs.join("---\n");
            let translation = run(&case, &shuffled, &config);
            assert_eq!(
                translation,
                reference,
                "{} differs with seed {seed}:\n{}",
                case.display(),
                diff(&render(&reference), &render(&translation))
            );
        }
    }
}

// === incremental translation ===

/// Every object of every fixture, parsed (generated certificates filled in), and the distinct
/// configurations of the fixtures.
fn pool() -> (Vec<SharedObject>, Vec<TranslateConfig>) {
    let mut objects = Vec::new();
    let mut configs = vec![TranslateConfig::default()];
    for case in fixtures() {
        let input = with_generated(&std::fs::read_to_string(case.join("input.yaml")).unwrap());
        objects.extend(parse_manifests(&input).unwrap().into_iter().filter_map(SharedObject::new));
        let config = config(&case);
        if !configs.contains(&config) {
            configs.push(config);
        }
    }
    (objects, configs)
}

fn check_incremental(translator: &Translator, snapshot: &Snapshot, config: &TranslateConfig, what: &str) {
    let reference = translate(snapshot, config);
    let incremental = translator.translation();
    assert!(
        *incremental == reference,
        "{what}: incremental translation differs (- from scratch, + incremental):\n{}",
        diff(&render(&reference), &render(incremental))
    );
}

/// Updates `translator` and checks that the changes it reports (unless it translated
/// everything) are exactly the virtual hosts and backends that differ from the previous table.
fn update_and_check(
    translator: &mut Translator,
    snapshot: &Snapshot,
    changed: &[SnapshotKey],
    config: &TranslateConfig,
    what: &str,
) -> bool {
    let before = translator.translation().table.clone();
    let update = translator.update(snapshot, Some(changed), config);
    check_incremental(translator, snapshot, config, what);
    let Some(changes) = update.changes else { return false };
    let expected = TableChanges::between(&before, &translator.translation().table);
    assert_eq!(changes, expected, "{what}: reported changes");
    true
}

/// One object of every fixture at a time, in a shuffled order, is added to the snapshot, then
/// removed again: after each step, [`Translator`] (given only the changed key) must give what
/// translating the whole snapshot gives.
#[test]
fn incremental_translation_of_each_fixture_built_up_and_torn_down() {
    for case in fixtures() {
        let config = config(&case);
        let input = with_generated(&std::fs::read_to_string(case.join("input.yaml")).unwrap());
        let mut objects: Vec<SharedObject> =
            parse_manifests(&input).unwrap().into_iter().filter_map(SharedObject::new).collect();
        Rng(0x5eed ^ objects.len() as u64).shuffle(&mut objects);
        let mut snapshot = Snapshot::default();
        let mut translator = Translator::new();
        translator.update(&snapshot, None, &config);
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        for object in &objects {
            let key = object.key();
            snapshot.insert_shared(key.clone(), object.clone());
            let what = format!("{name}: after adding {key:?}");
            let _ = update_and_check(&mut translator, &snapshot, std::slice::from_ref(&key), &config, &what);
        }
        for object in objects.iter().rev() {
            let key = object.key();
            snapshot.remove(&key);
            let what = format!("{name}: after removing {key:?}");
            let _ = update_and_check(&mut translator, &snapshot, std::slice::from_ref(&key), &config, &what);
        }
    }
}

/// A change to an Ingress that keeps what it ties to others (a host, a Service) re-translates
/// only the Ingresses that share those, and says which host changed.
#[test]
fn incremental_translation_redoes_only_what_is_tied_to_the_change() {
    let ingress = |name: &str, host: &str, path: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\nspec:\n  ingressClassName: weir\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - path: {path}\n        pathType: Prefix\n        backend:\n          service:\n            name: {name}\n            port:\n              number: 80\n"
        )
    };
    let text: String = (0..50).map(|i| ingress(&format!("app-{i}"), &format!("app-{i}.test"), "/")).collect();
    let mut snapshot: Snapshot = parse_manifests(&text).unwrap().into_iter().collect();
    let config = TranslateConfig::default();
    let mut translator = Translator::new();
    assert!(translator.update(&snapshot, None, &config).changes.is_none(), "the first update is full");
    let edited = parse_manifests(&ingress("app-7", "app-7.test", "/v2")).unwrap();
    let key = snapshot.insert(edited.into_iter().next().unwrap()).unwrap().key();
    let update = translator.update(&snapshot, Some(std::slice::from_ref(&key)), &config);
    assert_eq!(update.translated, 1, "only app-7 shares its host and Service with app-7");
    let changes = update.changes.unwrap();
    assert_eq!(changes.hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), ["app-7.test"]);
    assert!(changes.backends.is_empty(), "the backend did not change: {changes:?}");
    check_incremental(&translator, &snapshot, &config, "after editing app-7");
}

/// `from-to-www-redirect` ties an Ingress to the other name of its host: an Ingress of its own
/// on `www.shop.test` (another Service) takes that name from the redirect, and gives it back.
#[test]
fn incremental_translation_of_a_www_redirect_and_the_other_name() {
    let ingress = |name: &str, host: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  annotations: {{{annotations}}}\nspec:\n  ingressClassName: weir\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: {name}\n            port:\n              number: 80\n"
        )
    };
    let redirecting =
        ingress("shop", "shop.test", "nginx.ingress.kubernetes.io/from-to-www-redirect: \"true\"");
    let mut snapshot: Snapshot = parse_manifests(&redirecting).unwrap().into_iter().collect();
    let config = TranslateConfig::default();
    let mut translator = Translator::new();
    translator.update(&snapshot, None, &config);
    let www = parse_manifests(&ingress("www", "www.shop.test", "")).unwrap().into_iter().next().unwrap();
    let key = SharedObject::new(www.clone()).unwrap().key();
    for step in ["added", "removed"] {
        if step == "added" {
            snapshot.insert(www.clone());
        } else {
            snapshot.remove(&key);
        }
        let what = format!("www.shop.test {step}");
        assert!(update_and_check(&mut translator, &snapshot, std::slice::from_ref(&key), &config, &what));
        let hosts: Vec<String> =
            translator.translation().table.hosts.iter().map(|h| h.host.to_string()).collect();
        assert_eq!(hosts, ["shop.test", "www.shop.test"], "{what}");
    }
}

/// ConfigMaps: the settings ConfigMap and those it names (`add-headers`, `proxy-set-headers`)
/// translate everything again; one named by a `custom-headers` annotation only the Ingresses
/// naming it; another none. Each result equals translating everything.
#[test]
fn incremental_translation_of_config_map_changes() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/annotations-custom-headers");
    let config = config(&case);
    let input = with_generated(&std::fs::read_to_string(case.join("input.yaml")).unwrap());
    let mut snapshot: Snapshot = parse_manifests(&input).unwrap().into_iter().collect();
    let other = "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: unrelated\n  namespace: default\ndata:\n  a: b\n";
    snapshot.extend(parse_manifests(other).unwrap());
    let mut translator = Translator::new();
    translator.update(&snapshot, None, &config);
    let mut edit = |namespace: &str, name: &str, value: &str| {
        let key = ObjectRef::new(namespace, name);
        let mut cm = snapshot.config_maps.get(&key).unwrap_or_else(|| panic!("{key}")).clone();
        cm.data.get_or_insert_with(Default::default).insert("X-Frame-Options".into(), value.into());
        snapshot.insert(weir::snapshot::Object::ConfigMap(Box::new(cm)));
        let key = SnapshotKey::ConfigMap(key);
        let update = translator.update(&snapshot, Some(std::slice::from_ref(&key)), &config);
        check_incremental(&translator, &snapshot, &config, &format!("after editing {key:?}"));
        (update.changes, update.translated)
    };
    let (changes, translated) = edit("default", "security-headers", "SAMEORIGIN");
    assert_eq!(translated, 2, "shop names default/security-headers, missing shares its Service");
    let changes = changes.expect("a custom-headers ConfigMap is an incremental change");
    assert_eq!(changes.hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(), ["shop.example"]);
    let (changes, translated) = edit("default", "unrelated", "1");
    assert_eq!((changes.map(|c| c.hosts.len()), translated), (Some(0), 0), "nothing names it");
    assert!(edit("ingress-nginx", "ingress-nginx-controller", "1").0.is_none(), "the settings ConfigMap");
    assert!(edit("ingress-nginx", "response-headers", "1").0.is_none(), "named by add-headers");
    assert!(edit("ops", "upstream-headers", "1").0.is_none(), "named by proxy-set-headers");
}

/// Random edits over the objects of all fixtures (fixtures reuse names, so an object of one
/// replaces another's), random mutations of Ingresses (hosts, TLS, annotations that tie
/// Ingresses together, classes, timestamps, backends) and removals, under each fixture's
/// configuration: after every step, the incremental translation (told the changed keys by
/// [`Snapshot::changes_since`]) equals translating everything. Fixed seeds.
#[test]
fn incremental_translation_matches_translating_everything_over_random_edits() {
    let (mut pool, configs) = pool();
    // With a Gateway and HTTPRoutes every change translates everything (`has_gateway_routes`):
    // the Gateway fixtures' Gateways stay out, so that incremental updates are exercised.
    pool.retain(|o| !matches!(o.key(), SnapshotKey::Gateway(_)));
    let names = |kind: fn(&SnapshotKey) -> bool| -> Vec<String> {
        pool.iter().filter(|o| kind(&o.key())).filter_map(|o| o.metadata().name.clone()).collect()
    };
    let services = names(|k| matches!(k, SnapshotKey::Service(_)));
    let secrets = names(|k| matches!(k, SnapshotKey::Secret(_)));
    for (n, config) in configs.iter().enumerate() {
        let mut rng = Rng(0x9e37_79b9 + n as u64);
        let mut snapshot = Snapshot::default();
        let mut translator = Translator::new();
        translator.update(&snapshot, None, config);
        let (mut mutated, mut incremental) = (0, 0);
        for step in 0..400 {
            let before = snapshot.clone();
            for _ in 0..1 + rng.next() % 3 {
                let pick = |rng: &mut Rng, len: usize| usize::try_from(rng.next() % len as u64).unwrap();
                match rng.next() % 12 {
                    0..=4 => {
                        let object = pool[pick(&mut rng, pool.len())].clone();
                        snapshot.insert_shared(object.key(), object);
                    }
                    5..=6 => {
                        let keys = snapshot.changes_since(&Snapshot::default());
                        if !keys.is_empty() {
                            snapshot.remove(&keys[pick(&mut rng, keys.len())]);
                        }
                    }
                    7 => {
                        let keys: Vec<_> = snapshot.config_maps.keys().cloned().collect();
                        if keys.is_empty() {
                            continue;
                        }
                        let key = &keys[pick(&mut rng, keys.len())];
                        let mut cm = snapshot.config_maps.get(key).unwrap().clone();
                        mutate_config_map(&mut cm, &mut rng);
                        snapshot.insert(weir::snapshot::Object::ConfigMap(Box::new(cm)));
                    }
                    8 => {
                        let keys: Vec<_> = snapshot.services.keys().cloned().collect();
                        if keys.is_empty() {
                            continue;
                        }
                        let key = &keys[pick(&mut rng, keys.len())];
                        let mut service = snapshot.services.get(key).unwrap().clone();
                        let spec = service.spec.get_or_insert_with(Default::default);
                        spec.cluster_ip = match rng.next() % 3 {
                            0 => None,
                            1 => Some("10.96.0.7".into()),
                            _ => Some(format!("10.96.1.{}", rng.next() % 250)),
                        };
                        snapshot.insert(weir::snapshot::Object::Service(Box::new(service)));
                    }
                    _ => {
                        let keys: Vec<_> = snapshot.ingresses.keys().cloned().collect();
                        if keys.is_empty() {
                            continue;
                        }
                        let key = &keys[pick(&mut rng, keys.len())];
                        let mut ingress = snapshot.ingresses.get(key).unwrap().clone();
                        mutate(&mut ingress, &mut rng, &services, &secrets);
                        snapshot.insert(weir::snapshot::Object::Ingress(Box::new(ingress)));
                        mutated += 1;
                    }
                }
            }
            let changed = snapshot.changes_since(&before);
            let what = format!("config {n}, step {step}: {changed:?}");
            incremental += usize::from(update_and_check(&mut translator, &snapshot, &changed, config, &what));
        }
        assert!(mutated > 50, "only {mutated} mutations");
        assert!(incremental > 200, "only {incremental} of 400 updates were incremental");
    }
}

/// One random change to a ConfigMap: a header of its own added or removed, or a settings key
/// (an `ssl-redirect` default, the `add-headers` ConfigMap) set or unset.
fn mutate_config_map(cm: &mut k8s_openapi::api::core::v1::ConfigMap, rng: &mut Rng) {
    const DATA: &[(&str, &str)] = &[
        ("X-Extra", "1"),
        ("X-Frame-Options", "SAMEORIGIN"),
        ("ssl-redirect", "false"),
        ("add-headers", "default/security-headers"),
        ("global-allowed-response-headers", "X-Extra"),
    ];
    let (key, value) = DATA[usize::try_from(rng.next() % DATA.len() as u64).unwrap()];
    let data = cm.data.get_or_insert_with(Default::default);
    if data.remove(key).is_none() {
        data.insert(key.to_string(), value.to_string());
    }
}

/// One random change to an Ingress, among those that tie Ingresses together.
fn mutate(
    ingress: &mut k8s_openapi::api::networking::v1::Ingress,
    rng: &mut Rng,
    services: &[String],
    secrets: &[String],
) {
    use k8s_openapi::api::networking::v1::{
        IngressBackend, IngressServiceBackend, IngressTLS, ServiceBackendPort,
    };
    const HOSTS: &[&str] = &[
        "a.example.com",
        "b.example.com",
        "*.example.com",
        "",
        "x.test",
        "app.example.com",
        "www.a.example.com",
        "example.com",
        "www.example.com",
    ];
    const ANNOTATIONS: &[(&str, &str)] = &[
        ("nginx.ingress.kubernetes.io/canary", "true"),
        ("nginx.ingress.kubernetes.io/canary-weight", "30"),
        ("nginx.ingress.kubernetes.io/server-alias", "b.example.com"),
        ("nginx.ingress.kubernetes.io/server-alias", "alias.example.com"),
        ("nginx.ingress.kubernetes.io/use-regex", "true"),
        ("nginx.ingress.kubernetes.io/ssl-redirect", "false"),
        ("nginx.ingress.kubernetes.io/force-ssl-redirect", "true"),
        ("nginx.ingress.kubernetes.io/ssl-passthrough", "true"),
        ("nginx.ingress.kubernetes.io/custom-http-errors", "404,503"),
        ("nginx.ingress.kubernetes.io/default-backend", "web"),
        ("nginx.ingress.kubernetes.io/backend-protocol", "HTTPS"),
        ("kubernetes.io/ingress.class", "weir"),
        ("nginx.ingress.kubernetes.io/from-to-www-redirect", "true"),
        ("nginx.ingress.kubernetes.io/custom-headers", "security-headers"),
        ("nginx.ingress.kubernetes.io/custom-headers", "default/security-headers"),
        ("nginx.ingress.kubernetes.io/service-upstream", "true"),
    ];
    let pick = |rng: &mut Rng, len: usize| usize::try_from(rng.next() % len.max(1) as u64).unwrap();
    let spec = ingress.spec.get_or_insert_with(Default::default);
    let backend = |name: &str| IngressBackend {
        service: Some(IngressServiceBackend {
            name: name.to_string(),
            port: Some(ServiceBackendPort { number: Some(80), name: None }),
        }),
        resource: None,
    };
    match rng.next() % 9 {
        0 => {
            if let Some(rule) = spec.rules.as_mut().and_then(|r| r.first_mut()) {
                let host = HOSTS[pick(rng, HOSTS.len())];
                rule.host = (!host.is_empty()).then(|| host.to_string());
            }
        }
        1 | 2 => {
            let (key, value) = ANNOTATIONS[pick(rng, ANNOTATIONS.len())];
            let annotations = ingress.metadata.annotations.get_or_insert_with(Default::default);
            if annotations.remove(key).is_none() {
                annotations.insert(key.to_string(), value.to_string());
            }
        }
        3 => {
            let host = HOSTS[pick(rng, HOSTS.len())];
            let secret = (!secrets.is_empty()).then(|| secrets[pick(rng, secrets.len())].clone());
            spec.tls = match rng.next() % 3 {
                0 => None,
                1 => Some(vec![IngressTLS { hosts: None, secret_name: secret }]),
                _ => Some(vec![IngressTLS { hosts: Some(vec![host.to_string()]), secret_name: secret }]),
            };
        }
        4 => {
            if spec.rules.take().is_none() {
                spec.rules = Some(vec![Default::default()]);
            }
        }
        5 => {
            spec.default_backend = match spec.default_backend {
                Some(_) => None,
                None if !services.is_empty() => Some(backend(&services[pick(rng, services.len())])),
                None => None,
            };
        }
        6 => {
            let path = spec
                .rules
                .as_mut()
                .and_then(|r| r.first_mut())
                .and_then(|r| r.http.as_mut())
                .and_then(|h| h.paths.first_mut());
            if let Some(path) = path
                && !services.is_empty()
            {
                path.backend = backend(&services[pick(rng, services.len())]);
            }
        }
        7 => {
            spec.ingress_class_name = match spec.ingress_class_name {
                Some(_) => None,
                None => Some(["weir", "nginx", "public"][pick(rng, 3)].to_string()),
            };
        }
        _ => {
            let day = 1 + rng.next() % 28;
            ingress.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                format!("2024-01-{day:02}T00:00:00Z").parse().unwrap(),
            ));
        }
    }
}
