#!/usr/bin/env bash
# The cost of one short TCP-service connection (connect, one byte each way, close), in figures
# that other load on the machine does not move: user-space instructions (Ir) counted by
# callgrind, and system calls counted by strace. For steering L4 changes on a shared machine;
# CPU time is measured by bench/l4/run.sh on an idle one.
#
#   bench/callgrind/l4.sh OLD/weir NEW/weir
#   CONNS=5000 PROFILE_DIR=/tmp/prof bench/callgrind/l4.sh target/release/weir
#   bench/callgrind/l4.sh "$B" "$B --l4-splice=false"     # one build, two configurations
#   NGINX=0 bench/callgrind/l4.sh "$B"                    # without the nginx reference
#
# Each argument is a binary, optionally followed (in the same word, space-separated) by extra
# `weir serve` flags. For each: weir (manifests mode, `--threads 1`, the access log off unless
# the flags name `--access-log`, `--l4-splice=true` unless they name it) serving one TCP port
# from a tcp-services ConfigMap to an upstream that echoes one byte and closes (Python).
#  - Ir: weir under `valgrind --tool=callgrind`, WARMUP (500) connections, the counters zeroed, CONNS
#    (2,000) connections one after another, the counters dumped: Ir / CONNS.
#  - System calls: weir alone (no valgrind), WARMUP connections, then `strace -c -f` attached to
#    all its threads for CONNS connections: calls / CONNS, with the calls made at least once per
#    ten connections listed per connection (the failed ones, EAGAIN or EINPROGRESS, after a slash).
# Then the same two figures for nginx's stream module (one process, `master_process off`,
# `proxy_pass` to the same upstream, `proxy_half_close on`, as bench/l4), unless NGINX=0.
# PROFILE_DIR keeps the callgrind dumps (callgrind_annotate reads them); by default they are
# deleted. Needs valgrind, strace, nginx-light with libnginx-mod-stream, python3.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 WEIR_BIN [WEIR_BIN...]" >&2; exit 2; }
conns=${CONNS:-2000}
warmup=${WARMUP:-500}
port=${L4_PORT:-18561} admin=${ADMIN_PORT:-18562} http=${HTTP_PORT:-18563} https=${HTTPS_PORT:-18564}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
export PATH=$PATH:/usr/sbin
for tool in valgrind:valgrind callgrind_control:valgrind strace:strace nginx:nginx-light $py:python3; do
  command -v "${tool%%:*}" >/dev/null || { echo "missing ${tool%%:*} (apt-get install -y ${tool#*:})" >&2; exit 2; }
done
if [ "${NGINX:-1}" != 0 ] && [ ! -e /usr/lib/nginx/modules/ngx_stream_module.so ]; then
  echo "nginx's stream module is missing: apt-get install libnginx-mod-stream (or NGINX=0)" >&2
  exit 2
fi
work=$(mktemp -d /tmp/weir-bench-callgrind-l4.XXXXXX)
chmod 755 "$work"
upstream_pid=
proxy_pid=
strace_pid=
stop() { # pid
  if [ -n "$1" ]; then kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; fi
}
cleanup() {
  stop "$strace_pid"
  stop "$proxy_pid"
  stop "$upstream_pid"
  rm -rf "$work"
}
trap cleanup EXIT

# The upstream: one byte echoed per connection.
"$py" "$here/l4.py" echo "$work/up.port" &
upstream_pid=$!
for _ in $(seq 100); do [ -s "$work/up.port" ] && break; sleep 0.1; done
up=$(cat "$work/up.port" 2>/dev/null) || { echo "the upstream did not start" >&2; exit 1; }

mkdir -p "$work/manifests"
cat >"$work/manifests/app.yaml" <<EOF2
apiVersion: v1
kind: Service
metadata: {name: up, namespace: default}
spec:
  ports: [{name: tcp, port: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: up-1, namespace: default, labels: {kubernetes.io/service-name: up}}
addressType: IPv4
ports: [{name: tcp, port: $up}]
endpoints:
- addresses: ["127.0.0.1"]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: tcp, namespace: default}
data:
  "$port": "default/up:9000"
EOF2

mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF2
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 8000; }
stream {
  server {
    listen 127.0.0.1:$port;
    proxy_pass 127.0.0.1:$up;
    proxy_timeout 600s;
    proxy_half_close on;
  }
}
EOF2

clients() { "$py" "$here/l4.py" conns "$port" "$1"; }

