//! Helpers of the Gateway API tests that run `weir serve --manifests`: a Service manifest for a
//! backend on loopback, and manifests written as editors write them.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::Path;

/// The manifests of a Service `name` (port 80) whose one endpoint is `addr`.
pub fn service(name: &str, addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n---\n",
        port = addr.port(),
        ip = addr.ip(),
    )
}

/// Writes `yaml` as `dir/file` (write then rename, as editors do).
pub fn write(dir: &Path, file: &str, yaml: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}
