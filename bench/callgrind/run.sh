#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a deterministic figure (to ~1 %) for
# comparing weir builds on a shared or noisy machine, where wall-clock and CPU-time figures are
# not. User-space instructions only (the kernel's share is not counted); no timing.
#
#   bench/callgrind/run.sh WEIR_BIN [WEIR_BIN...]
#   SCENARIOS=h1,h2-tls REQUESTS=20000 bench/callgrind/run.sh old/weir new/weir
#   bench/callgrind/run.sh "$B" "$B --metrics=false"          # one build, two configurations
#   bench/callgrind/run.sh "$B" "$B +settings=otel.yaml"      # with a settings ConfigMap
#
# Each argument is a binary, optionally followed (in the same word, space-separated) by extra
# `weir serve` flags, and by `+settings=FILE`: a `default/weir-settings` ConfigMap (YAML) put
# beside the benchmark's manifests for that run. `$OTLP_PORT` in FILE is replaced by the port of
# a sink collector (the tests' OTLP receiver, /var/cache/weir/otlp-receiver) started for the run.
# The access log is off unless the flags name `--access-log`.
#
# For each binary: an upstream nginx (the bench's fixed small body) on 127.0.0.1, weir under
# `valgrind --tool=callgrind` with `--threads 1` in front of it, then per scenario 2,000 requests
# of warm-up, the counters zeroed, REQUESTS requests with h2load (32 HTTP/1.1 connections, or
# 8 HTTP/2 connections x 16 streams), the counters dumped: Ir / REQUESTS. PROFILE_DIR keeps the
# dumps (callgrind_annotate reads them); by default they are deleted.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 WEIR_BIN [WEIR_BIN...]" >&2; exit 2; }
scenarios=${SCENARIOS:-h1,h1-tls,h2-tls}
requests=${REQUESTS:-10000}
up=${UP_PORT:-18480} http=${HTTP_PORT:-18481} https=${HTTPS_PORT:-18482} admin=${ADMIN_PORT:-18483}
work=$(mktemp -d /tmp/weir-bench-callgrind.XXXXXX)
upstream_pid=
weir_pid=
cleanup() {
  if [ -n "$weir_pid" ]; then kill "$weir_pid" 2>/dev/null || true; wait "$weir_pid" 2>/dev/null || true; fi
  if [ -n "$upstream_pid" ]; then kill "$upstream_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=bench/callgrind/lib.sh
. "$(dirname "$0")/lib.sh"
mkdir -p "$work/manifests"
start_upstream
cat >"$work/manifests/bench.yaml" <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: weir
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: weir.dev/ingress-controller}
---
apiVersion: v1
kind: Secret
metadata: {name: bench-tls, namespace: bench}
type: kubernetes.io/tls
data:
  tls.crt: $(base64 -w0 "$work/cert.pem")
  tls.key: $(base64 -w0 "$work/key.pem")
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bench, namespace: bench}
spec:
  rules:
  - http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: up, port: {number: 80}}}}
---
apiVersion: v1
kind: Service
metadata: {name: up, namespace: bench}
spec:
  ports: [{name: http, port: 80, targetPort: $up}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: up-1
  namespace: bench
  labels: {kubernetes.io/service-name: up}
addressType: IPv4
ports: [{name: http, port: $up, protocol: TCP}]
endpoints:
- addresses: ["127.0.0.1"]
  conditions: {ready: true}
EOF

collector_pid=
stop_collector() {
  if [ -n "$collector_pid" ]; then kill "$collector_pid" 2>/dev/null || true; wait "$collector_pid" 2>/dev/null || true; fi
  collector_pid=
}
trap 'stop_collector; cleanup' EXIT

printf '%-40s %-8s %12s\n' binary scenario "Ir/request"
for spec in "$@"; do
  read -ra words <<<"$spec"
  bin=${words[0]}
  extra=()
  settings=
  for word in "${words[@]:1}"; do
    case $word in
      +settings=*) settings=${word#+settings=} ;;
      *) extra+=("$word") ;;
    esac
  done
  label="$(basename "$bin")${extra[*]:+ ${extra[*]}}${settings:+ $(basename "$settings")}"
  rm -f "$work/manifests/settings.yaml"
  if [ -n "$settings" ]; then
    receiver=/var/cache/weir/otlp-receiver/bin/python
    [ -x "$receiver" ] || { echo "+settings needs the OTLP receiver (scripts/test.sh install)" >&2; exit 2; }
    "$receiver" "$(dirname "$0")/../../controller/tests/otlp/receiver.py" >"$work/collector.out" &
    collector_pid=$!
    for _ in $(seq 100); do grep -q '^listening port=' "$work/collector.out" 2>/dev/null && break; sleep 0.1; done
    otlp_port=$(sed -n 's/^listening port=//p' "$work/collector.out" | head -1)
    [ -n "$otlp_port" ] || { echo "the OTLP receiver did not start" >&2; exit 1; }
    sed "s/\$OTLP_PORT/$otlp_port/g" "$settings" >"$work/manifests/settings.yaml"
  fi
  # nginx logs nothing here; builds with --access-log log every request unless told not to.
  quiet=()
  if [[ " ${extra[*]} " != *" --access-log "* ]] && "$bin" serve --help 2>/dev/null | grep -q -- --access-log; then
    quiet=(--access-log off)
  fi
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out.%p" --compress-strings=no \
    --compress-pos=no "$bin" --log-level warn serve --manifests "$work/manifests" \
    --listen-http "127.0.0.1:$http" --listen-https "127.0.0.1:$https" --listen-admin "127.0.0.1:$admin" \
    --threads 1 --default-certificate bench/bench-tls "${quiet[@]}" "${extra[@]}" >"$work/weir.log" 2>&1 &
  weir_pid=$!
  for _ in $(seq 200); do curl -fs -o /dev/null "http://127.0.0.1:$http/" && break; sleep 0.3; done
  curl -fs -o /dev/null "http://127.0.0.1:$http/" || { echo "weir did not serve; its log:" >&2; cat "$work/weir.log" >&2; exit 1; }
  for scenario in ${scenarios//,/ }; do
    measure "$weir_pid" "$label" "$scenario" "$(printf %s "$label" | tr -c 'A-Za-z0-9._=-' _).$scenario.callgrind"
  done
  kill "$weir_pid"; wait "$weir_pid" 2>/dev/null || true
  weir_pid=
  if [ -n "$settings" ]; then
    spans=$(grep -c '^{' "$work/collector.out" || true)
    echo "  ($label: the collector received $spans spans)"
  fi
  stop_collector
  rm -f "$work"/callgrind.out.*
done