# The proxy ($@) under callgrind: Ir per connection into $work/ir; keeps the dump as
# $PROFILE_DIR/NAME. (Not in a command substitution: the EXIT trap must see $proxy_pid.)
ir_per_conn() { # name argv...
  local name=$1 dump ir
  shift
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out.%p" --compress-strings=no \
    --compress-pos=no "$@" >"$work/proxy.log" 2>&1 &
  proxy_pid=$!
  "$py" "$here/l4.py" wait "$port" || { cat "$work/proxy.log" >&2; exit 1; }
  clients "$warmup"
  callgrind_control -z "$proxy_pid" >/dev/null 2>&1
  clients "$conns"
  callgrind_control -d "$proxy_pid" >/dev/null 2>&1
  sleep 0.5
  dump=$(ls -t "$work"/callgrind.out."$proxy_pid".* | head -1)
  ir=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$dump" | head -1)
  stop "$proxy_pid"
  proxy_pid=
  if [ -n "${PROFILE_DIR:-}" ]; then
    mkdir -p "$PROFILE_DIR" && mv "$dump" "$PROFILE_DIR/$name"
  fi
  rm -f "$work"/callgrind.out.*
  echo $((ir / conns)) >"$work/ir"
}

# The proxy ($@) alone, strace attached to all its threads for $conns connections: system calls
# per connection, then the calls made at least once per ten connections, into $work/sc.
syscalls_per_conn() { # argv...
  "$@" >"$work/proxy.log" 2>&1 &
  proxy_pid=$!
  "$py" "$here/l4.py" wait "$port" || { cat "$work/proxy.log" >&2; exit 1; }
  clients "$warmup"
  strace -c -f -p "$proxy_pid" -o "$work/strace.out" 2>"$work/strace.err" &
  strace_pid=$!
  for _ in $(seq 100); do grep -q attached "$work/strace.err" 2>/dev/null && break; sleep 0.1; done
  sleep 0.5
  clients "$conns"
  kill -INT "$strace_pid"
  wait "$strace_pid" 2>/dev/null || true
  strace_pid=
  stop "$proxy_pid"
  proxy_pid=
  # A row: % time, seconds, usecs/call, calls, [errors,] syscall. Failed calls (EAGAIN,
  # EINPROGRESS) are shown after a slash.
  awk -v n="$conns" '
    $1 ~ /^[0-9.]+$/ && $NF != "total" {
      total += $4
      if ($4 / n >= 0.1) {
        detail = detail sprintf(" %s %.2f", $NF, $4 / n)
        if (NF == 6 && $5 / n >= 0.01) detail = detail sprintf("/%.2f", $5 / n)
      }
    }
    END { printf "%.2f\t%s\n", total / n, detail }' "$work/strace.out" >"$work/sc"
}

weir_argv() { # bin extra...
  local bin=$1
  shift
  local argv=("$bin" --log-level warn serve --manifests "$work/manifests" --threads 1
    --listen-http "127.0.0.1:$http" --listen-https "127.0.0.1:$https" --listen-admin "127.0.0.1:$admin"
    --tcp-services-configmap default/tcp --l4-listen-address 127.0.0.1)
  [[ " $* " == *" --access-log"* ]] || argv+=(--access-log off)
  [[ " $* " == *" --l4-splice"* ]] || argv+=(--l4-splice=true)
  printf '%s\0' "${argv[@]}" "$@"
}

printf '%-44s %10s %12s   %s\n' proxy "Ir/conn" "syscalls/conn" "(calls per connection)"
report() { # label ir syscalls-line
  local calls=${3%%$'\t'*} detail=${3#*$'\t'}
  printf '%-44s %10d %12s  %s\n' "$1" "$2" "$calls" "$detail"
}
for spec in "$@"; do
  read -ra words <<<"$spec"
  extra=("${words[@]:1}")
  label="$(basename "${words[0]}")${extra[*]:+ ${extra[*]}}"
  mapfile -d '' argv < <(weir_argv "${words[0]}" "${extra[@]}")
  ir_per_conn "$(printf %s "$label" | tr -c 'A-Za-z0-9._=-' _).l4.callgrind" "${argv[@]}"
  syscalls_per_conn "${argv[@]}"
  report "$label" "$(cat "$work/ir")" "$(cat "$work/sc")"
done
if [ "${NGINX:-1}" != 0 ]; then
  nginx_argv=(nginx -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf")
  ir_per_conn nginx-stream.l4.callgrind "${nginx_argv[@]}"
  syscalls_per_conn "${nginx_argv[@]}"
  report "nginx $(nginx -v 2>&1 | sed 's|.*/||') stream" "$(cat "$work/ir")" "$(cat "$work/sc")"
fi
echo "($conns connections after $warmup of warm-up, one after another; Ir: user space only)"
