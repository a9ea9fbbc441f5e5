//! Gateway API status written by the leader, against the real API server (kube-apiserver with
//! the repository's CRDs): GatewayClass `Accepted`; Gateway `Accepted`/`Programmed`,
//! `status.addresses` and per listener `attachedRoutes`, `supportedKinds` and conditions;
//! HTTPRoute `parents` with `Accepted` and `ResolvedRefs` and their reasons; `observedGeneration`
//! on every condition; nothing rewritten when nothing changed. And the HTTPRoute routes.

#![allow(clippy::unwrap_used, missing_docs)]

mod gateway_crds_support;
mod support_kube;

use std::time::Duration;

use erased::Ser as _;
use gateway_crds_support::{create, install_gateway_crds};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::api::Api;
use serde_json::{Value, json};
use support_kube::{ApiServer, Echo, Weir, apply, endpoints, eventually, isolated, service};
use weir::gateway::{Gateway, GatewayClass, GrpcRoute, HttpRoute, TlsRoute};

const CONTROLLER: &str = "weir.dev/gateway-controller";

/// The condition `type_` of a list (`Value::Null` when absent).
fn cond<'a>(conditions: &'a Value, type_: &str) -> &'a Value {
    conditions.as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

/// `(status, reason, observedGeneration)` of a condition.
fn summary(c: &Value) -> (String, String, i64) {
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
        c["observedGeneration"].as_i64().unwrap_or(-1),
    )
}

fn s(status: &str, reason: &str, generation: i64) -> (String, String, i64) {
    (status.to_string(), reason.to_string(), generation)
}

/// Our entry in the `status.parents` of the route `name`.
async fn our_parent<K>(routes: &Api<K>, name: &str) -> Option<Value>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let route = serde_json::to_value(routes.get(name).await.ok()?).ok()?;
    route["status"]["parents"].as_array()?.iter().find(|p| p["controllerName"] == CONTROLLER).cloned()
}

/// The status of the listener `name` of the Gateway `gateway`.
async fn listener_status(gateways: &Api<Gateway>, gateway: &str, name: &str) -> Option<Value> {
    let status = gateways.get(gateway).await.ok()?.status.value();
    status["listeners"].as_array()?.iter().find(|l| l["name"] == name).cloned()
}

/// The API server with the Gateway API CRDs, a Service `web` in `default` whose one endpoint is
/// the echo backend `a`, and the GatewayClass `weir` of weir's controller.
async fn cluster_with_class() -> (ApiServer, kube::Client, Echo) {
    let api = ApiServer::start().await;
    let (admin, echo) = class_and_web(&api, "default").await;
    (api, admin, echo)
}

/// The CRDs, our GatewayClass `weir`, and a Service `web` in `ns` whose endpoint is an echo
/// backend answering `a` (kept alive by the returned [`Echo`]).
async fn class_and_web(api: &ApiServer, ns: &str) -> (kube::Client, Echo) {
    let admin = api.client().await;
    install_gateway_crds(&admin).await;
    let echo = Echo::start(&["a"]).await;
    apply::<Service>(&admin, ns, service("web")).await;
    apply::<Endpoints>(&admin, ns, endpoints("web", &echo.ports)).await;
    create(
        &admin,
        None,
        "v1",
        "GatewayClass",
        "gatewayclasses",
        json!({"metadata": {"name": "weir"}, "spec": {"controllerName": CONTROLLER}}),
    )
    .await
    .unwrap();
    (admin, echo)
}

/// The Gateway `edge` in `ns`: one HTTP listener `http` on port 80 of our class `weir`.
async fn edge_gateway(admin: &kube::Client, ns: &str) {
    let gateway = json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir", "listeners": [
        {"name": "http", "port": 80, "protocol": "HTTP"},
    ]}});
    create(admin, Some(ns), "v1", "Gateway", "gateways", gateway).await.unwrap();
}

#[test]
fn gateway_api_status_written_by_the_leader() {
    isolated("gateway_api_status_written_by_the_leader", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "alt", "port": 8080, "protocol": "HTTP"},
            ]}}),
        )
        .await
        .unwrap();
        let route = |name: &str, parent: Value, backend: &str| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [parent], "hostnames": [format!("{name}.example")],
                "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}})
        };
        gw("HTTPRoute", "httproutes", route("web", json!({"name": "edge", "sectionName": "http"}), "web"))
            .await
            .unwrap();
        gw(
            "HTTPRoute",
            "httproutes",
            route("bad", json!({"name": "edge", "sectionName": "http"}), "missing"),
        )
        .await
        .unwrap();
        gw("HTTPRoute", "httproutes", route("lost", json!({"name": "edge", "sectionName": "nosuch"}), "web"))
            .await
            .unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("web.example", "a", Duration::from_secs(10)).await;
        assert_eq!(
            weir.get("bad.example", "/").map(|r| r.0),
            Some(500),
            "an unresolved backendRef answers 500"
        );

        let classes: Api<GatewayClass> = Api::all(admin.clone());
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let routes: Api<HttpRoute> = Api::namespaced(admin.clone(), ns);

        // GatewayClass `Accepted`.
        eventually("the GatewayClass status", Duration::from_secs(15), || async {
            let c = classes.get("weir").await.ok()?;
            let status = c.status.value();
            (summary(cond(&status["conditions"], "Accepted")) == s("True", "Accepted", 1)).then_some(())
        })
        .await;

        // Gateway: Accepted (ListenersNotValid: one listener is on another port), Programmed,
        // addresses, listeners.
        let status = eventually("the Gateway status", Duration::from_secs(15), || async {
            let g = gateways.get("edge").await.ok()?;
            let status = g.status.value();
            (status["addresses"] == json!([{"type": "IPAddress", "value": "192.0.2.10"}])).then_some(status)
        })
        .await;
        let listener = |name: &str| {
            status["listeners"].as_array().unwrap().iter().find(|l| l["name"] == name).unwrap().clone()
        };
        let http = listener("http");
        assert_eq!(http["attachedRoutes"], 2, "web and bad: {status}");
        assert_eq!(
            http["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}, {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
        );
        assert_eq!(summary(cond(&http["conditions"], "Programmed")), s("True", "Programmed", 1), "{status}");
        let alt = listener("alt");
        assert_eq!(
            summary(cond(&alt["conditions"], "Accepted")),
            s("False", "PortUnavailable", 1),
            "{status}"
        );
        assert_eq!(cond(&status["conditions"], "Accepted")["observedGeneration"], 1, "{status}");

        // HTTPRoutes: per parent, Accepted and ResolvedRefs with their reasons.
        let parent = |name: &'static str| our_parent(&routes, name);
        let web = eventually("web's status", Duration::from_secs(15), || parent("web")).await;
        assert_eq!(summary(cond(&web["conditions"], "Accepted")), s("True", "Accepted", 1), "{web}");
        assert_eq!(summary(cond(&web["conditions"], "ResolvedRefs")), s("True", "ResolvedRefs", 1), "{web}");
        let bad = eventually("bad's status", Duration::from_secs(15), || parent("bad")).await;
        assert_eq!(
            summary(cond(&bad["conditions"], "ResolvedRefs")),
            s("False", "BackendNotFound", 1),
            "{bad}"
        );
        let lost = eventually("lost's status", Duration::from_secs(15), || parent("lost")).await;
        assert_eq!(
            summary(cond(&lost["conditions"], "Accepted")),
            s("False", "NoMatchingParent", 1),
            "{lost}"
        );

        // Only changes are written: an unrelated change translates again, nothing is rewritten.
        let version = routes.get("web").await.unwrap().metadata.resource_version;
        let gw_version = gateways.get("edge").await.unwrap().metadata.resource_version;
        apply::<Service>(&admin, ns, service("unrelated")).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            routes.get("web").await.unwrap().metadata.resource_version,
            version,
            "HTTPRoute rewritten"
        );
        assert_eq!(
            gateways.get("edge").await.unwrap().metadata.resource_version,
            gw_version,
            "Gateway rewritten"
        );
    });
}

