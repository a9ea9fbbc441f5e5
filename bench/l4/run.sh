#!/usr/bin/env bash
# TCP services side by side: weir (--tcp-services-configmap), HAProxy (mode tcp) and nginx
# (stream), each pinned to one core with one worker, the client and the upstream (Python) on
# the other. Scenarios: one stream of SIZE_MB (1 GiB) client -> upstream, and CONNS short
# connections (connect, one byte each way, close). Interleaved rounds; prints each proxy's median
# throughput / connection rate, proxy CPU seconds per GiB / per 10k connections, and the ratios of
# weir to the peers. See bench/README.md.
#
#   bench/l4/run.sh                          # 3 rounds, 1 GiB, 10k connections
#   ROUNDS=5 SIZE_MB=2048 CONNS=20000 bench/l4/run.sh
#   SCENARIOS=mixed ROUNDS=9 bench/l4/run.sh # short connections through all proxies at once
#
# Environment: WEIR_BIN (default: build it with cargo), ROUNDS, SIZE_MB, CONNS, SCENARIOS
# (default stream,conns; mixed: all proxies run at once on PROXY_CPU and the client takes one
# short connection through each in turn, so that the machine's drift falls on all alike), PROXIES
# (default weir,haproxy,nginx; `weir-copy` is weir with --l4-splice=false; `weir-base` is the
# build WEIR_BASE_BIN names, a baseline, in the same rounds), PROXY_CPU (default 1),
# LOAD_CPU (default 0), WORKDIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# shellcheck source=../lib.sh
. "$here/../lib.sh"
require_tools nginx:nginx-light haproxy:haproxy taskset:util-linux python3:python3
if [ ! -e /usr/lib/nginx/modules/ngx_stream_module.so ]; then
  echo "nginx's stream module is missing: apt-get install libnginx-mod-stream" >&2
  exit 2
fi
if [ "$(nproc)" -lt 2 ]; then
  echo "needs at least 2 CPUs (one for the proxy, one for the client and upstream)" >&2
  exit 2
fi
if [ -z "${WEIR_BIN:-}" ]; then
  WEIR_BIN=$(dist_bins "$root" weir)/weir
fi
export WEIR_BIN
work_dir weir-bench-l4
taskset -c "${LOAD_CPU:-0}" python3 "$here/l4bench.py"
