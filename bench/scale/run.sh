#!/usr/bin/env bash
# Scale benchmark: generates 10,000 Ingresses / 20,000 Services / 100,000 endpoints (bench/scale/
# gen.py), serves them with `weir serve --manifests`, and measures start-up (parse, translate,
# compile + swap, from weir's own "routing table published" log line), RSS after load, change
# propagation (file written -> first request routed by the new rule) over CHANGES edits, FULL
# full rebuilds, and failed requests while CHURN route changes happen under continuous wrk load.
#
#   bench/scale/run.sh
#   INGRESSES=1000 SERVICES=2000 ENDPOINTS=10000 CHANGES=20 CHURN=100 bench/scale/run.sh
#
# MODE=gateway runs the Gateway API variant instead (bench/scale/gateway.py): 5,000 HTTPRoutes
# created through a real kube-apiserver (scripts/kube-apiserver.sh build, cached), as root, in a
# private network namespace; ROUTES, SERVICES, NAMESPACES, BACKENDS, CHANGES, CREATORS, SAMPLE,
# RESTART (1: then the restart case, weir started on the routes already there), RESTART_BINS
# (`name=path ...`: the restart case for each binary in turn, on the same routes), RESTART_ROUNDS
# (that many rounds, then the median of each figure per binary), WEIR_LOG_LEVEL (weir's
# --log-level; `...,kube_client=debug` logs every API request).
#
#   MODE=gateway bench/scale/run.sh
#   MODE=gateway CHANGES=0 RESTART_ROUNDS=2 RESTART_BINS="base=/path/a new=/path/b" bench/scale/run.sh
#
# Environment: WEIR_BIN (default: build with cargo), INGRESSES, SERVICES, ENDPOINTS, CHANGES
# (default 100), FULL (default 10), CHURN (default 1000), CHURN_INTERVAL_MS (default 50), WORKDIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../lib.sh
. "$here/../lib.sh"
for tool in wrk python3; do
  command -v $tool >/dev/null || { echo "missing $tool (apt-get install -y $tool)" >&2; exit 2; }
done
if [ -z "${WEIR_BIN:-}" ]; then
  WEIR_BIN=$(dist_bins "$root" weir)/weir
fi
export WEIR_BIN
if [ -z "${WORKDIR:-}" ]; then
  WORKDIR=$(mktemp -d /tmp/weir-bench-scale.XXXXXX)
  trap 'rm -rf "$WORKDIR"' EXIT
fi
export WORKDIR
if [ "${MODE:-ingress}" = gateway ]; then
  [ "$(id -u)" = 0 ] || { echo "MODE=gateway needs root (a private network namespace)" >&2; exit 2; }
  "$root/scripts/kube-apiserver.sh" build >&2
  # The API server refuses endpoints on 127.0.0.0/8: in the namespace, lo carries 10.0.0.0/8.
  unshare --net sh -c 'ip link set lo up && ip addr add 10.0.0.1/8 dev lo && exec python3 -u "$1"' \
    sh "$here/gateway.py"
  exit 0
fi
python3 -u "$here/scale.py"
