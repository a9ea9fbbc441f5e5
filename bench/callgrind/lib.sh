# Shared by bench/callgrind/run.sh (weir) and bench/callgrind/nginx.sh (the nginx reference):
# the tools, the upstream nginx, the certificate, the loads and one scenario's measurement.
# Expects $work, $up, $http, $https, $requests set; sets $upstream_pid.

export PATH=$PATH:/usr/sbin
for tool in valgrind:valgrind callgrind_control:valgrind nginx:nginx-light h2load:nghttp2-client \
  openssl:openssl curl:curl; do
  command -v "${tool%%:*}" >/dev/null || { echo "missing ${tool%%:*} (apt-get install -y ${tool#*:})" >&2; exit 2; }
done

# The upstream nginx (the bench's fixed small body) on 127.0.0.1:$up, and a certificate for
# bench.local in $work/cert.pem and $work/key.pem.
start_upstream() {
  mkdir -p "$work/up"
  cat >"$work/up/nginx.conf" <<CONF
worker_processes 1;
pid $work/up/nginx.pid;
error_log $work/up/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  client_body_temp_path $work/up/body;
  server {
    listen 127.0.0.1:$up backlog=4096;
    location / { default_type text/plain; return 200 "hello from the upstream, a small fixed body\n"; }
  }
}
CONF
  openssl ecparam -name prime256v1 -genkey -noout -out "$work/key.pem" 2>/dev/null
  openssl req -x509 -new -key "$work/key.pem" -out "$work/cert.pem" -days 2 -subj /CN=bench.local \
    -addext subjectAltName=DNS:bench.local 2>/dev/null
  nginx -p "$work/up" -e "$work/up/error.log" -c "$work/up/nginx.conf" -g "daemon off;" &
  upstream_pid=$!
  for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$up/" && break; sleep 0.1; done
  kill -0 "$upstream_pid" 2>/dev/null || { echo "the upstream nginx did not start (port $up in use?)" >&2; exit 1; }
}

load() { # scenario count
  case $1 in
    h1) h2load --h1 -c 32 -t 1 -n "$2" "http://127.0.0.1:$http/" ;;
    h1-tls) h2load --h1 -c 32 -t 1 -n "$2" "https://127.0.0.1:$https/" ;;
    h2-tls) h2load -c 8 -m 16 -t 1 -n "$2" "https://127.0.0.1:$https/" ;;
    *) echo "unknown scenario $1" >&2; return 2 ;;
  esac
}

# One scenario against the process PID under callgrind (its dumps $work/callgrind.out.PID.*):
# 2,000 requests of warm-up, the counters zeroed, $requests requests, the counters dumped;
# prints LABEL, the scenario and Ir per request; keeps the dump in $PROFILE_DIR as NAME.
measure() { # pid label scenario name
  load "$3" 2000 >/dev/null
  callgrind_control -z "$1" >/dev/null 2>&1
  local out dump ok ir
  out=$(load "$3" "$requests")
  callgrind_control -d "$1" >/dev/null 2>&1
  sleep 0.5
  dump=$(ls -t "$work"/callgrind.out."$1".* | head -1)
  ok=$(sed -n 's/.* \([0-9]*\) succeeded.*/\1/p' <<<"$out")
  [ "$ok" = "$requests" ] || { echo "$3: $ok of $requests requests succeeded" >&2; exit 1; }
  ir=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$dump" | head -1)
  printf '%-40s %-8s %12d\n' "$2" "$3" $((ir / requests))
  if [ -n "${PROFILE_DIR:-}" ]; then
    mkdir -p "$PROFILE_DIR" && mv "$dump" "$PROFILE_DIR/$4"
  else
    rm -f "$dump"
  fi
}