/// Listener TLS and TLSRoute status, written by the leader: an HTTPS listener whose
/// `certificateRefs` name a Secret of another namespace without a ReferenceGrant gets
/// `ResolvedRefs` False `RefNotPermitted` (conformance `GatewaySecretMissingReferenceGrant`), a
/// missing Secret `InvalidCertificateRef` (`GatewayInvalidTLSConfiguration`), neither is
/// `Programmed`; two Gateways with one hostname on one port: the newer one's listener is
/// `Conflicted` (`HostnameConflict`); TLSRoutes get per parent `Accepted` (or
/// `NoMatchingListenerHostname`) and `ResolvedRefs` (or `BackendNotFound`). A `TLS` listener
/// with `tls.mode: Terminate` (`TLSRouteModeTerminate`; conformance
/// `TLSRouteListenerTerminateSupportedKinds`) beside a `Passthrough` one on the same port
/// (`TLSRouteModeMixed`) is `Accepted`, `Programmed`, `ResolvedRefs` and not `Conflicted`, with
/// `supportedKinds` TLSRoute and its route attached (`Accepted`, `ResolvedRefs`); one whose
/// Secret is missing gets what an HTTPS listener gets (`InvalidCertificateRef`, not
/// `Programmed`), and the route naming only it is not accepted.
#[test]
fn gateway_api_tls_listener_and_tlsroute_status() {
    use base64::Engine as _;
    use k8s_openapi::api::core::v1::Secret;
    isolated("gateway_api_tls_listener_and_tlsroute_status", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let term = rcgen::generate_simple_self_signed(vec!["a.term.example".to_string()]).unwrap();
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        apply::<Secret>(
            &admin,
            ns,
            json!({"metadata": {"name": "term-tls"}, "type": "kubernetes.io/tls", "data": {
                "tls.crt": b64(term.cert.pem()), "tls.key": b64(term.signing_key.serialize_pem())}}),
        )
        .await;
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "first"}, "spec": {"gatewayClassName": "weir", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "dup.example"},
                {"name": "refused", "port": 443, "protocol": "HTTPS", "hostname": "refused.example",
                 "tls": {"certificateRefs": [{"name": "other-tls", "namespace": "certs"}]}},
                {"name": "missing", "port": 443, "protocol": "HTTPS", "hostname": "missing.example",
                 "tls": {"certificateRefs": [{"name": "nope"}]}},
                {"name": "pass", "port": 443, "protocol": "TLS", "hostname": "*.pass.example",
                 "tls": {"mode": "Passthrough"}},
                {"name": "term", "port": 443, "protocol": "TLS", "hostname": "*.term.example",
                 "allowedRoutes": {"kinds": [{"kind": "TLSRoute"}]},
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "term-tls"}]}},
                {"name": "term-missing", "port": 443, "protocol": "TLS", "hostname": "missing.term-x.example",
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "nope"}]}},
            ]}}),
        )
        .await
        .unwrap();
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "second"}, "spec": {"gatewayClassName": "weir", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "dup.example"},
            ]}}),
        )
        .await
        .unwrap();
        let route_on = |section: &str, name: &str, host: &str, backend: &str| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [{"name": "first", "sectionName": section}], "hostnames": [host],
                "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}})
        };
        let tls_route = |name: &str, host: &str, backend: &str| route_on("pass", name, host, backend);
        gw("TLSRoute", "tlsroutes", tls_route("pass", "a.pass.example", "web")).await.unwrap();
        gw("TLSRoute", "tlsroutes", tls_route("pass-missing", "b.pass.example", "missing")).await.unwrap();
        gw("TLSRoute", "tlsroutes", tls_route("pass-miss", "x.other.example", "web")).await.unwrap();
        gw("TLSRoute", "tlsroutes", route_on("term", "term", "a.term.example", "web")).await.unwrap();
        gw(
            "TLSRoute",
            "tlsroutes",
            route_on("term-missing", "term-missing", "missing.term-x.example", "web"),
        )
        .await
        .unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let routes: Api<TlsRoute> = Api::namespaced(admin.clone(), ns);

        let listener = |gateway: &'static str, name: &'static str| listener_status(&gateways, gateway, name);
        let refused =
            eventually("first/refused", Duration::from_secs(15), || listener("first", "refused")).await;
        assert_eq!(
            summary(cond(&refused["conditions"], "ResolvedRefs")),
            s("False", "RefNotPermitted", 1),
            "{refused}"
        );
        assert_eq!(cond(&refused["conditions"], "Programmed")["status"], "False", "{refused}");
        let missing =
            eventually("first/missing", Duration::from_secs(15), || listener("first", "missing")).await;
        assert_eq!(
            summary(cond(&missing["conditions"], "ResolvedRefs")),
            s("False", "InvalidCertificateRef", 1),
            "{missing}"
        );
        let pass = eventually("first/pass", Duration::from_secs(15), || listener("first", "pass")).await;
        assert_eq!(summary(cond(&pass["conditions"], "Programmed")), s("True", "Programmed", 1), "{pass}");
        assert_eq!(
            pass["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "TLSRoute"}])
        );
        // pass and pass-missing attached; pass-miss has no matching hostname.
        assert_eq!(pass["attachedRoutes"], 2, "{pass}");
        let first = eventually("first/http", Duration::from_secs(15), || listener("first", "http")).await;
        assert_eq!(
            summary(cond(&first["conditions"], "Conflicted")),
            s("False", "NoConflicts", 1),
            "{first}"
        );
        let second = eventually("second/http", Duration::from_secs(15), || listener("second", "http")).await;
        assert_eq!(
            summary(cond(&second["conditions"], "Conflicted")),
            s("True", "HostnameConflict", 1),
            "{second}"
        );

        let parent = |name: &'static str| our_parent(&routes, name);
        let ok = eventually("pass's status", Duration::from_secs(15), || parent("pass")).await;
        assert_eq!(summary(cond(&ok["conditions"], "Accepted")), s("True", "Accepted", 1), "{ok}");
        assert_eq!(summary(cond(&ok["conditions"], "ResolvedRefs")), s("True", "ResolvedRefs", 1), "{ok}");
        let bad =
            eventually("pass-missing's status", Duration::from_secs(15), || parent("pass-missing")).await;
        assert_eq!(
            summary(cond(&bad["conditions"], "ResolvedRefs")),
            s("False", "BackendNotFound", 1),
            "{bad}"
        );
        let miss = eventually("pass-miss's status", Duration::from_secs(15), || parent("pass-miss")).await;
        assert_eq!(
            summary(cond(&miss["conditions"], "Accepted")),
            s("False", "NoMatchingListenerHostname", 1),
            "{miss}"
        );

        // The Terminate listener beside the Passthrough one on port 443.
        let term = eventually("first/term", Duration::from_secs(15), || listener("first", "term")).await;
        for (type_, status, reason) in [
            ("Accepted", "True", "Accepted"),
            ("Programmed", "True", "Programmed"),
            ("ResolvedRefs", "True", "ResolvedRefs"),
            ("Conflicted", "False", "NoConflicts"),
        ] {
            assert_eq!(summary(cond(&term["conditions"], type_)), s(status, reason, 1), "{type_}: {term}");
        }
        assert_eq!(
            term["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "TLSRoute"}])
        );
        assert_eq!(term["attachedRoutes"], 1, "{term}");
        assert_eq!(summary(cond(&pass["conditions"], "Conflicted")), s("False", "NoConflicts", 1), "{pass}");
        let routed = eventually("term's status", Duration::from_secs(15), || parent("term")).await;
        assert_eq!(summary(cond(&routed["conditions"], "Accepted")), s("True", "Accepted", 1), "{routed}");
        assert_eq!(
            summary(cond(&routed["conditions"], "ResolvedRefs")),
            s("True", "ResolvedRefs", 1),
            "{routed}"
        );
        // Its Secret missing: what an HTTPS listener gets; the route on it only is not accepted.
        let bad =
            eventually("first/term-missing", Duration::from_secs(15), || listener("first", "term-missing"))
                .await;
        assert_eq!(
            summary(cond(&bad["conditions"], "ResolvedRefs")),
            s("False", "InvalidCertificateRef", 1),
            "{bad}"
        );
        assert_eq!(summary(cond(&bad["conditions"], "Programmed")), s("False", "Invalid", 1), "{bad}");
        let unserved =
            eventually("term-missing's status", Duration::from_secs(15), || parent("term-missing")).await;
        assert_eq!(cond(&unserved["conditions"], "Accepted")["status"], "False", "{unserved}");
    });
}

