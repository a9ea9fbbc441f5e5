#!/usr/bin/env bash
# weir quickstart: builds weir, starts four `weir echo` backends on loopback and `weir serve` on
# the manifests beside this script, then prints curl lines to try. Ctrl-C stops everything.
#
#   examples/quickstart/run.sh           # interactive
#   examples/quickstart/run.sh --smoke   # run the curl lines, check the answers, exit (CI)
#
# Environment: WEIR_BIN (use this binary instead of building one), WEIR_HTTP (default
# 127.0.0.1:8080), WEIR_HTTPS (default 127.0.0.1:8443), WEIR_ADMIN (default 127.0.0.1:9090).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
smoke=0
[ "${1:-}" = "--smoke" ] && smoke=1
http=${WEIR_HTTP:-127.0.0.1:8080}
https=${WEIR_HTTPS:-127.0.0.1:8443}
admin=${WEIR_ADMIN:-127.0.0.1:9090}

if [ -n "${WEIR_BIN:-}" ]; then
  bin=$WEIR_BIN
else
  echo "building weir (release; the first build takes a few minutes)..." >&2
  (cd "$root" && cargo build --release --locked --bin weir)
  target=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  bin=$target/release/weir
fi

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The replicas the EndpointSlices in manifests/ point at.
"$bin" echo --listen 127.0.0.2:9001 --name web-0 --log-level warn & pids+=($!)
"$bin" echo --listen 127.0.0.3:9001 --name web-1 --log-level warn & pids+=($!)
"$bin" echo --listen 127.0.0.4:9002 --name api-0 --log-level warn & pids+=($!)
"$bin" echo --listen 127.0.0.5:9002 --name api-1 --log-level warn & pids+=($!)
"$bin" serve --manifests "$here/manifests" --listen-http "$http" --listen-https "$https" --listen-admin "$admin" & pids+=($!)

for _ in $(seq 1 100); do
  if curl -fsS "http://$admin/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -fsS "http://$admin/readyz" >/dev/null || { echo "weir did not become ready" >&2; exit 1; }

tries=(
  "demo.example.com /"
  "demo.example.com /api/users"
  "demo.example.com /health"
  "demo.example.com /apix"
  "shop.apps.example.com /"
  "unknown.example.org /anything"
)

if [ $smoke = 0 ]; then
  cat <<TXT

weir is serving the quickstart on http://$http (admin: http://$admin/metrics).
The manifests are in $here/manifests: edit them and weir reloads within a second.
Try:
TXT
  for t in "${tries[@]}"; do
    set -- $t
    echo "  curl -H 'Host: $1' http://$http$2"
  done
  echo "  $bin check --manifests $here/manifests"
  echo "  $bin dump --manifests $here/manifests"
  echo
  echo "Ctrl-C stops weir and the echo backends."
  wait
  exit 0
fi

# Smoke: every line must reach the backend the manifests say.
expect=(web api api web api web)
fail=0
for i in "${!tries[@]}"; do
  set -- ${tries[$i]}
  body=$(curl -fsS -H "Host: $1" "http://$http$2") || { echo "FAIL $1$2: request failed"; fail=1; continue; }
  name=$(printf '%s' "$body" | sed -n 's/.*"name":"\([a-z]*\)-[0-9]".*/\1/p')
  if [ "$name" = "${expect[$i]}" ]; then
    echo "ok   $1$2 -> $name"
  else
    echo "FAIL $1$2: expected ${expect[$i]}, got: $body"
    fail=1
  fi
done
[ $fail = 0 ] && echo "smoke: 6 passed, 0 failed" || { echo "quickstart smoke failed"; exit 1; }
