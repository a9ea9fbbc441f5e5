//! The Helm chart `charts/weir`: `helm lint --strict`; every values set under `charts/weir/ci/`
//! (and the defaults) rendered and validated strictly against the Kubernetes OpenAPI schemas
//! (kubernetes-validate); the values schema refusing typos; `examples/kubernetes/` being the
//! chart's rendering; and `helm install` / `upgrade` / `uninstall` against the real
//! kube-apiserver, with `weir serve` run exactly as the rendered Deployment runs it, as the
//! chart's ServiceAccount.
//!
//! Helm (`/var/cache/weir/helm/bin/helm`, or `WEIR_HELM`) and kubernetes-validate
//! (`/var/cache/weir/kubernetes-validate`, or `WEIR_KUBERNETES_VALIDATE`) are installed by
//! `scripts/test.sh install`. Without them a test is skipped with a printed reason, or fails
//! when `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

mod support_kube;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser as _;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::Value;
use support_kube::{
    ApiServer, Echo, apply, create_namespace, endpoints, eventually, http_get, ingress, isolated, service,
};

// === tools ===

fn require_all() -> bool {
    std::env::var("WEIR_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/weir")
}

fn helm_path() -> PathBuf {
    std::env::var_os("WEIR_HELM").map(PathBuf::from).unwrap_or_else(|| "/var/cache/weir/helm/bin/helm".into())
}

fn validate_path() -> PathBuf {
    std::env::var_os("WEIR_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/weir/kubernetes-validate/bin/kubernetes-validate".into())
}

/// True (with the reason printed) when one of `tools` is missing; panics instead under
/// `WEIR_REQUIRE_ALL=1`.
fn skip(tools: &[PathBuf]) -> bool {
    for tool in tools {
        if !tool.is_file() {
            let reason = format!("{} missing: run scripts/test.sh install (as root)", tool.display());
            assert!(!require_all(), "cannot run the chart tests and WEIR_REQUIRE_ALL=1: {reason}");
            eprintln!("SKIPPED: {reason}");
            return true;
        }
    }
    false
}

/// Helm with its own configuration, cache and data directories (nothing under $HOME).
struct Helm {
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    fn new() -> Helm {
        Helm { home: tempfile::tempdir().unwrap(), kubeconfig: None }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(helm_path());
        for (var, dir) in
            [("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"), ("HELM_DATA_HOME", "data")]
        {
            cmd.env(var, self.home.path().join(dir));
        }
        match &self.kubeconfig {
            Some(path) => cmd.env("KUBECONFIG", path),
            None => cmd.env_remove("KUBECONFIG"),
        };
        cmd.stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    /// Runs helm, failing the test with its output when it fails; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `helm template weir charts/weir -n weir-system ARGS`.
    fn template(&self, args: &[&str]) -> String {
        let chart = chart();
        let mut all = vec!["template", "weir", chart.to_str().unwrap(), "--namespace", "weir-system"];
        all.extend_from_slice(args);
        self.ok(&all)
    }
}

/// The documents of a multi-document YAML stream (empty ones left out).
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .map(|doc| doc.trim_start_matches("---"))
        .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("{e}:\n{doc}")))
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendering"))
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| format!("{}/{}", d["apiVersion"].as_str().unwrap(), d["kind"].as_str().unwrap()))
        .collect()
}

/// The values sets under charts/weir/ci, by file name.
fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The container of the controller workload in a rendering.
fn controller_container(docs: &[Value]) -> Value {
    let workload = docs
        .iter()
        .find(|d| {
            (d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
                && d["metadata"]["name"] == "weir-controller"
        })
        .expect("the controller workload");
    let [container] = workload["spec"]["template"]["spec"]["containers"].as_array().unwrap().as_slice()
    else {
        panic!("one container expected: {workload}")
    };
    container.clone()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

/// Kubernetes' `$(VAR)` expansion of container args (`$$` escapes a `$`).
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("$$") {
            out.push('$');
            rest = t;
        } else if let Some((name, after)) = tail.strip_prefix("$(").and_then(|t| t.split_once(')'))
            && let Some(value) = env.get(name)
        {
            out.push_str(value);
            rest = after;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The container's environment as the kubelet gives it to a pod `pod` in `namespace` with IP
/// `ip` (downward API fields; literal values).
fn container_env(container: &Value, pod: &str, namespace: &str, ip: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = var["value"].as_str() {
            v.to_string()
        } else {
            match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => pod.to_string(),
                Some("metadata.namespace") => namespace.to_string(),
                Some("status.podIP") => ip.to_string(),
                Some("spec.nodeName") => "node-1".to_string(),
                other => panic!("environment variable {name}: {other:?} is not emulated by this test"),
            }
        };
        let value = expand(&value, &env);
        env.insert(name, value);
    }
    env
}

// === rendering ===

/// The chart's appVersion (the image tag it runs by default) is weir's version.
#[test]
fn app_version_is_weirs() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let chart: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"), "charts/weir/Chart.yaml appVersion");
    assert_eq!(chart["apiVersion"], "v2");
}

