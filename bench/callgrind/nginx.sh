#!/usr/bin/env bash
# The reference for weir's access-log cost: instructions per request of nginx itself (one
# process: `daemon off; master_process off;`) under `valgrind --tool=callgrind`, proxying to an
# upstream nginx, with the same loads as bench/callgrind/run.sh. Two runs: `access_log off`, and
# a JSON line per request (`escape=json`) to a file with the fields of weir's default line
# (ingress-nginx's default fields, the Ingress's names set as variables, as ingress-nginx does).
# The difference is nginx's cost per access-log line.
#
#   SCENARIOS=h1,h2-tls REQUESTS=5000 bench/callgrind/nginx.sh
#
# PROFILE_DIR keeps the dumps. User-space instructions only; no timing.
set -euo pipefail
scenarios=${SCENARIOS:-h1,h2-tls}
requests=${REQUESTS:-5000}
up=${UP_PORT:-18490} http=${HTTP_PORT:-18491} https=${HTTPS_PORT:-18492}
work=$(mktemp -d /tmp/weir-bench-nginx.XXXXXX)
upstream_pid=
proxy_pid=
cleanup() {
  if [ -n "$proxy_pid" ]; then kill "$proxy_pid" 2>/dev/null || true; wait "$proxy_pid" 2>/dev/null || true; fi
  if [ -n "$upstream_pid" ]; then kill "$upstream_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=bench/callgrind/lib.sh
. "$(dirname "$0")/lib.sh"
mkdir -p "$work/proxy"
start_upstream

proxy_conf() { # access_log directive
  cat <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/proxy/nginx.pid;
error_log $work/proxy/error.log warn;
events { worker_connections 8192; }
http {
  log_format weir escape=json '{"time":"\$time_iso8601","remote_addr":"\$remote_addr",'
    '"remote_user":"\$remote_user","request":"\$request","status":\$status,'
    '"body_bytes_sent":\$body_bytes_sent,"bytes_sent":\$bytes_sent,"http_referer":"\$http_referer",'
    '"http_user_agent":"\$http_user_agent","request_length":\$request_length,'
    '"request_time":\$request_time,"host":"\$host","proxy_upstream_name":"\$proxy_upstream_name",'
    '"upstream_addr":"\$upstream_addr","upstream_response_time":\$upstream_response_time,'
    '"upstream_status":\$upstream_status,"req_id":"\$request_id","namespace":"\$namespace",'
    '"ingress_name":"\$ingress_name","service_name":"\$service_name","service_port":\$service_port,'
    '"request_end":"\$request_completion"}';
  $1
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path $work/proxy/body;
  proxy_temp_path $work/proxy/proxy;
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server {
    listen 127.0.0.1:$http backlog=4096;
    listen 127.0.0.1:$https ssl http2 backlog=4096;
    ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem;
    set \$proxy_upstream_name bench-up-80;
    set \$namespace bench;
    set \$ingress_name bench;
    set \$service_name up;
    set \$service_port 80;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Request-ID \$request_id;
      proxy_set_header X-Real-IP \$remote_addr;
      proxy_set_header X-Forwarded-For \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
EOF
}

printf '%-40s %-8s %12s\n' configuration scenario "Ir/request"
for label in access_log_off access_log_json; do
  case $label in
    access_log_off) directive="access_log off;" ;;
    access_log_json) directive="access_log $work/proxy/access.log weir;" ;;
  esac
  proxy_conf "$directive" >"$work/proxy/nginx.conf"
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out.%p" --compress-strings=no \
    --compress-pos=no nginx -p "$work/proxy" -e "$work/proxy/error.log" -c "$work/proxy/nginx.conf" \
    >"$work/proxy.log" 2>&1 &
  proxy_pid=$!
  for _ in $(seq 200); do curl -fs -o /dev/null "http://127.0.0.1:$http/" && break; sleep 0.3; done
  curl -fs -o /dev/null "http://127.0.0.1:$http/" || { echo "nginx did not serve:" >&2; cat "$work/proxy.log" "$work/proxy/error.log" >&2; exit 1; }
  for scenario in ${scenarios//,/ }; do
    measure "$proxy_pid" "nginx $label" "$scenario" "nginx.$label.$scenario.callgrind"
  done
  if [ "$label" = access_log_json ]; then
    echo "  (a line: $(tail -1 "$work/proxy/access.log"))"
  fi
  kill "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
  proxy_pid=
  rm -f "$work"/callgrind.out.*
done
