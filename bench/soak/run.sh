#!/usr/bin/env bash
# Soak: weir under moderate mixed load (h1 keep-alive and new connections, TLS h1, h2 over TLS,
# WebSocket sessions, gRPC unary calls and streams) for a bounded time while faults are injected
# on a schedule (table swaps, certificate rotation, endpoint churn with draining, an upstream
# killed and restarted). Samples weir's RSS, fds, threads and tokio tasks over time, attributes
# every client error to a fault, and prints PASS or FAIL. See bench/README.md.
#
#   bench/soak/run.sh                          # 30 minutes
#   SOAK_MINUTES=2 bench/soak/run.sh           # a quick try
#   WEIR_BIN=/path/weir SOAK_BIN=/path/weir-soak OUT_DIR=/tmp/soak bench/soak/run.sh
#
# Environment: SOAK_MINUTES (30), SOAK_INTERVAL (sampling, 10 s), OUT_DIR (default
# /tmp/weir-soak.<date>), WEIR_BIN and SOAK_BIN (default: `cargo build --profile dist` of this
# checkout), SOAK_SCALE (multiplies the load, 1: about 160 requests/s), SWAP_EVERY (3 s),
# ROTATE_EVERY (60 s), CHURN_EVERY (20 s), DRAIN (5 s), FLAP_EVERY (90 s), FLAP_DOWN (3 s),
# FLAP_GRACE (5 s), GROWTH_TOLERANCE (0.10), PORT_BASE (29100: ports 29101-29190 on
# 127.0.0.1 and backends on 127.0.0.21-42), PROXY_CPU / LOAD_CPU (taskset weir / the rest).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# shellcheck source=../lib.sh
. "$here/../lib.sh"
tools=(openssl:openssl python3:python3)
if [ -n "${PROXY_CPU:-}${LOAD_CPU:-}" ]; then tools+=(taskset:util-linux); fi
require_tools "${tools[@]}"

if [ -z "${WEIR_BIN:-}" ] || [ -z "${SOAK_BIN:-}" ]; then
  bins=$(dist_bins "$root" weir weir-soak)
  WEIR_BIN=${WEIR_BIN:-$bins/weir}
  SOAK_BIN=${SOAK_BIN:-$bins/weir-soak}
fi
export WEIR_BIN SOAK_BIN

OUT_DIR=${OUT_DIR:-/tmp/weir-soak.$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT_DIR"
export OUT_DIR
echo "soak output: $OUT_DIR" >&2

exec python3 "$here/soak.py"
