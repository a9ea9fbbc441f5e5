#!/usr/bin/env bash
# A real Kubernetes API server for weir's tests, built from Debian's own source package.
#
#   scripts/kube-apiserver.sh build        build kube-apiserver (and unpack etcd) once; cached
#   scripts/kube-apiserver.sh bin-dir      print the directory holding kube-apiserver and etcd
#   scripts/kube-apiserver.sh start DIR    start etcd + kube-apiserver on loopback (free ports),
#                                          write DIR/kubeconfig, DIR/admin-token, DIR/pids
#   scripts/kube-apiserver.sh stop DIR     stop what `start DIR` started
#
# Works on a fresh Debian bookworm machine as root, touching nothing under /etc: APT runs with a
# private configuration (bookworm deb + deb-src from the Debian archive) whose state lives in the
# cache. The cache (WEIR_KUBE_CACHE, default /var/cache/weir/kube) holds the binaries after the
# first build, so reruns skip it. Never commit anything from there.
set -euo pipefail

CACHE=${WEIR_KUBE_CACHE:-/var/cache/weir/kube}
BIN=$CACHE/bin
KUBE_VERSION=v1.20.2
# Fixes applied to the source before building; a cached build without this stamp is rebuilt.
PATCHES="reflect2-go1.18-mapiterinit"

log() { printf '[kube-apiserver.sh] %s\n' "$*" >&2; }

apt_private() {
  local apt=$CACHE/apt
  mkdir -p "$apt/etc/sources.list.d" "$apt/etc/preferences.d" "$apt/state/lists/partial" \
    "$apt/cache/archives/partial" "$apt/etc/apt.conf.d"
  cat >"$apt/etc/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
EOF
  cat >"$apt/apt.conf" <<EOF
Dir::Etc "$apt/etc";
Dir::Etc::sourcelist "$apt/etc/sources.list";
Dir::Etc::sourceparts "$apt/etc/sources.list.d";
Dir::Etc::preferencesparts "$apt/etc/preferences.d";
Dir::Etc::parts "$apt/etc/apt.conf.d";
Dir::State "$apt/state";
Dir::State::status "/var/lib/dpkg/status";
Dir::Cache "$apt/cache";
APT::Get::Only-Source "false";
EOF
  export APT_CONFIG=$apt/apt.conf
}

# Kubernetes 1.20 vendors github.com/modern-go/reflect2 v1.0.1, whose map iteration calls
# reflect.mapiterinit with its pre-Go-1.18 signature: built with Go 1.19, the API server dies
# (SIGSEGV) the first time json-iterator encodes a map, i.e. at the first custom resource it
# decodes. Apply reflect2 v1.0.2's fix (mapiterinit fills a caller-allocated, full-size hiter).
patch_reflect2() {
  local dir=$1/vendor/github.com/modern-go/reflect2
  grep -q 'func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) \*hiter' "$dir/unsafe_link.go" || return 0
  log "patching vendored reflect2 for Go >= 1.18 (map iteration)"
  perl -0pi -e 's#// m escapes into the return value.*?func mapiterinit\(rtype unsafe.Pointer, m unsafe.Pointer\) \*hiter\n##s;
    s#type hiter struct \{.*?\n\}#type hiter struct {
	key         unsafe.Pointer
	value       unsafe.Pointer
	t           unsafe.Pointer
	h           unsafe.Pointer
	buckets     unsafe.Pointer
	bptr        unsafe.Pointer
	overflow    *[]unsafe.Pointer
	oldoverflow *[]unsafe.Pointer
	startBucket uintptr
	offset      uint8
	wrapped     bool
	B           uint8
	i           uint8
	bucket      uintptr
	checkBucket uintptr
}#s' "$dir/unsafe_link.go"
  perl -0pi -e 's#return &UnsafeMapIterator\{\n\t\thiter:      mapiterinit\(type2.rtype, \*\(\*unsafe.Pointer\)\(obj\)\),#var it hiter\n\tmapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), &it)\n\treturn &UnsafeMapIterator{\n\t\thiter:      &it,#' "$dir/unsafe_map.go"
  cat >"$dir/go_above_118.go" <<'GO'
package reflect2

import "unsafe"

//go:linkname mapiterinit reflect.mapiterinit
func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer, it *hiter)
GO
  grep -q 'mapiterinit(type2.rtype, \*(\*unsafe.Pointer)(obj), &it)' "$dir/unsafe_map.go" ||
    { log "patching reflect2 failed"; exit 1; }
}

