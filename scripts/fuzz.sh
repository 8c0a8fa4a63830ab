#!/usr/bin/env bash
# Fuzzes the dataset format's parsers (docs/format.md) with libFuzzer.
#
#   scripts/fuzz.sh [SECONDS]   build, then run each target SECONDS (default 30)
#   scripts/fuzz.sh --seeds     rebuild and regenerate the seed corpus in fuzz/corpus
#
# Builds with clang (Debian's clang 14 and libclang-rt-14-dev are enough)
# and -fsanitize=fuzzer,address,undefined into build-fuzz (override with
# STOKER_FUZZ_BUILD). Each target runs on a temporary copy of its seed
# corpus, so fuzz/corpus is only read. Inputs that crash are kept in
# build-fuzz/artifacts/TARGET/. Exits non-zero if any target found a crash,
# a leak, undefined behaviour, a timeout or a broken property.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${STOKER_FUZZ_BUILD:-$root/build-fuzz}"
cc="${FUZZ_CC:-clang}"
cxx="${FUZZ_CXX:-clang++}"

mode=run
seconds=30
case "${1:-}" in
  --seeds) mode=seeds ;;
  -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
  '') ;;
  *[!0-9]*) echo "usage: $0 [SECONDS] | --seeds" >&2; exit 2 ;;
  *) seconds="$1" ;;
esac

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTOKER_FUZZ=ON -DSTOKER_BUILD_TESTS=OFF \
  -DSTOKER_WITH_IO_URING=OFF -DSTOKER_WITH_TURBOJPEG=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link $san" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
cmake --build "$build" -j"$(nproc)" --target manifest_fuzzer shard_fuzzer make_fuzz_seeds

if [[ $mode == seeds ]]; then
  rm -f "$root"/fuzz/corpus/manifest/* "$root"/fuzz/corpus/shard/*
  "$build/fuzz/make_fuzz_seeds" "$root/fuzz/corpus"
  exit 0
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

failed=()
for target in manifest shard; do
  corpus="$tmp/$target"
  mkdir -p "$corpus" "$build/artifacts/$target"
  cp "$root/fuzz/corpus/$target/"* "$corpus/"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$build/artifacts/$target/")
  case $target in
    manifest) args+=(-max_len=16384 -dict="$root/fuzz/manifest.dict") ;;
    shard) args+=(-max_len=20480) ;;
  esac
  echo "== ${target}_fuzzer, ${seconds} s"
  if ! "$build/fuzz/${target}_fuzzer" "${args[@]}" "$corpus"; then
    failed+=("$target")
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/artifacts/)" >&2
  exit 1
fi
echo "fuzz: no crashes"
