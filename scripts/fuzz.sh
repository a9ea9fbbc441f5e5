#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers untrusted bytes reach (issue 23); each target in
# fuzz/fuzz_targets/*.rs says what it feeds and what it checks.
#
#   scripts/fuzz.sh                  build every target, run each for FUZZ_SECONDS (default 30)
#   scripts/fuzz.sh TARGET [SECONDS] build and run one
#   scripts/fuzz.sh --build          build only
#
# libFuzzer through cargo-fuzz, on stable Rust: RUSTC_BOOTSTRAP=1 lets stable rustc take the
# -Z flags cargo-fuzz passes. No sanitizer (`-s none`): weir's crates deny unsafe code, so ASan
# would mostly slow the build and the runs; debug assertions and overflow checks stay on.
# cargo-fuzz is installed into $WEIR_CACHE/tools, the build cached in $WEIR_CACHE/target-fuzz,
# both outside the checkout. Each run starts from fuzz/corpus/TARGET copied to a temporary
# directory (the committed seeds never grow); a crash leaves its input in
# $WEIR_CACHE/fuzz-artifacts/TARGET and fails the script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${WEIR_CACHE:-/var/cache/weir}
tools=$cache/tools
target_dir=${FUZZ_TARGET_DIR:-$cache/target-fuzz/fuzz}
cargo_fuzz_version=0.13.2
export PATH=$tools/bin:$PATH
export RUSTC_BOOTSTRAP=1

build_only=false
only=
seconds=${FUZZ_SECONDS:-30}
case "${1:-}" in
  --build) build_only=true ;;
  -h|--help) sed -n 2,17p "$0"; exit 0 ;;
  "") ;;
  *) only=$1; seconds=${2:-$seconds} ;;
esac

# libfuzzer-sys compiles libFuzzer (C++) with the system compiler.
if ! command -v c++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "fuzz.sh: installing g++ (libFuzzer is C++)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
  else
    echo "fuzz.sh: needs a C++ compiler (apt-get install g++)" >&2
    exit 2
  fi
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  echo "fuzz.sh: installing cargo-fuzz $cargo_fuzz_version into $tools" >&2
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version" --root "$tools"
fi

cd "$root"
mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^weir-fuzz$')
if [[ -n $only ]]; then
  if [[ ! " ${all[*]} " == *" $only "* ]]; then
    echo "fuzz.sh: no target $only (targets: ${all[*]})" >&2
    exit 2
  fi
  targets=("$only")
else
  targets=("${all[@]}")
fi

flags=(--fuzz-dir "$root/fuzz" --sanitizer none --target-dir "$target_dir")
start=$SECONDS
if [[ -n $only ]]; then
  cargo fuzz build "${flags[@]}" "$only"
else
  cargo fuzz build "${flags[@]}"
fi
echo "fuzz.sh: built in $((SECONDS - start)) s" >&2
$build_only && exit 0

triple=$(rustc -vV | sed -n 's/^host: //p')
bin_dir=$target_dir/$triple/release
failed=()
for t in "${targets[@]}"; do
  work=$(mktemp -d "${TMPDIR:-/tmp}/weir-fuzz-$t.XXXXXX")
  artifacts=$cache/fuzz-artifacts/$t
  mkdir -p "$artifacts"
  if [[ -d fuzz/corpus/$t ]]; then cp -r "fuzz/corpus/$t/." "$work/"; fi
  dict=()
  if [[ -f fuzz/dict/$t.dict ]]; then dict=(-dict="fuzz/dict/$t.dict"); fi
  echo "fuzz.sh: $t for ${seconds} s" >&2
  if ! "$bin_dir/$t" "$work" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 2> "$work.log"; then
    tail -n 40 "$work.log" >&2
    failed+=("$t")
  else
    grep -E '^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$work.log" | sed "s/^/  $t: /" >&2 || true
  fi
  rm -rf "$work" "$work.log"
done
if ((${#failed[@]})); then
  echo "fuzz.sh: crashes in: ${failed[*]} (inputs in $cache/fuzz-artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, no crash" >&2
