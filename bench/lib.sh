# Shared by the bench scripts (sourced, not run): the tool check, the weir build and the work
# directory that bench/peers/run.sh, bench/idle/run.sh and bench/soak/run.sh each need.

# require_tools CMD:PACKAGE...: exits 2 naming the Debian packages of the commands not found
# (on PATH or in /usr/sbin, where nginx and haproxy live), then adds /usr/sbin to PATH.
require_tools() {
  local missing=() tool
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "${tool%%:*}" >/dev/null 2>&1 ||
      missing+=("${tool#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "missing tools; install them with: apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  export PATH=$PATH:/usr/sbin
}

# dist_bins ROOT NAME...: builds the binaries NAME... of the checkout at ROOT (the `dist`
# profile, what ships: release with whole-program LTO; locked) and prints the directory they
# are in.
dist_bins() {
  local root=$1 bins=() name
  shift
  for name in "$@"; do bins+=(--bin "$name"); done
  echo "building ${*} (profile dist; 12-14 minutes on two cores the first time)..." >&2
  (cd "$root" && cargo build --profile dist --locked "${bins[@]}" >&2)
  local target
  target=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  echo "$target/dist"
}

# work_dir PREFIX: exports WORKDIR, the given one or a fresh /tmp/PREFIX.XXXXXX that is removed
# when the script exits (with the key the run generates); readable by nginx's workers.
work_dir() {
  if [ -z "${WORKDIR:-}" ]; then
    WORKDIR=$(mktemp -d "/tmp/$1.XXXXXX")
    trap 'rm -rf "$WORKDIR"' EXIT
  fi
  mkdir -p "$WORKDIR"
  chmod 755 "$WORKDIR"
  export WORKDIR
}
