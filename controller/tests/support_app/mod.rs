//! One app for the serve tests: a Service with one endpoint and an Ingress for `app.test`.
#![allow(dead_code)]

use std::net::SocketAddr;

/// The manifests of a Service `echo` whose one endpoint is `backend`, and an Ingress routing
/// `app.test` `path` (Prefix) to it.
pub fn app_yaml(backend: SocketAddr, path: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: echo-1
  namespace: default
  labels: {{kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints:
- addresses: ["{ip}"]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web, namespace: default}}
spec:
  ingressClassName: weir
  rules:
  - host: app.test
    http:
      paths:
      - {{path: {path}, pathType: Prefix, backend: {{service: {{name: echo, port: {{number: 80}}}}}}}}
"#,
        port = backend.port(),
        ip = backend.ip(),
    )
}
