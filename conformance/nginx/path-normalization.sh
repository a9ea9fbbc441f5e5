#!/usr/bin/env bash
# Where the expected answers of scenarios/path-normalization.yaml come from: a real nginx with
# ingress-nginx's locations for a Prefix path /admin (`location = /admin`, `location /admin/`)
# behind an allow list (here: deny all), a regex route, and `/` for everything else; each
# request target is sent byte for byte (curl --path-as-is) and the status printed with what
# nginx routed it as. Needs nginx (apt-get install nginx-light) and curl; loopback only.
#
#   conformance/nginx/path-normalization.sh [PORT]
set -euo pipefail
export PATH=$PATH:/usr/sbin
port=${1:-18999}
work=$(mktemp -d /tmp/weir-nginx-paths.XXXXXX)
trap 'nginx -p "$work" -c "$work/nginx.conf" -s stop 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/logs"
cat >"$work/nginx.conf" <<CONF
worker_processes 1;
error_log $work/logs/error.log;
pid $work/nginx.pid;
events { worker_connections 64; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$port;
    server_name demo.example.com;
    location = /admin { return 403; }
    location /admin/ { return 403; }
    location ~ "^/re/adm[a-z]+" { return 403; }
    location / { return 200 "web uri=\$uri request_uri=\$request_uri\n"; }
  }
}
CONF
nginx -p "$work" -c "$work/nginx.conf"
sleep 0.3
for p in /admin /admin/x //admin ///admin//x /%61dmin /%61DMIN /adm%69n /./admin /x/../admin \
  /x/%2e%2e/admin /x/.%2E/admin /admin%2fx /admin%2Fx /x%2f..%2fadmin /admin/. /admin/.. \
  /%2e%2e/admin /%2E%2e/admin /.%2e/admin /.. /a/../../admin /admin%00 /admin%0a /admin%7f \
  /%zz /admin% /%252e%252e/admin '/\admin' '/admin;x' /re/admin /re//admin /%72e/admin; do
  printf '%-22s ' "$p"
  curl -s --path-as-is -o "$work/body" -w '%{http_code} ' -H 'Host: demo.example.com' "http://127.0.0.1:$port$p"
  head -c 70 "$work/body" | tr '\n' ' ' | sed 's/<html>.*//'
  echo
done
printf '%-22s ' 'two Host headers'
printf 'GET / HTTP/1.1\r\nHost: demo.example.com\r\nHost: other\r\nConnection: close\r\n\r\n' |
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; cat >&3; head -1 <&3"