/// `helm lint --strict` passes with the default values and with every CI values set.
#[test]
fn helm_lint_strict() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let chart = chart();
    helm.ok(&["lint", "--strict", chart.to_str().unwrap()]);
    for values in ci_values() {
        helm.ok(&["lint", "--strict", chart.to_str().unwrap(), "--values", values.to_str().unwrap()]);
    }
}

/// The defaults and each CI values set render manifests that the Kubernetes OpenAPI schemas
/// accept strictly (no unknown field anywhere), and the sets render what they are about.
#[test]
fn rendered_manifests_validate_strictly() {
    if skip(&[helm_path(), validate_path()]) {
        return;
    }
    let helm = Helm::new();
    let dir = tempfile::tempdir().unwrap();
    let mut sets: Vec<(String, Vec<String>)> = vec![("default".into(), vec![])];
    for values in ci_values() {
        let name = values.file_stem().unwrap().to_str().unwrap().to_string();
        sets.push((name, vec!["--values".into(), values.to_str().unwrap().into()]));
    }
    let names: BTreeSet<&str> = sets.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "daemonset-hostnetwork-values",
        "replicas-pdb-hpa-values",
        "metrics-servicemonitor-values",
        "node-values",
        "ingress-nginx-values",
    ] {
        assert!(names.contains(expected), "charts/weir/ci/{expected}.yaml is missing");
    }
    let mut rendered = BTreeMap::new();
    for (name, args) in &sets {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let yaml = helm.template(&args);
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, &yaml).unwrap();
        let out = Command::new(validate_path()).args(["--strict", "--quiet"]).arg(&path).output().unwrap();
        let report =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{name}: the rendering does not validate strictly:\n{report}\n{yaml}");
        // The only kinds without a schema are the Prometheus Operator's.
        for line in report.lines().filter(|l| l.contains("Couldn't find schema")) {
            assert!(line.contains("monitoring.coreos.com/v1"), "{name}: {line}");
        }
        let docs = documents(&yaml);
        // Every object is weir's and lives in the release namespace (or is cluster-scoped).
        for doc in &docs {
            assert_eq!(doc["metadata"]["labels"]["app.kubernetes.io/instance"], "weir", "{doc}");
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                assert_eq!(ns, "weir-system", "{doc}");
            }
        }
        rendered.insert(name.clone(), docs);
    }

    // Defaults: a Deployment behind a LoadBalancer Service, hardened, probes on the admin port.
    let docs = &rendered["default"];
    let c = controller_container(docs);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["runAsUser"], 65532);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["NET_BIND_SERVICE"]));
    let pod = &find(docs, "Deployment", "weir-controller")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["lifecycle"]["preStop"]["sleep"]["seconds"], 5);
    let svc = find(docs, "Service", "weir-controller");
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    let ports: Vec<(i64, &str)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["port"].as_i64().unwrap(), p["targetPort"].as_str().unwrap()))
        .collect();
    assert_eq!(ports, [(80, "http"), (443, "https")]);
    let container_ports: BTreeMap<&str, i64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_i64().unwrap()))
        .collect();
    assert_eq!(container_ports, BTreeMap::from([("http", 8080), ("https", 8443), ("metrics", 10254)]));
    assert_eq!(
        c["image"],
        format!("weir:{}", env!("CARGO_PKG_VERSION")),
        "the tag defaults to the appVersion"
    );
    let class = find(docs, "IngressClass", "weir");
    assert_eq!(class["spec"]["controller"], "weir.dev/ingress-controller");
    assert!(
        !kinds(docs)
            .iter()
            .any(|k| k.ends_with("/PodDisruptionBudget") || k.ends_with("/HorizontalPodAutoscaler"))
    );
    assert!(!docs.iter().any(|d| d["kind"] == "DaemonSet"), "no node module by default");

    // DaemonSet on the host network, on 80/443 with NET_BIND_SERVICE only (and still 65532).
    let docs = &rendered["daemonset-hostnetwork-values"];
    let ds = find(docs, "DaemonSet", "weir-controller");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(ds["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    let c = controller_container(docs);
    assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["NET_BIND_SERVICE"]));
    assert_eq!(c["securityContext"]["runAsUser"], 65532);
    assert!(strings(&c["args"]).contains(&"--listen-http=0.0.0.0:80".to_string()));
    assert!(!kinds(docs).iter().any(|k| k.ends_with("/PodDisruptionBudget")), "no PDB for a DaemonSet");

    // Replicas: PDB and HPA, GA versions on a current cluster.
    let docs = &rendered["replicas-pdb-hpa-values"];
    assert_eq!(find(docs, "PodDisruptionBudget", "weir-controller")["apiVersion"], "policy/v1");
    assert_eq!(find(docs, "PodDisruptionBudget", "weir-controller")["spec"]["maxUnavailable"], 1);
    let hpa = find(docs, "HorizontalPodAutoscaler", "weir-controller");
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["maxReplicas"], 10);
    assert!(
        find(docs, "Deployment", "weir-controller")["spec"]["replicas"].is_null(),
        "the HPA owns replicas"
    );

    // Metrics: a Service, a ServiceMonitor and a PrometheusRule.
    let docs = &rendered["metrics-servicemonitor-values"];
    assert_eq!(find(docs, "Service", "weir-controller-metrics")["spec"]["ports"][0]["port"], 10254);
    let monitor = find(docs, "ServiceMonitor", "weir-controller");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let rule = find(docs, "PrometheusRule", "weir-controller");
    assert_eq!(rule["spec"]["groups"][0]["rules"][0]["alert"], "WeirTranslationWarnings");
    assert!(!rendered["default"].iter().any(|d| d["apiVersion"] == "monitoring.coreos.com/v1"));

    // The node module.
    let docs = &rendered["node-values"];
    let node = find(docs, "DaemonSet", "weir-node");
    let [nc] = node["spec"]["template"]["spec"]["containers"].as_array().unwrap().as_slice() else {
        panic!()
    };
    assert!(strings(&nc["args"]).contains(&"--mode=nftables".to_string()));
    assert_eq!(node["spec"]["template"]["spec"]["serviceAccountName"], "weir-node");

    // The migrating user's class and settings.
    let docs = &rendered["ingress-nginx-values"];
    assert_eq!(
        find(docs, "IngressClass", "nginx")["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"],
        "true"
    );
    let settings = find(docs, "ConfigMap", "weir-controller");
    assert_eq!(settings["data"]["proxy-body-size"], "16m");
    assert_eq!(settings["data"]["hsts"], "true");
    assert_eq!(settings["data"]["keep-alive"], "75");
    let args = strings(&controller_container(docs)["args"]);
    for arg in [
        "--ingress-class=nginx",
        "--controller-name=k8s.io/ingress-nginx",
        "--watch-ingress-without-class",
        "--election-id=ingress-nginx-leader",
    ] {
        assert!(args.contains(&arg.to_string()), "{arg} missing from {args:?}");
    }
    assert_eq!(find(docs, "Lease", "ingress-nginx-leader")["apiVersion"], "coordination.k8s.io/v1");
}