/// Client certificate validation status (`Gateway.spec.tls.frontend`), written by the leader:
/// the conditions `FrontendTLSValidation.caCertificateRefs` names on the listener (conformance
/// `GatewayInvalidFrontendClientCertificateValidation`, one Gateway per case as weir has one
/// HTTPS port): a ConfigMap that does not exist `InvalidCACertificateRef`, a Service
/// `InvalidCACertificateKind`, a ConfigMap of another namespace without a ReferenceGrant
/// `RefNotPermitted`, each with `Accepted` False `NoValidCACertificate` and not `Programmed`;
/// the Gateway's HTTP listener untouched (`GatewayFrontendInvalidDefaultClientCertificateValidation`);
/// `InsecureFrontendValidationMode` True `ConfigurationChanged` on a Gateway with
/// `AllowInsecureFallback` (`GatewayFrontendClientCertificateValidationInsecureFallback`), gone
/// once the mode is `AllowValidOnly` again; and the missing ConfigMap, once created, read by
/// name from the API server: the listener is accepted.
#[test]
fn gateway_api_frontend_client_certificate_validation_status() {
    use base64::Engine as _;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    isolated("gateway_api_frontend_client_certificate_validation_status", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap().pem();
        let site = rcgen::generate_simple_self_signed(vec!["site.example".to_string()]).unwrap();
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        apply::<Secret>(
            &admin,
            ns,
            json!({"metadata": {"name": "site-tls"}, "type": "kubernetes.io/tls", "data": {
                "tls.crt": b64(site.cert.pem()), "tls.key": b64(site.signing_key.serialize_pem())}}),
        )
        .await;
        let ca_map = |name: &str| json!({"metadata": {"name": name}, "data": {"ca.crt": ca}});
        apply::<ConfigMap>(&admin, ns, ca_map("client-ca")).await;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        support_kube::apply_with(namespaces, json!({"metadata": {"name": "elsewhere"}})).await;
        apply::<ConfigMap>(&admin, "elsewhere", ca_map("their-ca")).await;
        let gateway = |name: &str, validation: Value| {
            let mut listeners = vec![json!({"name": "https", "port": 443, "protocol": "HTTPS",
                "hostname": format!("{name}.example"), "tls": {"certificateRefs": [{"name": "site-tls"}]}})];
            if name == "unresolved" {
                listeners.push(
                    json!({"name": "http", "port": 80, "protocol": "HTTP", "hostname": "unresolved.example"}),
                );
            }
            json!({"metadata": {"name": name}, "spec": {"gatewayClassName": "weir",
                "tls": {"frontend": {"default": {"validation": validation}}}, "listeners": listeners}})
        };
        // No `group: ""`: the test API server cannot store an empty string (the repository's
        // CRDs leave this group optional, `scripts/gateway-api-crds.py`); unset is the core group.
        let cm = |name: &str, namespace: Option<&str>| {
            let mut r = json!({"kind": "ConfigMap", "name": name});
            if let Some(ns) = namespace {
                r["namespace"] = json!(ns);
            }
            r
        };
        for (name, validation) in [
            ("unresolved", json!({"caCertificateRefs": [cm("late-ca", None)]})),
            ("wrong-kind", json!({"caCertificateRefs": [{"kind": "Service", "name": "web"}]})),
            ("no-grant", json!({"caCertificateRefs": [cm("their-ca", Some("elsewhere"))]})),
            (
                "fallback",
                json!({"mode": "AllowInsecureFallback", "caCertificateRefs": [cm("client-ca", None)]}),
            ),
        ] {
            create(&admin, Some(ns), "v1", "Gateway", "gateways", gateway(name, validation)).await.unwrap();
        }

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let listener = |gateway: &'static str, name: &'static str| listener_status(&gateways, gateway, name);
        for (gateway, reason) in [
            ("unresolved", "InvalidCACertificateRef"),
            ("wrong-kind", "InvalidCACertificateKind"),
            ("no-grant", "RefNotPermitted"),
        ] {
            let l = eventually(gateway, Duration::from_secs(15), || listener(gateway, "https")).await;
            let c = &l["conditions"];
            assert_eq!(summary(cond(c, "ResolvedRefs")), s("False", reason, 1), "{gateway}: {l}");
            assert_eq!(summary(cond(c, "Accepted")), s("False", "NoValidCACertificate", 1), "{gateway}: {l}");
            assert_eq!(cond(c, "Programmed")["status"], "False", "{gateway}: {l}");
        }
        let http =
            eventually("unresolved/http", Duration::from_secs(15), || listener("unresolved", "http")).await;
        for type_ in ["Accepted", "ResolvedRefs", "Programmed"] {
            assert_eq!(cond(&http["conditions"], type_)["status"], "True", "{type_}: {http}");
        }
        let fallback =
            eventually("fallback/https", Duration::from_secs(15), || listener("fallback", "https")).await;
        for type_ in ["Accepted", "ResolvedRefs", "Programmed"] {
            assert_eq!(cond(&fallback["conditions"], type_)["status"], "True", "{type_}: {fallback}");
        }
        let insecure = |generation: i64| {
            let gateways = gateways.clone();
            async move {
                let g = gateways.get("fallback").await.ok()?;
                let status = g.status.value();
                (cond(&status["conditions"], "Accepted")["observedGeneration"] == generation)
                    .then(|| cond(&status["conditions"], "InsecureFrontendValidationMode").clone())
            }
        };
        let c =
            eventually("fallback's InsecureFrontendValidationMode", Duration::from_secs(15), || insecure(1))
                .await;
        assert_eq!(summary(&c), s("True", "ConfigurationChanged", 1), "{c}");

        // Back to AllowValidOnly: the condition is removed.
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        );
        let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(admin.clone(), ns, &resource);
        let patch =
            json!({"spec": {"tls": {"frontend": {"default": {"validation": {"mode": "AllowValidOnly"}}}}}});
        dynamic
            .patch("fallback", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap();
        let c = eventually("fallback at generation 2", Duration::from_secs(15), || insecure(2)).await;
        assert_eq!(c, Value::Null, "the condition is removed");

        // The missing ConfigMap appears: read by name from the API server, the listener serves.
        apply::<ConfigMap>(&admin, ns, ca_map("late-ca")).await;
        eventually("unresolved/https accepted", Duration::from_secs(15), || async {
            let l = listener("unresolved", "https").await?;
            (summary(cond(&l["conditions"], "Accepted")) == s("True", "Accepted", 1)).then_some(())
        })
        .await;
    });
}