cmd_build() {
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ] &&
    [ "$(cat "$BIN/PATCHES" 2>/dev/null)" = "$PATCHES" ]; then
    log "cached: $BIN ($("$BIN/kube-apiserver" --version 2>/dev/null || true))"
    return 0
  fi
  local started=$SECONDS
  local need=()
  command -v dpkg-source >/dev/null || need+=(dpkg-dev)
  command -v make >/dev/null || need+=(make)
  command -v xz >/dev/null || need+=(xz-utils)
  # The Kubernetes build copies its tree with rsync. A system rsync, installed by apt with its
  # libraries (libpopt0 among them): one unpacked from its .deb alone cannot load them.
  command -v rsync >/dev/null || need+=(rsync)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  mkdir -p "$CACHE" "$BIN"
  local work=$CACHE/work
  rm -rf "$work"
  mkdir -p "$work/debs" "$work/root"
  apt_private
  log "apt-get update (private config)"
  apt-get update -qq
  log "downloading sources and toolchain"
  (cd "$work" && apt-get source -qq --download-only kubernetes/bookworm)
  (cd "$work/debs" && apt-get download -qq golang-1.19-go golang-1.19-src etcd-server etcd-client)
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
  log "unpacking kubernetes source"
  local dsc
  dsc=$(ls "$work"/kubernetes_*.dsc)
  (cd "$work" && dpkg-source --no-check -q -x "$dsc" src >/dev/null)
  patch_reflect2 "$work/src"
  local goroot=$work/root/usr/lib/go-1.19
  if [ ! -e "$goroot/src/runtime" ]; then
    # golang-1.19-go links src to /usr/share/go-1.19/src; point it into the unpacked tree.
    rm -f "$goroot/src"
    ln -s "$work/root/usr/share/go-1.19/src" "$goroot/src"
  fi
  log "building kube-apiserver $KUBE_VERSION (several minutes)"
  (
    cd "$work/src"
    export GOROOT=$goroot
    export PATH=$goroot/bin:$work/root/usr/bin:$PATH
    export GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0 GO111MODULE=on
    export GOCACHE=$CACHE/gocache GOPATH=$CACHE/gopath
    export KUBE_GIT_VERSION=$KUBE_VERSION KUBE_GIT_TREE_STATE=clean
    make WHAT=cmd/kube-apiserver
  )
  install -m 0755 "$work/src/_output/local/bin/linux/amd64/kube-apiserver" "$BIN/kube-apiserver" 2>/dev/null ||
    install -m 0755 "$(find "$work/src/_output" -type f -name kube-apiserver | head -1)" "$BIN/kube-apiserver"
  install -m 0755 "$work/root/usr/bin/etcd" "$BIN/etcd"
  [ -x "$work/root/usr/bin/etcdctl" ] && install -m 0755 "$work/root/usr/bin/etcdctl" "$BIN/etcdctl"
  echo "$PATCHES" >"$BIN/PATCHES"
  rm -rf "$work" "$CACHE/gopath"
  log "built in $((SECONDS - started)) s: $("$BIN/kube-apiserver" --version)"
}

# A free loopback port: a random one in the ephemeral range that nothing answers on.
free_port() {
  local p
  while :; do
    p=$((32768 + RANDOM % 28000))
    if ! (: </dev/tcp/127.0.0.1/$p) 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

cmd_start() {
  local dir=${1:?usage: start DIR}
  [ -x "$BIN/kube-apiserver" ] || { log "not built: run '$0 build' first"; exit 1; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local etcd_client etcd_peer api_port token
  etcd_client=$(free_port)
  etcd_peer=$(free_port)
  api_port=$(free_port)
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  echo "$token" >"$dir/admin-token"
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  "$BIN/etcd" --data-dir "$dir/etcd" --name weir-test \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "weir-test=http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address 127.0.0.1 --secure-port "$api_port" --cert-dir "$dir/certs" \
    --token-auth-file "$dir/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$dir/sa.key" \
    --service-account-signing-key-file "$dir/sa.key" --service-cluster-ip-range 10.96.0.0/16 \
    --advertise-address 127.0.0.1 >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  local url=https://127.0.0.1:$api_port
  for _ in $(seq 1 120); do
    if curl -fsk -H "Authorization: Bearer $token" "$url/readyz" >/dev/null 2>&1; then
      cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: weir-test
  cluster: {server: "$url", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: weir-test
  context: {cluster: weir-test, user: admin}
current-context: weir-test
EOF
      log "ready: $url (kubeconfig: $dir/kubeconfig)"
      echo "$dir/kubeconfig"
      return 0
    fi
    sleep 0.5
  done
  log "kube-apiserver not ready after 60 s; see $dir/apiserver.log"
  cmd_stop "$dir"
  exit 1
}

cmd_stop() {
  local dir=${1:?usage: stop DIR}
  for p in apiserver etcd; do
    if [ -f "$dir/$p.pid" ]; then
      kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
      rm -f "$dir/$p.pid"
    fi
  done
}

case "${1:-}" in
  build) cmd_build ;;
  bin-dir) echo "$BIN" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