/// The controller's rendered arguments are ones `weir` accepts, for every values set.
#[test]
fn rendered_arguments_parse() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let mut sets = vec![vec![]];
    for values in ci_values() {
        sets.push(vec!["--values".to_string(), values.to_str().unwrap().to_string()]);
    }
    sets.push(vec!["--set".into(), "controller.service.ipFamilies={IPv6}".into()]);
    for set in sets {
        let args: Vec<&str> = set.iter().map(String::as_str).collect();
        let docs = documents(&helm.template(&args));
        let containers = docs
            .iter()
            .filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
            .map(|d| d["spec"]["template"]["spec"]["containers"][0].clone());
        for c in containers {
            let env = container_env(
                &c,
                "weir-0",
                "weir-system",
                if set.iter().any(|s| s.contains("IPv6")) { "fd00::5" } else { "10.244.0.5" },
            );
            let mut argv = vec!["weir".to_string()];
            argv.extend(strings(&c["args"]).iter().map(|a| expand(a, &env)));
            if let Err(e) = weir::cli::Cli::try_parse_from(&argv) {
                panic!("{set:?}: {argv:?}: {e}");
            }
        }
    }
}

/// The PDB and HPA API versions follow the cluster: GA where served, beta on older clusters.
#[test]
fn api_versions_follow_the_cluster() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let values = chart().join("ci/replicas-pdb-hpa-values.yaml");
    let values = values.to_str().unwrap();
    let versions = |extra: &[&str]| -> BTreeSet<String> {
        let mut args = vec!["--values", values];
        args.extend_from_slice(extra);
        kinds(&documents(&helm.template(&args)))
            .into_iter()
            .filter(|k| k.ends_with("/PodDisruptionBudget") || k.ends_with("/HorizontalPodAutoscaler"))
            .collect()
    };
    let ga: BTreeSet<String> =
        ["policy/v1/PodDisruptionBudget", "autoscaling/v2/HorizontalPodAutoscaler"].map(String::from).into();
    let beta: BTreeSet<String> =
        ["policy/v1beta1/PodDisruptionBudget", "autoscaling/v2beta2/HorizontalPodAutoscaler"]
            .map(String::from)
            .into();
    assert_eq!(versions(&[]), ga);
    assert_eq!(versions(&["--kube-version", "1.20.0"]), beta);
    assert_eq!(
        versions(&[
            "--kube-version",
            "1.20.0",
            "--api-versions",
            "policy/v1/PodDisruptionBudget",
            "--api-versions",
            "autoscaling/v2/HorizontalPodAutoscaler"
        ]),
        ga
    );
    // Kubernetes 1.21/1.22 serve policy/v1 but not autoscaling/v2.
    assert_eq!(
        versions(&["--kube-version", "1.22.0"]),
        ["policy/v1/PodDisruptionBudget", "autoscaling/v2beta2/HorizontalPodAutoscaler"]
            .map(String::from)
            .into()
    );
}