/// ListenerSet status and routing (GEP-1713, `apis/v1/listenerset_types.go`), written by the
/// leader: the Gateway `edge` takes ListenerSets of its own namespace
/// (`allowedListeners.namespaces.from: Same`). `team` adds `app` (served: a request for
/// `app.example` reaches the backend through it, by a route whose `parentRef` is the
/// ListenerSet) and `clash`, with no hostname like the Gateway's own listener: `Conflicted`
/// `HostnameConflict` (conformance `ListenerSetHostnameConflict`), `team` stays `Accepted`
/// (`ListenersNotValid`) and `Programmed`. `outsider` in another namespace is `NotAllowed`
/// (`ListenerSetAllowedNamespaceSame`); `orphan` names a Gateway that does not exist and gets
/// no status. The Gateway counts `attachedListenerSets: 1`; the route's parent entry names the
/// ListenerSet. Nothing is rewritten when nothing changed.
#[test]
fn gateway_api_listenerset_status_and_routing() {
    isolated("gateway_api_listenerset_status_and_routing", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        support_kube::apply_with(namespaces, json!({"metadata": {"name": "apps"}})).await;
        create(
            &admin,
            Some(ns),
            "v1",
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir",
                "allowedListeners": {"namespaces": {"from": "Same"}},
                "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
        )
        .await
        .unwrap();
        let set = |namespace: &'static str, name: &str, parent: &str, listeners: Value| {
            let admin = admin.clone();
            let value = json!({"metadata": {"name": name}, "spec": {
                "parentRef": {"name": parent, "namespace": "default"}, "listeners": listeners}});
            async move { create(&admin, Some(namespace), "v1", "ListenerSet", "listenersets", value).await }
        };
        set(
            ns,
            "team",
            "edge",
            json!([
                {"name": "app", "port": 80, "protocol": "HTTP", "hostname": "app.example"},
                {"name": "clash", "port": 80, "protocol": "HTTP"},
            ]),
        )
        .await
        .unwrap();
        let one = json!([{"name": "app", "port": 80, "protocol": "HTTP", "hostname": "other.example"}]);
        set("apps", "outsider", "edge", one.clone()).await.unwrap();
        set(ns, "orphan", "nowhere", one).await.unwrap();
        create(
            &admin,
            Some(ns),
            "v1",
            "HTTPRoute",
            "httproutes",
            json!({"metadata": {"name": "via-set"}, "spec": {
                "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "ListenerSet", "name": "team", "sectionName": "app"}],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
        )
        .await
        .unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        // Through the ListenerSet's listener to the backend.
        weir.wait_route("app.example", "a", Duration::from_secs(15)).await;

        let sets: Api<weir::gateway::ListenerSet> = Api::namespaced(admin.clone(), ns);
        let team = eventually("team's status", Duration::from_secs(15), || async {
            let status = sets.get("team").await.ok()?.status.value();
            (cond(&status["conditions"], "Accepted")["observedGeneration"] == 1).then_some(status)
        })
        .await;
        assert_eq!(
            summary(cond(&team["conditions"], "Accepted")),
            s("True", "ListenersNotValid", 1),
            "{team}"
        );
        assert_eq!(summary(cond(&team["conditions"], "Programmed")), s("True", "Programmed", 1), "{team}");
        let listener = |name: &str| {
            team["listeners"].as_array().unwrap().iter().find(|l| l["name"] == name).unwrap().clone()
        };
        let app = listener("app");
        assert_eq!(app["attachedRoutes"], 1, "{team}");
        assert_eq!(summary(cond(&app["conditions"], "Programmed")), s("True", "Programmed", 1), "{team}");
        assert_eq!(
            app["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}, {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
        );
        let clash = listener("clash");
        for type_ in ["Accepted", "Programmed"] {
            assert_eq!(
                summary(cond(&clash["conditions"], type_)),
                s("False", "HostnameConflict", 1),
                "{team}"
            );
        }
        assert_eq!(
            summary(cond(&clash["conditions"], "Conflicted")),
            s("True", "HostnameConflict", 1),
            "{team}"
        );

        let outsiders: Api<weir::gateway::ListenerSet> = Api::namespaced(admin.clone(), "apps");
        let outsider = eventually("outsider's status", Duration::from_secs(15), || async {
            let status = outsiders.get("outsider").await.ok()?.status.value();
            (cond(&status["conditions"], "Accepted")["observedGeneration"] == 1).then_some(status)
        })
        .await;
        for type_ in ["Accepted", "Programmed"] {
            assert_eq!(
                summary(cond(&outsider["conditions"], type_)),
                s("False", "NotAllowed", 1),
                "{outsider}"
            );
        }

        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let edge = eventually("edge's attachedListenerSets", Duration::from_secs(15), || async {
            let status = gateways.get("edge").await.ok()?.status.value();
            status["attachedListenerSets"].as_i64().map(|n| (n, status))
        })
        .await;
        assert_eq!(edge.0, 1, "{}", edge.1);
        // The Gateway lists its own listener only; `team`'s are in `team`'s status.
        let names: Vec<&Value> = edge.1["listeners"].as_array().unwrap().iter().map(|l| &l["name"]).collect();
        assert_eq!(names, [&json!("http")], "{}", edge.1);

        let routes: Api<HttpRoute> = Api::namespaced(admin.clone(), ns);
        let parent =
            eventually("via-set's status", Duration::from_secs(15), || our_parent(&routes, "via-set")).await;
        assert_eq!(parent["parentRef"]["kind"], "ListenerSet", "{parent}");
        assert_eq!(summary(cond(&parent["conditions"], "Accepted")), s("True", "Accepted", 1), "{parent}");
        // Entries for its declared parentRefs only: none for the ListenerSet's Gateway
        // (conformance `ListenerSetRouteStatusScopedToParentRef`).
        let via_set = serde_json::to_value(routes.get("via-set").await.unwrap()).unwrap();
        assert_eq!(via_set["status"]["parents"].as_array().map(Vec::len), Some(1), "{via_set}");

        // The orphan is nobody's: no condition of weir's (at most the CRD's default, Pending).
        let orphan = sets.get("orphan").await.unwrap().status.value();
        let reason = &cond(&orphan["conditions"], "Accepted")["reason"];
        assert!(reason.is_null() || reason == "Pending", "{orphan}");

        // Only changes are written.
        let version = sets.get("team").await.unwrap().metadata.resource_version;
        apply::<Service>(&admin, ns, service("unrelated")).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            sets.get("team").await.unwrap().metadata.resource_version,
            version,
            "ListenerSet rewritten"
        );
    });
}

/// `serde_json::Value` of any optional status.
mod erased {
    pub trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for Option<T> {
        fn value(&self) -> serde_json::Value {
            self.as_ref().and_then(|s| serde_json::to_value(s).ok()).unwrap_or(serde_json::Value::Null)
        }
    }
}

/// `GatewaySpec.addresses` against the addresses weir publishes (`--publish-status-address`),
/// the steps of conformance `GatewayStaticAddresses` and `GatewayOptionalAddressValue`: an
/// address type weir does not take is `Accepted: False, UnsupportedAddress`; once it is
/// removed, an address that is not weir's is `Programmed: False, AddressNotUsable`; once that is
/// removed, the Gateway is programmed and `status.addresses` is the usable one. An entry with a
/// type and no value gets weir's address of that type. The listener serves throughout.
#[test]
fn gateway_static_addresses_status() {
    isolated("gateway_static_addresses_status", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        // Hostnames: two Gateways' listeners without one would conflict on weir's socket.
        let listeners =
            |host: &str| json!([{"name": "http", "port": 80, "protocol": "HTTP", "hostname": host}]);
        let fake = json!({"type": "test/fake-invalid-type", "value": "fake address teehee!"});
        let unusable = json!({"type": "IPAddress", "value": "198.51.100.7"});
        let usable = json!({"type": "IPAddress", "value": "192.0.2.10"});
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "static"}, "spec": {"gatewayClassName": "weir",
                "addresses": [fake, unusable, usable], "listeners": listeners("static.example")}}),
        )
        .await
        .unwrap();
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "empty"}, "spec": {"gatewayClassName": "weir",
                "addresses": [{"type": "IPAddress"}], "listeners": listeners("empty.example")}}),
        )
        .await
        .unwrap();
        gw(
            "HTTPRoute",
            "httproutes",
            json!({"metadata": {"name": "web"}, "spec": {"parentRefs": [{"name": "static"}],
                "hostnames": ["static.example"], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
        )
        .await
        .unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("static.example", "a", Duration::from_secs(10)).await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let status_at = |name: &'static str, generation: i64| {
            let gateways = gateways.clone();
            async move {
                let status = gateways.get(name).await.ok()?.status.value();
                let current = status["conditions"].as_array().is_some_and(|cs| {
                    !cs.is_empty() && cs.iter().all(|c| c["observedGeneration"] == generation)
                });
                current.then_some(status)
            }
        };

        let status =
            eventually("static at generation 1", Duration::from_secs(15), || status_at("static", 1)).await;
        assert_eq!(
            summary(cond(&status["conditions"], "Accepted")),
            s("False", "UnsupportedAddress", 1),
            "{status}"
        );
        let status =
            eventually("empty at generation 1", Duration::from_secs(15), || status_at("empty", 1)).await;
        assert_eq!(status["addresses"], json!([usable]), "the empty IPAddress entry gets weir's: {status}");
        assert_eq!(
            summary(cond(&status["conditions"], "Programmed")),
            s("True", "Programmed", 1),
            "{status}"
        );

        let resource = kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        );
        let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(admin.clone(), ns, &resource);
        let set = |addresses: Value| {
            let dynamic = dynamic.clone();
            async move {
                let patch = json!({"spec": {"addresses": addresses}});
                dynamic
                    .patch("static", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        };
        set(json!([unusable, usable])).await;
        let status =
            eventually("static at generation 2", Duration::from_secs(15), || status_at("static", 2)).await;
        assert_eq!(summary(cond(&status["conditions"], "Accepted")), s("True", "Accepted", 2), "{status}");
        let programmed = cond(&status["conditions"], "Programmed");
        assert_eq!(summary(programmed), s("False", "AddressNotUsable", 2), "{status}");
        assert!(programmed["message"].as_str().unwrap().contains("198.51.100.7"), "{programmed}");
        assert_eq!(status["addresses"], json!([usable]), "{status}");
        assert_eq!(weir.get("static.example", "/").map(|r| r.0), Some(200), "the listener still serves");

        set(json!([usable])).await;
        let status =
            eventually("static at generation 3", Duration::from_secs(15), || status_at("static", 3)).await;
        assert_eq!(summary(cond(&status["conditions"], "Accepted")), s("True", "Accepted", 3), "{status}");
        assert_eq!(
            summary(cond(&status["conditions"], "Programmed")),
            s("True", "Programmed", 3),
            "{status}"
        );
        assert_eq!(status["addresses"], json!([usable]), "{status}");
    });
}

