//! Golden tests of the node plan: `tests/node_fixtures/<case>/input.yaml` (Services, slices,
//! Endpoints) and optional `config.yaml` (a `PlanConfig`; the node is `node-a` otherwise) are
//! planned and compared, as YAML, with `expected.yaml`; the iptables and nftables renderings
//! (IPv4, `--cluster-cidr 10.244.0.0/16`) with `iptables.expected` and `nftables.expected`, and
//! ipvs mode's netlink messages, ipsets and iptables chains with `ipvs.expected`.
//! `WEIR_BLESS=1` rewrites the expected files; read them before committing.

// Test helpers outside `#[test]` functions: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used)]

mod support_diff;
use support_diff::diff;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use weir::node::plan::IpFamily;
use weir::node::plan::{PlanConfig, Ruleset, plan};
use weir::node::{iptables, nftables};
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node_fixtures");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("input.yaml").is_file())
        .collect();
    cases.sort();
    cases
}

fn config(case: &Path) -> PlanConfig {
    match std::fs::read_to_string(case.join("config.yaml")) {
        Ok(text) => {
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}/config.yaml: {e}", case.display()))
        }
        Err(_) => PlanConfig { node_name: Some("node-a".into()) },
    }
}

fn run(case: &Path, input: &str, config: &PlanConfig) -> Ruleset {
    let objects = parse_manifests(input).unwrap_or_else(|e| panic!("{}/input.yaml: {e}", case.display()));
    let snapshot: Snapshot = objects.into_iter().collect();
    plan(&snapshot, config)
}

fn render(ruleset: &Ruleset) -> String {
    serde_saphyr::to_string(ruleset).unwrap()
}

/// The full `iptables-restore` input for the IPv4 entries, with `--cluster-cidr 10.244.0.0/16`.
fn render_iptables(ruleset: &Ruleset) -> String {
    let config =
        iptables::Config { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..Default::default() };
    let tables = iptables::render(ruleset, &config);
    iptables::restore_text(None, &tables, &iptables::Tables::default()).unwrap()
}

/// The full `nft -f` transaction for the IPv4 entries, with `--cluster-cidr 10.244.0.0/16`.
fn render_nftables(ruleset: &Ruleset) -> String {
    let config =
        nftables::Config { cluster_cidr: Some("10.244.0.0/16".parse().unwrap()), ..Default::default() };
    nftables::transaction(IpFamily::IPv4, None, &nftables::render(ruleset, &config)).unwrap()
}

