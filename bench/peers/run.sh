#!/usr/bin/env bash
# Side-by-side benchmark: weir, nginx and HAProxy as reverse proxies in front of the same
# upstream (an nginx serving fixed bodies), each proxy pinned to one core with one worker, the
# load generators and the upstream on the other core. Interleaved rounds; per scenario prints each
# proxy's median req/s, p99, proxy CPU seconds per 10k requests, peak RSS and the ratios of weir
# to nginx and HAProxy, then checks its own integrity. See bench/README.md.
#
#   bench/peers/run.sh                         # 3 rounds x 5 s, every scenario
#   ROUNDS=5 DURATION=10 bench/peers/run.sh    # longer
#   SCENARIOS=h1,h2-tls PROXIES=weir,nginx bench/peers/run.sh
#   SCENARIOS=gzip-100k,br-100k bench/peers/run.sh   # response compression (ingress-nginx's levels)
#
# Environment: WEIR_BIN (default: build it with cargo), ROUNDS, DURATION (s), WARMUP (s),
# SCENARIOS, PROXIES, PROXY_CPU (default 1), LOAD_CPU (default 0), WORKDIR (default a temp dir),
# JSON_OUT (write every run's raw figures there), H1_RATE and H2_RATE (requests/s of the
# fixed-rate scenarios h1-rate and h2-tls-rate, default 40000), PEER_HEADERS (weir: nginx and
# HAProxy set the request headers weir sets, the default; none: they add none), KEY_TYPE (ec:
# ECDSA P-256, the default; rsa: RSA 2048), WEIR_BASE_BIN (a second weir build, run beside the
# others as the proxy weir-base: before and after a change in one run), WEIR_BASE_ARGS (extra
# `weir serve` flags of weir-base, e.g. --metrics=false with WEIR_BASE_BIN=$WEIR_BIN).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# shellcheck source=../lib.sh
. "$here/../lib.sh"
require_tools nginx:nginx-light haproxy:haproxy wrk:wrk h2load:nghttp2-client openssl:openssl \
  taskset:util-linux python3:python3 curl:curl
# br-100k compares with nginx's brotli module (Debian's libnginx-mod-http-brotli-filter).
case ",${SCENARIOS:-br-100k}," in
  *,br-100k,*)
    [ -f /usr/lib/nginx/modules/ngx_http_brotli_filter_module.so ] || {
      echo "br-100k needs nginx's brotli module: apt-get install -y libnginx-mod-http-brotli-filter" \
        "(or leave br-100k out of SCENARIOS)" >&2
      exit 2
    } ;;
esac
if [ "$(nproc)" -lt 2 ]; then
  echo "needs at least 2 CPUs (one for the proxy, one for load and upstream)" >&2
  exit 2
fi

if [ -z "${WEIR_BIN:-}" ]; then
  WEIR_BIN=$(dist_bins "$root" weir)/weir
fi
export WEIR_BIN
work_dir weir-bench-peers  # nginx workers (user nobody) read the 1 MiB body from it
workdir=$WORKDIR

# A fresh ECDSA P-256 key and self-signed certificate for every run (never committed).
# KEY_TYPE=rsa: RSA 2048 instead (full handshakes cost differently per key type).
case "${KEY_TYPE:-ec}" in
  ec) openssl ecparam -name prime256v1 -genkey -noout -out "$workdir/key.pem" 2>/dev/null ;;
  rsa) openssl genrsa -out "$workdir/key.pem" 2048 2>/dev/null ;;
  *) echo "KEY_TYPE must be ec or rsa" >&2; exit 2 ;;
esac
openssl req -x509 -new -key "$workdir/key.pem" -out "$workdir/cert.pem" -days 2 \
  -subj /CN=bench.local -addext subjectAltName=DNS:bench.local 2>/dev/null

# The orchestrator runs on the load core so that it never steals the proxy's core.
taskset -c "${LOAD_CPU:-0}" python3 "$here/peers.py"