/// GRPCRoute status: per parent `Accepted` and `ResolvedRefs` with their reasons and
/// `observedGeneration`, the listener's `attachedRoutes`, and the HTTPRoute/GRPCRoute hostname
/// conflict of `GRPCRouteSpec.hostnames` ("The rejected Route MUST raise an 'Accepted'
/// condition with a status of 'False'").
#[test]
fn grpcroute_status_written_by_the_leader() {
    isolated("grpcroute_status_written_by_the_leader", || async {
        let api = ApiServer::start().await;
        let ns = "default";
        let (admin, _echo) = class_and_web(&api, ns).await;
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        edge_gateway(&admin, ns).await;
        let rule = |backend: &str, filters: Value| json!({"backendRefs": [{"name": backend, "port": 80}], "filters": filters});
        let route = |name: &str, host: &str, rule: Value| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [{"name": "edge"}], "hostnames": [host], "rules": [rule]}})
        };
        // The HTTPRoute is created first, and its name comes first too: it wins even if both
        // were created within one second.
        gw("HTTPRoute", "httproutes", route("a-http", "shared.example", rule("web", json!([]))))
            .await
            .unwrap();
        gw("GRPCRoute", "grpcroutes", route("z-grpc", "shared.example", rule("web", json!([]))))
            .await
            .unwrap();
        gw("GRPCRoute", "grpcroutes", route("ok", "ok.example", rule("web", json!([])))).await.unwrap();
        gw("GRPCRoute", "grpcroutes", route("bad", "bad.example", rule("missing", json!([])))).await.unwrap();
        let extension = json!([{"type": "ExtensionRef", "extensionRef": {"group": "example.com", "kind": "Plugin", "name": "p"}}]);
        gw("GRPCRoute", "grpcroutes", route("ext", "ext.example", rule("web", extension))).await.unwrap();
        // Two mirrors (HTTPRouteRequestMultipleMirrors), one to a missing Service.
        let mirror = |to: &str| json!({"type": "RequestMirror", "requestMirror": {"backendRef": {"name": to, "port": 80}}});
        let mirrors = json!([mirror("web"), mirror("missing")]);
        gw("GRPCRoute", "grpcroutes", route("mirrors", "mirrors.example", rule("web", mirrors)))
            .await
            .unwrap();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("shared.example", "a", Duration::from_secs(15)).await;

        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        let routes: Api<GrpcRoute> = Api::namespaced(admin.clone(), ns);
        let parent = |name: &'static str| {
            let routes = routes.clone();
            async move {
                let r = routes.get(name).await.ok()?;
                let status = serde_json::to_value(r.status?).ok()?;
                status["parents"].as_array()?.iter().find(|p| p["controllerName"] == CONTROLLER).cloned()
            }
        };
        let ok = eventually("ok's status", Duration::from_secs(15), || parent("ok")).await;
        assert_eq!(summary(cond(&ok["conditions"], "Accepted")), s("True", "Accepted", 1), "{ok}");
        assert_eq!(summary(cond(&ok["conditions"], "ResolvedRefs")), s("True", "ResolvedRefs", 1), "{ok}");
        let bad = eventually("bad's status", Duration::from_secs(15), || parent("bad")).await;
        assert_eq!(summary(cond(&bad["conditions"], "Accepted")), s("True", "Accepted", 1), "{bad}");
        assert_eq!(
            summary(cond(&bad["conditions"], "ResolvedRefs")),
            s("False", "BackendNotFound", 1),
            "{bad}"
        );
        // `HTTPRequestMirrorFilter.backendRef`: "If the referent cannot be found, this BackendRef
        // is invalid and must be dropped from the Gateway. The controller must ensure the
        // "ResolvedRefs" condition on the Route status is set to `status: False`"; the route is
        // still accepted, its other mirror kept.
        let mirrors = eventually("mirrors' status", Duration::from_secs(15), || parent("mirrors")).await;
        assert_eq!(summary(cond(&mirrors["conditions"], "Accepted")), s("True", "Accepted", 1), "{mirrors}");
        assert_eq!(
            summary(cond(&mirrors["conditions"], "ResolvedRefs")),
            s("False", "BackendNotFound", 1),
            "{mirrors}"
        );
        assert!(
            mirrors["conditions"].to_string().contains("filters[1].requestMirror.backendRef"),
            "{mirrors}"
        );
        // `GRPCRouteFilter.type`: an ExtensionRef weir has none of is not skipped.
        let ext = eventually("ext's status", Duration::from_secs(15), || parent("ext")).await;
        assert_eq!(summary(cond(&ext["conditions"], "Accepted")), s("False", "UnsupportedValue", 1), "{ext}");
        let lost = eventually("z-grpc's status", Duration::from_secs(15), || parent("z-grpc")).await;
        assert_eq!(
            summary(cond(&lost["conditions"], "Accepted")),
            s("False", "NotAllowedByListeners", 1),
            "{lost}"
        );
        assert!(lost["conditions"].to_string().contains("default/a-http"), "{lost}");

        // `ListenerStatus.attachedRoutes`: "Routes with any other value for the Accepted
        // condition MUST NOT be included in this count": a-http, ok, bad and mirrors, not z-grpc
        // (the conflict) nor ext (its filter).
        let status = eventually("the Gateway status", Duration::from_secs(15), || async {
            let g = gateways.get("edge").await.ok()?;
            let status = serde_json::to_value(g.status?).ok()?;
            (status["listeners"][0]["attachedRoutes"] == 4).then_some(status)
        })
        .await;
        assert_eq!(
            status["listeners"][0]["supportedKinds"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}, {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
        );
        // The HTTPRoute still serves the shared host.
        assert_eq!(weir.get("shared.example", "/").map(|r| r.0), Some(200));
    });
}

