"""Generates a manifest directory for `weir serve --manifests`: INGRESSES Ingresses (host
app-N.bench.local, two paths each), SERVICES Services and ENDPOINTS endpoints spread evenly over
the Services as EndpointSlices, in one file per namespace, plus the `live` Service whose one
endpoint is a real backend (LIVE_ADDR) and the default IngressClass. Endpoint addresses are in
127.0.0.0/8 and never receive traffic (only `live` does).

    python3 bench/scale/gen.py OUT_DIR [INGRESSES [SERVICES [ENDPOINTS [LIVE_ADDR]]]]
    (defaults: 10000 20000 100000 127.0.0.1:28950)
"""

import os
import sys


def main():
    out = sys.argv[1]
    ingresses = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    services = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
    endpoints = int(sys.argv[4]) if len(sys.argv) > 4 else 100_000
    live = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1:28950"
    namespaces = max(1, ingresses // 100)
    os.makedirs(out, exist_ok=True)
    live_ip, live_port = live.rsplit(":", 1)

    with open(os.path.join(out, "00-base.yaml"), "w") as f:
        f.write(f"""apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: weir
  annotations: {{ingressclass.kubernetes.io/is-default-class: "true"}}
spec: {{controller: weir.dev/ingress-controller}}
---
apiVersion: v1
kind: Service
metadata: {{name: live, namespace: live}}
spec:
  ports: [{{name: http, port: 80, targetPort: {live_port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: live-1, namespace: live, labels: {{kubernetes.io/service-name: live}}}}
addressType: IPv4
ports: [{{name: http, port: {live_port}, protocol: TCP}}]
endpoints:
- addresses: ["{live_ip}"]
  conditions: {{ready: true}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: live, namespace: live}}
spec:
  rules:
  - host: live.bench.local
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: live, port: {{number: 80}}}}}}}}
""")

    ep_next = 0
    for ns in range(namespaces):
        docs = []
        ing_range = range(ns * ingresses // namespaces, (ns + 1) * ingresses // namespaces)
        svc_range = range(ns * services // namespaces, (ns + 1) * services // namespaces)
        for s in svc_range:
            docs.append(f"""apiVersion: v1
kind: Service
metadata: {{name: svc-{s}, namespace: ns-{ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]""")
            count = (s + 1) * endpoints // services - s * endpoints // services
            addrs = []
            for _ in range(count):
                n = ep_next
                ep_next += 1
                addrs.append(f'- addresses: ["127.{1 + n // 65536 % 254}.{n // 256 % 256}.{1 + n % 254}"]\n'
                             f"  conditions: {{ready: true}}")
            docs.append(f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc-{s}-1, namespace: ns-{ns}, labels: {{kubernetes.io/service-name: svc-{s}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
""" + "\n".join(addrs))
        svcs = list(svc_range)
        for k, i in enumerate(ing_range):
            a = svcs[(2 * k) % len(svcs)] if svcs else 0
            b = svcs[(2 * k + 1) % len(svcs)] if svcs else 0
            docs.append(f"""apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: ing-{i}, namespace: ns-{ns}}}
spec:
  rules:
  - host: app-{i}.bench.local
    http:
      paths:
      - {{path: /, pathType: Prefix, backend: {{service: {{name: svc-{a}, port: {{number: 80}}}}}}}}
      - {{path: /api, pathType: Prefix, backend: {{service: {{name: svc-{b}, port: {{number: 80}}}}}}}}""")
        with open(os.path.join(out, f"ns-{ns:04}.yaml"), "w") as f:
            f.write("\n---\n".join(docs) + "\n")
    print(f"{ingresses} Ingresses, {services} Services, {ep_next} endpoints in {namespaces} files")


if __name__ == "__main__":
    main()
