#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs the whole suite.
#
#   scripts/test.sh            install what is missing, then run every test (cargo test --workspace)
#   scripts/test.sh install    install what is missing, run nothing
#   scripts/test.sh -- ARGS    install, then cargo test --workspace ARGS (a filter, --nocapture...)
#
# What it installs, as root on Debian (apt-get; without root it only says what is missing, and
# the tests that need it skip with the reason, or fail under WEIR_REQUIRE_ALL=1):
# - clients the TLS and proxy tests drive: curl, openssl, h2load (nghttp2-client), a C compiler;
# - the kernel tools `weir node` programs in network namespaces: iptables, nftables, ipvsadm,
#   ipset, conntrack, iproute2 (`ip netns`), util-linux (`unshare`);
# - a real kube-apiserver and etcd for the Kubernetes end-to-end tests, built once from
#   Debian's source package by scripts/kube-apiserver.sh (cached in /var/cache/weir/kube).
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
)

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
  else
    log "not root: the kube-apiserver build and the tests that need root will be skipped"
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
    ;;
  *)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
