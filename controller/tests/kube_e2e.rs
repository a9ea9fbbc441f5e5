//! weir against a real kube-apiserver (1.20, built by `scripts/kube-apiserver.sh build`):
//! objects created through the API, behaviour checked with real HTTP requests through weir.
//!
//! Each test runs in its own network namespace with its own etcd and API server (see
//! `support_kube`). Skipped with a printed reason when the binaries or root are missing, failed
//! instead when `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

mod support_kube;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Api;
use kube::api::ListParams;
use support_kube::{
    ApiServer, Echo, Weir, apply, apply_class, create_namespace, delete, endpoints, eventually, ingress,
    isolated, measured, service,
};

const CONTROLLER: &str = "weir.dev/ingress-controller";
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

        let weir = Weir::start(&api.kubeconfig, &["--publish-status-address", "192.0.2.10"]);
        let ready = weir.wait_ready(Duration::from_secs(30)).await;
        measured("weir start to first publish (readyz)", ready);
        assert!(
            weir.log().contains("watching core v1 Endpoints instead"),
            "the fallback is logged:\n{}",
            weir.log()
        );

        // Routes appear.
        weir.wait_route("web.example", "a", REROUTE).await;
        // Another class is ignored entirely.
        assert_eq!(weir.get("foreign.example", "/").map(|r| r.0), Some(404));

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
