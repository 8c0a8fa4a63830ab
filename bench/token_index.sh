#!/bin/sh
# Issue 36's token window index benchmark (docs/benchmarks.md, "Token window
# index"): the C++ build and lookups against NumPy's on the same document
# lengths, then a real dataset's open. Usage: bench/token_index.sh BUILD_DIR [N...]
set -eu
build=${1:?usage: bench/token_index.sh BUILD_DIR [N...]}
shift
[ $# -gt 0 ] || set -- 1000000 10000000
here=$(dirname "$0")
[ -x "$build/token_index_bench" ] || {
  echo "no $build/token_index_bench: configure with -DSTOKER_BUILD_PROBES=ON and build the target token_index_bench" >&2
  exit 1
}
"$build/token_index_bench" build "$@"
/usr/bin/python3 "$here/token_index_numpy.py" "$@"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/token_index_bench" open "$dir/ds" 1000000
