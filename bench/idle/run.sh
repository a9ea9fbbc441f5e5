#!/usr/bin/env bash
# Idle connection memory: the resident memory one idle client connection costs weir, nginx and
# HAProxy (plain HTTP/1.1 keep-alive after one request, and TLS after one request), side by side
# with bench/peers' configurations. See bench/README.md.
#
#   bench/idle/run.sh                      # 10,000 connections, 3 rounds, both kinds
#   CONNS=5000 ROUNDS=1 KINDS=tls bench/idle/run.sh
#
# Environment: WEIR_BIN (default: build it with cargo), CONNS, ROUNDS, KINDS (keepalive,tls),
# PROXIES, SETTLE (seconds between the last connection and the reading, default 6), WARMUP_CONNS
# (connections served and closed SETTLE before the first reading, default 0: read 0.5 s after
# the start), PROXY_CPU,
# LOAD_CPU, WORKDIR. Needs root or a hard open-file limit of at least 2 x CONNS + 64 (HAProxy needs two per connection).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# shellcheck source=../lib.sh
. "$here/../lib.sh"
require_tools nginx:nginx-light haproxy:haproxy openssl:openssl taskset:util-linux python3:python3
if [ -z "${WEIR_BIN:-}" ]; then
  WEIR_BIN=$(dist_bins "$root" weir)/weir
fi
export WEIR_BIN
work_dir weir-bench-idle
workdir=$WORKDIR

openssl ecparam -name prime256v1 -genkey -noout -out "$workdir/key.pem" 2>/dev/null
openssl req -x509 -new -key "$workdir/key.pem" -out "$workdir/cert.pem" -days 2 \
  -subj /CN=bench.local -addext subjectAltName=DNS:bench.local 2>/dev/null

taskset -c "${LOAD_CPU:-0}" python3 "$here/idle.py"
