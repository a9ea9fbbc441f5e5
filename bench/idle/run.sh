#!/usr/bin/env bash
# Idle connection memory: the resident memory one idle client connection costs weir, nginx and
# HAProxy (plain HTTP/1.1 keep-alive after one request, and TLS after one request), side by side
# with bench/peers' configurations. See bench/README.md.
#
#   bench/idle/run.sh                      # 10,000 connections, 3 rounds, both kinds
#   CONNS=5000 ROUNDS=1 KINDS=tls bench/idle/run.sh
#
# Environment: WEIR_BIN (default: build it with cargo), CONNS, ROUNDS, KINDS (keepalive,tls),
# PROXIES, SETTLE (seconds between the last connection and the reading, default 2), PROXY_CPU,
# LOAD_CPU, WORKDIR. Needs root or a hard open-file limit of at least 2 x CONNS + 64 (HAProxy needs two per connection).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

missing=()
for tool in nginx:nginx-light haproxy:haproxy openssl:openssl taskset:util-linux python3:python3; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "${tool%%:*}" >/dev/null 2>&1 ||
    missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing tools; install them with: apt-get install -y ${missing[*]}" >&2
  exit 2
fi
export PATH=$PATH:/usr/sbin

if [ -z "${WEIR_BIN:-}" ]; then
  echo "building weir (release)..." >&2
  (cd "$root" && cargo build --release --locked --bin weir >&2)
  target=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  WEIR_BIN=$target/release/weir
fi
export WEIR_BIN

if [ -n "${WORKDIR:-}" ]; then
  workdir=$WORKDIR
else
  workdir=$(mktemp -d /tmp/weir-bench-idle.XXXXXX)
  trap 'rm -rf "$workdir"' EXIT
fi
mkdir -p "$workdir"
chmod 755 "$workdir"
export WORKDIR=$workdir

openssl ecparam -name prime256v1 -genkey -noout -out "$workdir/key.pem" 2>/dev/null
openssl req -x509 -new -key "$workdir/key.pem" -out "$workdir/cert.pem" -days 2 \
  -subj /CN=bench.local -addext subjectAltName=DNS:bench.local 2>/dev/null

taskset -c "${LOAD_CPU:-0}" python3 "$here/idle.py"
