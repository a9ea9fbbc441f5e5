//! The conformance scenarios through a real kube-apiserver (1.20, from
//! `scripts/kube-apiserver.sh build`): each step's objects are applied through the API and weir
//! reads them with its Kubernetes source. One API server per scenario, each in a private network
//! namespace (root); skipped with a reason without them, failed when `WEIR_REQUIRE_ALL=1`.
//!
//! Not run this way: `bad-manifest` (the API server refuses what it checks: broken files are a
//! manifest-source matter), `conflicts` (the API server sets creationTimestamp itself, so the
//! scenario's ages cannot be written) and `class-selection` (the API server refuses an Ingress
//! with both the class field and the legacy annotation, which the scenario checks).

#![allow(missing_docs, clippy::unwrap_used)]

#[path = "../../controller/tests/support_kube/mod.rs"]
mod support_kube;

use support_kube::{ApiServer, isolated};
use weir_conformance::kube::KubeTarget;

fn scenario(test: &str, name: &str) {
    isolated(test, || async move {
        weir_conformance::backends::use_address_block(10);
        let api = ApiServer::start().await;
        let target = KubeTarget { client: api.client().await, kubeconfig: api.kubeconfig.clone() };
        let path = weir_conformance::scenarios_dir().join(format!("{name}.yaml"));
        match weir_conformance::run_file_kube(&path, &target).await {
            Ok(report) if report.passed() => {
                // Shown by `isolated` even though the test passes: known failures, steps not run.
                for line in report.to_string().lines() {
                    println!("REPORT {line}");
                }
            }
            Ok(report) => panic!("{report}"),
            Err(weir_conformance::Error::Unavailable(why))
                if std::env::var_os("WEIR_REQUIRE_ALL").is_none() =>
            {
                println!("skipping scenario {name}: {why}");
            }
            Err(error) => panic!("scenario {name} could not run: {error}"),
        }
    });
}

macro_rules! scenarios {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $test() {
                scenario(stringify!($test), $file);
            }
        )*
    };
}

scenarios! {
    kube_default_backend => "default-backend",
    kube_host_rules => "host-rules",
    kube_hot_reload => "hot-reload",
    kube_load_balancing => "load-balancing",
    kube_merged_rules => "merged-rules",
    kube_no_endpoints => "no-endpoints",
    kube_path_rules => "path-rules",
    kube_annotations => "annotations",
    kube_settings => "settings",
    kube_path_normalization => "path-normalization",
    kube_gateway_hostnames => "gateway-hostnames",
    kube_gateway_paths => "gateway-paths",
    kube_gateway_backends => "gateway-backends",
    kube_gateway_allowed_routes => "gateway-allowed-routes",
    kube_gateway_filters => "gateway-filters",
    kube_gateway_generation => "gateway-generation",
    kube_gateway_listeners => "gateway-listeners",
    kube_gateway_listenersets => "gateway-listenersets",
    kube_gateway_extended => "gateway-extended",
    kube_gateway_hostname_precedence => "gateway-hostname-precedence",
    kube_gateway_grpc_hostname_precedence => "gateway-grpc-hostname-precedence",
    kube_gateway_named_rules => "gateway-named-rules",
    kube_gateway_backend_filters => "gateway-backend-filters",
}