/// Each HTTPRoute's status is written once: routes created one after another make weir
/// translate and reconcile again and again while its own earlier writes are still on their way
/// back through the watch; a reconcile in between must not write the same status again (at
/// 5,000 routes about 240 writes were such duplicates: bench/RESULTS.md, Gateway API scale).
/// Nothing else changes these routes' status (their Gateway and Service exist before them), so
/// the count is exact: one `Gateway API status updated` line per route in weir's log.
#[test]
fn each_route_status_is_written_once() {
    isolated("each_route_status_is_written_once", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        edge_gateway(&admin, ns).await;
        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        eventually("the Gateway status", Duration::from_secs(15), || async {
            let status = gateways.get("edge").await.ok()?.status.value();
            (summary(cond(&status["conditions"], "Programmed")) == s("True", "Programmed", 1)).then_some(())
        })
        .await;

        let names: Vec<String> = (0..24).map(|i| format!("once-{i}")).collect();
        for name in &names {
            gw(
                "HTTPRoute",
                "httproutes",
                json!({"metadata": {"name": name}, "spec": {
                    "parentRefs": [{"name": "edge"}], "hostnames": [format!("{name}.example")],
                    "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
            )
            .await
            .unwrap();
            // Spread over several translations (the source's holdoff is 100 ms).
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let routes: Api<HttpRoute> = Api::namespaced(admin.clone(), ns);
        wait_accepted(&routes, names.iter().map(String::as_str)).await;
        weir.wait_route("once-23.example", "a", Duration::from_secs(15)).await;
        // Let any late duplicate show (the resync and the last translations).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let log = weir.log();
        let writes = |name: &str| {
            let quoted = format!("name=\"{name}\"");
            let bare = format!("name={name} ");
            log.lines()
                .filter(|l| l.contains("Gateway API status updated") && l.contains("HTTPRoute"))
                .filter(|l| l.contains(&quoted) || l.contains(&bare) || l.ends_with(&format!("name={name}")))
                .count()
        };
        let counts: Vec<(String, usize)> = names.iter().map(|n| (n.clone(), writes(n))).collect();
        assert!(
            counts.iter().all(|(_, c)| *c == 1),
            "status writes per route (each exactly 1): {counts:?}\n--- weir log\n{log}"
        );
    });
}

/// Waits for weir's parent status on each route of `names`, and checks it is `Accepted` for
/// generation 1.
async fn wait_accepted<'a>(routes: &Api<HttpRoute>, names: impl IntoIterator<Item = &'a str>) {
    for name in names {
        let parent =
            eventually(&format!("{name}'s status"), Duration::from_secs(30), || our_parent(routes, name))
                .await;
        assert_eq!(summary(cond(&parent["conditions"], "Accepted")), s("True", "Accepted", 1), "{parent}");
    }
}

/// A restart on objects already in the API server, whose statuses the previous weir wrote,
/// publishes one table for them, not two: the reflectors' first lists used to leave a wake-up
/// behind that made the first burst translate the same snapshot again (`changed_hosts=0`; a
/// full translation of 0.9-1.7 s at 5,000 HTTPRoutes, bench/RESULTS.md "Gateway API scale").
/// (On a first start the echo of weir's own status writes hid it: a status-only change, no
/// table.) The new weir writes nothing until one new route, which then makes exactly one more
/// table: two in all.
#[test]
fn a_restart_publishes_one_table_for_what_is_already_there() {
    isolated("a_restart_publishes_one_table_for_what_is_already_there", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let ns = "default";
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        edge_gateway(&admin, ns).await;
        let route = |name: &str| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [{"name": "edge"}], "hostnames": [format!("{name}.example")],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}})
        };
        let names = ["there-0", "there-1", "there-2"];
        for name in names {
            gw("HTTPRoute", "httproutes", route(name)).await.unwrap();
        }
        let mut first = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        first.wait_ready(Duration::from_secs(30)).await;
        let routes: Api<HttpRoute> = Api::namespaced(admin.clone(), ns);
        wait_accepted(&routes, names).await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        eventually("the Gateway's attachedRoutes", Duration::from_secs(15), || async {
            let status = gateways.get("edge").await.ok()?.status.value();
            (status["listeners"][0]["attachedRoutes"] == 3).then_some(())
        })
        .await;
        first.terminate();

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("there-2.example", "a", Duration::from_secs(10)).await;
        // Past the source's holdoff (100 ms): an identical table would be out by now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Read before the new route: its own Accepted and the Gateway's attachedRoutes are
        // writes this weir must make.
        let before = weir.log();
        assert!(!before.contains("Gateway API status updated"), "the statuses were already right\n{before}");
        gw("HTTPRoute", "httproutes", route("late")).await.unwrap();
        weir.wait_route("late.example", "a", Duration::from_secs(15)).await;
        // The log line follows the swap that answered the request: wait for it, then give a
        // third table the holdoff's time to show.
        let tables = || weir.log().lines().filter(|l| l.contains("routing table published")).count();
        eventually("the new route's table in the log", Duration::from_secs(5), || async {
            (tables() >= 2).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = weir.log();
        assert_eq!(tables(), 2, "tables published (the start's, then the new route's)\n--- weir log\n{log}");
    });
}

