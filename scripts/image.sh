#!/usr/bin/env bash
# Builds weir's OCI image without a container daemon (umoci, skopeo; Debian packages).
#
#   scripts/image.sh [--binary PATH] [--output DIR] [--tag TAG] [--source TEXT]
#
# The image holds the weir binary (stripped; file capability cap_net_bind_service), exactly the shared libraries `ldd` lists for it,
# the CA certificates, /etc/passwd and /etc/group naming user 65532 (nonroot), an empty /tmp;
# no shell, no package manager. It runs as 65532:65532, entrypoint `weir`, default command
# `serve`, with OCI labels (source, revision, version, licenses).
#
# Without --binary it builds the binary that ships (cargo build --profile dist -p weir: release
# with whole-program LTO, see Cargo.toml). Outputs, in DIR (default target/image):
#   DIR/oci                   an OCI image layout, tag TAG (umoci unpack / skopeo copy oci:DIR/oci:TAG)
#   DIR/weir-TAG.docker.tar   a docker-archive tagged weir:TAG (podman load -i / docker load -i)
# TAG defaults to the binary's version (`weir --version`).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[image.sh] %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

binary="" output=target/image tag="" source=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary PATH}; shift 2 ;;
    --output) output=${2:?--output DIR}; shift 2 ;;
    --tag) tag=${2:?--tag TAG}; shift 2 ;;
    --source) source=${2:?--source TEXT}; shift 2 ;;
    -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

for tool in umoci skopeo ldd tar setcap; do
  command -v "$tool" >/dev/null || die "$tool not found: run scripts/test.sh install (as root)"
done
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || die "$ca missing: apt-get install ca-certificates"

if [ -z "$binary" ]; then
  log "cargo build --profile dist --locked -p weir"
  cargo build --profile dist --locked -p weir
  binary=${CARGO_TARGET_DIR:-target}/dist/weir
fi
[ -x "$binary" ] || die "$binary is not an executable"
version=$("$binary" --version | awk '{print $2}')
[ -n "$version" ] || die "$binary --version printed no version"
tag=${tag:-$version}
case "$tag" in *[!A-Za-z0-9_.-]* | "" | [.-]*) die "invalid tag $tag" ;; esac
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
source=${source:-$(git remote get-url origin 2>/dev/null || echo "weir $revision")}
license=$(sed -n 's/^license *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
# Reproducible timestamps: the commit's time.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"

install -m 0755 "$binary" "$root/usr/local/bin/weir"
if command -v strip >/dev/null; then
  strip --strip-debug "$root/usr/local/bin/weir"
fi
# Binding ports below 1024 as user 65532 (the chart's hostNetwork DaemonSet on 80/443): a file
# capability, since Kubernetes grants no ambient capabilities. The pod must keep
# NET_BIND_SERVICE in its bounding set (the chart adds it): the kernel refuses to exec a binary
# whose file capabilities it cannot grant.
setcap cap_net_bind_service=+ep "$root/usr/local/bin/weir"

# The shared libraries the binary loads, at the paths the dynamic loader looks for them.
# `ldd` prints "name => /path (addr)" and, for the loader, "/path (addr)".
while read -r lib; do
  [ -e "$lib" ] || die "ldd names $lib, which does not exist"
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)

install -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"

# One layer, files owned by root, sorted, with the commit's time.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  --xattrs --xattrs-include=security.capability -C "$root" -cf "$work/layer.tar" .

mkdir -p "$output"
layout=$output/oci
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci raw add-layer --image "$layout:$tag" --history.created_by "scripts/image.sh" "$work/layer.tar"
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
umoci config --image "$layout:$tag" \
  --created "$created" \
  --history.created_by "scripts/image.sh (config)" \
  --config.user 65532:65532 \
  --config.entrypoint weir --config.cmd serve \
  --config.workingdir / \
  --config.env PATH=/usr/local/bin \
  --config.exposedports 8080/tcp --config.exposedports 8443/tcp \
  --config.label "org.opencontainers.image.title=weir" \
  --config.label "org.opencontainers.image.source=$source" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.licenses=$license" \
  --config.label "org.opencontainers.image.created=$created"
umoci gc --layout "$layout"

archive=$output/weir-$tag.docker.tar
rm -f "$archive"
skopeo --insecure-policy copy --quiet "oci:$layout:$tag" "docker-archive:$archive:weir:$tag"

layer_bytes=$(stat -c %s "$work/layer.tar")
blob_bytes=$(du -sb "$layout/blobs" | cut -f1)
log "image weir:$tag: $(du -sh "$root" | cut -f1) unpacked (layer tar $layer_bytes bytes), OCI layout $blob_bytes bytes (gzip)"
log "OCI layout: $layout (tag $tag); docker-archive: $archive (podman load -i / docker load -i)"
