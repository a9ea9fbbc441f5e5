//! Conformance scenarios: one test per file in `conformance/scenarios/`.
//!
//! Each test starts its own weir and echo backends, so they run in parallel. A failing test
//! lists every failed check of its scenario. Set `RUST_LOG` (e.g. `RUST_LOG=weir=debug`) to
//! see weir's logs, such as the routing tables it publishes and the warnings of translation.

#![allow(missing_docs)]

use std::collections::BTreeSet;

/// Runs `scenarios/<name>.yaml` and fails with the full report if any check failed.
async fn scenario(name: &str) {
    if std::env::var_os("RUST_LOG").is_some() {
        // Several tests share the process: only the first installs the subscriber.
        let _already_set = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let path = weir_conformance::scenarios_dir().join(format!("{name}.yaml"));
    match weir_conformance::run_file(&path).await {
        Ok(report) if report.passed() => println!("{report}"),
        Ok(report) => panic!("{report}"),
        Err(weir_conformance::Error::Unavailable(why)) if std::env::var_os("WEIR_REQUIRE_ALL").is_none() => {
            println!("skipping scenario {name}: {why}");
        }
        Err(error) => panic!("scenario {name} could not run: {error}"),
    }
}

macro_rules! scenarios {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                scenario($file).await;
            }
        )*

        /// Every scenario file has a test above, and every test a file.
        #[test]
        fn every_scenario_file_has_a_test() {
            let tested: BTreeSet<&str> = [$($file),*].into_iter().collect();
            let dir = weir_conformance::scenarios_dir();
            let mut files = BTreeSet::new();
            for entry in std::fs::read_dir(&dir).expect("the scenarios directory is readable") {
                let path = entry.expect("a directory entry").path();
                if path.extension().is_some_and(|e| e == "yaml") {
                    let stem = path.file_stem().expect("a file name").to_string_lossy();
                    files.insert(stem.into_owned());
                }
            }
            let files: BTreeSet<&str> = files.iter().map(String::as_str).collect();
            assert_eq!(files, tested, "scenario files vs tests in tests/conformance.rs");
        }

        /// Every scenario file parses and is valid, without running anything.
        #[test]
        fn every_scenario_is_valid() {
            for file in [$($file),*] {
                let path = weir_conformance::scenarios_dir().join(format!("{file}.yaml"));
                if let Err(error) = weir_conformance::scenario::Scenario::load(&path) {
                    panic!("{error}");
                }
            }
        }
    };
}

scenarios! {
    host_rules => "host-rules",
    path_rules => "path-rules",
    default_backend => "default-backend",
    load_balancing => "load-balancing",
    merged_rules => "merged-rules",
    conflicts => "conflicts",
    class_selection => "class-selection",
    hot_reload => "hot-reload",
    no_endpoints => "no-endpoints",
    bad_manifest => "bad-manifest",
    annotations => "annotations",
    service_upstream => "service-upstream",
    settings => "settings",
    path_normalization => "path-normalization",
    guards => "guards",
    gateway_hostnames => "gateway-hostnames",
    gateway_paths => "gateway-paths",
    gateway_backends => "gateway-backends",
    gateway_allowed_routes => "gateway-allowed-routes",
    gateway_filters => "gateway-filters",
    gateway_generation => "gateway-generation",
    gateway_listeners => "gateway-listeners",
    gateway_listenersets => "gateway-listenersets",
    gateway_extended => "gateway-extended",
    gateway_hostname_precedence => "gateway-hostname-precedence",
    gateway_grpc_hostname_precedence => "gateway-grpc-hostname-precedence",
    gateway_named_rules => "gateway-named-rules",
    gateway_backend_filters => "gateway-backend-filters",
}

/// The runner itself: deliberately wrong expectations are each reported, with what answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_reports_every_failure() {
    let text = r#"
description: Deliberately wrong expectations.
backends: {a: 2}
steps:
  - name: one of two replicas in the slice
    files:
      a.yaml: |
        apiVersion: v1
        kind: Service
        metadata: {name: a}
        spec: {ports: [{name: http, port: 80}]}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata: {name: a-1, labels: {kubernetes.io/service-name: a}}
        addressType: IPv4
        ports: [{name: http, port: {{port:a}}}]
        endpoints: [{addresses: ["{{ip:a-0}}"]}]
        ---
        apiVersion: networking.k8s.io/v1
        kind: Ingress
        metadata: {name: a}
        spec:
          ingressClassName: weir
          rules:
            - host: a.example.com
              http:
                paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]
    expect:
      - {host: a.example.com, backend: a}
      - {host: a.example.com, any_of: [a-0, a-1]}
      - {host: a.example.com, status: 404}
      - {host: nowhere.example.com, backend: a}
      - {host: a.example.com, backend: a-1}
      - {host: a.example.com, distribution: {requests: 10, backends: [a]}}
      - {host: a.example.com, backend: a, upstream_headers: {x-forwarded-host: wrong.example.com}}
      - {host: a.example.com, backend: a, response_headers: {location: /nowhere}}
      - {host: a.example.com, path: /x, backend: a, upstream_path: /y}
"#;
    let scenario = weir_conformance::scenario::Scenario::parse(text, "inline").expect("a valid scenario");
    let report = weir_conformance::run("inline", &scenario).await.expect("the scenario runs");
    println!("{report}");
    assert_eq!(report.checks, 10, "{report}");
    let problems: Vec<&str> = report.failures.iter().map(|f| f.problem.as_str()).collect();
    assert_eq!(problems.len(), 7, "{report}");
    assert!(
        problems[0].contains("expected status 404 and an answer from weir itself, got 200 from echo a-0")
    );
    assert!(problems[1].contains("expected status 200 and an answer from backend a, got 404 from weir"));
    assert!(problems[2].contains("expected an answer from backend a-1, got 200 from echo a-0"));
    assert!(problems[3].contains("a-1 never answered"), "{}", problems[3]);
    assert!(
        problems[4].contains(
            r#"the backend to receive x-forwarded-host: "wrong.example.com" (it got Some("a.example.com"))"#
        ),
        "{}",
        problems[4]
    );
    assert!(problems[5].contains(r#"response header location: "/nowhere" (got None)"#), "{}", problems[5]);
    assert!(
        problems[6].contains(r#"the backend to receive path "/y" (it got Some("/x"))"#),
        "{}",
        problems[6]
    );
    assert!(
        report
            .to_string()
            .contains("step 1 (one of two replicas in the slice): GET http://nowhere.example.com/")
    );
}