/// A typo or a wrong type in a values file fails with a message naming it; ingress-nginx keys
/// weir does not need are accepted.
#[test]
fn the_schema_refuses_typos() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let chart = chart();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("controller:\n  replicaCont: 2\n", "replicaCont"),
        ("controller:\n  service:\n    tpye: NodePort\n", "tpye"),
        ("contoller:\n  kind: DaemonSet\n", "contoller"),
        ("controller:\n  replicaCount: two\n", "replicaCount"),
        ("controller:\n  kind: StatefulSet\n", "kind"),
        ("node:\n  mode: kernelspace\n", "mode"),
        ("controller:\n  config:\n    proxy-body-size: [1m]\n", "proxy-body-size"),
        ("controller:\n  extraArgs:\n    ingress-class: other\n", "ingress-class"),
        ("controller:\n  service:\n    ports:\n      http: 70000\n", "http"),
    ];
    for (i, (values, key)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("typo-{i}.yaml"));
        std::fs::write(&path, values).unwrap();
        let out =
            helm.run(&["template", "weir", chart.to_str().unwrap(), "--values", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{values:?} was accepted");
        assert!(stderr.contains("schema") && stderr.contains(key), "{values:?}: unclear error:\n{stderr}");
    }
    // Every ignored key is accepted, whatever its value.
    let ignored = ignored_keys();
    let mut values = serde_json::Map::new();
    for key in ignored.keys() {
        let mut node = &mut values;
        let parts: Vec<&str> = key.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            node = node
                .entry(part.to_string())
                .or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
                .unwrap();
        }
        node.insert(parts[parts.len() - 1].to_string(), serde_json::json!({"enabled": true}));
    }
    let path = dir.path().join("ignored.yaml");
    std::fs::write(&path, serde_json::to_string(&values).unwrap()).unwrap();
    helm.ok(&["template", "weir", chart.to_str().unwrap(), "--values", path.to_str().unwrap()]);
}