/// weir writes every Gateway API status with exactly the privileges of
/// `examples/kubernetes/rbac.yaml` (the chart's rendering): a ServiceAccount token, not an admin
/// one. GatewayClass, Gateway (with `attachedListenerSets`), ListenerSet, HTTPRoute, GRPCRoute
/// and TLSRoute each get their status, and no request is forbidden (the chart's ClusterRole had
/// no `tlsroutes/status` until this test).
#[test]
fn gateway_api_status_with_the_charts_rbac() {
    isolated("gateway_api_status_with_the_charts_rbac", || async {
        let (api, admin, _echo) = cluster_with_class().await;
        let rbac = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes/rbac.yaml");
        support_kube::apply_file(&admin, &rbac).await;
        let ns = "default";
        let gw = |kind, plural, value| create(&admin, Some(ns), "v1", kind, plural, value);
        gw(
            "Gateway",
            "gateways",
            json!({"metadata": {"name": "edge"}, "spec": {"gatewayClassName": "weir",
            "allowedListeners": {"namespaces": {"from": "Same"}},
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "web.example"},
                {"name": "grpc", "port": 80, "protocol": "HTTP", "hostname": "grpc.example"},
                {"name": "pass", "port": 443, "protocol": "TLS", "hostname": "*.pass.example",
                 "tls": {"mode": "Passthrough"}},
            ]}}),
        )
        .await
        .unwrap();
        gw(
            "ListenerSet",
            "listenersets",
            json!({"metadata": {"name": "team"}, "spec": {"parentRef": {"name": "edge"},
                "listeners": [{"name": "app", "port": 80, "protocol": "HTTP", "hostname": "team.example"}]}}),
        )
        .await
        .unwrap();
        let route = |name: &str, section: &str, host: &str| {
            json!({"metadata": {"name": name}, "spec": {
                "parentRefs": [{"name": "edge", "sectionName": section}], "hostnames": [host],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}})
        };
        gw("HTTPRoute", "httproutes", route("web", "http", "web.example")).await.unwrap();
        gw("GRPCRoute", "grpcroutes", route("grpc", "grpc", "grpc.example")).await.unwrap();
        gw("TLSRoute", "tlsroutes", route("pass", "pass", "a.pass.example")).await.unwrap();

        let token = support_kube::service_account_token(&admin, "weir-system", "weir").await;
        let weir = Weir::start(
            &api.kubeconfig_for(&token),
            &["--election-namespace", "weir-system", "--publish-status-address", "192.0.2.10"],
        );
        weir.wait_ready(Duration::from_secs(30)).await;
        weir.wait_route("web.example", "a", Duration::from_secs(15)).await;

        let classes: Api<GatewayClass> = Api::all(admin.clone());
        eventually("the GatewayClass status", Duration::from_secs(15), || async {
            let status = classes.get("weir").await.ok()?.status.value();
            (summary(cond(&status["conditions"], "Accepted")) == s("True", "Accepted", 1)).then_some(())
        })
        .await;
        let gateways: Api<Gateway> = Api::namespaced(admin.clone(), ns);
        eventually("the Gateway status", Duration::from_secs(15), || async {
            let status = gateways.get("edge").await.ok()?.status.value();
            let programmed = summary(cond(&status["conditions"], "Programmed")) == s("True", "Programmed", 1);
            (programmed && status["attachedListenerSets"] == 1).then_some(())
        })
        .await;
        let resource = |kind: &str, plural: &str| {
            kube::discovery::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind),
                plural,
            )
        };
        let sets: Api<kube::api::DynamicObject> =
            Api::namespaced_with(admin.clone(), ns, &resource("ListenerSet", "listenersets"));
        eventually("the ListenerSet status", Duration::from_secs(15), || async {
            let set = sets.get("team").await.ok()?;
            let status = set.data.get("status")?.clone();
            (summary(cond(&status["conditions"], "Accepted")) == s("True", "Accepted", 1)).then_some(())
        })
        .await;
        let http: Api<HttpRoute> = Api::namespaced(admin.clone(), ns);
        let grpc: Api<GrpcRoute> = Api::namespaced(admin.clone(), ns);
        let tls: Api<TlsRoute> = Api::namespaced(admin.clone(), ns);
        let accepted = |parent: Option<Value>| {
            parent.filter(|p| summary(cond(&p["conditions"], "Accepted")) == s("True", "Accepted", 1))
        };
        eventually("the HTTPRoute status", Duration::from_secs(15), || async {
            accepted(our_parent(&http, "web").await)
        })
        .await;
        eventually("the GRPCRoute status", Duration::from_secs(15), || async {
            accepted(our_parent(&grpc, "grpc").await)
        })
        .await;
        eventually("the TLSRoute status", Duration::from_secs(15), || async {
            accepted(our_parent(&tls, "pass").await)
        })
        .await;
        let log = weir.log();
        assert!(!log.to_lowercase().contains("forbidden"), "a request was forbidden:\n{log}");
    });
}
