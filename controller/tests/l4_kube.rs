//! TCP services read from a real kube-apiserver: the services ConfigMap is watched, its edits
//! and the Service's endpoints apply without a restart, and a bad entry becomes an Event on the
//! ConfigMap. Runs in its own network namespace (see `support_kube`); skipped with a printed
//! reason without root or the binaries, failed instead under `WEIR_REQUIRE_ALL=1`.

#![allow(clippy::unwrap_used)]

mod support_kube;

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use support_kube::{
    ApiServer, Echo, Weir, apply, create_namespace, endpoints, eventually, http_get, isolated, service,
};

/// A port free on 127.0.0.1 now (weir binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The echo backend that answers a GET through the L4 port `port`.
async fn answer(port: u16, want: &str) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    eventually(&format!("port {port} answered by {want}"), Duration::from_secs(10), || async {
        (http_get(addr, "l4.test", "/").is_some_and(|(status, name)| status == 200 && name == want))
            .then_some(())
    })
    .await;
}

#[test]
fn tcp_services_follow_the_api() {
    isolated("tcp_services_follow_the_api", || async {
        let api = ApiServer::start().await;
        let client = api.client().await;
        let ns = "db";
        create_namespace(&client, ns).await;
        let echo = Echo::start(&["a", "b"]).await;
        apply::<Service>(&client, ns, service("web")).await;
        apply::<Endpoints>(&client, ns, endpoints("web", &[echo.ports[0]])).await;
        let (first, second, bad) = (free_port(), free_port(), free_port());
        let tcp = |data: serde_json::Value| serde_json::json!({"metadata": {"name": "tcp"}, "data": data});
        apply::<ConfigMap>(&client, ns, tcp(serde_json::json!({first.to_string(): "db/web:http"}))).await;

        let weir = Weir::start(
            &api.kubeconfig,
            &["--tcp-services-configmap", "db/tcp", "--l4-listen-address", "127.0.0.1"],
        );
        weir.wait_ready(Duration::from_secs(30)).await;
        answer(first, "a").await;

        // An edited ConfigMap: a new port serves, a bad entry gets an Event on the ConfigMap.
        let data = serde_json::json!({
            first.to_string(): "db/web:http",
            second.to_string(): "db/web:80",
            bad.to_string(): "db/missing:80",
        });
        apply::<ConfigMap>(&client, ns, tcp(data)).await;
        answer(second, "a").await;
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        let event = eventually("an Event on the services ConfigMap", Duration::from_secs(10), || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("tcp"))
        })
        .await;
        assert_eq!(event.reason.as_deref(), Some("ServiceNotFound"), "{event:?}");
        assert_eq!(event.regarding.as_ref().and_then(|r| r.kind.as_deref()), Some("ConfigMap"));
        assert!(event.note.as_deref().unwrap_or_default().contains(&format!("data[{bad}]")), "{event:?}");

        // The Service's endpoints change: new connections go to the new backend.
        apply::<Endpoints>(&client, ns, endpoints("web", &[echo.ports[1]])).await;
        answer(first, "b").await;
        answer(second, "b").await;
        drop(echo);
    });
}