/// The ingress-nginx keys the chart accepts and ignores, with the reason NOTES.txt gives
/// (the `weir.ignoredKeys` list of _helpers.tpl).
fn ignored_keys() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(chart().join("templates/_helpers.tpl")).unwrap();
    let start = text.find("{{- define \"weir.ignoredKeys\" -}}").unwrap();
    let body = &text[start..];
    let body = &body[body.find('\n').unwrap() + 1..body.find("{{- end -}}").unwrap()];
    body.lines()
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The schema declares exactly the ignored keys NOTES.txt knows, and docs/chart.md names each.
#[test]
fn schema_notes_and_doc_agree_on_ignored_keys() {
    fn walk(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
        for (key, sub) in schema["properties"].as_object().into_iter().flatten() {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            if sub["description"]
                .as_str()
                .is_some_and(|d| d.starts_with("ingress-nginx chart key, accepted and ignored"))
            {
                out.insert(path.clone());
            }
            walk(sub, &path, out);
        }
    }
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap()).unwrap();
    let mut declared = BTreeSet::new();
    walk(&schema, "", &mut declared);
    let listed: BTreeSet<String> = ignored_keys().into_keys().collect();
    assert_eq!(declared, listed, "values.schema.json and _helpers.tpl's weir.ignoredKeys differ");
    let doc = std::fs::read_to_string(repo().join("docs/chart.md")).unwrap();
    for key in &listed {
        assert!(doc.contains(&format!("`{key}`")), "docs/chart.md does not name `{key}`");
    }
    // The schema is closed: every object it describes with properties refuses unknown keys,
    // except Kubernetes objects passed through.
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["controller"]["additionalProperties"], false);
}

/// One source of truth: `examples/kubernetes/rbac.yaml` (weir serve's ServiceAccount and
/// rules), `node-rbac.yaml` and `node-daemonset.yaml` (weir node) are the chart's rendering,
/// with a header and the Namespace. `WEIR_BLESS=1` rewrites them.
#[test]
fn examples_are_rendered_from_the_chart() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: weir-system\n";
    let generated = "# Generated from charts/weir (WEIR_BLESS=1 cargo test -p weir --test chart examples): edit\n\
                     # the chart, not this file.\n";
    let split = |text: &str| -> Vec<String> {
        text.split("\n---\n").map(|d| d.trim_start_matches("---\n").trim_end().to_string() + "\n").collect()
    };
    let serve = helm.template(&[
        "--show-only",
        "templates/serviceaccount.yaml",
        "--show-only",
        "templates/rbac.yaml",
        "--set",
        "image.tag=dev",
    ]);
    let node = helm.template(&[
        "--show-only",
        "templates/node.yaml",
        "--set",
        "node.enabled=true",
        "--set",
        "node.mode=iptables",
        "--set",
        "node.clusterCIDR=10.244.0.0/16",
        "--set",
        "image.tag=dev",
    ]);
    let node_docs = split(&node);
    let (daemonset, node_rbac): (Vec<String>, Vec<String>) =
        node_docs.into_iter().partition(|d| d.lines().any(|l| l == "kind: DaemonSet"));
    let files = [
        (
            "rbac.yaml",
            format!(
                "# Least privileges of `weir serve` reading the Kubernetes API, for the ServiceAccount\n\
                 # weir-system/weir. Checked by controller/tests/kube_e2e.rs (rbac_is_sufficient) and\n\
                 # controller/tests/chart.rs (helm_install_upgrade_uninstall), which run weir with a token of\n\
                 # exactly this ServiceAccount.\n{generated}{namespace}---\n{}",
                split(&serve).join("---\n")
            ),
        ),
        (
            "node-rbac.yaml",
            format!(
                "# Least privileges of `weir node` (the in-tree kube-proxy, one per node) reading the\n\
                 # Kubernetes API, for the ServiceAccount weir-system/weir-node: read Services and their\n\
                 # endpoints, nothing else. Checked by controller/tests/node_kube.rs\n\
                 # (weir_node_follows_the_api), which runs weir node with a token of this ServiceAccount.\n\
                 {generated}{namespace}---\n{}",
                node_rbac.join("---\n")
            ),
        ),
        (
            "node-daemonset.yaml",
            format!(
                "# `weir node` on every node (the chart's node.enabled=true, node.mode=iptables). Apply\n\
                 # node-rbac.yaml first. iptables mode needs an image with the weir binary plus iptables (the\n\
                 # host's backend, legacy or nft), conntrack, ipset and iproute2; nftables mode needs only conntrack.\n\
                 {generated}{}",
                daemonset.join("---\n")
            ),
        ),
    ];
    let dir = repo().join("examples/kubernetes");
    let bless = std::env::var("WEIR_BLESS").is_ok_and(|v| v == "1");
    for (file, text) in files {
        let path = dir.join(file);
        if bless {
            std::fs::write(&path, &text).unwrap();
        }
        let found = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            found == text,
            "examples/kubernetes/{file} differs from the chart's rendering (WEIR_BLESS=1 rewrites it):\n{text}"
        );
    }
}