/// ipvs mode for every entry (`--ipvs-scheduler rr`, node addresses 192.0.2.1 and
/// 2001:db8::1, `--cluster-cidr 10.244.0.0/16`): the IPVS netlink messages that create it from
/// nothing, each as the hex of its wire form (family id 0x1d, sequence numbers from 1) and
/// decoded back from those bytes; then the `ipset restore` input and the iptables chains.
fn render_ipvs(ruleset: &Ruleset) -> String {
    use weir::node::{ipvs, netlink};
    let config = ipvs::Config {
        scheduler: ipvs::Scheduler::Rr,
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        masquerade_all: false,
    };
    let node_ips = ["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
    let state = ipvs::render(ruleset, &config, &node_ips);
    let mut out = String::from("# netlink (IPVS family id 0x1d)\n");
    let none = Default::default();
    for (seq, msg) in (1..).zip(ipvs::messages(&none, &state.services)) {
        let bytes = netlink::encode(&msg, 0x1d, seq);
        let frames = netlink::decode(&bytes, &ipvs::schema).unwrap();
        let [netlink::Frame::Message(decoded)] = frames.as_slice() else { panic!("{frames:?}") };
        assert_eq!(decoded.message, msg, "the encoding does not decode back");
        writeln!(out, "{}\n  {}", ipvs::describe(&decoded.message), netlink::hex(&bytes)).unwrap();
    }
    out += "# addresses on weir-ipvs0\n";
    for ip in &state.addresses {
        writeln!(out, "{ip}").unwrap();
    }
    out += "# ipset restore\n";
    out += &ipvs::ipset_text(None, &state.sets);
    out += "# iptables-restore\n";
    out +=
        &iptables::restore_text(None, &ipvs::tables(ruleset, &config), &iptables::Tables::default()).unwrap();
    out
}

#[test]
fn golden() {
    let bless = std::env::var_os("WEIR_BLESS").is_some_and(|v| v == "1");
    let cases = fixtures();
    assert!(cases.len() >= 12, "expected at least 12 node fixtures, found {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let ruleset = run(case, &input, &config(case));
        let outputs = [
            ("expected.yaml", render(&ruleset)),
            ("iptables.expected", render_iptables(&ruleset)),
            ("nftables.expected", render_nftables(&ruleset)),
            ("ipvs.expected", render_ipvs(&ruleset)),
        ];
        for (file, actual) in outputs {
            let expected_path = case.join(file);
            if bless {
                std::fs::write(&expected_path, &actual).unwrap();
                continue;
            }
            let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
            if expected != actual {
                failures.push(format!(
                    "=== {}/{file} (- expected, + actual)\n{}",
                    case.file_name().unwrap().to_string_lossy(),
                    diff(&expected, &actual)
                ));
            }
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
fn plan_does_not_depend_on_input_order() {
    for case in fixtures() {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let config = config(&case);
        let reference = run(&case, &input, &config);
        let mut docs = documents(&input);
        for _ in 0..docs.len() {
            docs.rotate_left(1);
            docs.reverse();
            let ruleset = run(&case, &docs.join("---\n"), &config);
            assert_eq!(
                ruleset,
                reference,
                "{}:\n{}",
                case.display(),
                diff(&render(&reference), &render(&ruleset))
            );
        }
    }
}

#[test]
fn ruleset_round_trips_through_yaml() {
    for case in fixtures() {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let ruleset = run(&case, &input, &config(&case));
        let back: Ruleset = serde_saphyr::from_str(&render(&ruleset)).unwrap();
        assert_eq!(back, ruleset, "{}", case.display());
    }
}

/// Names reach `iptables-restore` and `nft` input (rule comments) and ipset names: a newline or
/// a quote in a Service, namespace or port name must never reach them. A manifest directory is
/// not the API server, so such objects are skipped with a warning; the valid ones still render.
#[test]
fn names_with_newlines_and_quotes_never_reach_the_rule_text() {
    let service = |namespace: &str, name: &str, port_name: &str, ip: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: {port_name}, port: 80, targetPort: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s-{ip}, namespace: {namespace}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: {port_name}, port: 8080}}]\nendpoints: [{{addresses: [10.244.0.9]}}]\n---\n"
        )
    };
    let injections = [
        // A newline that would start a rule of its own, in each name.
        service("default", r#""web\n-A INPUT -j ACCEPT""#, "http", "10.96.20.1"),
        service(r#""default\n-A INPUT -j ACCEPT""#, "web", "http", "10.96.20.2"),
        service("default", "ports", r#""http\n-A INPUT -j ACCEPT""#, "10.96.20.3"),
        // A quote that would end the comment.
        service("default", r#"'web" -j ACCEPT #'"#, "http", "10.96.20.4"),
        service("default", "quoted", r#"'h"p'"#, "10.96.20.5"),
        // nft's own quoting and statement separator.
        service("default", r#""web; flush ruleset""#, "http", "10.96.20.6"),
    ];
    let input = injections.concat() + &service("default", "good", "http", "10.96.20.9");
    let objects = parse_manifests(&input).unwrap();
    let snapshot: Snapshot = objects.into_iter().collect();
    let ruleset = plan(&snapshot, &PlanConfig { node_name: None });
    // Only the valid Service is planned; each invalid one is reported.
    let planned: Vec<String> = ruleset.services.iter().map(|sp| sp.key.to_string()).collect();
    assert_eq!(planned, ["default/good:http/tcp"], "{planned:?}");
    assert_eq!(ruleset.warnings.len(), injections.len(), "{:?}", ruleset.warnings);
    let texts = [render_iptables(&ruleset), render_nftables(&ruleset), render_ipvs(&ruleset)];
    for text in &texts[..2] {
        assert!(text.contains("\"default/good:http"), "the comment names the Service:\n{text}");
    }
    for text in &texts {
        // The valid Service renders (ipvs mode names no Service: its address stands for it);
        // none of the invalid ones does.
        assert!(text.contains("10.96.20.9"), "the valid Service renders:\n{text}");
        for i in 1..=6 {
            assert!(!text.contains(&format!("10.96.20.{i}")), "an invalid Service rendered:\n{text}");
        }
        for bad in ["-A INPUT -j ACCEPT", "ACCEPT #", "flush ruleset", "h\"p", "web\""] {
            assert!(!text.contains(bad), "{bad:?} reached the rule text:\n{text}");
        }
        // Every line is a rule, a chain, a table or a set line of weir's own making.
        for line in text.lines() {
            assert!(!line.starts_with("-A INPUT"), "{line}");
        }
    }
}