// === helm install against the API server ===

/// `weir serve` started exactly as the rendered container: its args and env (the downward API
/// emulated, `$(VAR)` expanded as the kubelet does), and nothing else but KUBECONFIG, standing in
/// for the in-cluster configuration (the ServiceAccount token and CA a pod has mounted).
struct Pod {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Pod {
    fn start(container: &Value, env: &BTreeMap<String, String>, kubeconfig: &Path) -> Pod {
        let weir = env!("CARGO_BIN_EXE_weir");
        let args: Vec<String> = strings(&container["args"]).iter().map(|a| expand(a, env)).collect();
        assert!(container["command"].is_null(), "the image's entrypoint (weir) runs the args");
        let mut child = Command::new(weir)
            .args(&args)
            .env_clear()
            .envs(env)
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Pod { child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn terminate(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of a POST announcing a body of `len` bytes it never sends: a refusal (413) comes
/// at once; a forwarded request waits for the body (`None` after a second).
fn declared_body(addr: SocketAddr, host: &str, len: usize) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(s, "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace().nth(1)?.parse().ok()
}

fn container_port(container: &Value, name: &str) -> u16 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}")) as u16
}

/// `(apiVersion, kind, namespace, name)` of every object of a manifest.
fn objects(docs: &[Value]) -> Vec<(String, String, Option<String>, String)> {
    docs.iter()
        .map(|d| {
            (
                d["apiVersion"].as_str().unwrap().to_string(),
                d["kind"].as_str().unwrap().to_string(),
                d["metadata"]["namespace"].as_str().map(str::to_string),
                d["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn exists(
    client: &kube::Client,
    (api_version, kind, ns, name): &(String, String, Option<String>, String),
) -> bool {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match api.get_opt(name).await {
        Ok(found) => found.is_some(),
        Err(e) => panic!("{kind} {name}: {e}"),
    }
}

/// `helm install` into the real API server; `weir serve` run with exactly the rendered
/// Deployment's arguments and environment, as the chart's ServiceAccount, serves an Ingress of
/// the chart's class and writes its status; `helm upgrade` with another `controller.config`
/// reloads the settings without a restart and without rolling the Deployment; `helm uninstall`
/// leaves none of the release's objects behind.
#[test]
fn helm_install_upgrade_uninstall() {
    if skip(&[helm_path()]) {
        return;
    }
    isolated("helm_install_upgrade_uninstall", || async {
        let api = ApiServer::start().await;
        let admin = api.client().await;
        let mut helm = Helm::new();
        helm.kubeconfig = Some(api.kubeconfig.clone());
        let chart = chart();
        let chart = chart.to_str().unwrap();
        let ns = "weir-system";

        // A migrating user's values file installs; NOTES lists what it ignores (dry run).
        let migrating = std::path::Path::new(chart).join("ci/ingress-nginx-values.yaml");
        let out = helm.ok(&[
            "install",
            "migrate",
            chart,
            "-n",
            "migrate",
            "--dry-run",
            "--values",
            migrating.to_str().unwrap(),
        ]);
        let notes = &out[out.find("NOTES:").expect("NOTES")..];
        for key in [
            "controller.admissionWebhooks",
            "controller.allowSnippetAnnotations",
            "defaultBackend",
            "controller.lifecycle",
        ] {
            assert!(notes.contains(&format!("  - {key}: ")), "NOTES does not list {key}:\n{notes}");
        }
        assert!(
            !notes.contains("controller.opentelemetry"),
            "NOTES lists a key the file does not set:\n{notes}"
        );

        // Install with two replicas and autoscaling: the PDB and HPA in the versions the API
        // server serves (1.20 here: policy/v1beta1 and autoscaling/v2beta2).
        let out = helm.ok(&[
            "install",
            "weir",
            chart,
            "-n",
            ns,
            "--create-namespace",
            "--set",
            "controller.replicaCount=2",
            "--set",
            "controller.autoscaling.enabled=true",
            "--set-string",
            "controller.config.proxy-body-size=8m",
        ]);
        assert!(out.contains("IngressClass \"weir\""), "NOTES name the class:\n{out}");
        let manifest = documents(&helm.ok(&["get", "manifest", "weir", "-n", ns]));
        let version = admin.apiserver_version().await.unwrap();
        let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
        let versions = kinds(&manifest);
        let pdb = if minor >= 21 { "policy/v1" } else { "policy/v1beta1" };
        let hpa = if minor >= 23 { "autoscaling/v2" } else { "autoscaling/v2beta2" };
        assert!(versions.contains(&format!("{pdb}/PodDisruptionBudget")), "1.{minor}: {versions:?}");
        assert!(versions.contains(&format!("{hpa}/HorizontalPodAutoscaler")), "1.{minor}: {versions:?}");
        for object in objects(&manifest) {
            assert!(exists(&admin, &object).await, "{object:?} was not created");
        }

        // The pod: exactly the rendered container, as the chart's ServiceAccount.
        let deployment = find(&manifest, "Deployment", "weir-controller").clone();
        let container = controller_container(&manifest);
        let account = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
        let token = support_kube::service_account_token(&admin, ns, account).await;
        let env = container_env(&container, "weir-controller-7d4b9-x2v4q", ns, "127.0.0.1");
        let mut pod = Pod::start(&container, &env, &api.kubeconfig_for(&token));
        let http = SocketAddr::from(([127, 0, 0, 1], container_port(&container, "http")));
        let probe = &container["readinessProbe"]["httpGet"];
        let probe_port = container_port(&container, probe["port"].as_str().unwrap());
        let probe_addr = SocketAddr::from(([127, 0, 0, 1], probe_port));
        eventually("the readiness probe", Duration::from_secs(30), || async {
            let ready =
                http_get(probe_addr, "probe", probe["path"].as_str().unwrap()).is_some_and(|(s, _)| s == 200);
            ready.then_some(())
        })
        .await;
        let liveness = container["livenessProbe"]["httpGet"]["path"].as_str().unwrap();
        assert_eq!(http_get(probe_addr, "probe", liveness).map(|r| r.0), Some(200));

        // A cloud load balancer gives the chart's Service an address.
        let services: Api<Service> = Api::namespaced(admin.clone(), ns);
        let lb = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.44"}]}}});
        services.patch_status("weir-controller", &PatchParams::default(), &Patch::Merge(&lb)).await.unwrap();

        // An application's Ingress of the chart's class (the IngressClass is the chart's).
        let app = "shop";
        create_namespace(&admin, app).await;
        let echo = Echo::start(&["a"]).await;
        apply::<Service>(&admin, app, service("web")).await;
        apply::<Endpoints>(&admin, app, endpoints("web", &echo.ports)).await;
        apply::<Ingress>(&admin, app, ingress("web", "weir", "web.example", "web")).await;
        eventually("the Ingress is served", Duration::from_secs(10), || async {
            (http_get(http, "web.example", "/") == Some((200, "a".to_string()))).then_some(())
        })
        .await;
        let ingresses: Api<Ingress> = Api::namespaced(admin.clone(), app);
        eventually("the status is written", Duration::from_secs(15), || async {
            let ing = ingresses.get("web").await.ok()?;
            let lb = ing.status?.load_balancer?.ingress?;
            (lb.first()?.ip.as_deref() == Some("192.0.2.44")).then_some(())
        })
        .await;
        // The settings ConfigMap applies: 9 MiB is over 8m.
        eventually("proxy-body-size 8m", Duration::from_secs(10), || async {
            (declared_body(http, "web.example", 9 << 20) == Some(413)).then_some(())
        })
        .await;
        assert_eq!(declared_body(http, "web.example", 4096), None, "4 KiB is forwarded");

        // helm upgrade with another controller.config: reloaded by the same process; the
        // Deployment's pod template is unchanged, so nothing rolls.
        let deployments: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            ns,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment")),
        );
        let generation = deployments.get("weir-controller").await.unwrap().metadata.generation;
        helm.ok(&[
            "upgrade",
            "weir",
            chart,
            "-n",
            ns,
            "--reuse-values",
            "--set-string",
            "controller.config.proxy-body-size=1k",
        ]);
        eventually("proxy-body-size 1k after helm upgrade", Duration::from_secs(10), || async {
            (declared_body(http, "web.example", 4096) == Some(413)).then_some(())
        })
        .await;
        assert!(pod.running(), "weir exited:\n{}", pod.log());
        let upgraded = documents(&helm.ok(&["get", "manifest", "weir", "-n", ns]));
        assert_eq!(
            find(&upgraded, "Deployment", "weir-controller"),
            &deployment,
            "the upgrade changed the Deployment"
        );
        assert_eq!(deployments.get("weir-controller").await.unwrap().metadata.generation, generation);
        assert_eq!(find(&upgraded, "ConfigMap", "weir-controller")["data"]["proxy-body-size"], "1k");
        let log = pod.log();
        assert!(!log.to_lowercase().contains("forbidden"), "a request was forbidden:\n{log}");

        // helm uninstall: the pods stop (SIGTERM) and every object of the release is gone,
        // the leader-election Lease included.
        helm.ok(&["uninstall", "weir", "-n", ns, "--wait"]);
        // The pods outlive the uninstall by their preStop sleep and drain: weir, still running
        // for longer than a Lease renewal period, must not re-create what was removed.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(pod.running(), "weir exited:\n{}", pod.log());
        pod.terminate();
        for object in objects(&upgraded) {
            assert!(!exists(&admin, &object).await, "{object:?} is left behind");
        }
        let leases: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            ns,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease")),
        );
        let left = leases.list(&Default::default()).await.unwrap();
        assert!(
            left.items.is_empty(),
            "Leases left behind: {:?}",
            left.items.iter().map(|l| &l.metadata.name).collect::<Vec<_>>()
        );
        assert!(helm.ok(&["list", "-A", "-q"]).trim().is_empty(), "a release is left");
    });
}

/// `tcp:` and `udp:` (ingress-nginx's keys) render the two services ConfigMaps, the flags that
/// name them, and each port on the controller's container and Service; without them, none.
#[test]
fn tcp_and_udp_values_render_configmaps_flags_and_ports() {
    if skip(&[helm_path()]) {
        return;
    }
    let helm = Helm::new();
    let values = chart().join("ci/l4-values.yaml");
    let docs = documents(&helm.template(&["--values", values.to_str().unwrap()]));
    let tcp = find(&docs, "ConfigMap", "weir-controller-tcp");
    assert_eq!(tcp["data"]["5432"], "db/postgres:5432");
    assert_eq!(tcp["data"]["1883"], "iot/mqtt:mqtt:PROXY:PROXY");
    let udp = find(&docs, "ConfigMap", "weir-controller-udp");
    assert_eq!(udp["data"]["53"], "kube-system/dns:dns");
    let c = controller_container(&docs);
    let args = strings(&c["args"]);
    for flag in [
        "--tcp-services-configmap=weir-system/weir-controller-tcp",
        "--udp-services-configmap=weir-system/weir-controller-udp",
    ] {
        assert!(args.contains(&flag.to_string()), "{flag} missing from {args:?}");
    }
    let ports = |v: &Value, key: &str| -> BTreeSet<(String, i64, String)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p[key].as_i64().unwrap(),
                    p["protocol"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let container = ports(&c["ports"], "containerPort");
    let service = find(&docs, "Service", "weir-controller");
    let service_ports = ports(&service["spec"]["ports"], "port");
    for want in [("5432-tcp", 5432, "TCP"), ("1883-tcp", 1883, "TCP"), ("53-udp", 53, "UDP")] {
        let want = (want.0.to_string(), want.1, want.2.to_string());
        assert!(container.contains(&want), "{want:?} not in the container's ports {container:?}");
        assert!(service_ports.contains(&want), "{want:?} not in the Service's ports {service_ports:?}");
    }
    let targets: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["targetPort"].as_str())
        .collect();
    assert!(targets.contains(&"53-udp") && targets.contains(&"5432-tcp"), "{targets:?}");

    let plain = documents(&helm.template(&[]));
    assert!(
        !plain.iter().any(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "weir-controller-tcp"),
        "no tcp ConfigMap without tcp values"
    );
    let args = strings(&controller_container(&plain)["args"]);
    assert!(!args.iter().any(|a| a.contains("services-configmap")), "{args:?}");
}
